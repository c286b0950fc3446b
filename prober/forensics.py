"""The forensic log audit: scan recorded answers (JSONL) against a ledger after an incident.

Each line is {"id": str, "tenant": str, "text": str, "prompt": str (optional)}, where tenant is who received
the text.  Input comes from files, `.gz` files or standard input (`-`), read line by line in bounded memory:
a line over the size cap is skipped without ever being held whole.  A bad line is reported with its number
and skipped; the rest is still scanned.  What could not be read is always counted, so a scan that checked
nothing, or not everything, never reads as clean.
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from prober.detect import Scanner
from prober.ledger import Ledger
from prober.types import Finding, Record

MAX_LINE_BYTES = 16 * 1024 * 1024
_SKIP_CHUNK = 1024 * 1024
MAX_REPORTED_ERRORS = 1000  # the count is exact; the messages stop here


@dataclass
class ForensicReport:
    scanned: int = 0
    findings: list[Finding] = field(default_factory=list)
    own_echoes: int = 0
    errors: list[str] = field(default_factory=list)
    invalid: int = 0  # lines that are not records (bad JSON, missing fields)
    oversized: int = 0  # lines over MAX_LINE_BYTES: not read, so not checked
    unfinished: int = 0  # inputs that could not be read to their end (a corrupt or truncated .gz)

    @property
    def skipped(self) -> int:
        return self.invalid + self.oversized

    def problem(self, where: str, message: str, *, oversized: bool = False) -> None:
        if oversized:
            self.oversized += 1
        else:
            self.invalid += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(f"{where}: {message}")

    def to_json(self) -> dict[str, object]:
        return {"scanned": self.scanned, "skipped": self.skipped, "invalid": self.invalid,
                "oversized": self.oversized, "unfinished_inputs": self.unfinished,
                "findings": [f.to_json() for f in self.findings], "own_echoes": self.own_echoes, "errors": self.errors}

    def exit_code(self, *, strict: bool = False) -> int:
        """2 when nothing was checked, when input was too large to read, or (strict) when any line was
        skipped; else 1 with findings, 0 without.  Errors outrank findings."""
        if self.scanned == 0 or self.oversized or self.unfinished or (strict and self.invalid):
            return 2
        return 1 if self.findings else 0


@contextmanager
def open_input(name: str) -> Iterator[BinaryIO]:
    """`-` is standard input; `*.gz` is decompressed as it is read."""
    if name == "-":
        yield sys.stdin.buffer
    elif name.endswith(".gz"):
        with gzip.open(name, "rb") as handle:
            yield handle  # type: ignore[misc]
    else:
        with open(name, "rb") as handle:
            yield handle


def bounded_lines(handle: BinaryIO) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line), or (number, None) for a line over the cap, skipped in bounded chunks."""
    number = 0
    while True:
        line = handle.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_BYTES:
            while line and not line.endswith(b"\n"):
                line = handle.readline(_SKIP_CHUNK)
            yield number, None
        else:
            yield number, line


def read_records(name: str, report: ForensicReport) -> Iterator[Record]:
    """Records from one JSONL input; problems go to `report` as '<input> line N: ...'."""
    try:
        yield from _records(name, report)
    except (OSError, EOFError) as exc:
        report.unfinished += 1
        report.errors.append(f"{name}: cannot be read to its end ({exc})")


def _records(name: str, report: ForensicReport) -> Iterator[Record]:
    with open_input(name) as handle:
        for number, raw in bounded_lines(handle):
            where = f"{name} line {number}"
            if raw is None:
                report.problem(where, f"longer than {MAX_LINE_BYTES:,} bytes, not read", oversized=True)
                continue
            if not raw.strip():
                continue
            try:
                item = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                report.problem(where, "not valid UTF-8")
                continue
            except json.JSONDecodeError as exc:
                report.problem(where, f"invalid JSON ({exc.msg})")
                continue
            except RecursionError:
                report.problem(where, "JSON nested too deeply")
                continue
            problem = _problem(item)
            if problem:
                report.problem(where, problem)
                continue
            yield Record(id=item["id"], tenant=item["tenant"], text=item["text"], prompt=item.get("prompt"))


def _problem(item: object) -> str | None:
    if not isinstance(item, dict):
        return "expected a JSON object"
    for key in ("id", "tenant", "text"):
        if not isinstance(item.get(key), str):
            return f"`{key}` must be a string"
    if item.get("prompt") is not None and not isinstance(item["prompt"], str):
        return "`prompt` must be a string when given"
    return None


def scan_inputs(names: list[str], scanner: Scanner, ledger: Ledger | None = None) -> ForensicReport:
    """Scan every record of every input; findings go to the ledger as each record yields them."""
    report = ForensicReport()
    for name in names:
        label = "stdin" if name == "-" else Path(name).name
        for record in read_records(name, report):
            result = scanner.scan(record)
            report.scanned += 1
            found = [replace(f, target=f"scan:{label}", found_at=time.time()) for f in result.findings]
            if found and ledger is not None:
                ledger.add_findings(found)
            report.findings.extend(found)
            report.own_echoes += len(result.own_echoes)
    return report
