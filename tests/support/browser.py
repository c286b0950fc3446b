"""Debian's Chromium, headless, driven over the DevTools protocol: load a page, collect every console
message, exception and log entry, evaluate a query against the rendered DOM, take a full-page screenshot."""

from __future__ import annotations

import base64
import itertools
import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import connect

from tests.support.tools import need, terminate

FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--remote-debugging-port=0", "--remote-allow-origins=*"]


class Rendered:
    def __init__(self, messages: list[dict[str, Any]], found: Any, screenshot: Path) -> None:
        self.messages = messages  # console messages, exceptions and log entries
        self.found = found  # what the query evaluated to
        self.screenshot = screenshot

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("level") in ("error", "exception")]


class Chromium:
    def __init__(self, folder: Path) -> None:
        binary = need("chromium")
        folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={folder / 'profile'}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 60
        for line in self.proc.stderr:
            found = re.search(r"DevTools listening on (ws://\S+)", line)
            if found:
                self.port = int(found.group(1).split(":")[2].split("/")[0])
                break
            if time.monotonic() > deadline:
                break
        else:
            raise AssertionError("chromium did not start")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # keep its log pipe from filling
        self._ids = itertools.count(1)

    def render(self, page: Path, query: str, screenshot: Path, width: int = 1280) -> Rendered:
        """Open `page`, wait for its load event, evaluate `query` (a JS expression returning JSON-able data)."""
        tab = httpx.put(f"http://127.0.0.1:{self.port}/json/new?about:blank", timeout=10).json()
        messages: list[dict[str, Any]] = []
        with connect(tab["webSocketDebuggerUrl"], max_size=None) as ws:
            def call(method: str, **params: Any) -> dict[str, Any]:
                ident = next(self._ids)
                ws.send(json.dumps({"id": ident, "method": method, "params": params}))
                while True:
                    message = json.loads(ws.recv(timeout=60))
                    if message.get("id") == ident:
                        if "error" in message:
                            raise AssertionError(f"{method}: {message['error']}")
                        result: dict[str, Any] = message.get("result", {})
                        return result
                    self._collect(message, messages)

            for domain in ("Page", "Runtime", "Log"):
                call(f"{domain}.enable")
            call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
            call("Page.navigate", url=page.resolve().as_uri())
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                message = json.loads(ws.recv(timeout=60))
                self._collect(message, messages)
                if message.get("method") == "Page.loadEventFired":
                    break
            found = call("Runtime.evaluate", expression=query, returnByValue=True)["result"].get("value")
            shot = call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        httpx.get(f"http://127.0.0.1:{self.port}/json/close/{tab['id']}", timeout=10)
        return Rendered(messages, found, screenshot)

    @staticmethod
    def _collect(message: dict[str, Any], into: list[dict[str, Any]]) -> None:
        params = message.get("params", {})
        if message.get("method") == "Runtime.consoleAPICalled":
            into.append({"level": params.get("type"), "text": str(params.get("args"))})
        elif message.get("method") == "Runtime.exceptionThrown":
            into.append({"level": "exception", "text": str(params.get("exceptionDetails"))})
        elif message.get("method") == "Log.entryAdded":
            entry = params.get("entry", {})
            into.append({"level": entry.get("level"), "text": entry.get("text"), "url": entry.get("url")})

    def close(self) -> None:
        terminate(self.proc)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
