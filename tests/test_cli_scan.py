"""`leakprobe canaries mint` and `leakprobe scan`: the contracts other tools depend on."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pytest

from prober.oneshot.forensics import ForensicReport, parse, read_batches
from prober.testbed.styles import paraphrase
from tests.support.cli import mint, run, write_jsonl

SECRET_ENV = {"LEAKPROBE_CANARY_KEY": "a shared deployment secret for tests"}


def test_mint_prints_the_documented_shape(tmp_path: Path) -> None:
    rows = mint(tmp_path / "l.sqlite", "tenant-a", count=3)
    assert len(rows) == 3
    assert all({"id", "tenant", "kind", "text"} <= row.keys() and row["kind"] == "token" for row in rows)


def test_scan_finds_cross_tenant_echo_and_ignores_own(tmp_path: Path) -> None:
    ledger = tmp_path / "l.sqlite"
    token = mint(ledger, "tenant-a")[0]
    fact = mint(ledger, "tenant-a", kind="fact", count=1)[0]
    log = write_jsonl(tmp_path / "answers.jsonl", [
        {"id": "a1", "tenant": "tenant-b", "text": f"The code is {str(token['text']).lower()}."},
        {"id": "a2", "tenant": "tenant-a", "text": f"Your code is {token['text']}."},
        {"id": "a3", "tenant": "tenant-b", "text": "Nothing to see here.", "prompt": "Nothing to see here."},
        {"id": "a4", "tenant": "tenant-b", "text": paraphrase(str(fact["text"])).replace("the", "that")},
    ])
    out = run("scan", "--ledger", str(ledger), "--format", "json", str(log))
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["scanned"] == 4 and report["own_echoes"] == 1
    by_record = {f["record_id"]: f for f in report["findings"]}
    assert set(by_record) == {"a1", "a4"}
    assert by_record["a1"]["kind"] == "cross_tenant_echo" and by_record["a1"]["detector"] == "exact"
    assert (by_record["a1"]["victim_tenant"], by_record["a1"]["observer_tenant"]) == ("tenant-a", "tenant-b")
    assert by_record["a1"]["canary_id"] == token["id"]
    assert by_record["a4"]["canary_id"] == fact["id"]
    assert {"record_id", "kind", "detector", "victim_tenant", "observer_tenant", "canary_id", "score"} \
        <= by_record["a4"].keys()


def test_clean_log_exits_0_and_bad_lines_are_reported_by_number(tmp_path: Path) -> None:
    ledger = tmp_path / "l.sqlite"
    mint(ledger, "tenant-a")
    log = write_jsonl(tmp_path / "answers.jsonl", [
        {"id": "ok1", "tenant": "tenant-b", "text": "All clear."},
        "{broken json",
        {"id": "no-text", "tenant": "tenant-b"},
        {"id": "huge", "tenant": "tenant-b", "text": "word " * 200_000},
        {"id": "empty", "tenant": "tenant-b", "text": ""},
    ])
    with log.open("ab") as handle:
        handle.write(b'{"id": "bin", "tenant": "x", "text": "\xff\xfe"}\n')
    out = run("scan", "--ledger", str(ledger), "--no-semantic", "--format", "json", str(log))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["scanned"] == 3
    assert "line 2: invalid JSON" in out.stderr and "line 3: `text` must be a string" in out.stderr
    assert "line 6: not valid UTF-8" in out.stderr


def test_replica_verifies_a_token_its_ledger_never_saw(tmp_path: Path) -> None:
    token = mint(tmp_path / "primary.sqlite", "tenant-a", env=SECRET_ENV)[0]
    replica = tmp_path / "replica.sqlite"
    mint(replica, "tenant-c", env=SECRET_ENV)
    log = write_jsonl(tmp_path / "a.jsonl", [{"id": "x", "tenant": "tenant-b", "text": f"see {token['text']}"}])
    out = run("scan", "--ledger", str(replica), "--no-semantic", "--tenant", "tenant-a", "--format", "json",
              str(log), env=SECRET_ENV)
    assert out.returncode == 1, out.stderr
    finding = json.loads(out.stdout)["findings"][0]
    assert finding["victim_tenant"] == "tenant-a" and finding["canary_id"] is None
    assert [d["type"] for d in finding["details"]] == ["mac_verified"] and finding["check"] is None


@pytest.mark.slow
def test_errors_exit_2_with_a_clear_message(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "a.jsonl", [{"id": "x", "tenant": "b", "text": "t"}])
    out = run("scan", "--ledger", str(tmp_path / "missing.sqlite"), str(log))
    assert out.returncode == 2 and "no such ledger" in out.stderr
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"garbage" * 100)
    out = run("scan", "--ledger", str(bad), str(log))
    assert out.returncode == 2 and "not a usable leakprobe ledger" in out.stderr
    ledger = tmp_path / "l.sqlite"
    mint(ledger, "a")
    out = run("scan", "--ledger", str(ledger), "--model", str(tmp_path / "no-such-model"), str(log))
    assert out.returncode == 2 and "cannot load embedding model" in out.stderr
    out = run("canaries", "mint", "--ledger", str(ledger), "--tenant", "a", "--kind", "fact", "--language", "xx")
    assert out.returncode == 2 and "no fact pack for language 'xx'" in out.stderr


def test_a_truncated_gz_keeps_every_whole_line_before_the_cut(tmp_path: Path) -> None:
    """A log cut off mid-stream (a full disk, a copy stopped): every line decompressed before the cut is scanned,
    and the input is counted as not read to its end (exit 2)."""
    lines = [json.dumps({"id": f"a{i}", "tenant": "t", "text": f"answer number {i} " * 20}).encode()
             for i in range(40_000)]
    data = gzip.compress(b"\n".join(lines) + b"\n")
    cut = data[: len(data) * 6 // 10]
    whole = zlib.decompressobj(wbits=31).decompress(cut).count(b"\n")
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(cut)
    report = ForensicReport()
    scanned = sum(1 for batch in read_batches([str(path)], report) for _ in parse(batch, report))
    assert scanned == whole > 20_000 and report.unfinished == 1 and report.exit_code() == 2, (scanned, whole)
