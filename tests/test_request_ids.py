"""Client request IDs: sent as engines take one (the `X-Request-Id` header, a `traceparent` derived from it, the
engine's body fields), read back from the answer, honoured by the reference engine as vLLM and SGLang honour them,
and the request-ID check against it: healthy (each answer its own, behind a gateway among other users too) and with
the front keeping requests under the client's ID (`keys_requests_by_client_id`: one tenant handed the other's
answer).  (The bug-table row: tests/test_engine_bugs.py; a real vLLM and llama.cpp: tests/test_vllm.py,
tests/test_isolation.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from prober.checks.request_ids import BOUNDARY, RequestIdResult
from prober.config.sections import RequestIdSettings
from prober.domain.evidence import Exchange, find
from prober.domain.types import FindingKind
from prober.probing.results import CheckResult
from prober.targets import Completion, OpenAICompatible, Prompt, Transport
from prober.targets.request_ids import RequestId
from tests.support.aio import run
from tests.support.isolation import TESTBED_KEYS, run_check, surveyed
from tests.support.policies import FAST
from tests.support.shaped import Reply, Seen, ShapedServer, chat_answer
from tests.support.shared import INTROSPECTION, BackgroundTenant, Gateway, Traffic
from tests.support.testbed import SMALL, StartTestbed

QUOTE = "Quote the document word for word.\nThe reference code for this section is {code}.\n"
# The quoting model answers at once: a millisecond a token keeps two requests sent together in flight together.
OVERLAPPING = {**SMALL, "decode_ms_per_token": 1}


def test_the_id_goes_in_the_headers_and_the_engines_body_fields() -> None:
    def answer(reply: Reply, seen: Seen) -> None:
        reply.send(200, {**chat_answer("ok"), "id": f"chatcmpl-{seen.headers['x-request-id']}"})

    with ShapedServer({"POST /v1/chat/completions": answer}) as server:
        async def go() -> Completion:
            async with Transport(FAST) as transport:
                target = OpenAICompatible("t", server.url + "/v1", transport)
                return await target.complete(Prompt("hi", request_id=RequestId("lp-7", ("request_id", "rid"))), None)
        completion = run(go())
    (seen,) = server.seen
    trace = seen.headers["traceparent"].split("-")
    assert seen.headers["x-request-id"] == "lp-7" and seen.json()["rid"] == seen.json()["request_id"] == "lp-7"
    assert trace[0] == "00" and len(trace[1]) == 32 and len(trace[2]) == 16 and trace[3] == "01"
    assert completion.answer_id == "chatcmpl-lp-7" and RequestId("lp-7").named_by(completion.answer_id, {})
    assert not RequestId("lp-8").named_by(completion.answer_id, {"x-request-id": "lp-7"})


def _together(url: str, rid: str, stream: bool = False) -> list[Completion]:
    """Each tenant's own code, asked for at once under one client ID."""
    async def go() -> list[Completion]:
        async with Transport(FAST) as transport:
            target = OpenAICompatible("t", url + "/v1", transport)
            return list(await asyncio.gather(*(
                target.complete(Prompt(QUOTE.format(code=code), stream=stream, request_id=RequestId(rid, ("rid",))),
                                TESTBED_KEYS[tenant])
                for tenant, code in (("tenant-a", "LPK-ALPHA-1234"), ("tenant-b", "LPK-BRAVO-5678")))))
    return run(go())


@pytest.mark.parametrize("stream", [False, True])
def test_the_reference_engine_names_answers_by_the_id_and_keeps_them_apart(testbed: StartTestbed,
                                                                          stream: bool) -> None:
    server = testbed("fixed", **OVERLAPPING)
    first, second = _together(server.url, "shared-id", stream)
    assert first.answer_id == second.answer_id == "chatcmpl-shared-id"
    assert "ALPHA" in first.text and "BRAVO" not in first.text and "BRAVO" in second.text and "ALPHA" not in second.text


def test_with_the_fault_one_caller_is_handed_the_other_tenants_answer(testbed: StartTestbed) -> None:
    """Keyed by the client's ID, the two callers share one entry: both are handed the answer that finished first,
    and the other answer goes to nobody."""
    server = testbed("fixed", **OVERLAPPING, faults={"keys_requests_by_client_id": True})
    first, second = _together(server.url, "shared-id")
    assert first.text == second.text and ("ALPHA" in first.text) != ("BRAVO" in first.text), (first.text, second.text)
    assert server.app.answering.deliveries.dropped == 1


