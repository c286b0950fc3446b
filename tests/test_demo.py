"""`make demo` runs `leakprobe demo`: the audit catches the incident at its real size, the fix is clean, and
both HTML reports say so in a real browser (headless Chromium)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import Chromium

# What a reader sees first, read from the rendered DOM (the page itself runs no script).
QUERY = """JSON.parse(JSON.stringify({
  status: document.querySelector('#verdict').dataset.status,
  headline: document.querySelector('#verdict h1').innerText,
  cells: [...document.querySelectorAll('table.matrix td[data-victim]')].map(td =>
    [td.dataset.victim, td.dataset.observer, Number(td.dataset.count)]),
  dots: document.querySelectorAll('svg.outcome-plot circle').length,
  incidents: [...document.querySelectorAll('details.incident')].map(d =>
    [d.dataset.kind, d.dataset.victim, d.dataset.observer, d.querySelectorAll('tr').length - 1]),
  order: [...document.querySelectorAll('#verdict, table.matrix, svg.outcome-plot, details.incident')]
    .map(e => e.tagName.toLowerCase()),
  external: [...document.querySelectorAll('[src], link[href]')].length,
}))"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    run = subprocess.run([sys.executable, "-m", "prober", "demo", "--out", str(out)], capture_output=True,
                         text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "leak caught; fixed preset: clean" in run.stderr
    assert "cross-tenant echoes" in run.stderr and "of tenant-a in the HTTP 200 answer to tenant-b" in run.stderr
    return out


@pytest.mark.slow
def test_demo_finds_the_incident_and_passes_the_fix(demo: Path) -> None:
    incident = json.loads((demo / "incident.json").read_text())
    assert incident["targets"][0]["capacity"]["pool_tokens"]["value"] == 681_280
    assert {f["kind"] for f in incident["findings"]} >= {"cross_tenant_echo", "boundary_accepted"}
    assert incident["verdict"]["status"] == "leak"
    fixed = json.loads((demo / "fixed.json").read_text())
    assert fixed["complete"] and not [f for f in fixed["findings"] if f["severity"] != "info"]
    assert fixed["verdict"]["status"] == "no_leak"
    assert (demo / "ledger.sqlite").is_file()


@pytest.mark.browser
def test_reports_read_right_in_a_real_browser(demo: Path, tmp_path: Path) -> None:
    chromium = Chromium(tmp_path / "chromium")
    try:
        seen: dict[str, Any] = {}
        for preset in ("incident", "fixed"):
            rendered = chromium.render(demo / f"{preset}.html", QUERY, tmp_path / f"{preset}.png")
            assert not rendered.errors, rendered.errors
            assert rendered.screenshot.stat().st_size > 10_000  # for people to look at
            seen[preset] = rendered.found
    finally:
        chromium.close()
    incident, fixed = seen["incident"], seen["fixed"]
    assert incident["status"] == "leak" and incident["headline"] == "LEAK"
    cells = {(v, o): n for v, o, n in incident["cells"]}
    assert cells[("tenant-a", "tenant-b")] > 0 and cells[("tenant-b", "tenant-a")] > 0
    assert incident["dots"] >= 10 and incident["external"] == 0
    echoes = [i for i in incident["incidents"] if i[0] == "cross_tenant_echo"]
    assert {(v, o) for _, v, o, _ in echoes} == {("tenant-a", "tenant-b"), ("tenant-b", "tenant-a")}
    assert all(rows > 0 for *_, rows in echoes)  # each expands to its findings
    order = incident["order"]  # verdict, then the matrix, then the plot, then the incidents
    assert order[0] == "header" and order.index("table") < order.index("svg") < order.index("details")
    assert fixed["status"] == "no_leak" and fixed["headline"] == "NO LEAK"
    assert all(n == 0 for *_, n in fixed["cells"]) and fixed["cells"]
    assert not [i for i in fixed["incidents"] if i[0] == "cross_tenant_echo"]
