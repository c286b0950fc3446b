"""The `/status` document: what an operator reads first when an alert fires — per target each job's last
run, success, error or skip and next run, the token budget left, capacity and verdicts (and how old they
are), open incidents with what each waits for, and those closed lately with why.  A view of what jobs
recorded (like the metrics); secrets are scrubbed before it leaves, and `redact` keeps only what a stranger
cannot use (no URLs, ledger location, config path or error texts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prober.daemon.jobs import TargetSession
from prober.daemon.ledger_health import LedgerHealth
from prober.daemon.records import JobRecords
from prober.daemon.schedule import JobScheduler
from prober.daemon.settings import Settings
from prober.domain.incidents import Incident

RECENTLY_S = 86_400.0  # closed incidents listed this long after they closed
REDACTED = "(redacted: send the daemon's token for details)"


def status_document(*, settings: Settings, sessions: Mapping[str, TargetSession], records: JobRecords,
                    scheduler: JobScheduler | None, incidents: Sequence[Incident], tokens_left: Mapping[str, int],
                    health: LedgerHealth, unready: str | None, last_reload_error: str | None, started: float,
                    now: float) -> dict[str, Any]:
    """What /status shows, from the records the daemon keeps (never read back out of its metrics)."""
    config = settings.config
    hold = config.daemon.incident_hold
    targets = []
    for name, session in sessions.items():
        surveyed = session.context.surveyed
        jobs = {}
        for job in settings.timetable.jobs:
            status = records.of(name, job)
            if status is not None:
                jobs[job] = status.to_json(scheduler.next_run(name, job) if scheduler else None)
        mine = [i for i in incidents if i.key.target == name]
        closed = [i for i in mine if not i.is_open(now, hold)]
        targets.append({
            "name": name, "url": session.config.url, "jobs": jobs, "tokens_per_day": config.daemon.tokens_per_day,
            "tokens_left_today": tokens_left.get(name),
            "capacity": surveyed.capacity.to_json() if surveyed else None,
            "verdicts": [v.to_json() for v in surveyed.verdicts] if surveyed else [],
            "capacity_learned_at": surveyed.at if surveyed else None,
            "open_incidents": [i.state_json(hold, now) for i in mine if i.is_open(now, hold)],
            "closed_incidents": [i.state_json(hold, now) for i in closed
                                 if (r := i.resolution(hold)) is not None and now - r.at < RECENTLY_S],
        })
    document = {"ready": unready is None, "not_ready_because": unready, "replica": config.daemon.replica,
                "started": started, "config": str(settings.path) if settings.path else None,
                "config_loaded_at": settings.loaded_at, "last_reload_error": last_reload_error,
                "ledger": {"description": health.ledger.description, "writable": health.ok, "error": health.error},
                "incident_hold_s": hold, "targets": targets}
    scrubbed: dict[str, Any] = settings.scrubber.value(document)
    return scrubbed


def redact(document: dict[str, Any]) -> dict[str, Any]:
    """The document less what could help a stranger reach or attack a target, the ledger or the daemon."""
    def hide(value: Any) -> Any:
        return None if value is None else REDACTED

    out = {**document, "not_ready_because": hide(document["not_ready_because"]), "config": hide(document["config"]),
           "last_reload_error": hide(document["last_reload_error"]),
           "ledger": {**document["ledger"], "description": REDACTED, "error": hide(document["ledger"]["error"])}}
    out["targets"] = [
        {**t, "url": REDACTED,
         "jobs": {job: {**s, "last_error": hide(s["last_error"]), "last_skip": hide(s["last_skip"])}
                  for job, s in t["jobs"].items()},
         "open_incidents": [_quiet(i) for i in t["open_incidents"]],
         "closed_incidents": [_quiet(i) for i in t["closed_incidents"]]}
        for t in document["targets"]]
    return out


def _quiet(incident: dict[str, Any]) -> dict[str, Any]:
    """An incident less the operator's note (free text)."""
    ack = incident.get("acknowledged")
    return {**incident, "acknowledged": None if ack is None else {**ack, "note": REDACTED if ack["note"] else ""}}
