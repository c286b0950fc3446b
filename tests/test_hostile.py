"""Hostile targets and hostile input: no secret leaves, no traceback, no endless audit, no false "clean"."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from prober.canaries.keys import resolve_key
from prober.canaries.tokens import verify
from prober.domain.errors import LedgerError
from prober.ledger import open_ledger
from prober.probing.path import MEASUREMENTS
from prober.targets.bounds import Size
from prober.targets.transport import KEEPALIVE_EXPIRY_S
from tests.support.hostile import (
    LATE_S,
    assert_cut_in_time,
    assert_no_key,
    compressed_answer,
    declared_but_stalled,
    echoing_every_status,
    endless_json,
    endless_stream,
    flooding_stream,
    gzip_of_zeros,
    hostile_engine,
    huge_first_answer,
    hung_up,
    implausible_usage,
    keepalive_only,
    refusing_everything,
    trickling_body,
)
from tests.support.testbed import SMALL, StartTestbed

KEYS = {"LP_A": "sk-tenant-alpha-7f3a9c21d0", "LP_B": "sk-tenant-bravo-42be8e5571"}
TENANTS = ["--tenant", "tenant-a=LP_A", "--tenant", "tenant-b=LP_B"]
FORMATS = ["table", "json", "sarif", "junit", "html"]

TIMEOUT_S = 2  # each hostile target's: the idle timeout, and (under 30 s) what an answer may take beyond max_tokens
MAX_TOKENS = 8
ANSWER_S = Size(max_tokens=MAX_TOKENS).answer_s(TIMEOUT_S)  # 2 s plus max_tokens 8 at 10 a second
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "tokenize": "/v1/tokenize",
         "metrics": "/metrics", "server_info": "/server_info", "models": "/v1/models"}
# Room for the survey's measurement of the path (one-token requests, each tenant's, cut at their bound when nothing
# answers) and a first control cut at its own, with 20 s to spare for the survey's own work on a busy machine.
AUDIT_DEADLINE_S = round(len(KEYS) * MEASUREMENTS * Size(max_tokens=1).answer_s(TIMEOUT_S) + ANSWER_S + 20)
DEADLINE_PASSED = "the audit's deadline passed"


# VmHWM: the peak resident memory of this program image (ru_maxrss may carry the forking parent's).
PEAK = """import atexit, os, re, runpy, sys
def peak():
    status = open("/proc/self/status").read()
    open(os.environ["LP_PEAK_FILE"], "w").write(re.search(r"VmHWM:\\s+(\\d+)", status).group(1))
atexit.register(peak)
sys.argv[0] = "leakprobe"
runpy.run_module("prober", run_name="__main__")
"""


def leakprobe(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prober", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **KEYS, **(env or {})})


def measured(tmp_path: Path, *args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run leakprobe and return its own peak resident memory in MiB."""
    peak = tmp_path / "peak"
    run = subprocess.run([sys.executable, "-c", PEAK, *args], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **KEYS, "LP_PEAK_FILE": str(peak)})
    return run, int(peak.read_text()) / 1024


def assert_clean(where: str, text: str | bytes) -> None:
    assert_no_key(where, text, list(KEYS.values()))


