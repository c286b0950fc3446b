"""`leakprobe audit` end to end against the reference engine: findings, exit codes, reports, crash safety."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import signal
import subprocess
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import httpx
import pytest

from prober.config.schema import assemble_config
from prober.domain.types import FindingKind, Severity
from prober.ledger import open_ledger
from prober.oneshot.audit import exit_code, run_audit
from prober.report import ReportFormat
from prober.targets import Secret
from tests.support.cli import command, invoke
from tests.support.crash import assert_nothing_lost, kill_at_random_moment
from tests.support.keys import KEYS
from tests.support.keys import TENANT_ARGS as TENANTS
from tests.support.pool import NewCanaries, ledger_key, sent_canaries
from tests.support.testbed import SMALL, StartTestbed
from tests.support.waiting import wait_for

HEALTHY = {"context_length": 4_096, "pool_tokens": 16_384, "page_size": 16, "prefill_ms_per_1k_tokens": 0}
LEAKS = {FindingKind.CROSS_TENANT_ECHO, FindingKind.BOUNDARY_ACCEPTED, FindingKind.PLACEHOLDER_SUBSTITUTION,
         FindingKind.FOREIGN_CONTENT}


def cli(*args: str) -> Any:
    return invoke("audit", *args)


def library_audit(url: str, ledger: Path, **settings: Any) -> Any:
    cfg = assemble_config(None, target=url, tenants=["tenant-a=LP_A", "tenant-b=LP_B"], ledger=str(ledger),
                          **settings)
    secrets: dict[str, Secret | None] = {"tenant-a": Secret(KEYS["LP_A"]), "tenant-b": Secret(KEYS["LP_B"])}
    return asyncio.run(run_audit(cfg, secrets))


def test_incident_is_caught_in_both_directions(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("incident", **SMALL)
    ledger = tmp_path / "l.sqlite"
    report = tmp_path / "r.json"
    result = cli("--target", server.url + "/v1", *TENANTS, "--ledger", str(ledger), "-f", "json", "-o", str(report))
    assert result.exit_code == 1, result.output
    doc = json.loads(report.read_text())
    assert doc["complete"] and doc["summary"]["worst"] == "critical"
    kinds = {f["kind"] for f in doc["findings"]}
    assert {"boundary_accepted", "cross_tenant_echo"} <= kinds
    echoes = [f for f in doc["findings"] if f["kind"] == "cross_tenant_echo"]
    assert {(f["victim_tenant"], f["observer_tenant"]) for f in echoes} == {("tenant-a", "tenant-b"),
                                                                             ("tenant-b", "tenant-a")}
    for f in echoes:  # every finding names target, tenants, probe, prompt length, severity, evidence
        assert f["target"] and f["record_id"].endswith("-probe") and f["prompt_tokens"] > 4_089
        fragment = {d["type"]: d for d in f["details"]}.get("fragment", {}).get("kind")
        whole = f["detector"] in ("exact", "fuzzy") or fragment == "token_part"
        # A paraphrase, a tag or a person's name alone: high; a made-up place or pet name alone: a warning.
        assert f["severity"] == ("critical" if whole else "warning" if fragment == "fact_word_name" else "high")
        assert f["evidence"]["excerpt_sha256"] and (f["canary_id"] or fragment == "probe_tag")
        assert f["check"] in ("campaign", "prefix-cache")
    # Each names the request's W3C trace context: the engine's exported span for it, where it exports traces.
    traces = {f["record_id"]: {d["type"]: d for d in f["details"]}["trace"]["trace_id"] for f in echoes}
    assert all(re.fullmatch(r"[0-9a-f]{32}", t) for t in traces.values()) and len(set(traces.values())) == len(traces)
    # Facts planted beside the tokens come back reworded in summaries, and are attributed in both directions by the
    # detector the rewording calls for: fuzzy where the names and numbers survive, semantic where they moved further
    # (which of the two, the random facts decide; tests/test_detect_eval.py measures each).
    store = open_ledger(ledger)
    facts = {c.id for c in store.active_canaries() if c.kind.value == "fact"}
    store.close()
    assert {(f["victim_tenant"], f["observer_tenant"]) for f in echoes if f["canary_id"] in facts
            and f["detector"] in ("fuzzy", "semantic")} == {("tenant-a", "tenant-b"), ("tenant-b", "tenant-a")}
    steps = {s["id"]: s for s in doc["targets"][0]["steps"]}
    assert {steps[f["record_id"]]["stream"] for f in echoes} == {True, False}  # plain and streaming both leak
    accepted = [f for f in doc["findings"] if f["kind"] == "boundary_accepted"]
    assert all(steps[f["record_id"]]["prompt_tokens"] >= server.engine.config.max_req_input_len for f in accepted)
    assert len(open_ledger(ledger).findings()) == len(doc["findings"])  # persisted as found
    # `scan -f json` over the same ledger speaks the same finding schema as the audit's report.
    store = open_ledger(ledger)
    canary = next(c for c in store.active_canaries() if c.tenant == "tenant-a" and c.kind.value == "token")
    store.close()
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"id": "log-1", "tenant": "tenant-b", "text": f"It said {canary.text}."}) + "\n")
    scanned = invoke("scan", str(answers), "--ledger", str(ledger), "--format", "json", "--no-semantic")
    [from_scan] = json.loads(scanned.stdout)["findings"]
    from_audit = echoes[0]
    assert from_scan.keys() == from_audit.keys() and from_scan["evidence"].keys() == from_audit["evidence"].keys()
    assert (from_scan["record_id"], from_scan["canary_id"], from_scan["victim_tenant"]) == ("log-1", canary.id,
                                                                                              "tenant-a")


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "overrides"), [("fixed", SMALL), ("healthy", HEALTHY)])
def test_fixed_and_healthy_are_clean_over_repeated_runs(testbed: StartTestbed, tmp_path: Path, preset: str,
                                                         overrides: dict[str, Any]) -> None:
    server = testbed(preset, **overrides)
    # Two rounds in one run, then a second run over the same ledger and engine pool: a round after a round
    # and a run after a run, each free to mistake what an earlier one left behind for a leak.
    for rounds in ("2", "1"):
        result = cli("--target", server.url + "/v1", *TENANTS, "--ledger", str(tmp_path / "l.sqlite"),
                     "--rounds", rounds, "-f", "json")
        assert result.exit_code == 0, (rounds, result.output)
        doc = json.loads(result.stdout)
        assert not [f for f in doc["findings"] if f["kind"] in LEAKS or f["severity"] != "info"]
        outcomes = {(s["boundary"], s["outcome"]) for s in doc["targets"][0]["steps"] if s["role"] == "probe"}
        served = ("max_req_input_len-1", "sight", "prefix-cache", "repeat", "limit-1", "media-collision",
                  "media-uuid-reuse", "media-reshaped", "request-id", "abort-retry", "response-cache",
                  "semantic-cache")  # and a uuid alone, another tenant's, refused
        assert all(outcome == ("served" if b in served else "refused") for b, outcome in outcomes), outcomes


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "expected", "code"), [
    ("abort_flag_unsynced", {FindingKind.ENGINE_ERROR}, 1),
    ("decode_skips_page_check", set(), 0),  # latent: nothing leaks while aborts are honoured
    # The scheduler counts the abort, the client gets HTTP 200 (SGLang #33507's shape).
    ("usage_reports_placeholder", {FindingKind.PLACEHOLDER_SUBSTITUTION, FindingKind.BOUNDARY_ACCEPTED,
                                   FindingKind.COUNTED_FAILURE}, 1),
    ("shared_prefix_cache", {FindingKind.CROSS_TENANT_CACHE_HIT}, 1),
])
def test_each_fault_alone(testbed: StartTestbed, tmp_path: Path, fault: str, expected: set[FindingKind],
                          code: int) -> None:
    server = testbed("fixed", **SMALL, faults={fault: True})
    result = library_audit(server.url + "/v1", tmp_path / "l.sqlite")
    found = {f.kind for f in result.findings if f.severity >= Severity.WARNING}
    assert found == expected and result.complete
    assert exit_code(result, Severity.WARNING) == code
    assert not any(f.kind is FindingKind.CROSS_TENANT_ECHO for f in result.findings)
    hits = [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_CACHE_HIT]
    # The cache-hit check knows whose prompt primed the cache: every hit names that other tenant.
    assert all(f.victim_tenant in ("tenant-a", "tenant-b") and f.victim_tenant != f.observer_tenant for f in hits)
    assert {(f.victim_tenant, f.observer_tenant) for f in hits} == (
        {("tenant-a", "tenant-b"), ("tenant-b", "tenant-a")} if fault == "shared_prefix_cache" else set())


@pytest.mark.slow
def test_reports_in_every_format_and_no_key_anywhere(testbed: StartTestbed, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = testbed("incident", **SMALL)
    ledger = tmp_path / "l.sqlite"
    for bad in ("pdf=out.pdf", "json", "json="):  # refused before anything is sent
        refused = cli("--target", server.url + "/v1", *TENANTS, "--ledger", str(ledger), "--report", bad)
        said = " ".join(refused.output.replace("│", " ").split())  # click's error box, unwrapped
        assert refused.exit_code == 2 and "--report" in said and "give FORMAT=PATH" in said, refused.output
        assert not ledger.exists()
    reports = {fmt: tmp_path / f"report.{fmt.value}" for fmt in ReportFormat if fmt is not ReportFormat.table}
    result = cli("--target", server.url + "/v1", *TENANTS, "--ledger", str(ledger), "--streaming", "stream",
                 "--no-concurrent", *(f"--report={fmt.value}={path}" for fmt, path in reports.items()))
    assert result.exit_code == 1, result.output
    assert "cross_tenant_echo" in result.stdout  # the table, on stdout as without --report
    text = {fmt: path.read_text() for fmt, path in reports.items()}
    outputs = [result.output, *text.values()]
    results = json.loads(text[ReportFormat.sarif])["runs"][0]["results"]
    assert {r["ruleId"] for r in results} >= {"LEAK001", "CAP001"}
    assert all(r["locations"] and r["partialFingerprints"]["leakprobe/v1"] for r in results)
    suites = ET.fromstring(text[ReportFormat.junit].split("?>", 1)[1])
    assert int(suites[0].get("failures", 0)) > 0 and int(suites[0].get("tests", 0)) > 10
    page = text[ReportFormat.html]
    assert page.count("<svg") >= 2 and "cross_tenant_echo" in page
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)  # self-contained
    assert json.loads(text[ReportFormat.json])["verdict"]["status"] == "leak"
    stored = ledger.read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("l.sqlite*"))
    for key in KEYS.values():
        assert all(key not in text for text in [*outputs, caplog.text])
        assert key.encode() not in stored
    assert "httpx" in caplog.text or "httpcore" in caplog.text


def test_dry_run_sends_no_prompt(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("incident", **SMALL)
    result = cli("--target", server.url + "/v1", *TENANTS, "--ledger", str(tmp_path / "l.sqlite"), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "plan (" in result.stdout and "DRY RUN" in result.stdout and "pool+1" in result.stdout
    assert "summarize" in result.stdout and "1 in 4 canary units also carries a fact" in result.stdout
    assert server.engine.paging.prefill_pool.usage().tokens_used == 0  # nothing reached the KV pool
    scrape = httpx.get(server.url + "/metrics").text
    assert not re.search(r'route="(chat|completions)"', scrape)


def test_dry_run_prices_each_check_from_what_a_correct_engine_serves(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("incident", **SMALL)
    config = tmp_path / "c.yaml"
    config.write_text(f"ledger: {tmp_path / 'l.sqlite'}\ntargets:\n  - name: shop\n    url: {server.url}/v1\n"
                      "    price_per_mtok: 2.5\n")
    text = cli("--config", str(config), *TENANTS, "--dry-run")
    assert text.exit_code == 0, text.output
    assert "shop: cost per check at 2.5 per million served prompt tokens" in text.stdout
    doc = json.loads(cli("--config", str(config), *TENANTS, "--dry-run", "-f", "json").stdout)
    target = doc["targets"][0]
    assert target["price_per_mtok"] == 2.5
    campaign, shapes = target["planned"]["campaign"], target["planned"]["shapes"]
    assert 0 < campaign["served"] < campaign["tokens"]  # the probes over the limit are refused before prefill
    assert campaign["price"] == pytest.approx(campaign["served"] * 2.5 / 1e6, abs=1e-4)
    assert shapes["served"] == shapes["tokens"] > 0  # every prompt fits
    assert server.engine.paging.prefill_pool.usage().tokens_used == 0


def test_errors_exit_2_with_one_line(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("incident", **SMALL)
    url = server.url + "/v1"
    poor = cli("--target", url, *TENANTS, "--ledger", str(tmp_path / "l.sqlite"), "--token-budget", "1000")
    assert poor.exit_code == 2 and "budget" in poor.output
    missing = invoke("audit", "--target", url, "--tenant", "a=LP_NOPE", "--tenant", "b=LP_B")
    assert missing.exit_code == 2 and "LP_NOPE is not set" in missing.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"targets:\n  - name: t\n    url: {url}\naudit:\n  streaming: sometimes\n")
    broken = cli("--config", str(bad), *TENANTS)
    assert broken.exit_code == 2 and "audit.streaming" in broken.output and len(broken.output.splitlines()) == 1
    alone = cli("--target", url, "--tenant", "tenant-a=LP_A", "--ledger", str(tmp_path / "l.sqlite"))
    assert alone.exit_code == 2 and "at least two tenants" in alone.output
    nobody = cli("--target", url, "--ledger", str(tmp_path / "l.sqlite"))
    assert nobody.exit_code == 2 and "at least two tenants" in nobody.output
    with_unreachable = cli("--target", "http://127.0.0.1:9/v1", *TENANTS, "--ledger", str(tmp_path / "l.sqlite"))
    assert with_unreachable.exit_code == 2


def _kill_once_sending(args: list[str], env: dict[str, str], server: Any, log: Path, sending: NewCanaries,
                       delay: float) -> None:
    """Start the audit and SIGKILL it `delay` s after the engine has its first new canaries (at once if a
    request is in flight then): a kill before it sent anything would prove nothing."""
    with log.open("w") as sink:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=sink, env=env)
        # On a busy machine starting takes long: wait while its log grows, not for a fixed time.
        wait_for(sending, "the audit to send canaries", progress=lambda: (log.stat().st_size, proc.poll()),
                 idle_s=120)
        kill_at_random_moment(server, delay, lambda: proc.send_signal(signal.SIGKILL))
        proc.wait()


@pytest.mark.slow
def test_sigkill_at_random_points_loses_nothing(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("incident", **{**SMALL, "prefill_ms_per_1k_tokens": 2})
    ledger = tmp_path / "l.sqlite"
    rng = random.Random(20261129)
    env = {**os.environ, **KEYS, "COLUMNS": "200"}
    args = command("audit", "--target", server.url + "/v1", *TENANTS, "--ledger", str(ledger), "-f", "json")
    for trial in range(4):
        log = tmp_path / f"stderr-{trial}.log"
        sending = NewCanaries(server, ledger, sent_canaries(server, ledger_key(ledger)) if ledger.exists() else set())
        _kill_once_sending(args, env, server, log, sending, rng.uniform(0.0, 2.0))
        assert_nothing_lost(server, ledger, sending, log.read_text().splitlines(), f"trial {trial}")
    # A late leak of a canary minted by a killed run is still attributed.
    store = open_ledger(ledger)
    old = next(c for c in store.active_canaries() if c.tenant == "tenant-a")
    store.close()
    answers = tmp_path / "late.jsonl"
    answers.write_text(json.dumps({"id": "late", "tenant": "tenant-b", "text": f"It said {old.text} here."}) + "\n")
    late = invoke("scan", str(answers), "--ledger", str(ledger), "--format", "json", "--no-semantic")
    assert late.exit_code == 1 and json.loads(late.stdout)["findings"][0]["victim_tenant"] == "tenant-a"
    rerun = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert rerun.returncode == 1, rerun.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "code"), [("fixed", 0), ("incident", 1)])
def test_a_reasoning_models_quote_is_read_like_its_answer(testbed: StartTestbed, tmp_path: Path, preset: str,
                                                          code: int) -> None:
    """The engine answers as a reasoning model does, its quote in `reasoning_content` and one short line of content:
    the audit sees its own canaries there (not blind), and another tenant's there is a leak."""
    server = testbed(preset, **SMALL, reasoning=True)
    result = cli("--target", server.url + "/v1", *TENANTS, "--ledger", str(tmp_path / "l.sqlite"), "-f", "json",
                 "--no-semantic", "--skip=timing")
    doc = json.loads(result.stdout)
    assert result.exit_code == code, doc["verdict"]
    assert doc["verdict"]["status"] == ("no_leak" if code == 0 else "leak")
    assert doc["targets"][0]["sight"]["prefix-cache and campaign"]["echoed"] > 0
    assert bool([f for f in doc["findings"] if f["kind"] == "cross_tenant_echo"]) is (code == 1)
