"""A prefill/decode router with the incident's missed abort, in front of two real vLLM instances.

Every completion goes to the prefill instance first (one token, so that its `ExampleConnector` stores the
prompt's KV for decode), then to the decode instance, which answers the client.  A correct router stops when
prefill refuses; this one forwards the request to decode all the same, as the incident's hand-off queue did
with an aborted prompt.  Everything else (models, tokenizer, metrics, health) is decode's.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.support.asgi import ThreadedServer

COMPLETIONS = ("/v1/completions", "/v1/chat/completions")
HOP_BY_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding"}


class MissedAbortRouter:
    def __init__(self, prefill: str, decode: str) -> None:
        self.prefill, self.decode = prefill.rstrip("/"), decode.rstrip("/")
        self.refused_by_prefill = 0  # requests prefill refused and decode answered anyway
        self._client = httpx.AsyncClient()  # replaced in the server's own event loop

        @contextlib.asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0)) as self._client:
                yield

        routes = [Route("/{path:path}", self._forward, methods=["GET", "POST"])]
        self._server = ThreadedServer(Starlette(routes=routes, lifespan=lifespan))
        self.url = self._server.url

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        if request.url.path in COMPLETIONS and request.method == "POST":
            first = {**json.loads(body), "max_tokens": 1, "stream": False}
            first.pop("stream_options", None)
            prefilled = await self._client.post(self.prefill + request.url.path, json=first, headers=headers)
            if prefilled.status_code != 200:
                self.refused_by_prefill += 1  # the abort the hand-off does not see
        upstream = await self._client.send(
            self._client.build_request(request.method, self.decode + request.url.path, content=body,
                                       headers=headers, params=request.query_params), stream=True)

        async def relay() -> AsyncIterator[bytes]:
            async for chunk in upstream.aiter_raw():
                yield chunk

        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(relay(), status_code=upstream.status_code, headers=kept,
                                 background=BackgroundTask(upstream.aclose))

    def start(self) -> MissedAbortRouter:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()
