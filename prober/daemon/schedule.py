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

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from prober.config import DaemonSettings
from prober.daemon.jobs import Job, Skip
from prober.ledger import JobLock, Ledger

RunJob = Callable[[str, Job], Awaitable[None]]
OnMissed = Callable[[str, Job, Skip], None]


class JobScheduler:
    def __init__(self, loop: asyncio.AbstractEventLoop, run_job: RunJob, on_missed: OnMissed) -> None:
        self._scheduler = AsyncIOScheduler(event_loop=loop, timezone=UTC)
        self._run_job = run_job
        self._on_missed = on_missed
        self._scheduler.add_listener(self._missed, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    def every(self, name: str, seconds: float, task: Callable[[], Awaitable[None]]) -> None:
        """A housekeeping task of the daemon itself (not per target)."""
        self._scheduler.add_job(task, IntervalTrigger(seconds=seconds), id=f"daemon:{name}", max_instances=1,
                                coalesce=True)

    def schedule(self, target: str, job: Job, daemon: DaemonSettings, first: float) -> None:
        interval = daemon.interval(job)
        self._scheduler.add_job(
            self._run_job, IntervalTrigger(seconds=interval, jitter=daemon.jitter_of(job)), args=[target, job],
            id=_job_id(target, job), name=f"{job} {target}", max_instances=1, coalesce=True,
            misfire_grace_time=max(1, int(interval / 2)), replace_existing=True,
            next_run_time=datetime.fromtimestamp(first, tz=UTC))

    def keep_only(self, targets: set[str]) -> None:
        """Drop the jobs of targets a reload removed."""
        for job in self._scheduler.get_jobs():
            target, sep, _ = job.id.partition("/")
            if sep and target not in targets:
                job.remove()

    def next_run(self, target: str, job: Job) -> datetime | None:
        scheduled = self._scheduler.get_job(_job_id(target, job))
        return scheduled.next_run_time if scheduled else None

    def start(self) -> None:
        self._scheduler.start()

    def shutdown(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

    def _missed(self, event: JobEvent) -> None:
        """APScheduler skipped a run: the previous one was still going (busy) or the slot was missed."""
        target, sep, job = event.job_id.partition("/")
        if sep:
            self._on_missed(target, Job(job), Skip.BUSY if event.code == EVENT_JOB_MAX_INSTANCES else Skip.MISSED)


def first_run(job: Job, interval: float, last_run: float | None, now: float) -> float:
    """Now for a job that never ran (a sentinel a moment after the first preflight), else when it is due."""
    first = now if last_run is None else max(now, last_run + interval)
    return first + min(1.0, interval / 2) if job is Job.SENTINEL else first


async def take_turn(ledger: Ledger, target: str, job: Job, interval: float, now: float) -> JobLock | Skip:
    """This replica's lock on the job, or why it is another replica's turn (raises LedgerError)."""
    name = _job_id(target, job)
    lock = await asyncio.to_thread(ledger.try_lock, name)
    if lock is None:
        return Skip.LOCKED
    if not await asyncio.to_thread(ledger.claim_slot, f"slot/{name}", now, now - interval / 2):
        lock.release()
        return Skip.CLAIMED
    return lock


def _job_id(target: str, job: Job) -> str:
    return f"{target}/{job}"
