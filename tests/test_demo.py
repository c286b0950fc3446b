"""`make demo` runs `leakprobe demo`: the incident leaks and is caught, the fix is clean."""

from __future__ import annotations

import subprocess
import sys


def test_demo_shows_the_leak_and_the_clean_fix() -> None:
    out = subprocess.run([sys.executable, "-m", "prober", "demo"], capture_output=True, text=True, timeout=300,
                         env={"COLUMNS": "200", "PATH": ""})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "cross_tenant_echo (critical, exact)" in out.stdout
    assert "of tenant-a in the answer to tenant-b" in out.stdout
    assert "incident preset leaked: True; fixed preset clean: True" in out.stdout
