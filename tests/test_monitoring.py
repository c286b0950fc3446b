"""Alert rules and Grafana dashboards against a real Prometheus, Alertmanager and daemon.

promtool checks and unit-tests the rules; then the daemon probes the reference engine, Prometheus scrapes it
and evaluates the rules, Alertmanager delivers to a webhook this test runs, and every PromQL expression of
every dashboard panel is sent to Prometheus' query API."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from prober.daemon.metrics import Metrics
from tests.conftest import SMALL, StartTestbed
from tests.daemonproc import DaemonProcess, daemon_config
from tests.monitoring import RULES, Alertmanager, Prometheus
from tests.shaped import Reply, Seen, ShapedServer
from tests.tools import need

DASHBOARDS = sorted((Path(__file__).resolve().parent.parent / "dashboards" / "grafana").glob("*.json"))
LEAK_ALERTS = {"LeakprobeCrossTenantLeak", "LeakprobePlaceholderSubstitution", "LeakprobeBoundaryAccepted"}
METRIC = re.compile(r"\bleakprobe_[a-z0-9_]+\b")


def exported_names() -> set[str]:
    """Every sample name the daemon can export (a fresh registry: families exist before their samples)."""
    names: set[str] = set()
    for family in metrics_registry().collect():
        suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return names


def metrics_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Metrics(registry)
    return registry


def panel_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]


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


def test_every_alert_has_its_tests_runbook_and_style() -> None:
    import yaml

    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    tested = yaml.safe_load((RULES.parent / "leakprobe-rules.test.yml").read_text())
    cases: dict[str, list[bool]] = {}
    for test in tested["tests"]:
        for case in test["alert_rule_test"]:
            cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    runbook = (Path(__file__).resolve().parent.parent / "docs" / "runbook.md").read_text()
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"Leakprobe([A-Z][a-z]+)+", name), name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        annotations = rule["annotations"]
        assert annotations["summary"].endswith(".") and "{{" not in annotations["summary"], name
        assert "{{" in annotations["description"] or rule["expr"].startswith("absent("), name  # nothing to name
        assert annotations["runbook_url"].endswith("/runbook/#" + name.lower()), name  # resolved: test_docs.py
        assert f"## {name} {{#{name.lower()}}}" in runbook, f"no runbook section for {name}"
        assert {True, False} <= set(cases.get(name, [])), f"{name} needs a firing and a non-firing test"
    leak = next(r for r in rules if r["alert"] == "LeakprobeCrossTenantLeak")
    assert "by (target, victim, observer)" in leak["expr"]


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
    for title, expr in panel_exprs(board):
        unknown = set(METRIC.findall(expr)) - exported
        assert not unknown, f"{path.name} / {title}: {unknown} is not a metric the daemon exports"
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


def test_rules_name_only_exported_metrics() -> None:
    unknown = set(METRIC.findall(RULES.read_text())) - exported_names()
    assert not unknown, unknown


def _firing(prometheus: Prometheus, alertname: str) -> set[tuple[str, str, str]]:
    return {(a["labels"].get("target", ""), a["labels"].get("victim", ""), a["labels"].get("observer", ""))
            for a in prometheus.alerts() if a["labels"]["alertname"] == alertname and a["state"] == "firing"}


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def test_incident_pages_through_prometheus_and_alertmanager(testbed: StartTestbed, tmp_path: Path) -> None:
    need("prometheus")
    need("prometheus-alertmanager")
    delivered: list[dict[str, Any]] = []

    def hook(reply: Reply, seen: Seen) -> None:
        delivered.append(seen.json())
        reply.send(200, {})

    server = testbed("incident", **SMALL)
    with ShapedServer({"POST /alert": hook}) as receiver, \
            DaemonProcess(daemon_config(server.url, tmp_path / "l.sqlite"), tmp_path) as daemon:
        manager = Alertmanager(tmp_path / "am", receiver.url + "/alert")
        prometheus = Prometheus(tmp_path / "prom", [daemon.url.split("//")[1]], manager.url)
        try:
            pairs = {("testbed", "tenant-a", "tenant-b"), ("testbed", "tenant-b", "tenant-a")}
            _wait(lambda: pairs <= _firing(prometheus, "LeakprobeCrossTenantLeak"), 90, "the leak alert to fire")
            leak = next(a for a in prometheus.alerts() if a["labels"]["alertname"] == "LeakprobeCrossTenantLeak")
            assert set(leak["labels"]) == {"alertname", "severity", "target", "victim", "observer"}
            assert leak["labels"]["severity"] == "critical" and "tenant" in leak["annotations"]["description"]
            _wait(lambda: any(a["labels"].get("alertname") == "LeakprobeCrossTenantLeak"
                              for body in delivered for a in body["alerts"]), 60, "Alertmanager's webhook")
            sent = {(a["labels"]["victim"], a["labels"]["observer"]) for body in delivered for a in body["alerts"]
                    if a["labels"]["alertname"] == "LeakprobeCrossTenantLeak"}
            assert sent <= {("tenant-a", "tenant-b"), ("tenant-b", "tenant-a")} and sent
            _wait(lambda: _firing(prometheus, "LeakprobeCapacityInversion"), 30, "the capacity alert")
            _wait(lambda: prometheus.query('leakprobe_probe_duration_seconds_count{job="campaign"}')["data"]["result"],
                  30, "a scraped campaign")
            empty = []
            for path in DASHBOARDS:
                target = ".*" if "overview" in path.name else "testbed"
                for title, expr in panel_exprs(json.loads(path.read_text())):
                    answer = prometheus.query(grafana(expr, target))
                    assert answer["status"] == "success", (path.name, title, answer)
                    if not answer["data"]["result"]:
                        empty.append(title)
            for title in ("Findings by kind and severity", "Advertised context vs KV pool", "Boundary outcomes",
                          "Requests by boundary and outcome", "Open incidents",
                          "Cross-tenant findings: victim (rows) × observer (columns)", "Request duration"):
                assert title not in empty, f"{title} returned no data"
        finally:
            prometheus.close()
            manager.close()
        assert daemon.stop() == 0


def test_no_leak_alert_against_the_fixed_engine(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("fixed", **SMALL)
    with DaemonProcess(daemon_config(server.url, tmp_path / "l.sqlite"), tmp_path) as daemon:
        prometheus = Prometheus(tmp_path / "prom", [daemon.url.split("//")[1]])
        try:
            _wait(lambda: daemon.sample("leakprobe_job_runs_total", job="campaign") >= 2
                  and daemon.get("/status").json()["targets"][0]["jobs"]["campaign"]["last_success"], 90,
                  "full cycles of every job")
            time.sleep(3)  # scraped and evaluated
            assert prometheus.query("leakprobe_findings_total")["data"]["result"]  # it does see the daemon
            active = {a["labels"]["alertname"] for a in prometheus.alerts()}
            assert not active & LEAK_ALERTS, active
            assert "LeakprobeCapacityInversion" in active  # the fixed engine still advertises more than it holds
        finally:
            prometheus.close()
        assert daemon.stop() == 0
