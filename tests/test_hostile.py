"""Hostile targets and hostile input: no secret leaves, no traceback, no endless audit, no false "clean"."""

from __future__ import annotations

import base64
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
from prober.errors import LedgerError
from prober.ledger import open_ledger
from tests.conftest import SMALL, StartTestbed
from tests.hostile import endless_stream, hostile_engine, huge_first_answer, trickling_body

KEYS = {"LP_A": "sk-tenant-alpha-7f3a9c21d0", "LP_B": "sk-tenant-bravo-42be8e5571"}
TENANTS = ["--tenant", "tenant-a=LP_A", "--tenant", "tenant-b=LP_B"]
FORMATS = ["table", "json", "sarif", "junit", "html"]


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


def secret_forms(secret: str) -> list[str]:
    raw = secret.encode()
    return [secret, base64.b64encode(raw).decode().rstrip("="), secret[4:]]  # the key, its base64, its body


def assert_clean(where: str, text: str | bytes) -> None:
    data = text if isinstance(text, bytes) else text.encode()
    for secret in KEYS.values():
        for form in secret_forms(secret):
            assert form.encode() not in data, f"{form!r} found in {where}"


def one_line_error(run: subprocess.CompletedProcess[str]) -> None:
    assert run.returncode == 2, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_echoed_keys_reach_no_output_log_or_ledger_byte(tmp_path: Path) -> None:
    with hostile_engine() as engine:
        ledger = tmp_path / "l.sqlite"
        outputs = []
        for fmt in FORMATS:
            run = leakprobe("audit", "--target", engine.url + "/v1", *TENANTS, "--ledger", str(ledger), "-f", fmt,
                            "--no-concurrent")
            assert run.returncode in (0, 1), run.stderr[-3000:]
            outputs.append((fmt, run.stdout + run.stderr))
        preflight = leakprobe("preflight", "--target", engine.url + "/v1", *TENANTS, "--format", "json")
        outputs.append(("preflight", preflight.stdout + preflight.stderr))
        seen = list(engine.seen)
    for where, text in outputs:
        assert_clean(where, text)
    assert "[redacted key of tenant-" in dict(outputs)["json"]  # the echo arrived, and was replaced, not masked
    for path in tmp_path.glob("l.sqlite*"):
        assert_clean(path.name, path.read_bytes())
    # Each tenant's requests carried that tenant's key: the canaries in every prompt belong to its sender.
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


@pytest.mark.parametrize("route", [endless_stream, trickling_body], ids=["endless-stream", "trickling-body"])
def test_a_request_that_never_ends_stops_at_the_deadline(tmp_path: Path, route: Any) -> None:
    with hostile_engine(chat=route) as engine:
        config = tmp_path / "c.yaml"
        config.write_text(f"targets:\n  - name: slow\n    url: {engine.url}/v1\n    timeout_s: 5\n    retries: 0\n"
                          f"    deadline_s: 1\ntenants:\n  - {{name: a, api_key_env: LP_A}}\n"
                          f"  - {{name: b, api_key_env: LP_B}}\nledger: {tmp_path / 'l.sqlite'}\n")
        started = time.monotonic()
        run = leakprobe("audit", "--config", str(config), "-f", "json", "--streaming", "stream", timeout=600)
        elapsed = time.monotonic() - started
    assert run.returncode == 2, run.stderr[-2000:]
    doc = json.loads(run.stdout)
    steps = doc["targets"][0]["steps"]
    assert steps and all(s["outcome"] == "timeout" and "deadline" in s["error"] for s in steps)
    assert max(s["total_s"] for s in steps) < 1 + 1.5
    assert elapsed < 1.5 * len(steps) + 30


def test_a_huge_answer_is_scanned_in_bounded_memory_and_reported_in_seconds(tmp_path: Path) -> None:
    with hostile_engine(chat=huge_first_answer(30 * 1024 * 1024)) as engine:
        started = time.monotonic()
        run, peak_mib = measured(tmp_path, "audit", "--target", engine.url + "/v1", *TENANTS, "--ledger",
                                 str(tmp_path / "l.sqlite"), "-f", "html", "-o", str(tmp_path / "r.html"),
                                 "--no-concurrent")
        elapsed = time.monotonic() - started
    assert run.returncode in (0, 1), run.stderr[-2000:]
    assert peak_mib < 300, f"peak {peak_mib:.0f} MiB"
    assert elapsed < 120 and (tmp_path / "r.html").stat().st_size < 2_000_000


@pytest.mark.parametrize("args", [
    ["audit", "--target", "http://[::1", "--tenant", "a=LP_A", "--tenant", "b=LP_B"],
    ["audit", "--target", "http://127.0.0.1:99999/v1", "--tenant", "a=LP_A", "--tenant", "b=LP_B"],
    ["preflight", "--target", "http://[::1"],
    ["preflight", "--target", "http://127.0.0.1:0/v1"],
], ids=["audit-bad-url", "audit-bad-port", "preflight-bad-url", "preflight-port-0"])
def test_bad_urls_are_one_line_errors(args: list[str], tmp_path: Path) -> None:
    one_line_error(leakprobe(*args))


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
        with httpx.Client(timeout=120) as client:
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
