"""When each job runs, and whose turn it is among replicas sharing a ledger.

APScheduler's AsyncIOScheduler on the daemon's loop: every interval plus jitter, a job never overlapping
itself (max_instances=1), missed runs coalesced with a grace of half the interval, and the first run after a
restart when the last one (kept in the ledger) is due again.  Replicas sharing a ledger run each job of each
target one at a time (a lock that dies with its holder) and once per slot (a claim in the ledger).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from apscheduler.events import (
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
    JobEvent,
    JobSubmissionEvent,
)
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from prober.checks import Registry
from prober.config.sections import DaemonSettings
from prober.daemon.outcomes import Skip
from prober.daemon.spending import DAY_S
from prober.domain.errors import ConfigError
from prober.ledger import JobLock, Ledger

RunJob = Callable[[str, str], Awaitable[None]]
OnMissed = Callable[[str, str, Skip], None]
OnLate = Callable[[str, float], None]  # a job, and how many seconds after it was due its run was handed over

PREFLIGHT = "preflight"  # the daemon's own job: it surveys each target and sends no generation request (no check)
PREFLIGHT_EVERY = 300.0


def daemon_jobs(checks: Registry) -> list[str]:
    """The daemon's jobs: its preflight, then one per check, in the registry's order."""
    names = [check.name for check in checks]
    if PREFLIGHT in names:
        raise ConfigError(f"a check is named {PREFLIGHT!r}, the daemon's survey job: rename it")
    return [PREFLIGHT, *names]


class Timetable:
    """How often each job runs: `daemon.schedule` where it names the job (`off`: never), else the job's own default
    (the preflight's 5 minutes, each check's `every`, which may be off); jitter `daemon.jitter`, else a tenth of the
    interval."""

    def __init__(self, daemon: DaemonSettings, checks: Registry) -> None:
        """Raises ConfigError for a job no check is registered under (a typo would otherwise run at the default)."""
        known = daemon_jobs(checks)
        for field in ("schedule", "jitter"):
            unknown = sorted(set(getattr(daemon, field)) - set(known))
            if unknown:
                raise ConfigError(f"daemon.{field}: {', '.join(unknown)}: not a job ({', '.join(known)})")
        if daemon.schedule.get(PREFLIGHT, PREFLIGHT_EVERY) is None:
            raise ConfigError("daemon.schedule.preflight cannot be off: every check plans from its survey")
        default = {job: PREFLIGHT_EVERY if job == PREFLIGHT else checks.get(job).every for job in known}
        every = {job: daemon.schedule.get(job, default[job]) for job in known}
        self._every = {job: seconds for job, seconds in every.items() if seconds is not None}
        self.jobs = list(self._every)  # those that run, in the registry's order
        self.hold = daemon.incident_hold
        self._named = set(daemon.schedule)
        self._jitter = dict(daemon.jitter)
        self._share = daemon.job_share * daemon.tokens_per_day  # tokens a day one default-scheduled job may plan

    def interval(self, job: str, planned: int = 0) -> float:
        """How often the job runs where each run plans `planned` prompt tokens: its interval, or, on its default
        schedule, as often as its share of the day's budget allows, if that is less often (paced, not skipped)."""
        every = self._every[job]
        if job in self._named or planned <= 0:
            return every
        return max(every, planned * DAY_S / self._share)

    def jitter(self, job: str, interval: float) -> float:
        return self._jitter.get(job, interval / 10)

    def recheck_warnings(self) -> list[str]:
        """Jobs whose intervals as scheduled at start cannot re-check within the hold (`recheck_warning`)."""
        return [warning for job in self.jobs if (warning := self.recheck_warning(job, self._every[job]))]

    def recheck_warning(self, job: str, interval: float) -> str | None:
        """Where the job, run every `interval` (paced or not), cannot re-check what it found within the hold: its
        incidents stay open (and page) until its next run, longer than the hold says."""
        if job == PREFLIGHT:
            return None  # finds nothing
        every = interval + self.jitter(job, interval)
        if every <= self.hold:
            return None
        return (f"daemon.schedule.{job} ({every:g} s with jitter) is longer than daemon.incident_hold ({self.hold:g} "
                f"s): an incident a {job} finds stays open until the next {job} re-checks its boundary clean, up to "
                f"{every:g} s after its last finding")


