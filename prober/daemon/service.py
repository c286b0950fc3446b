"""`leakprobe daemon`: one asyncio process running APScheduler's AsyncIOScheduler and a small ASGI server on
the same event loop.

Per target three jobs (preflight, sentinel, campaign), each on its own interval with jitter; a job never
overlaps itself (max_instances=1, coalesced) and a job whose plan would exceed the day's token budget is
skipped and counted, never half-run.  Faults never stop the daemon: a target that is down, slow or answers
garbage fails that run (counted by reason) and is tried again at its next slot.  A ledger that cannot be
written makes the daemon not ready and stops probing, because a canary that cannot be recorded must not
be sent.  SIGHUP or `POST /-/reload` reloads the config (a bad one keeps the old running); SIGTERM stops
scheduling, lets in-flight requests finish within the grace period, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvicorn
from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger
from prometheus_client import CollectorRegistry

from prober.campaign.events import Event, FindingRecorded
from prober.campaign.plan import pairs
from prober.campaign.scanning import RunScanner
from prober.campaign.wiring import Wiring
from prober.canaries.keys import resolve_key
from prober.canaries.mint import Minter
from prober.config import ProberConfig, assemble_config, listen_address
from prober.daemon.budget import TokenBudget
from prober.daemon.jobs import Job, JobOutcome, TargetSession
from prober.daemon.metrics import Metrics
from prober.embeddings import make_embedder
from prober.errors import CanaryKeyError, ConfigError, CredentialError, EmbedderError, LedgerError, StartupError
from prober.ledger import JobLock, Ledger, open_ledger
from prober.malloc import cap_arenas
from prober.scrub import Scrubber, ScrubbingFilter
from prober.secrets import load_secrets, scrubber_for
from prober.targets.credentials import Secret

log = logging.getLogger("leakprobe.daemon")

HOUSEKEEPING_S = 10.0  # ledger health, incidents (every replica's), budgets
CANARY_REFRESH_S = 2.0  # other replicas' new canaries: a fact they planted is known here within this
FULL_REFRESH_S = 3600.0  # rebuild the canary index from the ledger (drops expired canaries)
CANARY_SKEW_S = 300.0  # replicas' clocks may disagree: look this far back for their new canaries
TURN_TAKEN = ("locked", "claimed")  # skip reasons that mean another replica has the job


@dataclass
class JobStatus:
    last_run: float | None = None
    last_success: float | None = None
    last_error: str | None = None
    last_skip: str | None = None
    running: bool = False

    def to_json(self, next_run: datetime | None) -> dict[str, Any]:
        return {"running": self.running, "last_run": self.last_run, "last_success": self.last_success,
                "next_run": next_run.timestamp() if next_run else None, "last_error": self.last_error,
                "last_skip": self.last_skip}


@dataclass
class Settings:
    """What a (re)load produced: validated config and every credential it names."""

    config: ProberConfig
    secrets: dict[str, Secret | None]
    scrubber: Scrubber
    loaded_at: float = field(default_factory=time.time)


def load_settings(path: Path | None, flags: dict[str, Any]) -> Settings:
    """Config file < LEAKPROBE_* environment < flags; raises ConfigError or CredentialError."""
    config = assemble_config(path, environ=dict(os.environ), **flags)
    if len(config.tenants) < 2:
        raise ConfigError(f"{path or 'flags'}: tenants: the daemon needs at least two (a victim and an observer)")
    secrets = load_secrets(config)
    return Settings(config, secrets, scrubber_for(secrets, ledger=config.ledger))


class Daemon:
    def __init__(self, path: Path | None, flags: dict[str, Any], registry: CollectorRegistry | None = None) -> None:
        self.path = path
        self.flags = flags
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.settings = load_settings(path, flags)
        self.log_filter = ScrubbingFilter(self.settings.scrubber)
        self.started = time.time()
        self.stopping = asyncio.Event()
        self.ledger_ok = False
        self.ledger_error: str | None = None
        self.last_reload_error: str | None = None
        self.sessions: dict[str, TargetSession] = {}
        self.status: dict[str, dict[Job, JobStatus]] = {}
        self._running: set[asyncio.Task[Any]] = set()
        self._background: set[asyncio.Future[Any]] = set()
        self._canaries_seen = 0.0
        self._full_refresh = 0.0
        try:
            self.ledger: Ledger = open_ledger(self.config.ledger)
            self.key = resolve_key(self.ledger)
        except (LedgerError, CanaryKeyError) as exc:
            raise StartupError(str(exc)) from None
        self.ledger_ok = True
        detection = self.config.detection
        try:
            self.embedder = (make_embedder(detection.model, detection.device, detection.threshold)
                             if detection.semantic else None)
            if self.embedder is not None:
                self.embedder.load()
        except EmbedderError as exc:
            raise StartupError(str(exc)) from None
        self.minter = Minter(self.ledger, self.key, self.embedder)
        self.scanner: RunScanner | None = None
        self.scheduler: AsyncIOScheduler | None = None
        self.server: uvicorn.Server | None = None
        self.metrics.reload_ok.set(1)
        self.metrics.reload_time.set(self.settings.loaded_at)

    @property
    def config(self) -> ProberConfig:
        return self.settings.config

    @property
    def ready(self) -> bool:
        return self.ledger_ok and self.scheduler is not None and self.scheduler.running and not self.stopping.is_set()

    # -- lifecycle ------------------------------------------------------------------------------
    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; raises StartupError when the listen address cannot be bound."""
        sock = self._bind()
        cap_arenas()  # scans and ledger writes run in worker threads
        for handler in logging.getLogger().handlers:
            handler.addFilter(self.log_filter)
        loop = asyncio.get_running_loop()
        tenants = [t.name for t in self.config.tenants]
        known = await asyncio.to_thread(self.ledger.active_canaries)
        self.scanner = await asyncio.to_thread(RunScanner, known, key=self.key, tenants=tenants,
                                               embedder=self.embedder)
        self._canaries_seen = self._full_refresh = time.time()
        await self._housekeeping()  # incidents restored before the first scrape can be answered
        self.scheduler = AsyncIOScheduler(event_loop=loop, timezone=UTC)
        self.scheduler.add_listener(self._missed, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        self.scheduler.add_job(self._housekeeping, IntervalTrigger(seconds=HOUSEKEEPING_S), id="housekeeping",
                               max_instances=1, coalesce=True)
        self.scheduler.add_job(self._refresh_canaries, IntervalTrigger(seconds=CANARY_REFRESH_S), id="canaries",
                               max_instances=1, coalesce=True)
        await self._apply(self.settings)
        self.scheduler.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        loop.add_signal_handler(signal.SIGHUP, self._reload_in_background)
        server = self._serve(sock)
        host, port = sock.getsockname()[:2]
        log.info("leakprobe daemon listening on http://%s:%d (targets: %s; ledger %s)",
                 f"[{host}]" if ":" in host else host, port, ", ".join(t.name for t in self.config.targets),
                 self.ledger.description)
        await self.stopping.wait()
        await self._shutdown(server)
        return 0

    def _reload_in_background(self) -> None:
        task = asyncio.ensure_future(self.reload())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def stop(self) -> None:
        if not self.stopping.is_set():
            log.info("stopping: no new runs; in-flight requests get %.0f s", self.config.daemon.shutdown_grace)
            self.stopping.set()

    def _bind(self) -> socket.socket:
        host, port = listen_address(self.config.daemon.listen)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # Inherited by every accepted connection: without it a response written in two parts waits for
            # the client's delayed ACK (measured: 44 ms per /metrics request instead of under 1 ms).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise StartupError(f"cannot listen on {self.config.daemon.listen}: {exc.strerror or exc}") from None
        return sock

    def _serve(self, sock: socket.socket) -> asyncio.Task[None]:
        from prober.daemon.http import make_app

        config = uvicorn.Config(make_app(self), log_level="warning", access_log=False, lifespan="off")
        self.server = _QuietServer(config)
        return asyncio.create_task(self.server.serve(sockets=[sock]), name="http")

    async def _shutdown(self, server: asyncio.Task[None]) -> None:
        assert self.scheduler is not None
        self.scheduler.shutdown(wait=False)
        running = set(self._running)
        if running:
            _, late = await asyncio.wait(running, timeout=self.config.daemon.shutdown_grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
            if late:
                log.warning("%d job(s) cancelled after the %.0f s grace", len(late), self.config.daemon.shutdown_grace)
        for session in self.sessions.values():
            await session.retire()
        if self.server is not None:
            self.server.should_exit = True
        await asyncio.gather(server, return_exceptions=True)
        await asyncio.to_thread(self.ledger.close)
        log.info("stopped")

    # -- configuration --------------------------------------------------------------------------
    async def reload(self) -> tuple[bool, str]:
        """Load the config again; a config that fails keeps the old one running."""
        self.metrics.reloads.inc()
        try:
            fresh = await asyncio.to_thread(load_settings, self.path, self.flags)
            for name in ("ledger", "daemon.listen", "daemon.replica", "detection.semantic", "detection.model",
                         "detection.device", "detection.threshold"):
                old, new = _get(self.config, name), _get(fresh.config, name)
                if old != new:
                    raise ConfigError(f"{name} cannot change on reload ({old!r} -> {new!r}); restart the daemon")
        except (ConfigError, CredentialError) as exc:
            self.metrics.reload_failures.inc()
            self.metrics.reload_ok.set(0)
            self.last_reload_error = str(exc)
            log.error("config reload refused, the old config keeps running: %s", exc)
            return False, str(exc)
        old_targets = set(self.sessions)
        self.settings = fresh
        self.log_filter.scrubber = fresh.scrubber
        await self._apply(fresh)
        self.metrics.forget(old_targets - set(self.sessions))
        self.metrics.reload_ok.set(1)
        self.metrics.reload_time.set(fresh.loaded_at)
        self.last_reload_error = None
        log.info("config reloaded: targets %s", ", ".join(self.sessions))
        return True, "reloaded"

    async def _apply(self, settings: Settings) -> None:
        """Fresh sessions and jobs for every target; running jobs finish on their old sessions."""
        assert self.scheduler is not None and self.scanner is not None
        config = settings.config
        tenants = [t.name for t in config.tenants]
        pairs(tenants)
        self.scanner.tenants = tenants
        budget = TokenBudget(self.ledger, config.daemon.tokens_per_day)
        old = self.sessions
        self.sessions = {}
        wiring = Wiring.of(config, self.minter, self.scanner, settings.secrets, settings.scrubber, self.stopping)
        for target in config.targets:
            self.sessions[target.name] = TargetSession(target, wiring, daemon=config.daemon, audit=config.audit,
                                                       budget=budget)
            self.status.setdefault(target.name, {job: JobStatus() for job in Job})
            for job in Job:
                last_run = await self._recall(f"last_run/{target.name}/{job}")
                last_success = await self._recall(f"last_success/{target.name}/{job}")
                # A job that never succeeded is stale from the daemon's start, so the rules see it.
                self.metrics.last_success.labels(target.name, job).set(last_success or self.started)
                if last_run is not None:
                    self.metrics.last_run.labels(target.name, job).set(last_run)
                self._schedule(target.name, job, last_run)
        for name in set(self.status) - set(self.sessions):
            del self.status[name]
        for job in self.scheduler.get_jobs():
            if job.id != "housekeeping" and job.id.split("/", 1)[0] not in self.sessions:
                job.remove()
        for session in old.values():
            await session.retire()

    def _schedule(self, target: str, job: Job, last_run: float | None) -> None:
        """Every `interval` with jitter; the first run when the last one (before a restart) is due again."""
        assert self.scheduler is not None
        daemon = self.config.daemon
        interval = daemon.interval(job)
        self.metrics.schedule(target, job, interval, daemon.tokens_per_day, [t.name for t in self.config.tenants])
        first = time.time() if last_run is None else max(time.time(), last_run + interval)
        if job is Job.SENTINEL:
            first += min(1.0, interval / 2)  # after the first preflight has had a moment
        self.scheduler.add_job(
            self._job, IntervalTrigger(seconds=interval, jitter=daemon.jitter_of(job)), args=[target, job],
            id=f"{target}/{job}", name=f"{job} {target}", max_instances=1, coalesce=True,
            misfire_grace_time=max(1, int(interval / 2)), replace_existing=True,
            next_run_time=datetime.fromtimestamp(first, tz=UTC))

    # -- jobs -----------------------------------------------------------------------------------
    async def _job(self, target: str, job: Job) -> None:
        session = self.sessions.get(target)
        status = self.status.get(target, {}).get(job)
        if session is None or status is None or self.stopping.is_set():
            return
        if not self.ledger_ok:
            self._skip(target, job, status, "ledger", f"ledger not writable: {self.ledger_error}")
            return
        lock = await self._take_turn(target, job, status)
        if lock is None:
            return
        try:
            await self._run(session, target, job, status)
        finally:
            lock.release()

    async def _take_turn(self, target: str, job: Job, status: JobStatus) -> JobLock | None:
        """This replica's turn at a job, or None: replicas sharing a ledger run each job of each target one at
        a time (a lock that dies with its holder) and once per scheduled slot (a claim in the ledger)."""
        name = f"{target}/{job}"
        try:
            lock = await asyncio.to_thread(self.ledger.try_lock, name)
            if lock is None:
                self._skip(target, job, status, "locked", "another replica is running it")
                return None
            now = time.time()
            interval = self.config.daemon.interval(job)
            if not await asyncio.to_thread(self.ledger.claim_slot, f"slot/{name}", now, now - interval / 2):
                lock.release()
                self._skip(target, job, status, "claimed", "another replica ran it in this slot")
                return None
        except LedgerError as exc:
            self._ledger_failed(str(exc))
            self._skip(target, job, status, "ledger", str(exc))
            return None
        return lock

    async def _run(self, session: TargetSession, target: str, job: Job, status: JobStatus) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
        status.running = True
        self.metrics.runs.labels(target, job).inc()
        started = time.time()
        count = self.metrics.listener(target, job)

        def on_event(event: Event) -> None:
            count(event)
            if isinstance(event, FindingRecorded):
                log.warning("%s", event.finding.describe())  # only once it is in the ledger

        try:
            outcome = await session.run(job, on_event)
        finally:
            status.running = False
            if task is not None:
                self._running.discard(task)
        await self._conclude(target, job, status, outcome, started)

    async def _conclude(self, target: str, job: Job, status: JobStatus, outcome: JobOutcome, started: float) -> None:
        now = time.time()
        if outcome.skipped:
            self._skip(target, job, status, outcome.reason, outcome.message)
            return
        status.last_run = now
        self.metrics.last_run.labels(target, job).set(now)
        await self._remember(f"last_run/{target}/{job}", started)
        if outcome.ok:
            status.last_success, status.last_error = now, None
            self.metrics.last_success.labels(target, job).set(now)
            await self._remember(f"last_success/{target}/{job}", now)
            log.info("%s %s: ok in %.1f s, %s tokens", job, target, now - started, f"{outcome.tokens:,}")
            return
        status.last_error = f"{outcome.reason}: {outcome.message}"
        self.metrics.failures.labels(target, job, outcome.reason).inc()
        if outcome.reason == "ledger":
            self._ledger_failed(outcome.message)
        log.warning("%s %s: failed (%s): %s", job, target, outcome.reason, outcome.message)

    def _skip(self, target: str, job: Job, status: JobStatus, reason: str, message: str) -> None:
        status.last_skip = f"{reason}: {message}"
        self.metrics.skips.labels(target, job, reason).inc()
        # Leaving a job to another replica is how replicas cooperate, not a problem.
        log.log(logging.INFO if reason in TURN_TAKEN else logging.WARNING, "%s %s: skipped (%s): %s", job, target,
                reason, message)

    def _missed(self, event: JobEvent) -> None:
        """APScheduler skipped a run: the previous one was still going (busy) or the slot was missed."""
        target, _, job = event.job_id.partition("/")
        if job:
            reason = "busy" if event.code == EVENT_JOB_MAX_INSTANCES else "missed"
            self.metrics.skips.labels(target, job, reason).inc()

    async def _recall(self, key: str) -> float | None:
        value = await asyncio.to_thread(self.ledger.get_meta, key)
        return None if value is None else float(value)

    async def _remember(self, key: str, value: float) -> None:
        try:
            await asyncio.to_thread(self.ledger.set_meta, key, repr(value))
        except LedgerError as exc:
            self._ledger_failed(str(exc))

    # -- housekeeping ---------------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        """Ledger health, incidents (every replica's), budgets left."""
        try:
            await asyncio.to_thread(self.ledger.check_writable)
            incidents = await asyncio.to_thread(self.ledger.incidents)
            budget = TokenBudget(self.ledger, self.config.daemon.tokens_per_day)
            for name in self.sessions:
                self.metrics.budget_left.labels(name).set(await budget.left(name))
        except LedgerError as exc:
            self._ledger_failed(str(exc))
            return
        if not self.ledger_ok:
            log.info("ledger writable again")
        self.ledger_ok, self.ledger_error = True, None
        self.metrics.ledger_up.set(1)
        self.metrics.set_incidents(incidents, self.config.daemon.incident_hold)

    async def _refresh_canaries(self) -> None:
        """Other replicas' new canaries into the index; hourly, a rebuild that also drops expired ones."""
        scanner = self.scanner
        if scanner is None or not self.ledger_ok:
            return
        now = time.time()
        try:
            if now - self._full_refresh > FULL_REFRESH_S:
                known = await asyncio.to_thread(self.ledger.active_canaries)
                await asyncio.to_thread(scanner.refresh, known)
                self._full_refresh = now
            else:
                fresh = await asyncio.to_thread(self.ledger.active_canaries, None,
                                                self._canaries_seen - CANARY_SKEW_S)
                scanner.add(fresh)
        except LedgerError as exc:
            self._ledger_failed(str(exc))
            return
        self._canaries_seen = now
        self.metrics.canaries.set(scanner.canaries)

    def _ledger_failed(self, message: str) -> None:
        if self.ledger_ok:
            log.error("ledger not writable, probing paused until it is: %s", message)
        self.ledger_ok, self.ledger_error = False, message
        self.metrics.ledger_up.set(0)

    # -- status ---------------------------------------------------------------------------------
    def status_json(self) -> dict[str, Any]:
        now = time.time()
        hold = self.config.daemon.incident_hold
        incidents = self.metrics.incidents.incidents
        targets = []
        for name, session in self.sessions.items():
            surveyed = session.runner.surveyed
            jobs = {}
            for job, status in self.status[name].items():
                scheduled = self.scheduler.get_job(f"{name}/{job}") if self.scheduler else None
                jobs[job.value] = status.to_json(scheduled.next_run_time if scheduled else None)
            targets.append({
                "name": name, "url": session.config.url, "jobs": jobs,
                "tokens_per_day": self.config.daemon.tokens_per_day,
                "tokens_left_today": _sample(self.metrics, "leakprobe_token_budget_remaining_tokens", name),
                "capacity": surveyed.capacity.to_json() if surveyed else None,
                "verdicts": [v.to_json() for v in surveyed.verdicts] if surveyed else [],
                "open_incidents": [i.to_json() for i in incidents if i.key.target == name and i.is_open(now, hold)],
            })
        answer = {"ready": self.ready, "replica": self.config.daemon.replica, "started": self.started,
                  "config": str(self.path) if self.path else None,
                  "config_loaded_at": self.settings.loaded_at, "last_reload_error": self.last_reload_error,
                  "ledger": {"description": self.ledger.description, "writable": self.ledger_ok,
                             "error": self.ledger_error},
                  "incident_hold_s": hold, "targets": targets}
        scrubbed: dict[str, Any] = self.settings.scrubber.value(answer)
        return scrubbed


class _QuietServer(uvicorn.Server):
    """uvicorn on the daemon's loop without its own signal handlers: the daemon owns SIGTERM and SIGHUP."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _get(config: ProberConfig, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _sample(metrics: Metrics, name: str, target: str) -> int | None:
    value = metrics.registry.get_sample_value(name, {"target": target})
    return None if value is None else int(value)
