"""The forensic log audit: scan recorded responses (JSONL) against a ledger after an incident.

Each line is {"id": str, "tenant": str, "text": str, "prompt": str (optional)}, where tenant is who
received the text.  A bad line is reported with its number and skipped; the rest is still scanned.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from prober.detect import Scanner
from prober.ledger import Ledger
from prober.types import Finding, Record

MAX_LINE_BYTES = 16 * 1024 * 1024


@dataclass
class ForensicReport:
    scanned: int = 0
    findings: list[Finding] = field(default_factory=list)
    own_echoes: int = 0
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"scanned": self.scanned, "findings": [f.to_json() for f in self.findings],
                "own_echoes": self.own_echoes, "errors": self.errors}


def read_records(path: Path, errors: list[str]) -> Iterator[Record]:
    """Records from a JSONL file; problems are appended to `errors` as 'line N: ...'."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if len(raw) > MAX_LINE_BYTES:
                errors.append(f"line {number}: longer than {MAX_LINE_BYTES} bytes, skipped")
                continue
            if not raw.strip():
                continue
            try:
                item = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                errors.append(f"line {number}: not valid UTF-8")
                continue
            except json.JSONDecodeError as exc:
                errors.append(f"line {number}: invalid JSON ({exc.msg})")
                continue
            problem = _problem(item)
            if problem:
                errors.append(f"line {number}: {problem}")
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


def scan_file(path: Path, scanner: Scanner, ledger: Ledger | None = None) -> ForensicReport:
    """Scan every record; findings are written to the ledger as each record yields them."""
    report = ForensicReport()
    for record in read_records(path, report.errors):
        result = scanner.scan(record)
        report.scanned += 1
        found = [replace(f, target=f"scan:{path.name}", found_at=time.time()) for f in result.findings]
        if found and ledger is not None:
            ledger.add_findings(found)
        report.findings.extend(found)
        report.own_echoes += len(result.own_echoes)
    return report
