"""A target session's transport that reports every request, whichever job sent it (a survey's `/models`, a
sentinel's prompt, a campaign's), and whether it went to the target's API: the daemon's view of the target's
health comes from all of those, so a target that stops answering is seen at its next request of any kind;
a request cut short is counted wherever it went (a tokenizer or `/metrics` that never finishes too)."""

from __future__ import annotations

from collections.abc import Callable

from prober.config.schema import TargetConfig
from prober.targets.bounds import NO_GENERATION, Size
from prober.targets.credentials import Secret
from prober.targets.spans import Spans
from prober.targets.transport import HTTPExchange, OnChunk, Transport
from prober.text.scrub import Scrubber

OnExchange = Callable[[HTTPExchange, bool], None]  # the exchange, and whether it went to the target's API


class ObservedTransport(Transport):
    def __init__(self, config: TargetConfig, scrubber: Scrubber, on_exchange: OnExchange, *,
                 spans: Spans | None = None) -> None:
        super().__init__(config.policy(), scrubber, spans=spans)
        self._api = config.url.rstrip("/")
        self._on_exchange = on_exchange

    async def exchange(self, method: str, url: str, *, json: object = None, secret: Secret | None = None,
                       headers: dict[str, str] | None = None, on_chunk: OnChunk | None = None,
                       size: Size = NO_GENERATION) -> HTTPExchange:
        result = await super().exchange(method, url, json=json, secret=secret, headers=headers, on_chunk=on_chunk,
                                        size=size)
        # Only what was sent (the run's deadline may have passed first); the API itself tells the target's health
        # (introspection elsewhere, a gateway's engine, may be closed).
        if result.attempts:
            self._on_exchange(result, url.startswith(self._api))
        return result
