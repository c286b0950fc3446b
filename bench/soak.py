"""Soak: `leakprobe daemon` against the reference engine for many sentinel cycles at a fast schedule.

Phase 1: the full-size incident (advertised 1,048,576 tokens, KV pool 681,280): the first campaign sends
about 23 M tokens while `/metrics` and `/-/ready` are polled; their latency (median, p99, max) shows
whether anything blocks the daemon's event loop.  Phase 2: sentinels every 100 ms until N cycles have run;
resident memory, open file descriptors and threads of the daemon after warm-up and at the end.

    python bench/soak.py [cycles]          # default 1,000
    python bench/soak.py fleet [1,10,50]   # one daemon watching 1, 10, 50 targets

`fleet`: one daemon, N targets (the reference engine's `fixed` preset at the tests' sizes, one engine process per
ten targets), each with a preflight every minute, a sentinel every 15 s, a campaign every 5 minutes and a
cross-talk burst every 5 minutes (the other checks off).  After a minute's warm-up, for two minutes: the daemon's
resident memory and CPU (a core's share), how late runs were handed over after they were due
(`leakprobe_job_start_lag_seconds`, p50 and p99 interpolated in its buckets as Prometheus's histogram_quantile
does), runs not handed over at all because the last was still going or the slot passed
(`leakprobe_job_skips_total{reason=~"busy|missed"}`), and `/metrics`' latency (polled once a second) and size.
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
from prometheus_client.parser import text_string_to_metric_families

from prober.checks import REGISTRY
from tests.support.daemonproc import DaemonProcess

WARMUP_CYCLES = 50


def proc_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_mib": int(fields["VmRSS"].split()[0]) / 1024, "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def latencies(url: str, seconds: float | None, until: object = None, pause: float = 0.05) -> list[float]:
    """Poll /metrics and /-/ready back to back, `pause` seconds apart; per request wall time in ms."""
    out: list[float] = []
    deadline = time.monotonic() + (seconds or 1e9)
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < deadline and not (callable(until) and until()):
            for path in ("/metrics", "/-/ready"):
                start = time.perf_counter()
                client.get(url + path)
                out.append((time.perf_counter() - start) * 1000)
            time.sleep(pause)
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


FLEET_SCHEDULE = {"preflight": "1m", "sentinel": "15s", "campaign": "5m", "crosstalk": "5m"}
SMALL_ENGINE = {"preset": "fixed", "context_length": 16_384, "pool_tokens": 4_096, "page_size": 16,
                "prefill_ms_per_1k_tokens": 0}
TARGETS_PER_ENGINE = 10


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lag_quantile(buckets: dict[float, float], q: float) -> float:
    """The q-quantile of a histogram's cumulative buckets (upper bound -> count), interpolated as
    histogram_quantile interpolates it."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return 0.0
    rank, below, lower = q * total, 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(buckets[bound] - below, 1e-9)
        below, lower = buckets[bound], bound
    return lower


def lag_buckets(daemon: DaemonProcess) -> dict[float, float]:
    """The start lag's cumulative buckets over every job."""
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(daemon.scrape()):
        for s in family.samples:
            if s.name == "leakprobe_job_start_lag_seconds_bucket":
                bound = float(s.labels["le"])
                out[bound] = out.get(bound, 0.0) + s.value
    return out


def fleet_of(count: int, folder: Path) -> dict[str, float]:
    engines = []
    try:
        for n in range(max(1, count // TARGETS_PER_ENGINE)):
            (folder / f"engine-{n}.yaml").write_text(yaml.safe_dump(SMALL_ENGINE))
            engine = subprocess.Popen([sys.executable, "-m", "prober", "testbed", "serve", "--port", "0", "--config",
                                       str(folder / f"engine-{n}.yaml")], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)
            engines.append(engine)
        urls = [e.stdout.readline().strip() for e in engines if e.stdout is not None]
        off = {check.name: "off" for check in REGISTRY if check.name not in FLEET_SCHEDULE}
        config = {"ledger": str(folder / f"ledger-{count}.sqlite"),
                  "targets": [{"name": f"t{i:02d}", "url": urls[i % len(urls)], "timeout_s": 60, "retries": 0}
                              for i in range(count)],
                  "tenants": [{"name": "tenant-a", "api_key_env": "LP_A"},
                              {"name": "tenant-b", "api_key_env": "LP_B"}],
                  "daemon": {"listen": "127.0.0.1:0", "tokens_per_day": 10**10,
                             "schedule": {**off, **FLEET_SCHEDULE}}}
        with DaemonProcess(config, folder, name=f"fleet-{count}") as daemon:
            assert daemon.proc is not None
            time.sleep(60)
            before, rss_before = lag_buckets(daemon), proc_stats(daemon.proc.pid)["rss_mib"]
            cpu, wall = cpu_seconds(daemon.proc.pid), time.monotonic()
            polled = latencies(daemon.url, 120, pause=1.0)  # a scrape a second: Prometheus's is 15 s or more
            after, rss = lag_buckets(daemon), proc_stats(daemon.proc.pid)["rss_mib"]
            busy = (cpu_seconds(daemon.proc.pid) - cpu) / (time.monotonic() - wall)
            size = len(daemon.scrape())
            runs = daemon.sample("leakprobe_job_runs_total")
            late = daemon.sample("leakprobe_job_skips_total", reason="busy") + daemon.sample(
                "leakprobe_job_skips_total", reason="missed")
            failures = daemon.sample("leakprobe_job_failures_total")
            assert daemon.stop() == 0
        window = {bound: after[bound] - before.get(bound, 0.0) for bound in after}
        ordered = sorted(polled)
        return {"targets": count, "rss_mib": rss, "rss_warm_mib": rss_before, "runs": runs, "failures": failures,
                "not_handed_over": late, "daemon_cpu": busy,
                "lag_p50_s": lag_quantile(window, 0.5), "lag_p99_s": lag_quantile(window, 0.99),
                "handed_over": window.get(float("inf"), 0.0),
                "metrics_median_ms": statistics.median(ordered),
                "metrics_p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
                "metrics_kib": size / 1024}
    finally:
        for engine in engines:
            engine.terminate()
            engine.wait()


def fleet(counts: list[int]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="leakprobe-fleet-"))
    rows = [fleet_of(count, folder) for count in counts]
    print("targets  RSS MiB  per target  daemon CPU  runs  failed  busy/missed  lag p50 s  lag p99 s  "
          "/metrics ms (median, p99)  /metrics KiB")
    for row in rows:
        per = (row["rss_mib"] - rows[0]["rss_mib"]) / (row["targets"] - rows[0]["targets"]) if row is not rows[0] \
            else 0.0
        print(f"{row['targets']:>7}  {row['rss_mib']:>7.1f}  {per:>10.2f}  {row['daemon_cpu']:>10.0%}"
              f"  {row['runs']:>4.0f}  {row['failures']:>6.0f}"
              f"  {row['not_handed_over']:>11.0f}  {row['lag_p50_s']:>9.3f}  {row['lag_p99_s']:>9.3f}"
              f"  {row['metrics_median_ms']:>12.1f}, "
              f"{row['metrics_p99_ms']:.1f}  {row['metrics_kib']:>12.1f}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the clean-up: stop the daemon and the engine
    os.environ.setdefault("LP_A", "testbed-key-a")
    os.environ.setdefault("LP_B", "testbed-key-b")
    if len(sys.argv) > 1 and sys.argv[1] == "fleet":
        fleet([int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "1,10,50").split(",")])
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
