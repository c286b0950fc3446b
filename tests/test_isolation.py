"""The timing check, the cross-talk burst and the idle-slot check from the registry, as `leakprobe audit` runs
them: against the reference engine (its prefix cache shared or per tenant, prefill time simulated) and against a
real llama.cpp (tests/support/llamacpp.py).

llama.cpp reuses a slot's cached prompt prefix for whoever sends it next (`cache_prompt`, on by default):
behind one gateway every tenant shares it, and the timing check sees that without `cached_tokens`; with
`--no-cache-prompt` there is nothing to see.  With four slots over one unified KV cache, a burst of
concurrent requests of both tenants must each come back with its own canary only (llama.cpp #25992 reported
3 of 36 replies that were other requests').
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from prober.checks import REGISTRY
from prober.checks.abort_retry import AbortRetryResult
from prober.checks.idle_slots import BOUNDARY
from prober.checks.request_ids import RequestIdResult
from prober.config.sections import AbortRetrySettings, IdleSlotSettings, RequestIdSettings, TimingSettings
from prober.daemon.schedule import daemon_jobs
from prober.domain.types import FindingKind
from prober.probing.results import CheckResult
from tests.support.daemonproc import DaemonProcess, daemon_config
from tests.support.isolation import NO_KEYS, TESTBED_KEYS, burst, run_check, surveyed, timing
from tests.support.llamacpp import Installation, LlamaServer
from tests.support.testbed import SMALL, StartTestbed

# Prompts of ~200 tokens: at ~550 tokens/s prefill idle a miss costs a fraction of a second more than a hit
# (measured under a load of 15 at 300 tokens: hits 2.2-4.4 s, misses 13 s).  10 of each per pair decide at the
# default false-alarm rate (0.001) when every sample behaves, but beside a CPU hog one llama.cpp hit in ten came
# back as slow as the misses (p 0.00105); 16 still decide with two such hits in a pair (p 8.5e-5).
TIMING = TimingSettings(samples=16, prompt_tokens=200)
# Where nothing may be found the false-alarm rate holds at any count: the fewest that could decide.
TIMING_NOTHING = TimingSettings(samples=10, prompt_tokens=200)


@pytest.mark.slow
@pytest.mark.parametrize(("faults", "shared"), [({"shared_prefix_cache": True}, True), ({}, False)])
def test_reference_engine_prefix_cache_by_timing(testbed: StartTestbed, tmp_path: Path, faults: dict[str, bool],
                                                 shared: bool) -> None:
    """The reference engine sleeps for the prefill of what its prefix cache did not hold (1 ms a token here):
    keyed by content alone (the fault) another tenant's prompt comes back sooner, keyed by tenant it does not."""
    server = testbed("fixed", **{**SMALL, "prefill_ms_per_1k_tokens": 1_000}, faults=faults)
    result = timing(server.url, TESTBED_KEYS, tmp_path / "l.sqlite", TIMING)
    assert [d.found for d in result.decisions] == [shared, shared]
    assert {(f.victim_tenant, f.observer_tenant) for f in result.findings} == (
        {("tenant-a", "tenant-b"), ("tenant-b", "tenant-a")} if shared else set())


# A fresh interpreter (scipy.stats not yet imported) runs a timing check and reports on which thread the
# decision's import ran: on the event loop it held up everything else the process served for seconds (a
# daemon's /metrics timed out under load).
_IMPORT_THREAD = """
import sys, threading
from pathlib import Path
importers = []

class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "scipy.stats":
            importers.append(threading.current_thread() is threading.main_thread())

sys.meta_path.insert(0, Spy())
from tests.support.isolation import TESTBED_KEYS, timing
from prober.config.sections import TimingSettings
timing(sys.argv[1], TESTBED_KEYS, Path(sys.argv[2]), TimingSettings(samples=10, prompt_tokens=200))
print("on the event loop" if any(importers) else "in a worker" if importers else "never")
"""


