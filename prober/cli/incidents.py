"""`leakprobe incidents list|ack`: the incidents a ledger holds, and an operator closing one by hand.

An incident is named `TARGET/KIND/VICTIM/OBSERVER` (`-` where it names no victim), as `list` prints it.  An
acknowledgement is kept in the ledger with who gave it and when; every daemon on that ledger exports the
incident closed at its next housekeeping (within 10 s), and a newer finding opens it again."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Annotated

import typer

from prober.cli.app import app, print_table
from prober.cli.options import Format, Ledger, OutputFormat
from prober.config.sections import parse_duration
from prober.domain.errors import ConfigError
from prober.domain.incidents import Acknowledgement, Incident, IncidentKey
from prober.domain.types import FindingKind

incidents_app = typer.Typer(help="Incidents in the ledger: list them, acknowledge one.", no_args_is_help=True)
app.add_typer(incidents_app, name="incidents")

OPERATOR = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
NOTE_MAX = 500

Config = Annotated[Path | None, typer.Option(help="A daemon config: its ledger and incident_hold.")]
Hold = Annotated[str | None, typer.Option(metavar="DURATION",
                                          help="daemon.incident_hold (default: the config's, else 1h).")]


def incident_id(key: IncidentKey) -> str:
    return f"{key.target}/{key.kind.value}/{key.victim or '-'}/{key.observer}"


def parse_id(text: str) -> IncidentKey:
    parts = text.split("/")
    if len(parts) != 4:
        raise ConfigError(f"{text!r}: name an incident as TARGET/KIND/VICTIM/OBSERVER, as `leakprobe incidents "
                          "list` prints it")
    target, kind, victim, observer = parts
    try:
        finding_kind = FindingKind(kind)
    except ValueError:
        raise ConfigError(f"{text!r}: unknown finding kind {kind!r}") from None
    return IncidentKey(target, finding_kind, "" if victim == "-" else victim, observer)


def _where(config: Path | None, ledger: Ledger, hold: str | None) -> tuple[str, float]:
    """The ledger and hold: flags, else the config's, else the defaults."""
    from prober.checks import REGISTRY
    from prober.config.schema import assemble_config

    given = ledger.given if ledger else None
    settings = (assemble_config(config, environ=dict(os.environ), ledger=given, sections=REGISTRY.sections)
                if config else None)
    location = ledger.given if ledger else settings.ledger if settings else "leakprobe.sqlite"
    try:
        seconds = parse_duration(hold) if hold else settings.daemon.incident_hold if settings else 3_600.0
    except ValueError as exc:
        raise ConfigError(f"--hold: {exc}") from None
    return location, seconds


def _row(incident: Incident, now: float, hold: float) -> list[str]:
    closed = incident.resolution(hold)
    is_open = incident.is_open(now, hold)
    pending = [p.describe() for p in incident.pending()] or ["the hold"]
    why = "waiting for " + ", ".join(pending) if is_open else closed.describe() if closed else ""
    return [incident_id(incident.key), "open" if is_open else "closed", incident.severity.label, str(incident.count),
            time.strftime("%Y-%m-%d %H:%M", time.gmtime(incident.last_seen)), why]


@incidents_app.command("list")
def incidents_list(
    config: Config = None,
    ledger: Ledger = None,
    hold: Hold = None,
    every: Annotated[bool, typer.Option("--all", help="Closed incidents too.")] = False,
    output_format: Format = OutputFormat.table,
) -> None:
    """Open incidents (with --all, every one): what each waits for, or why it closed."""
    from prober.ledger import open_ledger

    location, seconds = _where(config, ledger, hold)
    store = open_ledger(location)
    try:
        incidents = store.incidents()
    finally:
        store.close()
    now = time.time()
    shown = [i for i in incidents if every or i.is_open(now, seconds)]
    if output_format is OutputFormat.json:
        typer.echo(json.dumps([{"id": incident_id(i.key), **i.state_json(seconds, now)} for i in shown], indent=2))
        return
    print_table(["incident", "state", "severity", "findings", "last seen (UTC)", "waiting for / closed because"],
                [_row(i, now, seconds) for i in shown])


@incidents_app.command("ack")
def incidents_ack(
    incident: Annotated[str, typer.Argument(metavar="TARGET/KIND/VICTIM/OBSERVER", help="As `list` prints it.")],
    by: Annotated[str, typer.Option(help="Who acknowledges it (shown in pages, /status and the ledger).")],
    note: Annotated[str, typer.Option(help="Why: a ticket, what was done (kept in the ledger and /status).")] = "",
    config: Config = None,
    ledger: Ledger = None,
) -> None:
    """Close an incident by hand (a newer finding opens it again)."""
    from prober.ledger import open_ledger

    if not OPERATOR.fullmatch(by):
        raise ConfigError(f"--by {by!r}: a name of letters, digits and . _ @ - (64 at most)")
    if len(note) > NOTE_MAX or any(ch in note for ch in "\r\n\x00"):
        raise ConfigError(f"--note: one line of at most {NOTE_MAX} characters")
    key = parse_id(incident)
    location, _ = _where(config, ledger, None)
    store = open_ledger(location)
    try:
        if not store.acknowledge(key, Acknowledgement(by, time.time(), note)):
            raise ConfigError(f"no incident {incident} in {store.description}")
    finally:
        store.close()
    typer.echo(f"acknowledged {incident} by {by}: daemons on this ledger export it closed within 10 s; a newer "
               "finding opens it again")
