"""A target session's transport that reports every request to the target's API, whichever job sent it (a
survey's `/models`, a sentinel's prompt, a campaign's): the daemon's view of the target's health comes from
all of them, so a target that stops answering is seen at its next request of any kind."""

from __future__ import annotations

from collections.abc import Callable

from prober.config import TargetConfig
from prober.scrub import Scrubber
from prober.targets.bounds import NO_GENERATION, Size
from prober.targets.credentials import Secret
from prober.targets.transport import HTTPExchange, OnChunk, Transport

OnExchange = Callable[[HTTPExchange], None]


class ObservedTransport(Transport):
    def __init__(self, config: TargetConfig, scrubber: Scrubber, on_exchange: OnExchange) -> None:
        super().__init__(config.policy(), scrubber)
        self._api = config.url.rstrip("/")
        self._on_exchange = on_exchange

    async def exchange(self, method: str, url: str, *, json: object = None, secret: Secret | None = None,
                       headers: dict[str, str] | None = None, on_chunk: OnChunk | None = None,
                       size: Size = NO_GENERATION) -> HTTPExchange:
        result = await super().exchange(method, url, json=json, secret=secret, headers=headers, on_chunk=on_chunk,
                                        size=size)
        if url.startswith(self._api):  # the API itself: introspection elsewhere (a gateway's engine) may be closed
            self._on_exchange(result)
        return result
