"""Real Prometheus and Alertmanager servers (Debian's packages) for the tests: temporary configs and data
folders, loopback ports, one-second scrape and evaluation intervals."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.tools import need, terminate

RULES = Path(__file__).resolve().parent.parent / "dashboards" / "prometheus" / "leakprobe-rules.yml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Server:
    def __init__(self, argv: list[str], url: str, log: Path) -> None:
        self.url = url
        self._log = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"{argv[0]} did not become ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def close(self) -> None:
        terminate(self.proc)
        self._log.close()


class Alertmanager(_Server):
    def __init__(self, folder: Path, webhook: str) -> None:
        binary = need("prometheus-alertmanager")
        folder.mkdir(parents=True, exist_ok=True)
        config = {"route": {"receiver": "hook", "group_by": ["alertname", "target", "victim", "observer"],
                            "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
                  "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook, "send_resolved": False}]}]}
        (folder / "alertmanager.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        super().__init__([binary, f"--config.file={folder / 'alertmanager.yml'}", f"--storage.path={folder / 'data'}",
                          f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                         f"http://127.0.0.1:{port}", folder / "alertmanager.log")


class Prometheus(_Server):
    def __init__(self, folder: Path, targets: list[str], alertmanager: str | None = None) -> None:
        binary = need("prometheus")
        folder.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "leakprobe", "honor_labels": True, "scrape_interval": "1s",
                                "static_configs": [{"targets": targets}]}]}
        if alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager.split("//")[1]]}]}]}
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        super().__init__([binary, f"--config.file={folder / 'prometheus.yml'}",
                          f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                          "--rules.alert.resend-delay=1s"],
                         f"http://127.0.0.1:{port}", folder / "prometheus.log")

    def query(self, expr: str) -> dict[str, Any]:
        """The query API's whole answer (status, data or error) for an instant query."""
        answer: dict[str, Any] = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=30).json()
        return answer

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = httpx.get(self.url + "/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        return alerts
