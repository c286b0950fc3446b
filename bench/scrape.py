"""Bursts of concurrent `/metrics` scrapes while the daemon runs a campaign: the cached exposition against the
baseline of rendering the registry for every request (what the daemon did before), on the same registry, the
same event loop and the same campaign, measured in the same run.

The daemon runs in this process against the full-size reference engine (a subprocess); each burst is sent
by a client subprocess (its own interpreter, so it does not share this process's loop or GIL), and prints the
latency of every request.

    python bench/scrape.py [concurrent] [rounds]      # default 200 concurrent, 5 rounds
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import uvicorn
import yaml
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from prober.canaries.keys import resolve_key
from prober.canaries.mint import Minter
from prober.daemon import Daemon, load_settings
from prober.daemon.http import make_app
from prober.ledger import open_ledger

CLIENT = """
import asyncio, json, sys, time, httpx
async def main(url, n):
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=n)) as client:
        async def one():
            start = time.perf_counter()
            (await client.get(url)).raise_for_status()
            return (time.perf_counter() - start) * 1000
        print(json.dumps(await asyncio.gather(*(one() for _ in range(n)))))
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def burst(url: str, concurrent: int) -> list[float]:
    out = subprocess.run([sys.executable, "-c", CLIENT, url, str(concurrent)], capture_output=True, text=True,
                         check=True, timeout=600)
    latencies: list[float] = json.loads(out.stdout)
    return latencies


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    return (f"median {statistics.median(values):7.1f} ms, p99 {ordered[int(len(ordered) * 0.99) - 1]:7.1f} ms, "
            f"max {ordered[-1]:7.1f} ms")


async def serve(daemon: Daemon, registry: CollectorRegistry) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    async def uncached(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app = make_app(daemon.endpoints)
    app.router.routes.append(Route("/metrics-uncached", uncached, methods=["GET"]))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    return server, task, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def main(concurrent: int, rounds: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="leakprobe-scrape-"))
    engine = subprocess.Popen([sys.executable, "-m", "prober", "testbed", "serve", "--preset", "incident", "--port",
                               "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert engine.stdout is not None
    base = engine.stdout.readline().strip()
    config = folder / "daemon.yaml"
    config.write_text(yaml.safe_dump({
        "ledger": str(folder / "ledger.sqlite"), "detection": {"semantic": False},
        "targets": [{"name": "testbed", "url": base, "timeout_s": 600, "retries": 0}],
        "tenants": [{"name": "tenant-a", "api_key_env": "LP_A"}, {"name": "tenant-b", "api_key_env": "LP_B"}],
        "daemon": {"tokens_per_day": 10**10, "schedule": {"preflight": "30s", "sentinel": "1s", "campaign": "10s"}}}))
    settings = load_settings(config, {})
    ledger = open_ledger(settings.config.ledger)
    registry = CollectorRegistry()
    daemon = Daemon(settings, Minter(ledger, resolve_key(ledger)), registry=registry)
    await daemon.start()
    server, task, url = await serve(daemon, registry)
    try:
        campaign = daemon.records.by_target["testbed"]["campaign"]
        while not campaign.running:
            await asyncio.sleep(0.1)
        size = len(generate_latest(registry))
        print(f"{concurrent} concurrent scrapes x {rounds} rounds during campaigns against the full-size engine; "
              f"exposition {size:,} bytes")
        results: dict[str, list[float]] = {"/metrics": [], "/metrics-uncached": [], "/-/healthy": []}
        for _ in range(rounds):
            for path, values in results.items():  # alternate, so both see the same phases of the campaign
                values += await asyncio.to_thread(burst, url + path, concurrent)
        cached, uncached = results["/metrics"], results["/metrics-uncached"]
        print(f"  cached exposition (the daemon's /metrics): {summary(cached)}")
        print(f"  rendered per request (baseline):           {summary(uncached)}")
        print(f"  /-/healthy (no exposition at all):        {summary(results['/-/healthy'])}")
        print(f"  median ratio baseline / cached: {statistics.median(uncached) / statistics.median(cached):.1f}x")
    finally:
        server.should_exit = True
        await task
        await daemon.shutdown()
        engine.terminate()
        engine.wait()


if __name__ == "__main__":
    os.environ.setdefault("LP_A", "testbed-key-a")
    os.environ.setdefault("LP_B", "testbed-key-b")
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200, int(sys.argv[2]) if len(sys.argv) > 2 else 5))
