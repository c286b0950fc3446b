"""The daemon's HTTP surface: `/metrics`, `/-/healthy`, `/-/ready`, `POST /-/reload`, `/status` and `/probe`.

Every handler only reads state that jobs have already written (a scrape never probes), so it answers at
once while a campaign runs and scans in worker threads.  It depends on the small `Endpoints` protocol, not on
the daemon, so the app can be served (or tested) over any object that answers these questions.

What changes or reveals something is guarded (`Access`): `/-/reload` is off unless `daemon.http_reload`, and
with `daemon.token_file` both it and `/status` want `Authorization: Bearer <token>`; `/status` may instead be
shown redacted to whoever asks.  `/probe` runs a check now and spends the operator's tokens (prober/daemon/probe.py):
with a token it wants it, without one it answers this host alone.  `/metrics` and the health checks stay open for
Prometheus and the kubelet.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from prober.daemon.probe import ProbeAnswer, Refused
from prober.targets.credentials import Secret

WEBHOOK_BODY_BYTES = 64 * 1024  # a Flagger or Argo call's JSON: its metadata, never more

INDEX = """<!doctype html><html><head><meta charset="utf-8"><title>leakprobe daemon</title></head><body>
<h1>leakprobe daemon</h1><ul><li><a href="metrics">/metrics</a></li><li><a href="status">/status</a></li>
<li><a href="-/healthy">/-/healthy</a></li><li><a href="-/ready">/-/ready</a></li>
<li>/probe?target=NAME&amp;check=NAME</li></ul></body></html>"""


@dataclass(frozen=True)
class Access:
    """Who may reload and read `/status` (from the config; a reload replaces it)."""

    token: Secret | None = None
    http_reload: bool = False
    status: Literal["full", "redacted"] = "full"
    probe_every: float | None = None  # None: no /probe

    def authorized(self, header: str | None) -> bool:
        """The request carries the token (compared in constant time)."""
        if self.token is None or not header:
            return False
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.reveal().encode())


class Endpoints(Protocol):
    async def exposition(self) -> bytes:
        """The Prometheus text exposition of the last completed results."""

    def unready(self) -> str | None:
        """Why the daemon is not ready (None: ready)."""

    async def reload(self) -> tuple[bool, str]:
        """Reload the config: (applied, one-line message)."""

    def status(self, redacted: bool) -> dict[str, Any]:
        """The `/status` document (secrets scrubbed; `redacted`: without what a stranger could use)."""

    def access(self) -> Access:
        """The guard of `/-/reload` and `/status` as the config sets it now."""

    async def probe(self, target: str, check: str) -> ProbeAnswer:
        """One check of one target now (raises Refused where it may not run)."""

    def refused(self, endpoint: str, status: int) -> None:
        """A request the guard refused (counted)."""


def make_app(endpoints: Endpoints) -> Starlette:
    def refuse(endpoint: str, status: int, message: str) -> Response:
        endpoints.refused(endpoint, status)
        headers = {"WWW-Authenticate": 'Bearer realm="leakprobe"'} if status == 401 else None
        return PlainTextResponse(f"{message}\n", status_code=status, headers=headers)

    async def metrics(request: Request) -> Response:
        return Response(await endpoints.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def healthy(request: Request) -> Response:
        return PlainTextResponse("OK\n")

    async def ready(request: Request) -> Response:
        why = endpoints.unready()
        return PlainTextResponse("ready\n" if why is None else f"not ready: {why}\n",
                                 status_code=200 if why is None else 503)

    async def reload(request: Request) -> Response:
        access = endpoints.access()
        if not access.http_reload:
            return refuse("reload", 403, "reloading over HTTP is off (daemon.http_reload): send the daemon SIGHUP")
        if access.token is not None and not access.authorized(request.headers.get("authorization")):
            return refuse("reload", 401, "a reload needs the daemon's token: Authorization: Bearer <token>")
        if request.headers.get("content-length", "0") != "0" or request.headers.get("transfer-encoding"):
            return PlainTextResponse("a reload takes no body: it re-reads the config file\n", status_code=413)
        ok, message = await endpoints.reload()
        return PlainTextResponse(f"{message}\n", status_code=200 if ok else 400)

    async def status(request: Request) -> Response:
        access = endpoints.access()
        if access.authorized(request.headers.get("authorization")):
            return JSONResponse(endpoints.status(redacted=False))
        if access.status == "redacted":
            return JSONResponse(endpoints.status(redacted=True))
        if access.token is not None:
            return refuse("status", 401, "/status needs the daemon's token: Authorization: Bearer <token> "
                          "(or set daemon.status: redacted)")
        return JSONResponse(endpoints.status(redacted=False))

    async def probe(request: Request) -> Response:
        access = endpoints.access()
        if access.probe_every is None:
            return refuse("probe", 403, "on-demand runs are off (daemon.probe_every)")
        if access.token is not None:
            if not access.authorized(request.headers.get("authorization")):
                return refuse("probe", 401, "/probe needs the daemon's token: Authorization: Bearer <token>")
        elif not _loopback(request):
            return refuse("probe", 403, "/probe answers this host alone without daemon.token_file: set one to call it "
                          "from elsewhere")
        asked = dict(request.query_params)
        if request.method == "POST":
            asked = {**(await _webhook_metadata(request)), **asked}
        target, check = asked.get("target"), asked.get("check")
        if not target or not check:
            return PlainTextResponse("give ?target=NAME&check=NAME (or both in a webhook's metadata)\n",
                                     status_code=400)
        try:
            answer = await endpoints.probe(target, check)
        except Refused as refused:
            endpoints.refused("probe", refused.status)
            after = {"Retry-After": f"{refused.retry_after:.0f}"} if refused.retry_after else None
            return PlainTextResponse(f"{refused}\n", status_code=refused.status, headers=after)
        if request.method == "POST" or asked.get("format") == "json" or "json" in request.headers.get("accept", ""):
            return JSONResponse(answer.to_json(), status_code=answer.verdict.status)
        return Response(answer.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def index(request: Request) -> Response:
        return HTMLResponse(INDEX)

    return Starlette(routes=[
        Route("/", index, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/-/healthy", healthy, methods=["GET", "HEAD"]),
        Route("/-/ready", ready, methods=["GET", "HEAD"]),
        Route("/-/reload", reload, methods=["POST", "PUT"]),
        Route("/status", status, methods=["GET"]),
        Route("/probe", probe, methods=["GET", "POST"]),
    ])


def _loopback(request: Request) -> bool:
    try:
        return request.client is not None and ipaddress.ip_address(request.client.host).is_loopback
    except ValueError:
        return False


async def _webhook_metadata(request: Request) -> dict[str, str]:
    """`target` and `check` from a webhook's JSON body (Flagger's `metadata`, or the top level), read no further
    than WEBHOOK_BODY_BYTES; anything else in it is ignored."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > WEBHOOK_BODY_BYTES:
            return {}
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    given = doc.get("metadata")
    metadata: dict[str, Any] = given if isinstance(given, dict) else {}
    return {key: value for key in ("target", "check")
            for value in [metadata.get(key, doc.get(key))] if isinstance(value, str)}
