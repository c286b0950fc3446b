"""Answers shaped like an engine's or a gateway's, served in this process through httpx's MockTransport.

For parsing and policy, where what matters is the bytes and headers that come back, not the socket: no server
starts, so each case costs milliseconds.  Behaviour that needs a real socket (timeouts, hang-ups, keep-alive,
refused connections, slow trickles) stays on tests/support/shaped.py's loopback servers.  Routes are written as
there: "METHOD /path" to a function of the request.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from prober.targets import Completion, Prompt, Secret, Transport, TransportPolicy
from prober.targets.api import Api
from prober.targets.factory import make_target
from tests.support.aio import run

Route = Callable[[httpx.Request], httpx.Response]


class Chunks(httpx.AsyncByteStream):
    """A body that arrives in pieces, as a server writes it: the transport reads raw chunks (httpx would hand a
    body given as bytes over at once), and a body that ends mid-event is a stream whose server closed."""

    def __init__(self, *pieces: bytes | str) -> None:
        self.pieces = [p.encode() if isinstance(p, str) else p for p in pieces]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece


def send(status: int, body: bytes | str | dict[str, Any] | list[Any] = b"", headers: dict[str, str] | None = None,
         content_type: str = "application/json") -> httpx.Response:
    """A whole response with its length declared (as tests/support/shaped.py's `Reply.send`)."""
    data = json.dumps(body).encode() if isinstance(body, dict | list) else (
        body.encode() if isinstance(body, str) else body)
    return httpx.Response(status, headers={"content-type": content_type, "content-length": str(len(data)),
                                           **(headers or {})}, stream=Chunks(data))


def stream(*pieces: bytes | str, status: int = 200, content_type: str = "text/event-stream") -> httpx.Response:
    """A body of no declared length, in the pieces given, ended by the server (as `Reply.start_stream`)."""
    return httpx.Response(status, headers={"content-type": content_type}, stream=Chunks(*pieces))


@dataclass
class Routes:
    """The handler MockTransport calls: each request recorded, answered by its route, or 404."""

    routes: dict[str, Route]
    seen: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        route = self.routes.get(f"{request.method} {request.url.path}")
        return route(request) if route is not None else send(404, {"detail": "Not Found"})

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


def chat(route: Route) -> Routes:
    """An OpenAI-compatible server whose chat route answers with `route`."""
    return Routes({"POST /v1/chat/completions": route})


BASE = "http://engine.test/v1"


def ask(routes: Routes | Route, prompt: Prompt, secret: Secret | None = None, api: str = "chat",
        policy: TransportPolicy | None = None) -> Completion:
    """One prompt through the adapter for `api` and the transport's policy, answered by `routes`."""
    handler = routes if isinstance(routes, Routes) else chat(routes)

    async def go() -> Completion:
        async with Transport(policy or TransportPolicy(retries=0), http=httpx.MockTransport(handler)) as transport:
            return await make_target(Api(api), "t", BASE, transport).complete(prompt, secret)
    return run(go())
