"""The daemon in this process, as the in-process tests drive it: built from a config file of the reference
engine's tenants, its metrics read from its own registry, its HTTP app over an ASGI transport."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client import CollectorRegistry

from prober.canaries.keys import resolve_key
from prober.canaries.mint import Minter
from prober.checks import REGISTRY, Registry
from prober.daemon import Daemon, load_settings
from prober.daemon.http import make_app
from prober.ledger import open_ledger
from tests.support.daemonproc import daemon_config


def make_daemon(url: str, folder: Path, *, target: dict[str, Any] | None = None,
                targets: list[dict[str, Any]] | None = None, audit: dict[str, Any] | None = None,
                sections: dict[str, Any] | None = None, checks: Registry = REGISTRY, **daemon: Any) -> Daemon:
    """`target`: more settings of the reference engine's target; `targets`: more targets beside it; `audit`: the
    audit settings campaigns take; `sections`: other top-level settings (a check's); `checks`: the registry its jobs
    come from."""
    settings = daemon_config(url, folder / "l.sqlite", **daemon)
    settings["targets"][0].update(target or {})
    settings["targets"] += targets or []
    config = folder / "daemon.yaml"
    config.write_text(yaml.safe_dump({**settings, "detection": {"semantic": False},
                                      **({"audit": audit} if audit else {}), **(sections or {})}))
    settings = load_settings(config, {}, checks)
    ledger = open_ledger(settings.config.ledger)
    return Daemon(settings, Minter(ledger, resolve_key(ledger)), registry=CollectorRegistry())


def sample(daemon: Daemon, name: str, **labels: str) -> float:
    """Sum over the series of `name` whose labels include `labels`."""
    total = 0.0
    for family in daemon.metrics.registry.collect():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def until(daemon: Daemon, condition: Callable[[], bool], what: str, idle_s: float = 60,
                cap_s: float = 1_800) -> None:
    """Wait while the daemon runs jobs (its run counter moves); fail after `idle_s` without a run, or at `cap_s` in
    any case (jobs that run and never bring the condition about)."""
    runs, started = -1.0, time.monotonic()
    moved = started
    while not condition():
        now_runs = sample(daemon, "leakprobe_job_runs_total")
        if now_runs != runs:
            runs, moved = now_runs, time.monotonic()
        assert time.monotonic() - moved < idle_s, f"no job ran for {idle_s:.0f} s waiting for {what}"
        assert time.monotonic() - started < cap_s, f"still no {what} after {cap_s:.0f} s"
        await asyncio.sleep(0.1)


def scenario(daemon: Daemon, body: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    async def run() -> None:
        await daemon.start()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(make_app(daemon.endpoints)),
                                         base_url="http://daemon") as client:
                await body(client)
        finally:
            await daemon.shutdown()
    asyncio.run(run())
