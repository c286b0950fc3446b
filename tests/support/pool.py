"""What the reference engine really received, read from its KV pools (the quoting model's pages hold token
ids): the ground truth a crash-safety test compares the ledger against."""

from __future__ import annotations

import re
from pathlib import Path

from prober.canaries.keys import resolve_key
from prober.canaries.tokens import verify
from prober.domain.errors import LedgerError
from prober.ledger import open_ledger
from prober.testbed import TestbedServer, tokenizer

_TOKEN = re.compile(r"LPK(?:-[0-9A-Z]{8}){4}")


def sent_canaries(server: TestbedServer, key: bytes) -> set[str]:
    """Every MAC-valid canary token body left in the engine's pools: canaries that were sent to it."""
    engine = server.engine
    bodies: set[str] = set()
    for pool in (engine.paging.prefill_pool, engine.paging.decode_pool):
        if pool is None:
            continue
        text = tokenizer.decode(pool.read(range(pool.num_pages), pool.num_pages * pool.page_size))
        bodies |= {m.replace("-", "")[3:] for m in _TOKEN.findall(text)}
    return {b for b in bodies if verify(key, b)}


class NewCanaries:
    """A condition: the engine has received canaries beyond `before`.  What it saw is kept (`seen`): a later
    prompt may overwrite the pages that held them, and they were sent all the same.  The ledger's key is read
    once the ledger exists (a process just started may still be creating it)."""

    def __init__(self, server: TestbedServer, ledger: Path, before: set[str]) -> None:
        self.server, self.ledger, self.before = server, ledger, before
        self.seen: set[str] = set()

    def __call__(self) -> bool:
        try:
            key = ledger_key(self.ledger)
        except LedgerError:  # not created yet, or being created
            return False
        self.seen |= sent_canaries(self.server, key) - self.before
        return bool(self.seen)


def ledger_key(ledger: Path) -> bytes:
    """The canary key of the ledger at `ledger` (the one its tokens' MACs verify with)."""
    store = open_ledger(ledger)
    try:
        return resolve_key(store)
    finally:
        store.close()


def in_flight(server: TestbedServer) -> int:
    """Requests the engine is serving right now."""
    return server.engine.stats.running