def one_line_error(run: subprocess.CompletedProcess[str]) -> None:
    assert run.returncode == 2, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_keys_echoed_in_every_encoding_reach_no_output_log_or_ledger_byte(tmp_path: Path) -> None:
    """The engine echoes each caller's key in every encoding (tests/support/hostile.py ENCODERS) in 200, 400, 401 and
    500 bodies, in headers, model ids and server_info: no form of any key in any report format, log line,
    preflight output or ledger byte."""
    config = tmp_path / "c.yaml"
    with hostile_engine(chat=echoing_every_status()) as engine:
        config.write_text(f"targets:\n  - {{name: echo, url: '{engine.url}/v1', retries: 0}}\ntenants:\n"
                          "  - {name: tenant-a, api_key_env: LP_A}\n  - {name: tenant-b, api_key_env: LP_B}\n"
                          f"ledger: {tmp_path / 'l.sqlite'}\naudit: {{concurrent: false}}\n")
        files = {fmt: tmp_path / f"report.{fmt}" for fmt in FORMATS if fmt != "table"}
        run = leakprobe("audit", "--config", str(config), *(f"--report={fmt}={path}" for fmt, path in files.items()))
        assert run.returncode == 2, run.stderr[-3000:]  # 400s where prompts fit, 401s, 500s: not observed
        reports = {fmt: path.read_text() for fmt, path in files.items()}
        outputs = [("table", run.stdout + run.stderr), *reports.items()]
        preflight = leakprobe("preflight", "--target", engine.url + "/v1", *TENANTS, "--format", "json")
        outputs.append(("preflight", preflight.stdout + preflight.stderr))
        statuses = {r.path for r in engine.seen}
    assert "/v1/chat/completions" in statuses and "/server_info" in statuses
    for where, text in outputs:
        assert_clean(where, text)
    doc = json.loads(reports["json"])
    outcomes = {s["outcome"] for s in doc["targets"][0]["steps"]}
    assert {"served", "refused", "server_error", "unauthorized"} <= outcomes, outcomes
    assert "[redacted key of tenant-" in reports["json"]  # the echo arrived, and was replaced, not masked
    for path in tmp_path.glob("l.sqlite*"):
        assert_clean(path.name, path.read_bytes())


def test_every_canary_belongs_to_the_tenant_whose_key_sent_it(tmp_path: Path) -> None:
    with hostile_engine() as engine:
        ledger = tmp_path / "l.sqlite"
        run = leakprobe("audit", "--target", engine.url + "/v1", *TENANTS, "--ledger", str(ledger), "-f", "json",
                        "--no-concurrent")
        # It echoes a prompt's first line: the short controls' canaries come back, no probe's (blind); and it serves
        # an image named by another tenant's uuid alone (the media check's boundary_accepted): an engine fault, exit 1,
        # the blindness still among the reasons.
        verdict = json.loads(run.stdout)["verdict"]
        assert run.returncode == 1 and verdict["status"] == "engine_fault", (verdict, run.stderr[-3000:])
        assert any("blind" in reason for reason in verdict["reasons"]), verdict["reasons"]
        seen = list(engine.seen)
    store = open_ledger(ledger)
    key = resolve_key(store)
    owner = {f"Bearer {KEYS['LP_A']}": "tenant-a", f"Bearer {KEYS['LP_B']}": "tenant-b"}
    checked = 0
    for request in seen:
        if request.path != "/v1/chat/completions":
            continue
        tenant = owner[request.headers["authorization"]]
        for token in re.findall(r"LPK(?:-[0-9A-Z]{8}){4}", request.body.decode()):
            verified = verify(key, token.replace("-", "")[3:], ["tenant-a", "tenant-b"])
            assert verified is not None and verified.tenant == tenant
            checked += 1
    store.close()
    assert checked > 10


def test_a_password_in_the_url_is_refused_and_never_printed(tmp_path: Path) -> None:
    with hostile_engine() as engine:
        port = engine.url.rsplit(":", 1)[1]
        for command in ("audit", "preflight"):
            run = leakprobe(command, "--target", f"http://spy:secretpw@127.0.0.1:{port}/v1", *TENANTS,
                            *(["--ledger", str(tmp_path / "l.sqlite")] if command == "audit" else []))
            one_line_error(run)
            assert "secretpw" not in run.stdout + run.stderr and "user info" in run.stderr
        config = tmp_path / "c.yaml"
        config.write_text(f"targets:\n  - name: t\n    url: http://spy:secretpw@127.0.0.1:{port}/v1\ntenants:\n"
                          "  - {name: a, api_key_env: LP_A}\n  - {name: b, api_key_env: LP_B}\n")
        daemon = leakprobe("daemon", "--config", str(config), "--check-config")
        one_line_error(daemon)
        assert "secretpw" not in daemon.stderr
        assert not engine.seen  # nothing was sent anywhere


