"""`leakprobe gate`, the deploy gate, as a pipeline runs it (a subprocess, its exit code, JUnit and SARIF files):
the incident's engine fails it within its ceilings, the fixed one passes, a target that never says its own canary
cannot pass (2), and the checks of the known bugs an engine's release is in join it where the ceiling has room."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.support.gate import gate, gated
from tests.support.hostile import CONTEXT, LIMIT, POOL, hostile_engine
from tests.support.testbed import SMALL, StartTestbed


def test_the_incident_fails_the_gate_within_its_ceilings_and_ci_reads_why(testbed: StartTestbed,
                                                                          tmp_path: Path) -> None:
    server = testbed("incident", **SMALL)
    junit, sarif = tmp_path / "gate.xml", tmp_path / "gate.sarif"
    run, (sent, served, ceiling, seconds) = gate(server.url, tmp_path, f"--report=junit={junit}",
                                                 f"--report=sarif={sarif}")
    assert run.returncode == 1, run.stderr[-3000:]
    assert ceiling == 3 * SMALL["pool_tokens"] and sent <= ceiling and served <= sent and seconds < 600
    assert run.stdout.startswith("LEAK"), run.stdout[:500]
    cases = ET.parse(junit).getroot().iter("testcase")
    assert any(case.find("failure") is not None for case in cases)
    rules = {r["ruleId"] for r in json.loads(sarif.read_text())["runs"][0]["results"]}
    assert rules, "the SARIF holds the gate's findings"


def test_the_fixed_engine_passes_the_gate(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("fixed", **SMALL)
    run, (sent, _, ceiling, _) = gate(server.url, tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sent <= ceiling and "NO LEAK" in run.stdout


def test_a_target_that_never_says_its_own_canary_cannot_pass(tmp_path: Path) -> None:
    """It refuses over its limit as a correct engine does, and echoes each prompt's first line, never a canary:
    nothing it answers could have shown a leak, so the gate could not decide.  (It echoes keys in its introspection,
    so the capacity comes from the config, as for a gateway that hides it.)"""
    config = tmp_path / "c.yaml"
    with hostile_engine() as engine:
        config.write_text(f"targets:\n  - name: mute\n    url: {engine.url}/v1\n    capacity: {{context_length: "
                          f"{CONTEXT}, pool_tokens: {POOL}, max_req_input_len: {LIMIT}}}\n"
                          "tenants:\n  - {name: tenant-a, api_key_env: LP_A}\n  - {name: tenant-b, api_key_env: LP_B}\n"
                          f"ledger: {tmp_path / 'l.sqlite'}\n")
        run, (sent, _, ceiling, _) = gated(tmp_path, "--config", str(config), "--max-tokens", "6000")
    assert run.returncode == 2 and "blind" in run.stderr, run.stdout[-2000:] + run.stderr[-3000:]
    assert 0 < sent <= ceiling


def test_a_known_bugs_check_joins_the_gate_where_the_ceiling_has_room(testbed: StartTestbed, tmp_path: Path) -> None:
    """SGLang 0.5.11 has the cross-talk row (no fix known): its check runs with the gate; the prefix-cache check's
    plan does not fit the default ceiling beside the gate's and is said not to run, and a wider ceiling runs it."""
    server = testbed("fixed", **SMALL, reports_version="0.5.11")
    json_report = tmp_path / "g.json"
    run, _ = gate(server.url, tmp_path, f"--report=json={json_report}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    checks = {c["check"]: c for c in json.loads(json_report.read_text())["targets"][0]["checks"]}
    assert {"gate", "crosstalk"} <= set(checks) and "campaign" not in checks
    assert "over what the token ceiling leaves" in checks["prefix-cache"]["summary"], checks["prefix-cache"]
    wide, _ = gate(server.url, tmp_path, "--max-tokens", "60000", f"--report=json={json_report}")
    assert wide.returncode == 0, wide.stderr[-3000:]
    checks = {c["check"]: c for c in json.loads(json_report.read_text())["targets"][0]["checks"]}
    assert checks["prefix-cache"]["requests"] > 0