class JobScheduler:
    def __init__(self, loop: asyncio.AbstractEventLoop, run_job: RunJob, on_missed: OnMissed,
                 on_late: OnLate) -> None:
        self._scheduler = AsyncIOScheduler(event_loop=loop, timezone=UTC)
        self._run_job = run_job
        self._on_missed = on_missed
        self._on_late = on_late
        self._scheduler.add_listener(self._missed, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        self._scheduler.add_listener(self._submitted, EVENT_JOB_SUBMITTED)

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    def every(self, name: str, seconds: float, task: Callable[[], Awaitable[None]]) -> None:
        """A housekeeping task of the daemon itself (not per target).  Cancelled at shutdown, it just ends, as a job
        does: APScheduler would log the cancellation as the task's error, with a traceback."""

        async def until_shutdown() -> None:
            try:
                await task()
            except asyncio.CancelledError:
                return

        self._scheduler.add_job(until_shutdown, IntervalTrigger(seconds=seconds), id=f"daemon:{name}",
                                max_instances=1, coalesce=True)

    def schedule(self, target: str, job: str, interval: float, jitter: float, first: float) -> None:
        """The job's runs from `first` on (again: its runs from now on, at the new interval)."""
        self._scheduler.add_job(
            self._run_job, IntervalTrigger(seconds=interval, jitter=jitter), args=[target, job],
            id=_job_id(target, job), name=f"{job} {target}", max_instances=1, coalesce=True,
            misfire_grace_time=max(1, int(interval / 2)), replace_existing=True,
            next_run_time=datetime.fromtimestamp(first, tz=UTC))

    def keep_only(self, targets: set[str], jobs: list[str]) -> None:
        """Drop the jobs of targets a reload removed, and those it turned off."""
        for scheduled in self._scheduler.get_jobs():
            target, sep, job = scheduled.id.partition("/")
            if sep and (target not in targets or job not in jobs):
                scheduled.remove()

    def next_run(self, target: str, job: str) -> datetime | None:
        scheduled = self._scheduler.get_job(_job_id(target, job))
        return scheduled.next_run_time if scheduled else None

    def start(self) -> None:
        self._scheduler.start()

    def shutdown(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

    def _submitted(self, event: JobSubmissionEvent) -> None:
        """A target's job handed to the loop: how late, after the (jittered) time it was due."""
        _, sep, job = event.job_id.partition("/")
        if sep and event.scheduled_run_times:
            self._on_late(job, max(0.0, (datetime.now(UTC) - event.scheduled_run_times[-1]).total_seconds()))

    def _missed(self, event: JobEvent) -> None:
        """APScheduler skipped a run: the previous one was still going (busy) or the slot was missed."""
        target, sep, job = event.job_id.partition("/")
        if sep:
            self._on_missed(target, job, Skip.BUSY if event.code == EVENT_JOB_MAX_INSTANCES else Skip.MISSED)


def first_run(job: str, interval: float, last_run: float | None, now: float) -> float:
    """Now for a job that never ran, else when it is due; a check a moment after the preflight, whose survey it
    plans from."""
    first = now if last_run is None else max(now, last_run + interval)
    return first if job == PREFLIGHT else first + min(1.0, interval / 2)


async def take_turn(ledger: Ledger, target: str, job: str, interval: float, now: float) -> JobLock | Skip:
    """This replica's lock on the job, or why it is another replica's turn (raises LedgerError)."""
    name = _job_id(target, job)
    lock = await asyncio.to_thread(ledger.try_lock, name)
    if lock is None:
        return Skip.LOCKED
    if not await asyncio.to_thread(ledger.claim_slot, f"slot/{name}", now, now - interval / 2):
        lock.release()
        return Skip.CLAIMED
    return lock


def _job_id(target: str, job: str) -> str:
    return f"{target}/{job}"
