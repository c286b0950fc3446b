"""`leakprobe daemon` as a real subprocess: config written to a file, the port it bound read from its log,
its HTTP endpoints and metrics read over loopback, signals sent as an operator would."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.keys import KEYS
from tests.support.waiting import wait_for

# The gateway-cache checks are off: no cache stands in front of these engines, and their 78 requests a start on every
# route (tests/test_response_cache.py, tests/test_semantic_cache.py run them) would be in flight at every signal.
FAST = {"schedule": {"preflight": "2s", "sentinel": "1s", "shapes": "4s", "campaign": "4s", "prefix-cache": "4s",
                     "response-cache": "off", "semantic-cache": "off"},
        "jitter": {"preflight": "200ms", "sentinel": "200ms", "campaign": "200ms"}}
# The timing check, the cross-talk burst and the request-ID and abort-and-retry checks run once when a daemon
# starts: at their smallest, since these daemons are about what campaigns and sentinels find (tests/test_vllm.py
# runs them in earnest).
# Seven samples: the fewest that can decide at the default false-alarm rate over two pairs (a looser rate would
# let a clean engine draw a finding now and then).
LEAN_CHECKS = {"timing": {"samples": 7, "rounds": 1, "prompt_tokens": 64}, "crosstalk": {"per_tenant": 1},
               "request-ids": {"groups": 1}, "abort-retry": {"tokens": 256}}


def daemon_config(url: str, ledger: Path, **daemon: Any) -> dict[str, Any]:
    """Two tenants of the reference engine, second-scale schedules, an ephemeral port."""
    return {"ledger": str(ledger),
            "targets": [{"name": "testbed", "url": url + "/v1", "timeout_s": 30, "retries": 0}],
            "tenants": [{"name": "tenant-a", "api_key_env": "LP_A"}, {"name": "tenant-b", "api_key_env": "LP_B"}],
            "daemon": {"listen": "127.0.0.1:0", **copy.deepcopy(FAST), **daemon}, **copy.deepcopy(LEAN_CHECKS)}


class DaemonProcess:
    def __init__(self, config: dict[str, Any], folder: Path, name: str = "daemon",
                 env: dict[str, str] | None = None) -> None:
        self.config_path = folder / f"{name}.yaml"
        self.log_path = folder / f"{name}.log"
        self.write_config(config)
        self.env = {**os.environ, **KEYS, **(env or {})}
        self.lines: list[str] = []
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self.args: list[str] = []  # more command-line flags

    def write_config(self, config: dict[str, Any]) -> None:
        self.config_path.write_text(yaml.safe_dump(config))

    def start(self, timeout: float = 60) -> DaemonProcess:
        self.lines.clear()
        self.proc = subprocess.Popen([sys.executable, "-m", "prober", "daemon", "--config", str(self.config_path),
                                      *self.args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=self.env)
        self._reader = threading.Thread(target=self._drain, args=(self.proc,), daemon=True)
        self._reader.start()
        self.wait_for(lambda: any("listening on http://" in line for line in self.lines) or not self.alive,
                      timeout, "the daemon to listen")
        if not self.alive:
            code = self.wait(10)
            raise AssertionError(f"daemon exited {code}: {self.log()[-2000:]}")
        found = re.search(r"listening on (http://\S+)", "\n".join(self.lines))
        assert found, self.log()
        self.url = found.group(1)
        return self

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        with self.log_path.open("a") as sink:
            for line in proc.stderr:
                self.lines.append(line.rstrip("\n"))
                sink.write(line)
                sink.flush()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return "\n".join(self.lines)

    def get(self, path: str) -> httpx.Response:
        # 30 s, as a POST's: two replicas beside a vLLM test on 2 cores once kept a scrape waiting over 10 s.
        return httpx.get(self.url + path, timeout=30)

    def post(self, path: str) -> httpx.Response:
        return httpx.post(self.url + path, timeout=30)

    def scrape(self) -> str:
        return self.get("/metrics").text

    def sample(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 when there are none)."""
        total = 0.0
        for family in text_string_to_metric_families(self.scrape()):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total

    def wait_for(self, condition: Callable[[], bool], idle_s: float, what: str) -> None:
        """Wait while the daemon makes progress (writes log lines: every job run, skip and finding does);
        fail after `idle_s` without a new line, so a slow daemon on a busy machine still gets its time."""
        # The cap only stops a daemon that keeps logging but never gets there (ten idle periods, 10 min at least).
        wait_for(condition, what, progress=lambda: len(self.lines), idle_s=idle_s, cap_s=max(600.0, 10 * idle_s),
                 context=lambda: self.log()[-3000:])

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The exit code, once the process has ended and all it wrote is read."""
        assert self.proc is not None
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code

    def stop(self) -> int:
        """SIGTERM and the exit code."""
        self.signal(signal.SIGTERM)
        return self.wait(60)

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *_: object) -> None:
        if self.proc is not None and self.proc.stderr is not None and not self.proc.stderr.closed:
            if self.alive:
                self.proc.kill()
            self.wait(30)