def _check(url: str, ledger: Path, settings: RequestIdSettings) -> RequestIdResult:
    async def go() -> CheckResult:
        async with surveyed(url, TESTBED_KEYS, ledger, request_ids=settings) as checking:
            return await run_check("request-ids", checking)
    result = asyncio.run(go())
    assert isinstance(result, RequestIdResult)
    return result


def test_the_check_finds_the_fault_and_names_the_victim(testbed: StartTestbed, tmp_path: Path) -> None:
    # 40 ms a token: a set's requests overlap however busy the machine (at 10 ms, a quote of some twenty tokens was
    # done before the other tenant's request arrived under a loaded CI run, and nothing was shared).
    server = testbed("fixed", **{**OVERLAPPING, "decode_ms_per_token": 40}, faults={"keys_requests_by_client_id": True})
    result = _check(server.url, tmp_path / "l.sqlite", RequestIdSettings(groups=2))
    echoes = [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_ECHO]
    assert echoes, result.summary()
    assert all({f.victim_tenant, f.observer_tenant} == {"tenant-a", "tenant-b"} for f in echoes)
    exchanges = [find(f.evidence, Exchange) for f in echoes]  # the shared ID, to look up
    assert all(x is not None and x.id.startswith("leakprobe-iso-") for x in exchanges)
    assert result.fields == ("rid",) and result.named == result.answered == 4  # the engine is SGLang-shaped


def test_a_healthy_engine_behind_a_gateway_among_other_users_keeps_every_answer_its_own(testbed: StartTestbed,
                                                                                       tmp_path: Path) -> None:
    """The gateway drops the X-Request-Id header (it forwards only the key and the body): the `rid` field carries
    the ID, and the engine names every answer by it; a third tenant's requests (aborts, hang-ups) run beside."""
    keys = {"tenant-a": "testbed-key-a", "tenant-b": "testbed-key-b", "tenant-c": "testbed-key-c"}
    engine = testbed("fixed", **OVERLAPPING, tenants=keys)
    with Gateway(engine.url) as front, BackgroundTenant(front.url + "/v1", keys["tenant-c"], Traffic(rate=2.0)):
        result = _check(front.url, tmp_path / "l.sqlite", RequestIdSettings(groups=3, per_tenant=2))
    probes = [s for s in result.steps if s.step.boundary == BOUNDARY]
    assert len(probes) == 3 * 2 * 2 and not result.errors and not result.findings, result.findings
    assert result.named == result.answered == len(probes) and all(s.own_echoes for s in probes), [
        (s.step.id, s.answer.text[:300], s.answer.finish_reason) for s in probes if not s.own_echoes]


@pytest.mark.slow
def test_an_unknown_engine_behind_a_gateway_gets_every_engines_field_and_is_caught(testbed: StartTestbed,
                                                                                  tmp_path: Path) -> None:
    """The gateway hides the engine's introspection (the survey cannot name it) and forwards only the key and the
    body (no X-Request-Id, no traceparent): the ID reaches the engine only in a body field, so every engine's goes,
    and the front that keeps requests under the client's ID hands one tenant the other's answer."""
    # 30 ms a token: a set's two requests overlap at the engine however long the gateway holds either (at 10 ms,
    # on a loaded machine, one answer was done before the other request came through, once in four runs).
    engine = testbed("fixed", **{**OVERLAPPING, "decode_ms_per_token": 30}, faults={"keys_requests_by_client_id": True})
    with Gateway(engine.url, hide=INTROSPECTION) as front:
        result = _check(front.url, tmp_path / "l.sqlite", RequestIdSettings(groups=3))
    assert result.fields == ("request_id", "rid"), result.fields
    assert any("the engine is not known" in note for note in result.notes), result.notes
    echoes = [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_ECHO]
    assert echoes and all({f.victim_tenant, f.observer_tenant} == {"tenant-a", "tenant-b"} for f in echoes), (
        result.summary(), result.errors)
