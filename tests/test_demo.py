"""`make demo` runs `leakprobe demo`: the audit catches the incident at its real size, the fix is clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_demo_finds_the_incident_and_passes_the_fix(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    run = subprocess.run([sys.executable, "-m", "prober", "demo", "--out", str(out)], capture_output=True,
                         text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "leak caught; fixed preset: clean" in run.stderr
    assert "cross-tenant echoes" in run.stderr and "of tenant-a in the HTTP 200 answer to tenant-b" in run.stderr
    incident = json.loads((out / "incident.json").read_text())
    assert incident["targets"][0]["capacity"]["pool_tokens"]["value"] == 681_280
    assert {f["kind"] for f in incident["findings"]} >= {"cross_tenant_echo", "boundary_accepted"}
    fixed = json.loads((out / "fixed.json").read_text())
    assert fixed["complete"] and not [f for f in fixed["findings"] if f["severity"] != "info"]
    assert (out / "incident.html").read_text().count("<svg") >= 2 and (out / "ledger.sqlite").is_file()
