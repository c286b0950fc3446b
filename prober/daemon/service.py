"""`leakprobe daemon`: one asyncio process running the job scheduler and a small ASGI server on one loop.

Per target its jobs (the preflight and one per registered check) run on their own intervals; a job whose plan
would exceed the day's token budget is skipped and counted, never half-run.  Faults never stop the daemon: a
target that is down, slow or answers garbage fails that run (counted by reason) and is tried again at its next slot.  A
ledger that cannot be written makes the daemon not ready and stops probing, because a canary that cannot be
recorded must not be sent.  SIGHUP or `POST /-/reload` reloads the config (a bad one keeps the old running);
SIGTERM stops scheduling, lets in-flight requests finish within the grace period, and exits 0.

`Daemon` takes what it works with (settings, ledger, canary key, embedder, registry, clock), so tests drive
it in-process; `open_daemon` does the I/O of a real start, and prober/daemon/serving.py puts it behind a socket
and the signals.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from prober.canaries.keys import resolve_key
from prober.canaries.mint import Minter
from prober.config.schema import ProberConfig
from prober.daemon import housekeeping
from prober.daemon.budget import TokenBudget
from prober.daemon.exposition import CachedExposition
from prober.daemon.housekeeping import Housekeeper
from prober.daemon.http import Access
from prober.daemon.jobs import TargetSession
from prober.daemon.ledger_health import LedgerHealth
from prober.daemon.metrics import Metrics
from prober.daemon.pacing import Pacing
from prober.daemon.probe import OnDemand, ProbeAnswer, Refused
from prober.daemon.records import Clock, JobRecords
from prober.daemon.schedule import JobScheduler
from prober.daemon.settings import Settings, load_settings
from prober.daemon.status import redact, status_document
from prober.daemon.turns import InFlight, Turns
from prober.domain.errors import LeakprobeError, StartupError
from prober.embeddings import make_embedder
from prober.ledger import open_ledger
from prober.probing.plan import pairs
from prober.probing.scanning import RunScanner, ledger_scanner
from prober.probing.wiring import Wiring, close_spans, exported_spans
from prober.system.malloc import cap_arenas
from prober.text.scrub import ScrubbingFilter

log = logging.getLogger("leakprobe.daemon")


def open_daemon(path: Path | None, flags: dict[str, Any], registry: CollectorRegistry | None = None) -> Daemon:
    """Read the config and credentials, open the ledger, load the embedder (raises LeakprobeError)."""
    settings = load_settings(path, flags)
    try:
        ledger = open_ledger(settings.config.ledger)
        key = resolve_key(ledger)
    except LeakprobeError as exc:
        raise StartupError(str(exc)) from None
    detection = settings.config.detection
    embedder = make_embedder(detection.model, detection.device, detection.threshold) if detection.semantic else None
    if embedder is not None:
        embedder.load()
    return Daemon(settings, Minter(ledger, key, embedder), registry=registry or CollectorRegistry())


class Daemon:
    def __init__(self, settings: Settings, minter: Minter, *, registry: CollectorRegistry,
                 clock: Clock = time.time) -> None:
        """`minter`: the ledger, the deployment key and the embedder, which every job mints and scans with."""
        self.settings = settings
        self.ledger = ledger = minter.ledger
        self.minter = minter
        self.clock = clock
        self.metrics = Metrics(registry, settings.checks)
        self.exposition = CachedExposition(registry)
        self.health = LedgerHealth(ledger, self.metrics)
        self.pacing = Pacing(self.metrics, clock, lambda target, job: self.records.of(target, job))
        self.records = JobRecords(ledger, self.metrics, clock, self.health.failed, self.pacing.paced)
        self.housekeeper = Housekeeper(self.health, self.metrics, clock)
        self.turns = Turns(ledger, self.health, self.records, self.metrics, self.housekeeper, clock)
        self.log_filter = ScrubbingFilter(settings.scrubber)
        self.started, self.stopping = clock(), asyncio.Event()
        self.last_reload_error: str | None = None
        self.sessions: dict[str, TargetSession] = {}
        self.scanner: RunScanner | None = None
        self.scheduler: JobScheduler | None = None
        self.spans = exported_spans(settings.config)  # leakprobe's own, where `tracing` says (not read on reload)
        self.in_flight = InFlight()
        self.on_demand = OnDemand(self.turns, self.metrics, clock)
        self._background: set[asyncio.Future[Any]] = set()
        self.metrics.process.reloaded(settings.loaded_at, attempt=False)

    @property
    def config(self) -> ProberConfig:
        return self.settings.config

    @property
    def endpoints(self) -> DaemonEndpoints:
        """What its HTTP app serves (prober/daemon/http.py `make_app`)."""
        return DaemonEndpoints(self)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Index the ledger's canaries, restore incidents, schedule every job (no socket, no signals)."""
        cap_arenas()  # scans and ledger writes run in worker threads
        self.scanner = scanner = await ledger_scanner(self.minter, [t.name for t in self.config.tenants])
        self.metrics.process.canaries.set_function(lambda: scanner.canaries)  # as it stands at each scrape
        await self.housekeep()  # incidents restored before the first scrape can be answered
        self.scheduler = JobScheduler(asyncio.get_running_loop(), self.run_job, self.metrics.missed,
                                      lambda job, late: self.metrics.process.start_lag.labels(job).observe(late))
        self.scheduler.every("housekeeping", housekeeping.EVERY_S, self.housekeep)
        self.scheduler.every("canaries", housekeeping.CANARY_REFRESH_S,
                             partial(self.housekeeper.refresh_canaries, scanner))
        await self._apply(self.settings)
        self.scheduler.start()

    def stop(self) -> None:
        if not self.stopping.is_set():
            log.info("stopping: no new runs; in-flight requests get %.0f s", self.config.daemon.shutdown_grace)
            self.stopping.set()

    async def shutdown(self) -> None:
        """Stop scheduling, let running jobs finish within the grace, close sessions and the ledger."""
        self.stopping.set()
        if self.scheduler is not None:
            self.scheduler.shutdown()
        late = await self.in_flight.finish(self.config.daemon.shutdown_grace)
        if late:
            log.warning("%d job(s) cancelled after the %.0f s grace", late, self.config.daemon.shutdown_grace)
        for session in self.sessions.values():
            await session.retire()
        await close_spans(self.spans)
        self.health.unready()  # a ledger file deleted or replaced just now is recovered before it is closed
        await self.health.recover(keep_aside=True)
        await asyncio.to_thread(self.ledger.close)

    # -- configuration --------------------------------------------------------------------------
    def reload_in_background(self) -> None:
        """SIGHUP's: a reload the signal handler does not wait for."""
        task = asyncio.ensure_future(self.reload())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def reload(self) -> tuple[bool, str]:
        """Load the config again; a config that fails keeps the old one running."""
        fresh = await asyncio.to_thread(self.settings.reloaded)
        self.metrics.process.reloaded(None if isinstance(fresh, str) else fresh.loaded_at)
        self.exposition.stale()
        self.last_reload_error = fresh if isinstance(fresh, str) else None
        if isinstance(fresh, str):
            log.error("config reload refused, the old config keeps running: %s", fresh)
            return False, fresh
        old_targets = set(self.sessions)
        self.settings = fresh
        self.log_filter.scrubber = fresh.scrubber
        await self._apply(fresh)
        self.metrics.forget(old_targets - set(self.sessions))
        log.info("config reloaded: targets %s", ", ".join(self.sessions))
        return True, "reloaded"

    async def _apply(self, settings: Settings) -> None:
        """Fresh sessions and jobs for every target; running jobs finish on their old sessions."""
        assert self.scheduler is not None and self.scanner is not None
        config = settings.config
        tenants = [t.name for t in config.tenants]
        pairs(tenants)
        self.scanner.tenants = tenants
        self.metrics.process.set_links(config.daemon.links)
        wiring = Wiring.of(config, self.minter, self.scanner, settings.secrets, settings.scrubber, self.stopping,
                           bugs=settings.checks, spans=self.spans)
        budget = TokenBudget(self.ledger, config.daemon.tokens_per_day)
        old, self.sessions = self.sessions, {}
        self.pacing.use(settings, self.scheduler)
        for target in config.targets:
            self.sessions[target.name] = TargetSession(target, settings, wiring, budget=budget,
                                                       on_exchange=partial(self.metrics.exchanged, target.name))
            for job in settings.timetable.jobs:
                self.pacing.schedule(target.name, job, await self.records.restore(target.name, job, self.started))
        self.records.keep_only(set(self.sessions))
        self.pacing.keep_only(set(self.sessions), settings.timetable.jobs)
        self.scheduler.keep_only(set(self.sessions), settings.timetable.jobs)
        for session in old.values():
            await session.retire()

    # -- jobs -----------------------------------------------------------------------------------
    async def run_job(self, target: str, job: str) -> None:
        """One run of one job, when it is this replica's turn (what the scheduler calls; tests call it too).

        Registered as running from its first line, so a shutdown waits for it; cancelled after the grace, it
        ends quietly (its requests were abandoned, nothing recorded is lost), not as a scheduler error."""
        with self.in_flight.tracked():
            try:
                session = self.sessions.get(target)
                if session is not None and not self.stopping.is_set():
                    await self.turns.run(session, job, self.config.daemon, self.pacing.interval(target, job))
            except asyncio.CancelledError:
                log.info("%s %s: cancelled at shutdown", job, target)
            finally:
                self.exposition.stale()

    async def probe(self, target: str, check: str) -> ProbeAnswer:
        """One check of one target now (`/probe`, prober/daemon/probe.py): raises Refused where it may not run."""
        if self.stopping.is_set() or not await self.health.check():
            why = "the daemon is stopping" if self.stopping.is_set() else f"the ledger: {self.health.error}"
            raise Refused(503, f"nothing may be sent now: {why}")
        try:
            with self.in_flight.tracked():
                return await self.on_demand.run(self.sessions, self.settings.checks, target, check, self.config)
        finally:
            self.exposition.stale()

    # -- housekeeping ---------------------------------------------------------------------------
    async def housekeep(self) -> None:
        """Ledger health (and recovery), incidents, budgets: every 10 s, and whenever a test wants it now."""
        await self.housekeeper.incidents_and_budgets(list(self.sessions), self.config.daemon)


