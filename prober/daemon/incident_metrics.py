"""Incidents as Prometheus series, computed at scrape time from what the ledger holds (every replica's
findings, re-checks and acknowledgements), so every replica exports the same picture and a restart hides
nothing.

The leak alerts read `leakprobe_incident_alerting`: 1 while an incident is open, 2 for
`daemon.resolved_notice` after it closed, then 0.  The alert keeps firing through that notice, with a text
that says why the incident closed (`leakprobe_incident_closed_timestamp_seconds` names how, by whom, at
which boundary), because a resolved notification repeats the alert's last text.  The other series fill the
page: how many findings, first and last seen, the boundary and prompt length of the latest.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from enum import IntEnum

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from prober.domain.incidents import Incident, IncidentKey, Recheck, Sighting
from prober.domain.types import Finding

KEY_LABELS = ["target", "kind", "victim", "observer"]


class AlertState(IntEnum):
    """Values of `leakprobe_incident_alerting`."""

    CLOSED = 0
    OPEN = 1
    CLOSING = 2  # closed less than `resolved_notice` ago: the alert still fires, saying why it closed


class IncidentCollector(Collector):
    def __init__(self) -> None:
        self.by_key: dict[IncidentKey, Incident] = {}
        self.hold = 3_600.0
        self.notice = 120.0

    @property
    def incidents(self) -> list[Incident]:
        return list(self.by_key.values())

    def replace(self, incidents: Iterable[Incident], hold: float, notice: float) -> None:
        """What the ledger holds now."""
        self.by_key = {i.key: i for i in incidents}
        self.hold, self.notice = hold, notice

    def record(self, finding: Finding, job: str) -> None:
        """A finding this process just persisted by `job`, shown before the next read of the ledger (which gets
        its check when the run ends): open at once, waiting for that check's re-check."""
        key = IncidentKey.of(finding)
        if key not in self.by_key:
            self.by_key[key] = Incident.opened_by(finding)
        incident = self.by_key[key]
        incident.count_in(finding)
        seen = Sighting.of(finding)
        others = [p for p in incident.checks if (p.job, p.boundary) != (job, seen.boundary)]
        incident.checks = [*others, Recheck(job, seen.boundary, finding.found_at, seen.prompt_tokens)]

    def state(self, incident: Incident, now: float) -> int:
        closed = incident.resolution(self.hold)
        if closed is None or now < closed.at:
            return AlertState.OPEN
        return AlertState.CLOSING if now < closed.at + self.notice else AlertState.CLOSED

    def collect(self) -> Iterator[GaugeMetricFamily]:
        def family(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=[*KEY_LABELS, *extra])

        last = family("leakprobe_last_finding_timestamp_seconds", "When the latest finding of this incident was "
                      "recorded (any replica).")
        first = family("leakprobe_incident_first_seen_timestamp_seconds", "When the first finding of this incident "
                       "was recorded.")
        count = family("leakprobe_incident_findings", "Findings recorded for this incident (exact, from the ledger).")
        opened = family("leakprobe_incident_open", "1 while the incident is open: within the hold of its last "
                        "finding, or waiting for a clean re-check; 0 once re-checked clean or acknowledged.")
        alerting = family("leakprobe_incident_alerting", "What the leak alerts read: 1 open, 2 closed less than "
                          "daemon.resolved_notice ago (the alert says why), 0 closed.")
        found = family("leakprobe_incident_check_last_found_timestamp_seconds", "When this check (a job at a "
                       "boundary, at this prompt length) last found the incident.", ("job", "boundary",
                                                                                      "prompt_tokens"))
        clean = family("leakprobe_incident_check_last_clean_timestamp_seconds", "When this check last re-checked "
                       "the incident's tenant pair clean.", ("job", "boundary"))
        closed = family("leakprobe_incident_closed_timestamp_seconds", "When the incident closed, and how: "
                        "rechecked (by a clean re-check at this boundary), acknowledged (by whom) or held (no "
                        "check re-checks it: the hold ended).", ("how", "by", "job", "boundary"))
        acked = family("leakprobe_incident_acknowledged_timestamp_seconds", "When an operator last acknowledged "
                       "the incident, and who.", ("by",))
        now = time.time()
        for incident in list(self.by_key.values()):
            k = incident.key
            key = [k.target, k.kind.value, k.victim, k.observer]
            last.add_metric(key, incident.last_seen)
            first.add_metric(key, incident.first_seen)
            count.add_metric(key, incident.count)
            state = self.state(incident, now)
            opened.add_metric(key, 1.0 if state == AlertState.OPEN else 0.0)
            alerting.add_metric(key, state)
            for p in incident.checks:
                found.add_metric([*key, p.job, p.boundary, _tokens(p)], p.last_found)
                if p.last_clean is not None:
                    clean.add_metric([*key, p.job, p.boundary], p.last_clean)
            resolution = incident.resolution(self.hold)
            if state != AlertState.OPEN and resolution is not None:
                by = resolution.ack.by if resolution.ack else ""
                where = resolution.check
                closed.add_metric([*key, resolution.how.value, by, where.job if where else "",
                                   where.boundary if where else ""], resolution.at)
            if incident.ack is not None:
                acked.add_metric([*key, incident.ack.by], incident.ack.at)
        hold = GaugeMetricFamily("leakprobe_incident_hold_seconds", "The least time an incident stays open after "
                                 "its last finding (daemon.incident_hold).")
        hold.add_metric([], self.hold)
        notice = GaugeMetricFamily("leakprobe_incident_resolved_notice_seconds", "How long a leak alert keeps "
                                   "firing after its incident closed, saying why (daemon.resolved_notice).")
        notice.add_metric([], self.notice)
        yield from (last, first, count, opened, alerting, found, clean, closed, acked, hold, notice)


def _tokens(check: Recheck) -> str:
    return "" if check.prompt_tokens is None else str(check.prompt_tokens)
