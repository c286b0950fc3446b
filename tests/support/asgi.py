"""An ASGI app served by uvicorn on a loopback port in a thread of the test process: the routers and gateways the
tests put in front of real engines."""

from __future__ import annotations

import threading

import uvicorn
from starlette.types import ASGIApp

from tests.support.ports import free_port


class ThreadedServer:
    def __init__(self, app: ASGIApp) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the server on port {self.port} did not start")
            threading.Event().wait(0.05)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
