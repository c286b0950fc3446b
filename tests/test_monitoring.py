"""Alert rules and Grafana dashboards against a real Prometheus, Alertmanager and daemon.

promtool checks and unit-tests the rules; then, end to end, the daemon probes the reference engine,
Prometheus scrapes it and evaluates the rules, and Alertmanager delivers to a webhook this test runs: a leak
that persists keeps paging across campaigns, a fixed engine closes it only after a clean re-check (and the
resolved notification says so), a stopped engine pages as down and its capacity alert ends, and every query
of every dashboard returns data along the way."""

from __future__ import annotations

import calendar
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from prober.daemon.metrics import Metrics
from prober.testbed import TestbedServer, build_config
from tests.support.daemonproc import DaemonProcess, daemon_config
from tests.support.monitoring import RULES, Prometheus, Webhook, alertmanager, fast_rules, prometheus
from tests.support.shaped import ShapedServer
from tests.support.testbed import SMALL
from tests.support.tools import need
from tests.support.waiting import wait_for

DASHBOARDS = sorted((Path(__file__).resolve().parent.parent / "dashboards" / "grafana").glob("*.json"))
LEAK_ALERTS = {"LeakprobeCrossTenantLeak", "LeakprobePlaceholderSubstitution", "LeakprobeBoundaryAccepted",
               "LeakprobeCrossTenantCacheHit"}
METRIC = re.compile(r"\bleakprobe_[a-z0-9_]+\b")
PAIRS = {("tenant-a", "tenant-b"), ("tenant-b", "tenant-a")}


