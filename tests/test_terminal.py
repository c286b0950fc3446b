"""Terminal output read through a pipe or a CI log: nothing cut, no colour; on a terminal, colour unless
NO_COLOR is set."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.testbed import SMALL, StartTestbed

KEYS = {"LP_A": "testbed-key-a", "LP_B": "testbed-key-b"}
LONG = "inference-gateway-eu-west-1-production-sglang-disaggregated"  # 60 characters


def config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(f"ledger: {tmp_path / 'l.sqlite'}\ntargets:\n  - name: {LONG}\n    url: {url}/v1\n"
                    "tenants:\n  - {name: tenant-a, api_key_env: LP_A}\n  - {name: tenant-b, api_key_env: LP_B}\n")
    return path


def on_a_terminal(args: list[str], env: dict[str, str]) -> str:
    """stdout and stderr on a pseudo-terminal, as an engineer at a shell sees them."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(300)
    os.close(leader)
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow
def test_piped_reports_cut_nothing_and_carry_no_colour(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("incident", **SMALL)
    path = config(tmp_path, server.url)
    for args in (["audit", "--config", str(path), "-f", "table"], ["preflight", "--config", str(path)]):
        run = subprocess.run([sys.executable, "-m", "prober", *args], capture_output=True, text=True, timeout=300,
                             env={**os.environ, **KEYS, "COLUMNS": "80"})
        assert run.returncode in (0, 1), run.stderr[-2000:]
        out = run.stdout
        assert LONG in out and "capacity_inversion" in out and (args[0] == "preflight" or f"{server.url}/v1" in out)
        assert "…" not in out and "\x1b[" not in out + run.stderr


def test_colour_on_a_terminal_and_none_with_no_color(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("incident", **SMALL)
    path = config(tmp_path, server.url)
    args = [sys.executable, "-m", "prober", "preflight", "--config", str(path)]
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    coloured = on_a_terminal(args, {**env, **KEYS, "TERM": "xterm-256color"})
    assert "\x1b[" in coloured and "capacity_inversion" in coloured
    plain = on_a_terminal(args, {**env, **KEYS, "TERM": "xterm-256color", "NO_COLOR": "1"})
    assert "\x1b[" not in plain.replace("\x1b[?25l", "").replace("\x1b[?25h", "") and "capacity_inversion" in plain
