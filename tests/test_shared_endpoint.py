"""leakprobe where it is not the only client: the reference engine behind a gateway (tests/support/shared.py) that
puts the operator's system prompt before every chat, answers 502 to some requests the engine already served, and
carries a third tenant's traffic — ordinary questions, prompts over the input limit, abandoned streams, hang-ups —
so that the engine's abort counter moves several times a minute under every window leakprobe reads.

The healthy engine's audit is clean (no finding of warning or worse, complete, seeing); the incident's is a
cross-tenant echo between the two tenants.  The same through a gateway that hides the engine's introspection, and one
whose `/metrics` answers from one of two replicas at random.  (The daemon behind the same gateway, through a real
Prometheus and Alertmanager: test_shared_daemon in this file; the project's vLLM: tests/test_vllm_shared.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prober.testbed import TestbedServer
from prober.types import Severity
from tests.support.cli import invoke
from tests.support.shared import BackgroundTenant, Gateway, Traffic
from tests.support.testbed import SMALL, StartTestbed

TENANTS = {"tenant-a": "testbed-key-a", "tenant-b": "testbed-key-b", "tenant-c": "testbed-key-c"}
TRAFFIC = Traffic(rate=2.0)  # ~0.6 aborts a second: over-limit prompts, abandoned streams, hang-ups
PAIRS = {("tenant-a", "tenant-b"), ("tenant-b", "tenant-a")}


@contextmanager
def shared(testbed: StartTestbed, preset: str, **gateway: Any) -> Iterator[tuple[TestbedServer, Gateway]]:
    engine = testbed(preset, **SMALL, tenants=TENANTS)
    with Gateway(engine.url, fail_after_served=0.05, **gateway) as front, \
            BackgroundTenant(front.url + "/v1", TENANTS["tenant-c"], TRAFFIC):
        yield engine, front


def audit(url: str, tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = invoke("audit", "--target", url + "/v1", "--tenant", "tenant-a=LP_A", "--tenant", "tenant-b=LP_B",
                    "--ledger", str(tmp_path / "l.sqlite"), "-f", "json", "--no-semantic", *args)
    return result.exit_code, json.loads(result.stdout)


def serious(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(f["kind"], f["record_id"], f["evidence"]["excerpt"]) for f in doc["findings"]
            if Severity.parse(f["severity"]) >= Severity.WARNING]


def test_a_healthy_engine_behind_a_gateway_among_other_users_is_clean(testbed: StartTestbed, tmp_path: Path) -> None:
    with shared(testbed, "fixed") as (engine, front):
        aborted, retried = engine.engine.stats.aborted, front.stats.failed_after_served
        code, doc = audit(front.url, tmp_path)
        aborted, retried = engine.engine.stats.aborted - aborted, front.stats.failed_after_served - retried
    assert aborted >= 3 and retried >= 1, (aborted, retried)  # other users' aborts, and 502s after the engine served
    assert code == 0 and serious(doc) == [], (code, doc["verdict"], serious(doc))
    target = doc["targets"][0]
    assert doc["verdict"]["status"] == "no_leak" and target["coverage"]["observed"] == target["coverage"]["planned"]
    (chat,) = target["paths"]
    assert chat["api"] == "chat" and not chat["varying"] and min(chat["by_tenant"]["tenant-a"]) > 100, chat
    assert target["sight"]["boundaries"]["echoed"] > 0 and not target["sight"]["boundaries"]["blind"]


def test_the_incident_behind_the_gateway_is_an_echo_between_the_two_tenants(testbed: StartTestbed,
                                                                            tmp_path: Path) -> None:
    with shared(testbed, "incident") as (_, front):
        code, doc = audit(front.url, tmp_path)
    echoes = {(f["victim_tenant"], f["observer_tenant"]) for f in doc["findings"] if f["kind"] == "cross_tenant_echo"}
    assert code == 1 and echoes == PAIRS, (code, echoes)
    (counted,) = [f for f in doc["findings"] if f["kind"] == "counted_failure"]
    assert counted["details"]["decisions"][0]["p_value"] < 1e-6  # its own aborts, far beyond the other tenant's


def test_hidden_introspection_runs_every_engine_familys_checks(testbed: StartTestbed, tmp_path: Path) -> None:
    """No /server_info or /metrics through the gateway (tokenize passes, as routers pass it): the operator gives the
    capacity, the engine is unknown, so the idle-slot check runs at llama.cpp's usual width; still clean."""
    config = tmp_path / "c.yaml"
    limit = min(SMALL["context_length"] - 1, SMALL["pool_tokens"] - 1) - 5  # SGLang's max_req_input_len
    with shared(testbed, "fixed", hide=("/server_info", "/get_server_info", "/metrics")) as (_, front):
        config.write_text(f"targets:\n  - name: hidden\n    url: {front.url}/v1\n    capacity: {{context_length: "
                          f"{SMALL['context_length']}, pool_tokens: {SMALL['pool_tokens']}, page_size: 16, "
                          f"max_req_input_len: {limit}}}\n"
                          "tenants:\n  - {name: tenant-a, api_key_env: LP_A}\n  - {name: tenant-b, api_key_env: LP_B}\n"
                          f"ledger: {tmp_path / 'l.sqlite'}\ndetection: {{semantic: false}}\n")
        result = invoke("audit", "--config", str(config), "-f", "json")
    doc = json.loads(result.stdout)
    target = doc["targets"][0]
    assert result.exit_code == 0 and serious(doc) == [], (result.exit_code, doc["verdict"], serious(doc))
    assert any(note.startswith("engine unknown") for note in target["capacity"]["notes"])
    assert target["sight"]["idle slots"] == {"checked": 2 * 2 * 4, "echoed": 2 * 2 * 4, "blind": False}


def test_metrics_from_either_of_two_replicas_are_never_compared(testbed: StartTestbed, tmp_path: Path) -> None:
    """/metrics answers from the engine or another replica at random: windows whose reads came from different
    processes are set aside and said, and the other replica's counters never make a finding."""
    other = testbed("fixed", **SMALL, tenants=TENANTS)
    with shared(testbed, "fixed") as (engine, front):
        front._replicas = [engine.url, other.url]
        code, doc = audit(front.url, tmp_path)
    assert code == 0 and serious(doc) == [], (code, serious(doc))
    assert any("different engine processes" in note for note in doc["targets"][0]["notes"]), doc["targets"][0]["notes"]
