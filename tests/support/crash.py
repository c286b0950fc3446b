"""Crash-safety trials: kill a process while it talks to the reference engine, then compare what the engine
received and what the process printed with what its ledger holds."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prober.ledger import open_ledger
from prober.testbed import TestbedServer
from tests.support.pool import NewCanaries, in_flight, ledger_key, sent_canaries

_PRINTED = re.compile(r"(?:^|: )finding \S+ (?P<kind>\S+) .*?\bprobe=(?P<record>\S+)(?:.*?\bcanary=(?P<canary>\S+))?")


def kill_at_random_moment(server: TestbedServer, delay: float, kill: Callable[[], None]) -> None:
    """Kill `delay` s from now, or sooner, the moment a request is in flight."""
    moment = time.monotonic() + delay
    while time.monotonic() < moment and not in_flight(server):
        time.sleep(0.001)
    kill()


def printed_findings(lines: Iterable[str]) -> set[tuple[str, str, str | None]]:
    """(kind, record, canary) of every finding a log line announced (`Finding.describe`)."""
    return {(m["kind"], m["record"], m["canary"]) for line in lines if (m := _PRINTED.search(line))}


def assert_nothing_lost(server: TestbedServer, ledger: Path, sending: NewCanaries, lines: Iterable[str],
                        who: str) -> None:
    """The killed process had sent canaries (`sending` saw them); every one the engine got is in the ledger,
    and every finding it printed."""
    sending()
    sent = sending.seen | sent_canaries(server, ledger_key(ledger))
    store = open_ledger(ledger)
    try:
        minted = {c.text.replace("-", "")[3:] for c in store.active_canaries()}
        stored = {(f.kind.value, f.record_id, f.canary_id) for f in store.findings()}
    finally:
        store.close()
    assert sending.seen, f"{who}: the killed process had sent nothing"
    assert sent <= minted, f"{who}: {len(sent - minted)} canaries were sent but are not in the ledger"
    assert printed_findings(lines) <= stored, f"{who}: printed findings missing from the ledger"
