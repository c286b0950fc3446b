"""System tools some tests need (promtool, Prometheus, Alertmanager, Chromium, PostgreSQL, hadolint).

`make test` installs them where it can (Debian's packages, as root).  Where one is still missing, a test
that needs it skips with one line that says how to get it, except under CI (`CI=true`), where a missing
tool fails the run: CI must never pass by skipping what it was meant to check.
"""

from __future__ import annotations

import os
import shutil

import pytest

HOW = {
    "promtool": "apt-get install prometheus",
    "prometheus": "apt-get install prometheus",
    "prometheus-alertmanager": "apt-get install prometheus-alertmanager",
    "chromium": "apt-get install chromium",
}


def need(tool: str) -> str:
    """The tool's path, or skip (fail under CI) with how to install it."""
    path = shutil.which(tool)
    if path:
        return path
    message = f"{tool} not found: {HOW.get(tool, 'install it')} (or run `make tools` as root)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI requires {message}")
    pytest.skip(message)
