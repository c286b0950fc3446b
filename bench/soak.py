"""Soak: `leakprobe daemon` against the reference engine for many sentinel cycles at a fast schedule.

Phase 1: the full-size incident (advertised 1,048,576 tokens, KV pool 681,280): the first campaign sends
about 23 M tokens while `/metrics` and `/-/ready` are polled; their latency (median, p99, max) shows
whether anything blocks the daemon's event loop.  Phase 2: sentinels every 100 ms until N cycles have run;
resident memory, open file descriptors and threads of the daemon after warm-up and at the end.

    python bench/soak.py [cycles]          # default 1,000
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from tests.support.daemonproc import DaemonProcess

WARMUP_CYCLES = 50


def proc_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_mib": int(fields["VmRSS"].split()[0]) / 1024, "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def latencies(url: str, seconds: float | None, until: object = None) -> list[float]:
    """Poll /metrics and /-/ready back to back; per request wall time in ms."""
    out: list[float] = []
    deadline = time.monotonic() + (seconds or 1e9)
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < deadline and not (callable(until) and until()):
            for path in ("/metrics", "/-/ready"):
                start = time.perf_counter()
                client.get(url + path)
                out.append((time.perf_counter() - start) * 1000)
            time.sleep(0.05)
    return out


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"median {statistics.median(values):.1f} ms, p99 {p99:.1f} ms, max {max(values):.1f} ms (n={len(values)})"


def main(cycles: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="leakprobe-soak-"))
    engine = subprocess.Popen([sys.executable, "-m", "prober", "testbed", "serve", "--preset", "incident", "--port",
                               "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert engine.stdout is not None
    base = engine.stdout.readline().strip().removesuffix("/v1")
    config = {"ledger": str(folder / "ledger.sqlite"),
              "targets": [{"name": "testbed", "url": base + "/v1", "timeout_s": 600, "retries": 0}],
              "tenants": [{"name": "tenant-a", "api_key_env": "LP_A"}, {"name": "tenant-b", "api_key_env": "LP_B"}],
              "daemon": {"listen": "127.0.0.1:0", "tokens_per_day": 10**9,
                         "schedule": {"preflight": "30s", "sentinel": "100ms", "campaign": "6h"},
                         "jitter": {"preflight": "1s", "sentinel": "10ms", "campaign": "1s"}}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    try:
        with DaemonProcess(config, folder) as daemon:
            assert daemon.proc is not None
            pid = daemon.proc.pid
            print(f"daemon pid {pid}, engine {base}, ledger {folder / 'ledger.sqlite'}")
            daemon.wait_for(lambda: daemon.get("/status").json()["targets"][0]["jobs"]["campaign"]["running"], 60,
                            "the first campaign")
            started = time.monotonic()

            def campaign_done() -> bool:
                return daemon.sample("leakprobe_last_run_timestamp_seconds", job="campaign") > 0

            during = latencies(daemon.url, None, until=campaign_done)
            tokens = daemon.sample("leakprobe_tokens_sent_total")
            print(f"campaign: {time.monotonic() - started:.0f} s, {tokens:,.0f} prompt tokens sent; "
                  f"/metrics and /-/ready meanwhile: {summary(during)}")
            daemon.wait_for(lambda: daemon.sample("leakprobe_job_runs_total", job="sentinel") >= WARMUP_CYCLES, 600,
                            "warm-up sentinels")
            before = proc_stats(pid)
            first = time.monotonic()
            runs = daemon.sample("leakprobe_job_runs_total", job="sentinel")
            quiet = latencies(daemon.url, 20)
            daemon.wait_for(lambda: daemon.sample("leakprobe_job_runs_total", job="sentinel") >= cycles + WARMUP_CYCLES,
                            3600, f"{cycles} sentinel cycles")
            after = proc_stats(pid)
            done = daemon.sample("leakprobe_job_runs_total", job="sentinel") - runs
            failures = daemon.sample("leakprobe_job_failures_total")
            print(f"sentinels: {done:,.0f} cycles in {time.monotonic() - first:.0f} s, "
                  f"{failures:.0f} failed runs; /metrics and /-/ready between campaigns: {summary(quiet)}")
            for name in ("rss_mib", "fds", "threads"):
                print(f"  {name}: {before[name]:,.1f} after warm-up -> {after[name]:,.1f} after {done:,.0f} cycles")
            assert daemon.stop() == 0
    finally:
        engine.terminate()
        engine.wait()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the clean-up: stop the daemon and the engine
    os.environ.setdefault("LP_A", "testbed-key-a")
    os.environ.setdefault("LP_B", "testbed-key-b")
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
