"""`leakprobe testbed serve` as a user runs it: a real process, a real port, a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx


def _serve(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "prober", "testbed", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_serve_prints_its_url_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "testbed.yaml"
    config.write_text("preset: fixed\npage_size: 32\nfaults:\n  shared_prefix_cache: true\n")
    proc = _serve("--config", str(config), "--tenant-key", "ops=drill-key-1")
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        info = httpx.get(url.removesuffix("/v1") + "/server_info",
                         headers={"Authorization": "Bearer drill-key-1"}).json()
        assert info["page_size"] == 32 and info["max_total_num_tokens"] == 681_280
        assert httpx.get(url + "/models", headers={"Authorization": "Bearer testbed-key-a"}).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert "drill-key-1" not in err


def test_bad_config_is_a_one_line_error_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("preset: incident\npool_tokens: many\n")
    proc = _serve("--config", str(config))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert err.strip().startswith("error: pool_tokens:")
    proc = _serve("--preset", "bogus")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "unknown preset 'bogus'" in err
    proc = _serve("--tenant-key", "no-equals-sign")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "NAME=API_KEY" in err


def test_python_dash_m_and_version() -> None:
    out = subprocess.run([sys.executable, "-m", "prober", "--version"], capture_output=True, text=True,
                         env={**os.environ}, check=True)
    assert out.stdout.startswith("leakprobe ")