def test_tenants_sharing_one_key_are_an_error(tmp_path: Path) -> None:
    with hostile_engine() as engine:
        run = leakprobe("audit", "--target", engine.url + "/v1", "--tenant", "a=LP_A", "--tenant", "b=LP_A",
                        "--ledger", str(tmp_path / "l.sqlite"))
        one_line_error(run)
        assert "same key" in run.stderr


@pytest.mark.slow
@pytest.mark.parametrize("route", [endless_stream, trickling_body], ids=["endless-stream", "trickling-body"])
def test_a_request_that_never_ends_stops_at_the_deadline(tmp_path: Path, route: Any) -> None:
    """`deadline_s` 1: each request to a route whose answer never ends is cut a second after it began, by the
    report's clock and by the engine's (which sees the client hang up); the survey's measurement of the path and the
    steps after it, none more."""
    with hostile_engine(chat=route) as engine:
        config = tmp_path / "c.yaml"
        config.write_text(f"targets:\n  - name: slow\n    url: {engine.url}/v1\n    timeout_s: 5\n    retries: 0\n"
                          f"    deadline_s: 1\ntenants:\n  - {{name: a, api_key_env: LP_A}}\n"
                          f"  - {{name: b, api_key_env: LP_B}}\nledger: {tmp_path / 'l.sqlite'}\n")
        run = leakprobe("audit", "--config", str(config), "-f", "json", "--streaming", "stream", timeout=600)
        cut = hung_up([r for r in engine.seen if r.path == PATHS["chat"]])
    assert run.returncode == 2, run.stderr[-2000:]
    doc = json.loads(run.stdout)
    steps = doc["targets"][0]["steps"]
    assert steps and all(s["outcome"] == "timeout" and "deadline" in s["error"] for s in steps), (
        doc["targets"][0]["errors"], run.stderr[-3000:])
    assert max(s["total_s"] for s in steps) < 1 + LATE_S
    assert max(r.held_s or 0 for r in cut) < 1 + LATE_S, [r.held_s for r in cut]
    assert len(cut) <= len(KEYS) * MEASUREMENTS + len(steps), len(cut)


def test_a_huge_answer_is_cut_as_soon_as_it_is_over_and_reported_in_seconds(tmp_path: Path) -> None:
    """A 30 MiB answer, its length not declared, to the first request (the probe-shape control, max_tokens 64):
    cut once it holds more bytes than 64 tokens can take, what arrived scanned, the report written."""
    with hostile_engine(chat=huge_first_answer(30 * 1024 * 1024)) as engine:
        started = time.monotonic()
        run, peak_mib = measured(tmp_path, "audit", "--target", engine.url + "/v1", *TENANTS, "--ledger",
                                 str(tmp_path / "l.sqlite"), "-f", "html", "-o", str(tmp_path / "r.html"),
                                 f"--report=json={tmp_path / 'r.json'}", "--no-concurrent", "--skip=timing",
                                 "--skip=crosstalk", "--skip=request-ids", "--skip=abort-retry",
                                 "--skip=media-cache", "--skip=response-cache",
                                 "--skip=semantic-cache")  # the campaign's answers
        elapsed = time.monotonic() - started
    # Its answers never repeat a canary (it echoes the first line of a prompt): blind, exit 2, report written.
    assert run.returncode == 2 and "audit was blind" in run.stderr, run.stderr[-2000:]
    first = json.loads((tmp_path / "r.json").read_text())["targets"][0]["steps"][0]
    assert first["outcome"] == "too_large" and "bytes a request of" in first["error"], first
    # Measured 216-218 MiB, the embedding model's ~90 included, in 6 s; read whole and scanned, it took 295 MiB.
    assert peak_mib < 250, f"peak {peak_mib:.0f} MiB"
    assert elapsed < 120 and (tmp_path / "r.html").stat().st_size < 2_000_000


