"""What every run shares, whichever target it probes: one value that the audit and the daemon build once
and hand to each runner, so a new shared dependency is one field here rather than a parameter threaded
through every constructor."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from prober.canaries.mint import Minter
from prober.capacity.known_bugs import BugTable
from prober.config.schema import ProberConfig
from prober.config.sections import CounterSettings
from prober.ledger.base import Ledger
from prober.probing.salts import claimed_salted
from prober.probing.scanning import RunScanner
from prober.targets.bounds import deadline_passed
from prober.targets.credentials import Secret
from prober.targets.spans import Spans
from prober.text.scrub import Scrubber


@dataclass(frozen=True)
class Wiring:
    ledger: Ledger  # canaries before they are sent, findings before they are told
    minter: Minter
    scanner: RunScanner  # every answer is checked against every tenant's canaries
    secrets: Mapping[str, Secret | None]  # tenant -> its API key
    tenants: tuple[str, ...]
    languages: Mapping[str, str] = field(default_factory=dict)  # tenant -> the fact pack its canaries use
    fact_share: float = 0.0  # of a prompt's canary units, those that carry a fact (0 without an embedder)
    scrubber: Scrubber = field(default_factory=Scrubber)  # every secret masked in what runs return
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # set: finish the exchange, start no other
    cache_salted: frozenset[str] = frozenset()  # tenants whose gateway, the config says, salts their prefix cache
    counters: CounterSettings = field(default_factory=CounterSettings)  # failure counters against the background
    bugs: BugTable | None = None  # the bug table a survey reads the engine's release against
    spans: Spans | None = None  # where every request is exported as a span (`tracing.otlp_endpoint`)

    def stop_reason(self) -> str | None:
        """Why no request may start now, if one may not: shutting down, the ledger moved, the run's deadline."""
        if self.stopping.is_set():
            return "shutting down"
        moved = self.ledger.identity_problem()  # its canaries could not be kept where they belong
        return moved or deadline_passed()

    @classmethod
    def of(cls, config: ProberConfig, minter: Minter, scanner: RunScanner, secrets: Mapping[str, Secret | None],
           scrubber: Scrubber, stopping: asyncio.Event | None = None, bugs: BugTable | None = None,
           spans: Spans | None = None) -> Wiring:
        """The wiring a config implies: its tenants and their languages, facts only where an embedder is."""
        return cls(minter.ledger, minter, scanner, secrets, tuple(t.name for t in config.tenants), config.languages,
                   config.detection.fact_share if minter.embedder is not None else 0.0, scrubber,
                   stopping or asyncio.Event(), claimed_salted(config.tenants), config.counters, bugs, spans)


def exported_spans(config: ProberConfig) -> Spans | None:
    """Where the config sends leakprobe's own spans (`tracing`), if anywhere: one per process, closed by its owner
    (`close_spans`) once its last request is done."""
    tracing = config.tracing
    return Spans(tracing.otlp_endpoint, tracing.service_name) if tracing.otlp_endpoint else None


async def close_spans(spans: Spans | None) -> None:
    """Send the spans still queued (the exporter blocks: in a thread)."""
    if spans is not None:
        await asyncio.to_thread(spans.close)
