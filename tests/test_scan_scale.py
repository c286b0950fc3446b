"""Log-scale forensic scans: worker processes, a shared ledger, and the scanner inside Dask.

The same log is scanned by one process and by several; the findings, counts and exit codes must agree,
the findings must be in the ledger, and a scanner pickled into other processes must find what it finds at
home.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prober.canaries.keys import resolve_key
from prober.canaries.mint import Minter
from prober.detect import CanarySet, Scanner
from prober.detect.patterns import PatternIndex
from prober.domain.types import Record
from prober.ledger import open_ledger
from prober.oneshot.forensics import ForensicReport, scan_file, scan_inputs
from tests.support.postgres import PostgresServer
from tests.support.tools import need_module

KEY = b"scale-test-key-scale-test-key-!!"
ENV = {"LEAKPROBE_CANARY_KEY": KEY.decode()}


def planted_logs(folder: Path, ledger_url: str, files: int = 3, lines: int = 1_500) -> tuple[list[Path], set[str]]:
    """JSONL logs (the last one gzipped) with one canary of tenant-a in every 250th answer to tenant-b,
    a few bad lines, and the ids of the records that carry a leak."""
    ledger = open_ledger(ledger_url)
    minter = Minter(ledger, KEY)
    leaked = minter.tokens("tenant-a", 40)
    ledger.close()
    rng = random.Random(5)
    words = "the farmer carries a basket of apples along the road while the river runs past the mill".split()
    paths, planted = [], set()
    for f in range(files):
        rows = []
        for i in range(lines):
            text = " ".join(rng.choice(words) for _ in range(rng.randrange(20, 300)))
            rid = f"f{f}-{i}"
            if i % 250 == 7:
                text += f" and the code {rng.choice(leaked).text.lower()} too."
                planted.add(rid)
            rows.append(json.dumps({"id": rid, "tenant": "tenant-b", "text": text}))
        rows.insert(100, "{not json")
        data = ("\n".join(rows) + "\n").encode()
        path = folder / f"log{f}.jsonl"
        if f == files - 1:
            path = path.with_suffix(".jsonl.gz")
            data = gzip.compress(data)
        path.write_bytes(data)
        paths.append(path)
    return paths, planted


def scan_cli(ledger: str, paths: list[Path], *extra: str) -> tuple[int, dict[str, object]]:
    out = subprocess.run([sys.executable, "-m", "prober", "scan", "--ledger", ledger, "--format", "json",
                          "--no-semantic", *extra, *map(str, paths)], capture_output=True, text=True,
                         env={**os.environ, **ENV}, timeout=600)
    assert out.returncode in (0, 1, 2), out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_workers_find_what_one_process_finds_and_persist_it(tmp_path: Path, backend: str,
                                                            request: pytest.FixtureRequest) -> None:
    if backend == "sqlite":
        ledger = str(tmp_path / "l.sqlite")
    else:
        server: PostgresServer = request.getfixturevalue("postgres")
        ledger = server.create_database()
    paths, planted = planted_logs(tmp_path, ledger)
    code_one, one = scan_cli(ledger, paths)
    code_many, many = scan_cli(ledger, paths, "--workers", "2")
    assert code_one == code_many == 1
    for report in (one, many):
        assert report["scanned"] == 4_500 and report["invalid"] == 3 and report["unfinished_inputs"] == 0
        assert {f["record_id"] for f in report["findings"]} == planted  # type: ignore[union-attr, index]
        assert all(f["victim_tenant"] == "tenant-a" for f in report["findings"])  # type: ignore[union-attr, index]
    def found(report: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in f.items() if k != "found_at"} for f in report["findings"]]
    assert found(one) == found(many)  # the same findings, in input order (each run stamps its own found_at)
    stored = open_ledger(ledger)
    assert sum(f.record_id in planted for f in stored.findings()) == 2 * len(planted)
    stored.close()


def test_a_scanner_pickles_and_finds_the_same_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its pattern index travels built (tables as they are, automata as their patterns): it is not built again."""
    ledger = open_ledger(tmp_path / "l.sqlite")
    exact, edited = Minter(ledger, KEY).tokens("tenant-a", 2)
    scanner = Scanner(CanarySet(ledger.active_canaries(), key=resolve_key(ledger)))
    typo = edited.text[:-6] + ("Z" if edited.text[-6] != "Z" else "Y") + edited.text[-5:]
    record = Record("r", "tenant-b", f"see {exact.text.replace('-', ' ')} and {typo}")
    blob = pickle.dumps(scanner)

    def built_again(*_: object) -> None:
        raise AssertionError("the pattern index was built again")

    monkeypatch.setattr(PatternIndex, "__init__", built_again)
    copy = pickle.loads(blob)
    assert [(f.canary_id, f.detector) for f in copy.scan(record).findings] == \
        [(f.canary_id, f.detector) for f in scanner.scan(record).findings]
    assert {f.canary_id for f in copy.scan(record).findings} == {exact.id, edited.id}


def test_scanning_files_with_dask(tmp_path: Path) -> None:
    """The README's recipe: the driver ships the scanner to a local cluster of two worker processes, maps
    scan_file over the logs, and persists what comes back."""
    distributed = need_module("dask.distributed", "dask[distributed]")
    ledger_path = str(tmp_path / "l.sqlite")
    paths, planted = planted_logs(tmp_path, ledger_path, files=4, lines=600)
    ledger = open_ledger(ledger_path)
    scanner = Scanner(CanarySet(ledger.active_canaries(), key=resolve_key(ledger)))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        shipped = client.scatter(scanner, broadcast=True)
        futures = client.map(scan_file, [str(p) for p in paths], scanner=shipped)
        report = ForensicReport()
        for future, part in distributed.as_completed(futures, with_results=True):
            ledger.add_findings(part.findings)
            report.merge(part)
            del future
    assert report.scanned == 2_400 and report.invalid == 4
    assert {f.record_id for f in report.findings} == planted
    assert {f.record_id for f in ledger.findings()} == planted
    local = scan_inputs([str(p) for p in paths], scanner)
    assert sorted(f.record_id for f in local.findings) == sorted(f.record_id for f in report.findings)
