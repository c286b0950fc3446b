"""`/metrics` from a cached exposition: rendering the registry costs milliseconds and grows with targets and
tenants, so under a burst of scrapes (many Prometheus replicas, a dashboard refresh, a hostile client) one
render serves them all, never more than `max_age_s` old.  The metrics change as jobs complete and configs
reload, and each marks the render stale, so a scrape after either sees it.  It renders in a thread of its own: the
default executor's threads may all be waiting on the ledger or scanning, and a scrape must not queue behind them
(Prometheus gives it 10 s, a test's 1 s interval one).

Counters and histograms are exported without their `_created` series: nothing here reads them, and they
double the exposition (client_python adds one per labelled series)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry, Metric, generate_latest

MAX_AGE_S = 1.0


class CachedExposition:
    def __init__(self, registry: CollectorRegistry, max_age_s: float = MAX_AGE_S) -> None:
        self.registry = registry
        self.max_age_s = max_age_s
        self._body = b""
        self._rendered_at = float("-inf")
        self._lock = asyncio.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="exposition")

    async def render(self) -> bytes:
        if time.monotonic() - self._rendered_at < self.max_age_s:
            return self._body
        async with self._lock:  # scrapes arriving during a render wait for it rather than start their own
            if time.monotonic() - self._rendered_at >= self.max_age_s:
                loop = asyncio.get_running_loop()
                self._body = await loop.run_in_executor(self._thread, generate_latest, _WithoutCreated(self.registry))
                self._rendered_at = time.monotonic()
        return self._body

    def stale(self) -> None:
        """Render afresh at the next scrape: something a reader may check at once (a job, a reload) changed."""
        self._rendered_at = float("-inf")


class _WithoutCreated:
    """The registry's families, less their `_created` samples (what `generate_latest` reads of a registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family
