"""Real Prometheus and Alertmanager servers (Debian's packages) for the tests: temporary configs and data
folders, loopback ports, one-second scrape and evaluation intervals, each a context manager that stops its
server however the test ends.  The Prometheus config is `examples/prometheus.yml`'s scrape job and the
Alertmanager route `examples/alertmanager.yml`'s, pointed at this test's daemon and webhook."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.ports import free_port
from tests.support.shaped import Reply, Seen
from tests.support.tools import need, terminate
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "dashboards" / "prometheus" / "leakprobe-rules.yml"
EXAMPLES = ROOT / "examples"


class _Server:
    def __init__(self, argv: list[str], url: str, log: Path) -> None:
        self.url = url
        self._log_path = log
        self._log = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, f"{self.proc.args[0]} exited:\n{self.log()}"
            try:
                return httpx.get(self.url + "/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        # Both start in about a second when idle; a minute leaves a busy machine its time.
        wait_for(ready, f"{self.proc.args[0]} to be ready", idle_s=60, context=self.log)

    def log(self) -> str:
        return self._log_path.read_text()[-3000:]

    def close(self) -> None:
        terminate(self.proc)
        self._log.close()


def alertmanager_config(webhook: str) -> dict[str, Any]:
    """The example route, its receiver's URL replaced by the test's webhook, waits cut to seconds."""
    config: dict[str, Any] = yaml.safe_load((EXAMPLES / "alertmanager.yml").read_text())
    config["route"].update({"group_wait": "1s", "group_interval": "1s"})
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = webhook
    return config


@contextmanager
def alertmanager(folder: Path, webhook: str) -> Iterator[_Server]:
    binary = need("prometheus-alertmanager")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(webhook)))
    port = free_port()
    server = _Server([binary, f"--config.file={folder / 'alertmanager.yml'}", f"--storage.path={folder / 'data'}",
                      f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                     f"http://127.0.0.1:{port}", folder / "alertmanager.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()


def fast_rules(folder: Path) -> Path:
    """The repository's rules with every `for:` a sixtieth as long (5m -> 5s): the same expressions and texts,
    on the seconds-scale schedules the tests run."""
    text = re.sub(r"(\n\s+for: )(\d+)m\n", lambda m: f"{m.group(1)}{m.group(2)}s\n", RULES.read_text())
    path = folder / RULES.name
    path.write_text(text)
    return path


class Webhook:
    """What Alertmanager delivered, each alert with when it arrived."""

    def __init__(self) -> None:
        self.received: list[tuple[float, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def __call__(self, reply: Reply, seen: Seen) -> None:
        with self._lock:
            self.received += [(time.time(), alert) for alert in seen.json()["alerts"]]
        reply.send(200, {})

    def of(self, alertname: str, status: str) -> list[tuple[float, dict[str, Any]]]:
        with self._lock:
            return [(at, a) for at, a in self.received
                    if a["labels"]["alertname"] == alertname and a["status"] == status]


class Prometheus(_Server):
    def query(self, expr: str) -> dict[str, Any]:
        """The query API's whole answer (status, data or error) for an instant query."""
        answer: dict[str, Any] = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=30).json()
        return answer

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = httpx.get(self.url + "/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        return alerts

    def firing(self, alertname: str) -> list[dict[str, Any]]:
        return [a for a in self.alerts() if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


def prometheus_config(daemon: str, rules: Path, alertmanager_url: str | None) -> dict[str, Any]:
    """The example scrape job pointed at the test's daemon, every interval one second."""
    example = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text())
    (job,) = [j for j in example["scrape_configs"] if j["job_name"] == "leakprobe"]
    job.update({"scrape_interval": "1s", "static_configs": [{"targets": [daemon]}]})
    config: dict[str, Any] = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                              "rule_files": [str(rules)], "scrape_configs": [job]}
    if alertmanager_url:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager_url.split("//")[1]]}]}]}
    return config


@contextmanager
def prometheus(folder: Path, daemon: str, alertmanager_url: str | None = None,
               rules: Path = RULES) -> Iterator[Prometheus]:
    binary = need("prometheus")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(daemon, rules, alertmanager_url)))
    port = free_port()
    # A firing alert is sent at once and then every resend delay, each time valid for four of them: Alertmanager
    # resolves one that is not sent again in time.  At 1 s (every interval here is 1 s) that was 4 s, and a loaded
    # 2-core machine stalled Prometheus longer: a "resolved" page while the rule still fired.  15 s gives a minute;
    # a new alert and a resolved one still go at once.
    server = Prometheus([binary, f"--config.file={folder / 'prometheus.yml'}",
                         f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                         "--rules.alert.resend-delay=15s"], f"http://127.0.0.1:{port}", folder / "prometheus.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()