class DaemonEndpoints:
    """The daemon as its HTTP app sees it (prober.daemon.http.Endpoints): views of what it holds, and reload."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def exposition(self) -> bytes:
        return await self.daemon.exposition.render()

    def unready(self) -> str | None:
        d = self.daemon
        ledger = d.health.unready()
        if ledger is not None:
            return ledger
        if d.scheduler is None or not d.scheduler.running or d.stopping.is_set():
            return "starting or stopping"
        return None

    async def reload(self) -> tuple[bool, str]:
        return await self.daemon.reload()

    def status(self, redacted: bool = False) -> dict[str, Any]:
        d = self.daemon
        document = status_document(settings=d.settings, sessions=d.sessions, records=d.records,
                                   scheduler=d.scheduler, incidents=d.metrics.incidents.incidents,
                                   tokens_left=d.housekeeper.tokens_left, health=d.health,
                                   unready=self.unready(), last_reload_error=d.last_reload_error,
                                   started=d.started, now=d.clock())
        return redact(document) if redacted else document

    def access(self) -> Access:
        daemon = self.daemon.config.daemon
        return Access(self.daemon.settings.token, daemon.http_reload, daemon.status, daemon.probe_every)

    async def probe(self, target: str, check: str) -> ProbeAnswer:
        return await self.daemon.probe(target, check)

    def refused(self, endpoint: str, status: int) -> None:
        self.daemon.metrics.process.http_refused.labels(endpoint, str(status)).inc()
