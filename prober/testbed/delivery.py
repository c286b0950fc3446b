"""Which caller is handed which answer.

A healthy front hands each caller its own request's answer, whatever ID the client gave (vLLM appends a random
suffix to a client's `request_id` since PR #27987; SGLang refuses a duplicate `rid` since PR #19035).  With
`keys_requests_by_client_id` the front files requests in flight under the client's ID, as a tokenizer manager
whose state is keyed by the client's `rid`, or a router that pairs answers with requests by the ID the client
sent (modelcontextprotocol/python-sdk #3060): callers that sent one ID at once share one entry, and each of them is
handed the answer that finished first; the others' answers go to nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    first: asyncio.Future[T]  # the answer that finished first under this ID
    callers: int = 0


@dataclass
class Deliveries(Generic[T]):
    by_client_id: bool
    dropped: int = 0  # answers that finished after another under their ID was handed out: nobody got them
    _entries: dict[str, _Entry[T]] = field(default_factory=dict)

    async def deliver(self, client_id: str | None, answer: Awaitable[T]) -> T:
        """The answer this caller is handed: its own, or (with the fault) the first to finish under its ID.  A
        request that fails fails for its own caller only."""
        if not self.by_client_id or client_id is None:
            return await answer
        entry = self._entries.get(client_id)
        if entry is None:
            entry = self._entries[client_id] = _Entry(asyncio.get_running_loop().create_future())
        entry.callers += 1
        try:
            own = await answer
            if entry.first.done():
                self.dropped += 1
            else:
                entry.first.set_result(own)
            return entry.first.result()
        finally:
            entry.callers -= 1
            if not entry.callers:
                del self._entries[client_id]
