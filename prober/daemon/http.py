"""The daemon's HTTP surface: `/metrics`, `/-/healthy`, `/-/ready`, `POST /-/reload` and `/status`.

Every handler only reads state that jobs have already written (a scrape never probes), so it answers at
once while a campaign runs and scans in worker threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from prober.daemon.service import Daemon

INDEX = """<!doctype html><html><head><meta charset="utf-8"><title>leakprobe daemon</title></head><body>
<h1>leakprobe daemon</h1><ul><li><a href="metrics">/metrics</a></li><li><a href="status">/status</a></li>
<li><a href="-/healthy">/-/healthy</a></li><li><a href="-/ready">/-/ready</a></li></ul></body></html>"""


def make_app(daemon: Daemon) -> Starlette:
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(daemon.registry), media_type=CONTENT_TYPE_LATEST)

    async def healthy(request: Request) -> Response:
        return PlainTextResponse("OK\n")

    async def ready(request: Request) -> Response:
        if daemon.ready:
            return PlainTextResponse("ready\n")
        why = f"ledger not writable: {daemon.ledger_error}" if daemon.ledger_error else "starting or stopping"
        return PlainTextResponse(f"not ready: {why}\n", status_code=503)

    async def reload(request: Request) -> Response:
        ok, message = await daemon.reload()
        return PlainTextResponse(f"{message}\n", status_code=200 if ok else 400)

    async def status(request: Request) -> Response:
        return JSONResponse(daemon.status_json())

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
