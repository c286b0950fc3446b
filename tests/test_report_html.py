"""The HTML report of a real audit of the reference engine: each incident says what to do, the tenant pairs
are explained, and the plan's boundary labels never overlap — checked on the boxes a real browser (headless
Chromium) lays them out in, since the text's width is the browser's to decide."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from prober.domain.types import FindingKind
from prober.report.advice import WHAT_TO_DO
from prober.report.html import PAIR_LEGEND, html_report, label_rows
from prober.report.table import table_report
from tests.support.browser import Chromium
from tests.support.cli import invoke
from tests.support.keys import TENANT_ARGS
from tests.support.testbed import SMALL

# Every boundary of the plan within 2% of the others: one panel, seven labels crowded together.
CROWDED = {**SMALL, "context_length": 4_096, "pool_tokens": 4_000}
BOXES = """[...document.querySelectorAll('svg.outcome-plot text.boundary')].map(t => {
  const b = t.getBBox(); return [t.textContent, b.x, b.y, b.width, b.height]; })"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from prober.testbed import TestbedServer, build_config

    folder = tmp_path_factory.mktemp("report")
    with TestbedServer(build_config("incident", CROWDED)) as server:
        audit = invoke("audit", "--target", server.url + "/v1", *TENANT_ARGS, "--ledger", str(folder / "l.sqlite"),
                       "--streaming", "plain", "--no-concurrent", "--no-semantic", "-f", "json")
    assert audit.exit_code == 1, audit.output  # findings
    doc: dict[str, Any] = json.loads(audit.stdout)
    return doc


@pytest.mark.unit
def test_every_finding_kind_has_what_to_do() -> None:
    assert set(WHAT_TO_DO) == set(FindingKind)
    assert all(advice.endswith(".") and len(advice) < 300 for advice in WHAT_TO_DO.values())


@pytest.mark.slow
def test_each_incident_says_what_to_do_and_pairs_are_explained(report: dict[str, Any]) -> None:
    page = html_report(report)
    kinds = {i["kind"] for i in report["incidents"]}
    assert {"cross_tenant_echo", "boundary_accepted"} <= kinds
    for kind in kinds:
        assert f"What to do: {WHAT_TO_DO[FindingKind(kind)]}".replace("'", "&#x27;") in page
    assert page.count('<span class="todo">') == len(report["incidents"])
    assert PAIR_LEGEND in page and "victim → observer</th>" in page
    assert "produced a finding" in page  # the plot's colours explained


def test_capacity_notes_reach_both_reports(report: dict[str, Any]) -> None:
    note = "GET /info did not answer (timeout: ReadTimeout after 600.0 s); what it would say is unknown"
    target = {**report["targets"][0], "capacity": {**report["targets"][0]["capacity"], "notes": [note]}}
    doc = {**report, "targets": [target]}
    assert f'<li class="muted">{note}</li>' in html_report(doc)
    assert f"  capacity note: {note}\n" in table_report(doc)


@pytest.mark.unit
def test_label_rows_never_put_two_overlapping_labels_on_one_row() -> None:
    spans = [(100.0, 60.0), (110.0, 40.0), (105.0, 20.0), (200.0, 30.0), (300.0, 10.0)]
    rows = label_rows(spans)
    assert rows[3] == 0 and rows[4] == 0  # far apart: the first row
    for (a, ra), (b, rb) in itertools.combinations(zip(spans, rows, strict=True), 2):
        if ra == rb:
            assert a[0] + a[1] / 2 <= b[0] - b[1] / 2 or b[0] + b[1] / 2 <= a[0] - a[1] / 2


@pytest.mark.browser
def test_boundary_labels_do_not_overlap_in_a_browser(report: dict[str, Any], tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(html_report(report))
    chromium = Chromium(tmp_path / "chromium")
    try:
        rendered = chromium.render(page, BOXES, tmp_path / "report.png")
    finally:
        chromium.close()
    assert not rendered.errors, rendered.errors
    boxes = rendered.found
    labels = {b["label"] for t in report["targets"] for b in t["plan"]["boundaries"]}
    assert {label for text, *_ in boxes for label in text.split(" · ")} == labels and len(labels) >= 5
    for (ta, xa, ya, wa, ha), (tb, xb, yb, wb, hb) in itertools.combinations(boxes, 2):
        apart = xa + wa <= xb or xb + wb <= xa or ya + ha <= yb or yb + hb <= ya
        assert apart, f"{ta!r} and {tb!r} overlap"
