"""Abort and retry on the reference engine: a client that hangs up mid-prefill has its request aborted between
prefill chunks, its pages freed; a healthy prefix cache holds only the pages that were written, so the retry computes
the rest; with `publishes_before_written` the retry takes the never-written pages as cached and reads another
tenant's KV there.  Then the abort-and-retry check: clean on the healthy engine (behind a gateway among other users'
aborts too), the victim named where the fault bites, and where a cache shared across tenants hands the victim's
request for the same prompt what the aborted one never wrote.  (The bug-table row: tests/test_engine_bugs.py; a
real llama.cpp and vLLM: tests/test_isolation.py, tests/test_vllm.py.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from prober.checks.abort_retry import AbortRetryResult
from prober.domain.types import FindingKind
from prober.probing.results import CheckResult
from prober.testbed import TestbedServer
from tests.support.isolation import TESTBED_KEYS, run_check, surveyed
from tests.support.shared import BackgroundTenant, Gateway, Traffic
from tests.support.testbed import SMALL, StartTestbed
from tests.support.waiting import wait_for

# A second a thousand tokens: a 3,500-token prompt prefills for 3.5 s in four chunks of 1,024, and a client that
# hangs up after 1.5 s is gone after the first and before the last, however late its request reached the engine.
SLOW_PREFILL = {**SMALL, "prefill_ms_per_1k_tokens": 1_000}
HEADERS = {"tenant-a": {"Authorization": "Bearer testbed-key-a"}, "tenant-b": {"Authorization": "Bearer testbed-key-b"}}


def document(code: str) -> str:
    """About 3,500 of the testbed's tokens: the request on the first line, a code in every line."""
    lines = [f"Line {n} of the ledger holds the reference code {code}-{n:03d} for the harbour." for n in range(130)]
    return "Quote the document word for word.\n" + "\n".join(lines)


def chat(server: TestbedServer, tenant: str, text: str, hang_up_s: float | None = None) -> dict[str, Any] | None:
    """One streamed chat request, read to its end, or hung up on after `hang_up_s` (None then)."""
    async def go() -> dict[str, Any] | None:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": 400, "stream": True,
                "stream_options": {"include_usage": True}}
        async with httpx.AsyncClient(timeout=60) as client:
            try:
                async with asyncio.timeout(hang_up_s), client.stream(
                        "POST", server.url + "/v1/chat/completions", json=body, headers=HEADERS[tenant]) as response:
                    events = [line[6:] async for line in response.aiter_lines() if line.startswith("data: {")]
            except TimeoutError:
                return None
        chunks = [json.loads(e) for e in events]
        return {"text": "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]),
                "cached": next(c["usage"]["prompt_tokens_details"]["cached_tokens"] for c in chunks if c.get("usage"))}
    return asyncio.run(go())


def abandoned_then_retried(server: TestbedServer) -> dict[str, Any]:
    """tenant-a's prompt abandoned mid-prefill, tenant-b's own prompt (its pages freed last), tenant-a's retry."""
    engine = server.engine
    aborted = engine.stats.aborted
    prompt = document("LPK-ALPHA")
    assert chat(server, "tenant-a", prompt, hang_up_s=1.5) is None
    wait_for(lambda: engine.stats.aborted > aborted and not engine.paging.prefill_pool.usage().pages_used,
             "the engine to abort the request and free its pages")
    other = chat(server, "tenant-b", document("LPK-BRAVO"))
    assert other is not None and "LPK-BRAVO" in other["text"]
    retry = chat(server, "tenant-a", prompt)
    assert retry is not None
    return retry


def test_an_abort_mid_prefill_leaves_only_written_pages_cached(testbed: StartTestbed) -> None:
    server = testbed("fixed", **SLOW_PREFILL)
    retry = abandoned_then_retried(server)
    chunk = server.engine.config.prefill_chunk_tokens
    assert 0 < retry["cached"] < 3_000 and retry["cached"] % chunk == 0, retry["cached"]  # whole chunks only
    assert "LPK-ALPHA" in retry["text"] and "LPK-BRAVO" not in retry["text"]


def test_with_the_fault_the_retry_reads_what_the_pages_held(testbed: StartTestbed) -> None:
    server = testbed("fixed", **SLOW_PREFILL, faults={"publishes_before_written": True})
    retry = abandoned_then_retried(server)
    assert retry["cached"] > 3_000  # every whole page, published when the prompt was admitted
    assert "LPK-BRAVO" in retry["text"], retry["text"]  # tenant-b's KV, where tenant-a's was never written


def _check(url: str, ledger: Path) -> AbortRetryResult:
    async def go() -> CheckResult:
        async with surveyed(url, TESTBED_KEYS, ledger) as checking:
            return await run_check("abort-retry", checking)
    result = asyncio.run(go())
    assert isinstance(result, AbortRetryResult)
    return result


CHECKED = {**SMALL, "prefill_ms_per_1k_tokens": 100}  # the check's prompts (~3,900 tokens) prefill in 0.4 s


def test_the_check_is_clean_on_a_healthy_engine_and_hangs_up_mid_prefill(testbed: StartTestbed,
                                                                        tmp_path: Path) -> None:
    server = testbed("fixed", **CHECKED)
    result = _check(server.url, tmp_path / "l.sqlite")
    assert result.abandoned == 2 and not result.answered_early and server.engine.stats.aborted >= 2
    assert not result.findings and not result.errors, [f.describe() for f in result.findings]
    assert result.sight is not None and result.sight.echoed == result.sight.checked == 4


def test_a_cache_shared_across_tenants_hands_the_victim_what_the_aborted_request_never_wrote(
        testbed: StartTestbed, tmp_path: Path) -> None:
    """With the cache shared, the victim's request for the observer's abandoned prompt hits its published pages and
    reads the observer's canaries (from the observer's own prompt before): found at the victim's request too."""
    server = testbed("fixed", **CHECKED, faults={"publishes_before_written": True, "shared_prefix_cache": True})
    result = _check(server.url, tmp_path / "l.sqlite")
    echoes = [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_ECHO]
    at = {f.record_id.rsplit("-", 1)[1] for f in echoes}
    assert "same" in at, [f.describe() for f in echoes]
    assert all({f.victim_tenant, f.observer_tenant} == {"tenant-a", "tenant-b"} for f in echoes)


def test_behind_a_gateway_among_other_users_aborts_a_healthy_engine_gives_nothing(testbed: StartTestbed,
                                                                                 tmp_path: Path) -> None:
    """Other users' hang-ups, abandoned streams and over-limit prompts move the same pages and the same abort
    counter: a healthy engine still computes what it did not write, and the check finds nothing."""
    keys = {"tenant-a": "testbed-key-a", "tenant-b": "testbed-key-b", "tenant-c": "testbed-key-c"}
    engine = testbed("fixed", **CHECKED, tenants=keys)
    with Gateway(engine.url) as front, \
            BackgroundTenant(front.url + "/v1", keys["tenant-c"], Traffic(rate=2.0)) as other:
        result = _check(front.url, tmp_path / "l.sqlite")
    assert sum(n for kind, n in other.sent.items() if not kind.startswith("ordinary")) >= 3, other.sent
    assert not result.findings and not result.errors, [f.describe() for f in result.findings]
    assert result.abandoned + result.answered_early == 2
