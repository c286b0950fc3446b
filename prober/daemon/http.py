"""The daemon's HTTP surface: `/metrics`, `/-/healthy`, `/-/ready`, `POST /-/reload` and `/status`.

Every handler only reads state that jobs have already written (a scrape never probes), so it answers at
once while a campaign runs and scans in worker threads.  It depends on the small `Endpoints` protocol, not on
the daemon, so the app can be served (or tested) over any object that answers these five questions.
"""

from __future__ import annotations

from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

INDEX = """<!doctype html><html><head><meta charset="utf-8"><title>leakprobe daemon</title></head><body>
<h1>leakprobe daemon</h1><ul><li><a href="metrics">/metrics</a></li><li><a href="status">/status</a></li>
<li><a href="-/healthy">/-/healthy</a></li><li><a href="-/ready">/-/ready</a></li></ul></body></html>"""


class Endpoints(Protocol):
    async def exposition(self) -> bytes:
        """The Prometheus text exposition of the last completed results."""

    def unready(self) -> str | None:
        """Why the daemon is not ready (None: ready)."""

    async def reload(self) -> tuple[bool, str]:
        """Reload the config: (applied, one-line message)."""

    def status(self) -> dict[str, Any]:
        """The `/status` document (secrets scrubbed)."""


def make_app(endpoints: Endpoints) -> Starlette:
    async def metrics(request: Request) -> Response:
        return Response(await endpoints.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def healthy(request: Request) -> Response:
        return PlainTextResponse("OK\n")

    async def ready(request: Request) -> Response:
        why = endpoints.unready()
        return PlainTextResponse("ready\n" if why is None else f"not ready: {why}\n",
                                 status_code=200 if why is None else 503)

    async def reload(request: Request) -> Response:
        if request.headers.get("content-length", "0") != "0" or request.headers.get("transfer-encoding"):
            return PlainTextResponse("a reload takes no body: it re-reads the config file\n", status_code=413)
        ok, message = await endpoints.reload()
        return PlainTextResponse(f"{message}\n", status_code=200 if ok else 400)

    async def status(request: Request) -> Response:
        return JSONResponse(endpoints.status())

    async def index(request: Request) -> Response:
        return HTMLResponse(INDEX)

    return Starlette(routes=[
        Route("/", index, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/-/healthy", healthy, methods=["GET", "HEAD"]),
        Route("/-/ready", ready, methods=["GET", "HEAD"]),
        Route("/-/reload", reload, methods=["POST", "PUT"]),
        Route("/status", status, methods=["GET"]),
    ])