def exported_names() -> set[str]:
    """Every sample name the daemon can export (a fresh registry: families exist before their samples; the
    exposition leaves `_created` out)."""
    registry = CollectorRegistry()
    Metrics(registry)
    names: set[str] = set()
    for family in registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return names


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def board_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel or annotation, expression) of every query the dashboard sends."""
    panels = [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]
    return panels + [(f"annotation {a['name']}", a["expr"]) for a in dashboard["annotations"]["list"]]


def grafana(expr: str, target: str) -> str:
    """The query Grafana would send: variables replaced as it replaces them."""
    return (expr.replace("$__rate_interval", "1m").replace("$__range", "10m").replace("$__interval", "15s")
            .replace("$target", target))


def test_rules_check_and_unit_tests_pass() -> None:
    promtool = need("promtool")
    check = subprocess.run([promtool, "check", "rules", RULES.name], cwd=RULES.parent, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run([promtool, "test", "rules", "leakprobe-rules.test.yml"], cwd=RULES.parent,
                           capture_output=True, text=True)
    assert tests.returncode == 0 and "SUCCESS" in tests.stdout, tests.stdout + tests.stderr


@pytest.mark.unit
def test_every_alert_has_its_tests_runbook_links_and_style() -> None:
    tested = yaml.safe_load((RULES.parent / "leakprobe-rules.test.yml").read_text())
    cases: dict[str, list[bool]] = {}
    for test in tested["tests"]:
        for case in test["alert_rule_test"]:
            cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    runbook = (Path(__file__).resolve().parent.parent / "docs" / "runbook.md").read_text()
    for rule in rules():
        name = rule["alert"]
        assert re.fullmatch(r"Leakprobe([A-Z][a-z]+)+", name), name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        annotations = rule["annotations"]
        assert annotations["summary"].endswith("."), name
        if "target" in rule["expr"]:  # the page says where, in its first line
            assert "$labels.target" in annotations["summary"], name
        assert "{{" in annotations["description"] or rule["expr"].startswith("absent("), name  # nothing to name
        assert annotations["runbook_url"].endswith("/runbook/#" + name.lower()), name  # resolved: test_docs.py
        assert f"## {name} {{#{name.lower()}}}" in runbook, f"no runbook section for {name}"
        assert {True, False} <= set(cases.get(name, [])), f"{name} needs a firing and a non-firing test"
        if not rule["expr"].startswith("absent("):
            assert "leakprobe_links_info" in annotations["dashboard_url"] + annotations["status_url"], name
    for rule in (r for r in rules() if r["alert"] in LEAK_ALERTS):
        assert "by (target, victim, observer)" in rule["expr"] and "leakprobe_incident_alerting" in rule["expr"]
        page = rule["annotations"]["summary"] + rule["annotations"]["description"]
        for what in ("$labels.observer", "leakprobe_incident_findings", "first_seen", "last_finding", "boundary",
                     "prompt_tokens", "Resolved"):
            assert what in page, (rule["alert"], what)


@pytest.mark.unit
@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_dashboards_are_provisionable_as_they_are(path: Path) -> None:
    text = path.read_text()
    board = json.loads(text)
    assert "__inputs" not in board and "DS_PROMETHEUS" not in text
    assert re.fullmatch(r"leakprobe-[a-z-]+", board["uid"]) and board["id"] is None and "leakprobe" in board["tags"]
    variables = board["templating"]["list"]
    assert variables[0]["type"] == "datasource" and variables[0]["query"] == "prometheus"
    assert any(v["name"] == "target" and "target" in v["definition"] for v in variables)
    for panel in board["panels"]:
        refs = [panel.get("datasource")] + [t.get("datasource") for t in panel.get("targets", [])]
        for ref in filter(None, refs):
            assert ref == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    exported = exported_names()
    for title, expr in board_exprs(board):
        unknown = set(METRIC.findall(expr)) - exported
        assert not unknown, f"{path.name} / {title}: {unknown} is not a metric the daemon exports"
        assert "increase(leakprobe_findings_total" not in expr, f"{title}: counts come exact from the ledger"
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    links = {link["title"]: link["url"] for link in board["links"]}
    assert links["Runbook"] == "${runbook}" and links["/status"] == "${status_url}"
    assert {a["name"] for a in board["annotations"]["list"]} >= {"Leakprobe alerts"}


@pytest.mark.unit
def test_rules_name_only_exported_metrics() -> None:
    unknown = set(METRIC.findall(RULES.read_text())) - exported_names()
    assert not unknown, unknown


def pairs_firing(prom: Prometheus, alertname: str) -> set[tuple[str, str]]:
    return {(a["labels"]["victim"], a["labels"]["observer"]) for a in prom.firing(alertname)}


def query_boards(prom: Prometheus, answered: set[tuple[str, str]]) -> None:
    """Every query of every dashboard, as Grafana sends it; those that returned data join `answered`."""
    for path in DASHBOARDS:
        for title, expr in board_exprs(json.loads(path.read_text())):
            answer = prom.query(grafana(expr, ".*" if "overview" in path.name else "testbed"))
            assert answer["status"] == "success", (path.name, title, answer)
            if answer["data"]["result"]:
                answered.add((path.name, title))


def running(daemon: DaemonProcess, job: str) -> bool:
    return bool(daemon.get("/status").json()["targets"][0]["jobs"][job]["running"])


@pytest.mark.slow
def test_pages_follow_the_evidence(tmp_path: Path) -> None:
    """The leak pages and keeps paging while the engine leaks, however short the hold; fixed, it resolves
    only after a clean re-check, and says so; stopped, the engine pages as down and its capacity alert ends."""
    need("prometheus")
    need("prometheus-alertmanager")
    hook = Webhook()
    engine = TestbedServer(build_config("incident", SMALL)).start()
    port = engine.port
    config = daemon_config(engine.url, tmp_path / "l.sqlite", incident_hold="2s", resolved_notice="4s",
                           links={"grafana": "https://grafana.example", "status": "https://lp.example/status"})
    config["audit"] = {"streaming": "stream", "concurrent": False}  # one streamed request per boundary
    config["detection"] = {"semantic": False}
    answered: set[tuple[str, str]] = set()
    try:
        with ShapedServer({"POST /alert": hook}) as receiver, DaemonProcess(config, tmp_path) as daemon, \
                alertmanager(tmp_path / "am", receiver.url + "/alert") as manager, \
                prometheus(tmp_path / "prom", daemon.url.split("//")[1], manager.url, fast_rules(tmp_path)) as prom:
            started = time.time()
            campaigns = lambda: daemon.sample("leakprobe_job_runs_total", job="campaign")  # noqa: E731
            daemon.wait_for(lambda: {p for _, a in hook.of("LeakprobeCrossTenantLeak", "firing")
                                     for p in [(a["labels"]["victim"], a["labels"]["observer"])]} >= PAIRS, 90,
                            "a page for each direction of the leak")
            paged = min(at for at, _ in hook.of("LeakprobeCrossTenantLeak", "firing"))
            first_seen = min(i["first_seen"] for t in daemon.get("/status").json()["targets"]
                             for i in t["open_incidents"] if i["kind"] == "cross_tenant_echo")
            (page,) = [a for _, a in hook.of("LeakprobeCrossTenantLeak", "firing")][:1]
            words = page["annotations"]
            assert words["summary"].endswith(" on testbed.") and page["labels"]["observer"] in words["summary"]
            assert re.search(r": \d+ findings, first .+, last .+\. The latest at boundary \S+ with a \d+-token "
                             r"prompt \(\w+ job\)\.", words["description"]), words["description"]
            assert words["dashboard_url"] == ("https://grafana.example/d/leakprobe-target/leakprobe-target"
                                              "?var-target=testbed")
            assert words["status_url"] == "https://lp.example/status"
            # Still leaking: two more whole campaigns, the 2 s hold passing again and again, and no resolved page.
            before = campaigns()
            query_boards(prom, answered)  # while they run
            daemon.wait_for(lambda: campaigns() >= before + 2 and not running(daemon, "campaign"), 120,
                            "two more campaigns")
            assert pairs_firing(prom, "LeakprobeCrossTenantLeak") == PAIRS
            assert not hook.of("LeakprobeCrossTenantLeak", "resolved")
            # Fixed, on the same address, between campaigns: resolved only after the next one re-checked clean.
            engine.stop()
            engine = TestbedServer(build_config("fixed", SMALL), port=port).start()
            switched = time.time()
            daemon.wait_for(lambda: len(hook.of("LeakprobeCrossTenantLeak", "resolved")) >= 2, 120,
                            "the resolved notifications")
            for _, resolved in hook.of("LeakprobeCrossTenantLeak", "resolved"):
                why = resolved["annotations"]["description"]
                found = re.search(r"Resolved: a clean re-check at boundary \S+ \(campaign job\) found nothing more "
                                  r"\((.+)\)\.$", why)
                assert found and resolved["annotations"]["summary"].startswith("Resolved: "), why
                rechecked = calendar.timegm(time.strptime(found.group(1).split(".")[0].removesuffix(" +0000 UTC"),
                                                          "%Y-%m-%d %H:%M:%S"))
                assert rechecked >= switched - 1, (why, switched)  # a re-check of the fixed engine, not before
            assert not pairs_firing(prom, "LeakprobeCrossTenantLeak")
            # Stopped: the target pages as down within its `for:`, and the capacity verdict ages out.
            wait_for(lambda: bool(prom.firing("LeakprobeCapacityInversion")), "the capacity alert", idle_s=30)
            engine.stop()
            stopped = time.time()
            daemon.wait_for(lambda: bool(prom.firing("LeakprobeTargetDown")), 60, "LeakprobeTargetDown")
            down = time.time()
            (alert,) = prom.firing("LeakprobeTargetDown")
            assert "its requests failed with: connect" in alert["annotations"]["description"]
            daemon.wait_for(lambda: not prom.firing("LeakprobeCapacityInversion"), 60, "the capacity alert to end")
            query_boards(prom, answered)
            resolved_at = max(at for at, _ in hook.of("LeakprobeCrossTenantLeak", "resolved"))
            print(f"\nleak to page {paged - first_seen:.1f} s (daemon start to page {paged - started:.1f} s); "
                  f"fixed to resolved {resolved_at - switched:.1f} s; "
                  f"engine stop to LeakprobeTargetDown firing {down - stopped:.1f} s (for: 5s here, 5m as shipped)")
            assert daemon.stop() == 0
    finally:
        engine.stop()
    # Every panel; of the annotations, the alerts (a config reload, the other one, did not happen here).
    every = {(p.name, title) for p in DASHBOARDS for title, _ in board_exprs(json.loads(p.read_text()))
             if title != "annotation Config reloads"}
    assert every - answered == set(), f"queries that never returned data: {sorted(every - answered)}"
