"""Each job's interval on each target, as its plans there pace it: a job on its default schedule whose plan would
take more than `daemon.job_share` of the day's budget runs less often (`Timetable.interval`), instead of being
skipped for budget.  The scheduler, the interval gauge and the day's projection follow every change: one record of
each job's last plan and interval serves them all."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from prober.daemon.metrics import Metrics
from prober.daemon.records import Clock, JobStatus
from prober.daemon.schedule import JobScheduler, first_run
from prober.daemon.settings import Settings
from prober.daemon.spending import Projection

log = logging.getLogger("leakprobe.daemon")


class Pacing:
    """Plans live in memory: after a restart, a paced job that is due at its default interval may run once before
    the first preflight paces it again."""

    def __init__(self, metrics: Metrics, clock: Clock, status_of: Callable[[str, str], JobStatus | None]) -> None:
        self.metrics = metrics
        self.clock = clock
        self.status_of = status_of
        self._plans: dict[str, dict[str, int]] = {}  # by target, by job: prompt tokens its last plan held
        self._intervals: dict[str, dict[str, float]] = {}  # by target, by job: as scheduled now
        self._over: dict[str, int] = {}  # by target: the projected day last warned of as over its budget
        self._settings: Settings | None = None
        self._scheduler: JobScheduler | None = None

    def use(self, settings: Settings, scheduler: JobScheduler) -> None:
        """The settings (a reload's) and the scheduler that the next `schedule` calls go by."""
        self._settings, self._scheduler = settings, scheduler

    def interval(self, target: str, job: str) -> float:
        return self._intervals[target][job]

    def schedule(self, target: str, job: str, last_run: float | None) -> None:
        """The job's runs on this target from when it is due, at the interval its last plan there paces it to."""
        assert self._settings is not None and self._scheduler is not None
        timetable, config = self._settings.timetable, self._settings.config
        interval = timetable.interval(job, self._plans.get(target, {}).get(job, 0))
        self._intervals.setdefault(target, {})[job] = interval
        self.metrics.schedule(target, job, interval, config.daemon.tokens_per_day, [t.name for t in config.tenants])
        self._scheduler.schedule(target, job, interval, timetable.jitter(job, interval),
                                 first_run(job, interval, last_run, self.clock()))

    def paced(self, target: str, ran: str, started: float, plans: Mapping[str, int]) -> None:
        """A run's plans taken in (`ran` made them, starting at `started`): a job whose plan changes its pace is
        scheduled anew from its last run; a job running now is paced by its own run's plan when it ends.  Then
        the target's day is projected anew, and a day over the budget is logged (again only when it changes)."""
        assert self._settings is not None
        for job, tokens in plans.items():
            self._plans.setdefault(target, {})[job] = tokens
            status = self.status_of(target, job)
            old = self._intervals.get(target, {}).get(job)
            if old is None or status is None or (status.running and job != ran):
                continue
            timetable = self._settings.timetable
            new = timetable.interval(job, tokens)
            if new != old:
                log.info("%s %s: every %s (was %s): its plan of %s prompt tokens a run fits daemon.job_share of "
                         "the day's budget so", job, target, _hours(new), _hours(old), f"{tokens:,}")
                if (warning := timetable.recheck_warning(job, new)) and not timetable.recheck_warning(job, old):
                    log.warning("%s: paced, %s", target, warning)
                self.schedule(target, job, started if job == ran else status.last_run)
        self._project(target)

    def _project(self, target: str) -> None:
        assert self._settings is not None
        plans = self._plans.get(target, {})
        projection = Projection.of(target, self._settings.config.daemon.tokens_per_day, plans,
                                   self._intervals.get(target, {}))
        if projection is not None:
            self.metrics.spending.show(projection, plans)
        if projection is None or projection.fits:
            self._over.pop(target, None)
        elif self._over.get(target) != projection.tokens:
            self._over[target] = projection.tokens
            log.warning("%s", projection.describe())

    def keep_only(self, targets: set[str], jobs: list[str]) -> None:
        """Forget the targets a reload removed and the jobs it turned off."""
        self._intervals = {target: {job: every for job, every in by_job.items() if job in jobs}
                           for target, by_job in self._intervals.items() if target in targets}
        self._plans = {target: by_job for target, by_job in self._plans.items() if target in targets}
        self._over = {target: tokens for target, tokens in self._over.items() if target in targets}


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"
