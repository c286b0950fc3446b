"""`leakprobe gate` as a pipeline step runs it: a subprocess, its exit code, and what it says it spent."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.keys import KEYS
from tests.support.keys import TENANT_ARGS as TENANTS

SPENT = re.compile(r"gate: ([\d,]+) prompt tokens sent \(([\d,]+) served\) of a ceiling of ([\d,]+), in ([\d.]+) s")


def gate(url: str, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], tuple[int, int, int, float]]:
    """The gate as a CI step runs it against `url`, and what it says it spent: tokens sent, served, the ceiling,
    seconds."""
    return gated(tmp_path, "--target", url + "/v1", *TENANTS, "--ledger", str(tmp_path / "l.sqlite"), *args)


def gated(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], tuple[int, int, int, float]]:
    run = subprocess.run([sys.executable, "-m", "prober", "gate", *args], capture_output=True, text=True,
                         timeout=600, env={**os.environ, **KEYS})
    spent = SPENT.search(run.stderr)
    assert spent is not None, run.stderr[-3000:]
    sent, served, ceiling = (int(spent.group(i).replace(",", "")) for i in (1, 2, 3))
    print(f"gate {' '.join(args[:2])}: exit {run.returncode}; {sent:,} tokens sent, {served:,} served, ceiling "
          f"{ceiling:,}; {spent.group(4)} s")
    return run, (sent, served, ceiling, float(spent.group(4)))
