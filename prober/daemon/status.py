"""The `/status` document: what an operator reads first when an alert fires — per target each job's last
run, success, error or skip and next run, the token budget left, capacity and verdicts, open incidents.
A view of what jobs recorded (like the metrics); secrets are scrubbed before it leaves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prober.daemon.jobs import Job, TargetSession
from prober.daemon.ledger_health import LedgerHealth
from prober.daemon.metrics import Metrics
from prober.daemon.records import JobRecords
from prober.daemon.schedule import JobScheduler
from prober.daemon.settings import Settings


def status_document(*, settings: Settings, sessions: Mapping[str, TargetSession], records: JobRecords,
                    scheduler: JobScheduler | None, metrics: Metrics, health: LedgerHealth, unready: str | None,
                    last_reload_error: str | None, started: float, now: float) -> dict[str, Any]:
    config = settings.config
    hold = config.daemon.incident_hold
    incidents = metrics.incidents.incidents
    targets = []
    for name, session in sessions.items():
        surveyed = session.runner.surveyed
        jobs = {}
        for job in Job:
            status = records.of(name, job)
            if status is not None:
                jobs[job.value] = status.to_json(scheduler.next_run(name, job) if scheduler else None)
        left = metrics.registry.get_sample_value("leakprobe_token_budget_remaining_tokens", {"target": name})
        targets.append({
            "name": name, "url": session.config.url, "jobs": jobs, "tokens_per_day": config.daemon.tokens_per_day,
            "tokens_left_today": None if left is None else int(left),
            "capacity": surveyed.capacity.to_json() if surveyed else None,
            "verdicts": [v.to_json() for v in surveyed.verdicts] if surveyed else [],
            "open_incidents": [i.to_json() for i in incidents if i.key.target == name and i.is_open(now, hold)],
        })
    document = {"ready": unready is None, "not_ready_because": unready, "replica": config.daemon.replica,
                "started": started, "config": str(settings.path) if settings.path else None,
                "config_loaded_at": settings.loaded_at, "last_reload_error": last_reload_error,
                "ledger": {"description": health.ledger.description, "writable": health.ok, "error": health.error},
                "incident_hold_s": hold, "targets": targets}
    scrubbed: dict[str, Any] = settings.scrubber.value(document)
    return scrubbed