@pytest.mark.slow
def test_the_timing_decision_stays_off_the_event_loop(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("fixed", **{**SMALL, "prefill_ms_per_1k_tokens": 1_000}, faults={"shared_prefix_cache": True})
    done = subprocess.run([sys.executable, "-c", _IMPORT_THREAD, server.url, str(tmp_path / "l.sqlite")],
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "in a worker", done.stdout


def test_reference_engine_burst_answers_are_their_own(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("fixed", **SMALL)
    result = burst(server.url, TESTBED_KEYS, tmp_path / "l.sqlite")
    assert result.requests == result.answered == 8, result.errors
    assert result.own_echoed == 8 and result.foreign == 0 and not result.findings  # the quoting model quotes


def test_llamacpp_prompt_cache_is_seen_by_timing(llama_install: Installation, tmp_path: Path) -> None:
    with LlamaServer(llama_install, ctx_size=4096, parallel=2) as server:
        result = timing(server.url, NO_KEYS, tmp_path / "l.sqlite", TIMING)
    assert [d.found for d in result.decisions] == [True, True]


def test_llamacpp_without_prompt_cache_has_nothing_to_time(llama_install: Installation, tmp_path: Path) -> None:
    with LlamaServer(llama_install, ctx_size=4096, parallel=2, extra=("--no-cache-prompt",)) as server:
        result = timing(server.url, NO_KEYS, tmp_path / "l.sqlite", TIMING_NOTHING)
    assert [d.found for d in result.decisions] == [False, False]


def test_llamacpp_concurrent_requests_get_their_own_answers(llama_install: Installation, tmp_path: Path) -> None:
    with LlamaServer(llama_install, ctx_size=4096, parallel=4, kv_unified=True) as server:
        result = burst(server.url, NO_KEYS, tmp_path / "l.sqlite")
    assert result.requests == result.answered == 8, result.errors
    assert result.own_echoed >= 6 and result.foreign == 0 and not result.findings


def test_llamacpp_slots_keep_nobody_elses_conversation(llama_install: Installation, tmp_path: Path) -> None:
    """The idle-slot check on a real llama.cpp with two slots (their number read off /props): each tenant's
    conversations in both slots, the other's cold prompts one at a time and then at once; nothing crosses
    (llama.cpp #27148 did not reproduce with this model: its sliding-window guard re-processes the prompt)."""
    async def go() -> CheckResult:
        async with surveyed(server.url, NO_KEYS, tmp_path / "l.sqlite",
                            idle_slots=IdleSlotSettings(tokens=96, max_tokens=24)) as run:
            return await run_check("idle-slots", run)
    with LlamaServer(llama_install, ctx_size=2048, parallel=2) as server:
        result = asyncio.run(go())
    slots = [s for s in result.steps if s.step.boundary == BOUNDARY]  # after the probe shape's controls
    assert len(slots) == 2 * 4 * 2 and not result.errors  # two slots: each pair fills, probes cold, refills, bursts
    assert not [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_ECHO], result.findings


def test_llamacpp_request_ids_and_abort_retry(llama_install: Installation, tmp_path: Path) -> None:
    """llama.cpp names every answer itself (a client's request ID goes nowhere) and keeps two tenants' requests sent
    at once apart.  Prefilling in batches of 64, it cancels a prompt hung up on halfway between batches (its slot kept
    257 and 193 of 384 tokens, measured), and the next request for that prompt takes the slot by its prefix; nothing
    of the other tenant's comes back in the retry.  (Its slot cache is one for every client, and these keyless
    tenants look alike to the cached-token explainer: a `cross_tenant_cache_hit` may be reported; not checked here.)"""
    async def both() -> tuple[CheckResult, CheckResult]:
        async with surveyed(server.url, NO_KEYS, tmp_path / "l.sqlite", retries=2,
                            request_ids=RequestIdSettings(groups=2, max_tokens=32),
                            abort_retry=AbortRetrySettings(tokens=384, max_tokens=32)) as checking:
            return await run_check("request-ids", checking), await run_check("abort-retry", checking)

    with LlamaServer(llama_install, ctx_size=2048, parallel=2, extra=("--batch-size", "64", "--ubatch-size", "64")
                     ) as server:
        ids, abort = asyncio.run(both())
    assert isinstance(ids, RequestIdResult) and isinstance(abort, AbortRetryResult)
    cached = {s.step.id.rsplit("-", 1)[1]: s.answer.usage.cached_tokens for s in abort.steps if s.answer.usage}
    print(ids.summary(), ids.sight, "|", abort.summary(), abort.sight, "| cached:", cached,
          [(f.kind, f.record_id) for f in abort.findings])
    assert ids.named == 0 and any("names requests itself" in note for note in ids.notes) and not ids.errors
    assert abort.abandoned + abort.answered_early == 2 and not abort.errors, abort.errors
    crossed = [f for f in ids.findings + abort.findings
               if f.kind in (FindingKind.CROSS_TENANT_ECHO, FindingKind.PHANTOM_CACHE_HIT)]
    assert not crossed, [f.describe() for f in crossed]
    assert ids.sight is not None and ids.sight.echoed and abort.sight is not None and abort.sight.echoed


@pytest.mark.slow
def test_daemon_jobs_export_what_timing_and_the_burst_find(testbed: StartTestbed, tmp_path: Path) -> None:
    """`leakprobe daemon` as a process against a reference engine whose prefix cache is shared: the timing job
    finds both pairs and exports its p-values and medians, the burst's answers are each their own."""
    # 2 s per 1k prompt tokens: a miss costs 400 ms more than a hit, well clear of a loaded machine's stalls.
    server = testbed("fixed", **{**SMALL, "prefill_ms_per_1k_tokens": 2_000}, faults={"shared_prefix_cache": True})
    config = daemon_config(server.url, tmp_path / "l.sqlite",
                           schedule=dict.fromkeys(daemon_jobs(REGISTRY), "24h"))
    config.update(detection={"semantic": False}, audit={"concurrent": False, "max_tokens": 8},
                  timing={"samples": TIMING.samples, "prompt_tokens": TIMING.prompt_tokens},
                  crosstalk={"per_tenant": 4})
    with DaemonProcess(config, tmp_path) as daemon:
        # Until a job has run, its last success reads as the daemon's start (stale from then): wait for its run.
        daemon.wait_for(lambda: all(daemon.sample("leakprobe_last_run_timestamp_seconds", job=job) > 0
                                    for job in ("timing", "crosstalk")), 120, "the timing and cross-talk runs")
        assert "timing testbed: ok" in daemon.log() and "crosstalk testbed: ok" in daemon.log(), daemon.log()[-3000:]
        pairs = (("tenant-a", "tenant-b"), ("tenant-b", "tenant-a"))
        for victim, observer in pairs:
            found = daemon.sample("leakprobe_findings_total", kind="cross_tenant_cache_timing", victim=victim,
                                  observer=observer)
            assert found == 1, daemon.log()[-3000:]
            p = daemon.sample("leakprobe_cache_timing_p_value", victim=victim, observer=observer)
            hit = daemon.sample("leakprobe_cache_timing_ttft_seconds", victim=victim, observer=observer, prompts="hit")
            miss = daemon.sample("leakprobe_cache_timing_ttft_seconds", victim=victim, observer=observer,
                                 prompts="miss")
            assert 0 < p <= 0.001 and 0 < hit < miss, (p, hit, miss)
        assert daemon.sample("leakprobe_crosstalk_answers_total", outcome="own") == 8
        assert daemon.sample("leakprobe_crosstalk_answers_total", outcome="foreign") == 0
        assert daemon.stop() == 0
