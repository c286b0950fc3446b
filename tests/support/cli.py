"""The `leakprobe` command as tests call it: in-process (fast, its output captured) or as a real process
(signals, exit codes, what a shell sees)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from prober.cli import app
from tests.support.keys import KEYS

_RUNNER = CliRunner()


def invoke(*args: str, env: Mapping[str, str] | None = None) -> Any:
    """`leakprobe ARGS` in this process, with the test keys in its environment (a click Result)."""
    return _RUNNER.invoke(app, list(args), env={**KEYS, **(env or {})})


def command(*args: str) -> list[str]:
    """The argv of `leakprobe ARGS` as a subprocess of this interpreter."""
    return [sys.executable, "-m", "prober", *args]


def run(*args: str, env: Mapping[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`leakprobe ARGS` as a process, to its end (the test keys in its environment)."""
    return subprocess.run(command(*args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **KEYS, **(env or {})})


def mint(ledger: Path, tenant: str, kind: str = "token", count: int = 2,
         env: dict[str, str] | None = None) -> list[dict[str, object]]:
    """`leakprobe canaries mint` as a process: the canaries it printed."""
    out = run("canaries", "mint", "--ledger", str(ledger), "--tenant", tenant, "--kind", kind,
              "--count", str(count), "--format", "json", env=env)
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, object]] = json.loads(out.stdout)
    return rows


def write_jsonl(path: Path, lines: list[object]) -> Path:
    """A log of answers, one JSON value (or a raw line) per line."""
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path