@pytest.mark.parametrize("args", [
    ["audit", "--target", "http://[::1", "--tenant", "a=LP_A", "--tenant", "b=LP_B"],
    ["audit", "--target", "http://127.0.0.1:99999/v1", "--tenant", "a=LP_A", "--tenant", "b=LP_B"],
    ["preflight", "--target", "http://[::1"],
    ["preflight", "--target", "http://127.0.0.1:0/v1"],
], ids=["audit-bad-url", "audit-bad-port", "preflight-bad-url", "preflight-port-0"])
def test_bad_urls_are_one_line_errors(args: list[str], tmp_path: Path) -> None:
    one_line_error(leakprobe(*args))


@pytest.mark.slow
def test_nul_bytes_and_deep_nesting_are_one_line_errors(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("targets: " + "[" * 5000 + "]" * 5000 + "\n")
    nul_ledger = tmp_path / "nul.yaml"
    nul_ledger.write_text('targets:\n  - {name: t, url: "http://127.0.0.1:9/v1"}\nledger: "a\\0b.sqlite"\n'
                          "tenants:\n  - {name: a, api_key_env: LP_A}\n  - {name: b, api_key_env: LP_B}\n")
    nul_key = tmp_path / "nulkey.yaml"
    nul_key.write_text('targets:\n  - {name: t, url: "http://127.0.0.1:9/v1"}\n'
                       'tenants:\n  - {name: a, api_key_file: "/run/a\\0b"}\n  - {name: b, api_key_env: LP_B}\n')
    for args in (["audit", "--config", str(deep)], ["preflight", "--config", str(deep)],
                 ["daemon", "--config", str(deep), "--check-config"], ["testbed", "serve", "--config", str(deep)],
                 ["audit", "--config", str(nul_ledger)], ["daemon", "--config", str(nul_ledger), "--check-config"],
                 ["audit", "--config", str(nul_key)]):
        one_line_error(leakprobe(*args))


def _ledger_with_canary(tmp_path: Path) -> tuple[Path, str]:
    ledger = tmp_path / "l.sqlite"
    run = leakprobe("canaries", "mint", "--ledger", str(ledger), "--tenant", "tenant-a", "--format", "json")
    return ledger, json.loads(run.stdout)[0]["text"]


def test_scan_never_reads_past_what_it_could_not_read(tmp_path: Path) -> None:
    ledger, canary = _ledger_with_canary(tmp_path)
    nested = tmp_path / "nested.jsonl"
    nested.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    run = leakprobe("scan", str(nested), "--ledger", str(ledger), "--no-semantic")
    assert run.returncode == 2 and "Traceback" not in run.stderr and "nested too deeply" in run.stderr
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n{\"id\": 1}\n")
    run = leakprobe("scan", str(garbage), "--ledger", str(ledger), "--no-semantic")
    assert run.returncode == 2 and "0 records scanned, 2 lines skipped" in run.stderr
    # A record over the size cap that holds a leak: read in bounded memory, and the scan is not clean.
    huge = tmp_path / "huge.jsonl"
    with huge.open("w") as out:
        out.write(json.dumps({"id": "ok", "tenant": "tenant-b", "text": "nothing here"}) + "\n")
        out.write('{"id": "big", "tenant": "tenant-b", "text": "' + "x" * (80 * 1024 * 1024) + f' {canary}"}}\n')
    run, peak = measured(tmp_path, "scan", str(huge), "--ledger", str(ledger), "--no-semantic", "--format", "json")
    assert run.returncode == 2 and "too large to read" in run.stderr
    assert json.loads(run.stdout)["oversized"] == 1 and json.loads(run.stdout)["scanned"] == 1
    assert peak < 200, f"peak {peak:.0f} MiB for an 80 MiB line"
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps({"id": "leak", "tenant": "tenant-b", "text": f"it said {canary}"}) + "\nbroken\n")
    lenient = leakprobe("scan", str(mixed), "--ledger", str(ledger), "--no-semantic")
    assert lenient.returncode == 1 and "1 lines skipped" in lenient.stderr
    assert leakprobe("scan", str(mixed), "--ledger", str(ledger), "--no-semantic", "--strict").returncode == 2


def test_a_refused_foreign_sqlite_file_is_left_untouched(tmp_path: Path) -> None:
    foreign = tmp_path / "app.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE customers (name TEXT)")
        db.execute("INSERT INTO customers VALUES ('Ada')")
    db.close()
    digest = hashlib.sha256(foreign.read_bytes()).hexdigest()
    with pytest.raises(LedgerError, match="another program"):
        open_ledger(foreign)
    run = leakprobe("scan", "-", "--ledger", str(foreign))
    assert run.returncode == 2
    assert hashlib.sha256(foreign.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # no -wal, no -shm


def test_reference_engine_refuses_deep_json(testbed: StartTestbed) -> None:
    server = testbed("healthy", **SMALL)
    nested = '{"messages": ' + "[" * 50_000 + "]" * 50_000 + "}"
    answer = httpx.post(server.url + "/v1/chat/completions", content=nested,
                        headers={"Authorization": "Bearer testbed-key-a", "Content-Type": "application/json"})
    assert answer.status_code == 400 and "nested too deeply" in answer.text


@pytest.mark.slow
def test_reference_engine_memory_stays_on_a_plateau_over_bursts() -> None:
    """Bursts of long prompts from 16 connections: resident memory after the last burst stays within 40 MiB
    of where it was after the first (it used to grow ~10 MiB a burst, without end)."""
    engine = subprocess.Popen([sys.executable, "-m", "prober", "testbed", "serve", "--preset", "healthy", "--port",
                               "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert engine.stdout is not None
        url = engine.stdout.readline().strip()
        words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike " * 1500
        headers = {"Authorization": "Bearer testbed-key-a"}

        def rss() -> int:
            status = Path(f"/proc/{engine.pid}/status").read_text()
            return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) // 1024  # type: ignore[union-attr]

        after = []
        # A connection left idle at the end of a burst is dropped before the engine's 5 s keep-alive timeout drops it,
        # as leakprobe's transport does: at 5 s both, a busy machine's engine could close one just as a request went
        # out on it ("Server disconnected without sending a response").
        with httpx.Client(timeout=120, limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)) as client:
            from concurrent.futures import ThreadPoolExecutor

            def one(i: int) -> None:
                client.post(url + "/chat/completions", headers=headers, json={
                    "messages": [{"role": "user", "content": f"Quote the document {i}.\n{words}"}],
                    "max_tokens": 32}).raise_for_status()

            with ThreadPoolExecutor(16) as pool:
                for _ in range(6):
                    list(pool.map(one, range(120)))
                    after.append(rss())
    finally:
        engine.terminate()
        engine.wait()
        if engine.stdout is not None:
            engine.stdout.close()
    assert after[-1] - after[0] <= 40, after


# -- decompression and declared lengths under the byte cap ------------------------------------------------
BOMB = 4 * 1024**3  # what the 6.8 KB `gzip, gzip` body inflates to


@pytest.mark.parametrize(("encoding", "layers", "outcome", "flags"), [
    ("gzip, gzip", 2, "malformed", []),  # a stack is refused before a byte is decoded
    # Decoded a bounded step at a time, until the cap: what max_tokens allows (a few hundred KiB here; up to
    # max_body_bytes, 64 MiB, per request in flight), so the embedding model (~90 MiB, nothing to do with
    # decoding) is left out.
    ("gzip", 1, "too_large", ["--no-semantic"]),
], ids=["double-gzip", "gzip"])
def test_a_compression_bomb_stays_under_the_byte_cap(tmp_path: Path, encoding: str, layers: int,
                                                     outcome: str, flags: list[str]) -> None:
    body = gzip_of_zeros(BOMB)
    if layers == 2:
        body = gzip.compress(body)
    with hostile_engine(chat=compressed_answer(body, encoding)) as engine:
        run, peak_mib = measured(tmp_path, "audit", "--target", engine.url + "/v1", *TENANTS, "--ledger",
                                 str(tmp_path / "l.sqlite"), "-f", "json", *flags)
    assert run.returncode == 2, run.stderr[-2000:]
    steps = json.loads(run.stdout)["targets"][0]["steps"]
    assert steps and {s["outcome"] for s in steps} == {outcome}, steps[0]
    # Measured 294.8-296.5 MiB (the runtime, the detectors' indexes and a few copies of the 30 MiB body), once
    # 300.04 in two busy workers; a copy per window or per detector would be gigabytes.
    assert peak_mib < 320, f"peak {peak_mib:.0f} MiB"


# A subprocess that sends 40 requests at once (the daemon's 40 targets) to a server that declares a body just
# under the cap and then stalls: a buffer sized from the declared length would hold 40 x 64 MiB.
DECLARED = """import asyncio, sys
from prober.targets.transport import Transport, TransportPolicy
async def main():
    async with Transport(TransportPolicy(deadline_s=3, retries=0)) as transport:
        done = await asyncio.gather(*(transport.exchange("POST", sys.argv[1], json={}) for _ in range(40)))
    kinds = {e.error.kind.value if e.error else "served" for e in done}
    assert kinds <= {"timeout", "connect", "truncated"}, kinds  # none got a body; a full listen queue refuses some
asyncio.run(main())
"""


def test_a_declared_length_allocates_nothing(tmp_path: Path) -> None:
    with hostile_engine(chat=declared_but_stalled(64 * 1024 * 1024 - 1)) as engine:
        peak = tmp_path / "peak"
        run = subprocess.run([sys.executable, "-c", PEAK.replace('runpy.run_module("prober", run_name="__main__")',
                                                                 DECLARED), engine.url + "/v1/chat/completions"],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "LP_PEAK_FILE": str(peak)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert int(peak.read_text()) / 1024 < 300, f"peak {int(peak.read_text()) / 1024:.0f} MiB"


# -- no false "clean", bounded audits, implausible usage ------------------------------------------------------
def _config(tmp_path: Path, url: str, target: str = "", audit: str = "", more: str = "") -> Path:
    config = tmp_path / "c.yaml"
    config.write_text(f"targets:\n  - {{name: t, url: '{url}/v1'{target}}}\ntenants:\n"
                      "  - {name: tenant-a, api_key_env: LP_A}\n  - {name: tenant-b, api_key_env: LP_B}\n"
                      f"ledger: {tmp_path / 'l.sqlite'}\naudit: {{{audit}}}\n{more}")
    return config


def test_a_target_that_refuses_every_prompt_is_incomplete_not_clean(tmp_path: Path) -> None:
    """A wrong model name or a WAF: every prompt gets a 400.  That is no observation of isolation: exit 2,
    verdict incomplete, with the reason; the breaker stops it after `breaker` refusals in a row."""
    with hostile_engine(chat=refusing_everything) as engine:
        run = leakprobe("audit", "--config", str(_config(tmp_path, engine.url, ", breaker: 4")), "-f", "json",
                        "--no-semantic")
    assert run.returncode == 2, run.stderr[-2000:]
    doc = json.loads(run.stdout)
    assert doc["verdict"]["status"] == "incomplete" and not doc["complete"]
    (reason,) = doc["verdict"]["reasons"]
    assert "0 of 31 planned requests observed (4 refused at lengths the capacity says fit, 27 not sent)" in reason
    assert "check the model name" in reason
    target = doc["targets"][0]
    assert target["coverage"] == {"planned": 31, "sent": 4, "observed": 0, "unobserved": {"refused": 4}}
    assert any("circuit breaker: 4 answers in a row" in e for e in target["errors"])


@pytest.mark.slow
@pytest.mark.parametrize(("route", "target", "audit", "why"), [
    (keepalive_only, ", deadline_s: 3", "", "nothing but keep-alives for 2 s"),
    (endless_stream, ", breaker: 100", f", max_tokens: {MAX_TOKENS}", "answer still arriving"),
    (flooding_stream, ", deadline_s: 3", "", "far more than was asked for"),
], ids=["keep-alive-only", "one-token-a-second", "flood"])
def test_streams_that_never_answer_end_the_audit_within_its_deadline(tmp_path: Path, route: Any, target: str,
                                                                     audit: str, why: str) -> None:
    """Keep-alives only: a stream with no event for `timeout_s` (2 s) is unobservable, though bytes keep coming.
    One token a second, with the default `deadline_s` (1,200 s) and a breaker that never trips: the request's own
    bound ends each answer, and the audit's total deadline the audit.  A flood: far more pieces than max_tokens.
    The breaker stops the others after 6 unobservable answers.  Each request ends for its own reason or at the
    audit's deadline, the engine sees none go on past its bound, and the audit ends within its deadline by the
    report's own clock: the time leakprobe takes to start and to write its report is no part of it."""
    with hostile_engine(chat=route) as engine:
        config = _config(tmp_path, engine.url, f", timeout_s: {TIMEOUT_S}, retries: 0{target}",
                         f"deadline: {AUDIT_DEADLINE_S}s{audit}")
        run = leakprobe("audit", "--config", str(config), "-f", "json", "--streaming", "stream", "--no-semantic")
        cut = [r for r in engine.seen if r.path == PATHS["chat"]]
        assert_cut_in_time(cut, TIMEOUT_S)
    assert run.returncode == 2, run.stderr[-2000:]
    doc = json.loads(run.stdout)
    report = doc["targets"][0]
    assert doc["verdict"]["status"] == "incomplete" and report["coverage"]["observed"] == 0
    errors = [s["error"] or "" for s in report["steps"]]
    assert any(why in e for e in errors) and all(why in e or DEADLINE_PASSED in e for e in errors), errors
    if route is endless_stream:
        assert any(DEADLINE_PASSED in e for e in errors + report["errors"]), report["errors"]
    assert doc["finished"] - doc["started"] < AUDIT_DEADLINE_S + LATE_S, doc["finished"] - doc["started"]


def test_implausible_usage_is_flagged_not_trusted(tmp_path: Path) -> None:
    for usage in (10**30, -5):
        with hostile_engine(chat=implausible_usage(usage)) as engine:
            # No timing check: this engine streams nothing, and the check would have no TTFT to compare.
            config = _config(tmp_path, engine.url, more="timing: {audit: false}\n")
            run = leakprobe("audit", "--config", str(config), "-f", "json", "--no-semantic", "--streaming", "plain")
        # It never repeats a canary (blind), and it answers an image named by a uuid alone (an engine fault, which
        # outranks blind: what was seen stays seen).
        assert run.returncode == 1, run.stderr[-2000:]
        doc = json.loads(run.stdout)
        assert doc["verdict"]["status"] == "engine_fault" and any(" blind: " in r for r in doc["verdict"]["reasons"])
        flagged = [f for f in doc["findings"] if f["kind"] == "implausible_usage"]
        assert flagged and all(f["severity"] == "warning" for f in flagged)
        assert not any(f["kind"] == "placeholder_substitution" for f in doc["findings"])
        assert all(s["usage_prompt_tokens"] is None for s in doc["targets"][0]["steps"])


# -- answers that never end, on every route -------------------------------------------------------------------
# Each target answers at once and never finishes: server-sent events a chunk a second (also to a plain request),
# JSON a piece a second with no newline and no end (also to a stream request), or keep-alive comments only.
NEVER_ENDING = {"sse": endless_stream, "json": endless_json, "keep-alive": keepalive_only}
# A plan's first two exchanges (the prefix-cache check) are plain: a breaker of 5 lets the third's three
# streamed requests go out, one of 3 stops after the control and four plain requests.
BREAKER = {"plain": 3, "stream": 5}


@pytest.mark.slow
@pytest.mark.parametrize(("route", "body", "streaming"), [
    *[("chat", body, streaming) for body in NEVER_ENDING for streaming in ("plain", "stream")],
    ("completions", "sse", "plain"), ("completions", "json", "stream"),
    ("tokenize", "json", "plain"), ("tokenize", "sse", "plain"), ("metrics", "sse", "plain"),
    ("server_info", "json", "plain"), ("models", "keep-alive", "plain"),
])
def test_an_answer_that_never_ends_is_cut_on_every_route(tmp_path: Path, route: str, body: str,
                                                         streaming: str) -> None:
    """Whatever the route, the stream flag and the content type, each request ends within its own bound: its
    first byte comes at once, and the rest may take `timeout_s` (2 s) plus max_tokens at 10 a second.  The
    shape choice stops at its first unanswered control, the breaker after `breaker` unobservable answers, so
    the audit ends, exit 2, within the documented bound (docs/security.md): the survey's cut requests (on a
    generation route, the path's measurement) and at most breaker + 3 requests, each cut within its bound, as the
    engine saw it; the time leakprobe takes to start and to write its report on a busy machine is no part of it.
    On a generation route every request sent is cut, the finding says so and keeps what arrived; elsewhere the
    audit goes on without what the route would have said."""
    api = "completions" if route == "completions" else "chat"
    hostile = {"chat": NEVER_ENDING[body]} if route == "chat" else {route: NEVER_ENDING[body]}
    breaker = BREAKER[streaming]
    with hostile_engine(**hostile) as engine:
        config = _config(tmp_path, engine.url,
                         f", api: {api}, timeout_s: {TIMEOUT_S}, retries: 0, breaker: {breaker}",
                         f"max_tokens: {MAX_TOKENS}, streaming: {streaming}")
        # The campaign's answers alone: the other checks' requests would only be cut the same way (and the media
        # check finds this echo engine's own faults: it serves an image named by a uuid alone).
        run = leakprobe("audit", "--config", str(config), "-f", "json", "--no-semantic", "--skip=timing",
                        "--skip=crosstalk", "--skip=request-ids", "--skip=abort-retry", "--skip=media-cache",
                        "--skip=response-cache", "--skip=semantic-cache")
        cut = [r for r in engine.seen if r.path == PATHS[route]]
        assert_cut_in_time(cut, TIMEOUT_S)
        paths = {r.path for r in engine.seen}
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    doc = json.loads(run.stdout)
    target = doc["targets"][0]
    steps = target["steps"]
    if route in ("chat", "completions"):
        assert steps and len(steps) <= 1 + breaker + 2, len(steps)  # one control, then the breaker
        assert len(cut) <= len(KEYS) * MEASUREMENTS + len(steps), len(cut)  # the path measured per tenant, the steps
        assert any(s["stream"] for s in steps) == (streaming == "stream")
        assert all(s["outcome"] in ("timeout", "too_large", "malformed") for s in steps), steps[0]
        assert all(s["total_s"] < ANSWER_S + LATE_S for s in steps), [s["total_s"] for s in steps]
        cut_findings = [f for f in doc["findings"] if f["kind"] in ("engine_error", "stream_error")]
        envelopes = [d for f in cut_findings for d in f["details"] if d["type"] == "envelope"]
        # A request the engine gave no status line within timeout_s (a loaded machine's scheduling) timed out
        # before it could be cut: no envelope to report.
        answered = [s for s in steps if s["status"] is not None]
        assert answered and len(cut_findings) == len(envelopes) == len(answered), (
            cut_findings, [(s["id"], s["status"], s["outcome"], s["error"]) for s in steps])
        assert all(e["cut"] in ("deadline", "keepalive") for e in envelopes), cut_findings
        if body != "keep-alive":
            assert all(e["arrived_chars"] > 0 for e in envelopes)  # what arrived was kept, and scanned
    else:
        assert PATHS[route] in paths, paths
        assert len(cut) <= 3, len(cut)  # the survey's, cut in turn
        if route == "tokenize":
            assert target["tokenizer"].startswith("usage"), target["tokenizer"]  # calibrated instead
        if route in ("server_info", "models"):
            notes = target["capacity"]["notes"]
            assert any(f"GET {PATHS[route]} did not answer" in n and "answer still arriving" in n for n in notes), notes
