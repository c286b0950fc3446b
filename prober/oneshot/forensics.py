"""The forensic log audit: scan recorded answers (JSONL) against a ledger after an incident.

Each line is {"id": str, "tenant": str, "text": str, "prompt": str (optional)}, where tenant is who received
the text.  Lines are read in batches and scanned in this process or in worker processes (`--workers`), which
share this process's scanner (`_pool`); a batch's findings are persisted as soon as it is done.  Input comes
from files, `.gz` files or standard input (`-`), read a block at a time in bounded memory: a line over the size
cap is skipped without ever being held whole.  A bad line is reported with its number and skipped; the rest is still
scanned.  What could not be read is always counted, so a scan that checked nothing, or not everything, never
reads as clean.
"""

from __future__ import annotations

import gc
import gzip
import json
import json.scanner
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, as_completed, wait
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, cast

import orjson

from prober.detect import Scanner
from prober.domain.types import Finding, Record
from prober.ledger import Ledger

MAX_LINE_BYTES = 16 * 1024 * 1024
READ_BYTES = 1024 * 1024
MAX_REPORTED_ERRORS = 1000  # the count is exact; the messages stop here
BATCH_LINES = 2_000
BATCH_BYTES = 8 * 1024 * 1024


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

    def merge(self, part: ForensicReport) -> None:
        self.scanned += part.scanned
        self.findings += part.findings
        self.own_echoes += part.own_echoes
        self.invalid += part.invalid
        self.oversized += part.oversized
        self.unfinished += part.unfinished
        self.errors += part.errors[: max(0, MAX_REPORTED_ERRORS - len(self.errors))]

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


def line_blocks(handle: BinaryIO) -> Iterator[list[bytes | None]]:
    """The lines of `handle` (their newlines cut off), as many as each read of READ_BYTES ends, split in C: the
    parent of a scan's workers reads at the speed of the disk.  None stands for a line over MAX_LINE_BYTES, which
    is never held whole (a read is under the cap, so only a line that spans reads can be over it).  Each read is
    one read of the source (`read1`): a truncated .gz raises on the read after its last whole piece, so what it
    decompressed is kept, and a pipe hands over what it has without waiting for a megabyte."""
    head: list[bytes] = []  # the start of a line that spans reads; let go once over the cap
    size = 0  # that line's bytes so far
    read = getattr(handle, "read1", handle.read)
    while block := read(READ_BYTES):
        lines = cast(list[bytes | None], block.split(b"\n"))
        rest = cast(bytes, lines.pop())  # after the last newline: the start of the next line
        if lines:
            first = cast(bytes, lines[0])
            lines[0] = None if size + len(first) > MAX_LINE_BYTES else b"".join([*head, first])
            head, size = [], 0
            yield lines
        size += len(rest)
        head = [*head, rest] if size <= MAX_LINE_BYTES else []
    if size:
        yield [None if size > MAX_LINE_BYTES else b"".join(head)]


@dataclass(frozen=True)
class Batch:
    """A run of raw lines of one input, scanned as a unit (in this process or a worker)."""

    source: str  # the input as named on the command line
    seq: int  # its place in the whole scan: findings are reported in input order
    first: int  # the number of its first line in the input
    lines: list[bytes | None]  # None: a line over the cap, not read
    size: int  # bytes


def read_batches(names: list[str], report: ForensicReport, *, lines: int = BATCH_LINES,
                 size: int = BATCH_BYTES) -> Iterator[Batch]:
    """Every input's lines in batches of at most `lines` lines or about `size` bytes; an input that cannot be
    read to its end (a truncated .gz) is counted in `report`, and its lines read so far are still scanned."""
    seq = 0
    for name in names:
        chunk: list[bytes | None] = []
        number, held = 1, 0  # the number of the chunk's first line; its bytes
        try:
            with open_input(name) as handle:
                for block in line_blocks(handle):
                    at = 0
                    while at < len(block):
                        take = block[at : at + lines - len(chunk)]
                        at += len(take)
                        chunk += take
                        held += sum(map(len, filter(None, take)))
                        if len(chunk) >= lines or held >= size:
                            yield Batch(name, seq, number, chunk, held)
                            seq, number, chunk, held = seq + 1, number + len(chunk), [], 0
        except (OSError, EOFError) as exc:
            report.unfinished += 1
            report.errors.append(f"{name}: cannot be read to its end ({exc})")
        if chunk:
            yield Batch(name, seq, number, chunk, held)
            seq += 1


def parse(batch: Batch, report: ForensicReport) -> Iterator[Record]:
    """The batch's records; problems go to `report` as '<input> line N: ...'."""
    for number, raw in enumerate(batch.lines, batch.first):
        if raw is None:
            report.problem(f"{batch.source} line {number}", f"longer than {MAX_LINE_BYTES:,} bytes, not read",
                           oversized=True)
            continue
        if not raw or raw.isspace():
            continue
        try:
            item = _read(raw)
            problem = _problem(item)
        except UnicodeDecodeError:
            problem = "not valid UTF-8"
        except json.JSONDecodeError as exc:
            problem = f"invalid JSON ({exc.msg})"
        except RecursionError:
            problem = "JSON nested too deeply"
        if problem:
            report.problem(f"{batch.source} line {number}", problem)
            continue
        yield Record(id=item["id"], tenant=item["tenant"], text=item["text"], prompt=item.get("prompt"))


def _read(raw: bytes) -> Any:
    """One line's JSON: orjson where it takes the line (half the time of decoding it and json's C scanner, a tenth of
    a scan's time), else the standard library's reading, so that its acceptance and its error messages stand for
    what orjson refuses (invalid UTF-8, NaN, integers past 64 bits, nesting past 1,024, lone surrogates)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _loads(raw.decode("utf-8"))


_SCAN = json.scanner.make_scanner(cast(Any, json.JSONDecoder()))  # json.loads's own C scanner (typeshed types
# its argument as a scanner: the decoder is what it reads its settings from)
_JSON_SPACE = " \t\n\r"


def _loads(text: str) -> Any:
    """json.loads(text), its C scanner called directly: the wrapper around it is a third of a log line's parse.
    A line it does not take whole goes through json.loads itself, whose error is the one reported."""
    text = text.strip(_JSON_SPACE)
    try:
        item, end = _SCAN(text, 0)
        if end == len(text):
            return item
    except (StopIteration, ValueError, RecursionError):
        pass
    return json.loads(text)


def _problem(item: object) -> str | None:
    if not isinstance(item, dict):
        return "expected a JSON object"
    for key in ("id", "tenant", "text"):
        if not isinstance(item.get(key), str):
            return f"`{key}` must be a string"
    if item.get("prompt") is not None and not isinstance(item["prompt"], str):
        return "`prompt` must be a string when given"
    return None


def scan_batch(batch: Batch, scanner: Scanner) -> ForensicReport:
    """One batch's part of the report (findings named after the input, not yet persisted)."""
    part = ForensicReport()
    label = "stdin" if batch.source == "-" else Path(batch.source).name
    records = list(parse(batch, part))  # a batch is bounded (BATCH_LINES, BATCH_BYTES)
    results = scanner.scan_many(records)
    part.scanned += len(results)
    for result in results:
        if result.findings:
            part.findings += [replace(f, target=f"scan:{label}", found_at=time.time()) for f in result.findings]
        part.own_echoes += len(result.own_echoes)
    return part


def scan_file(name: str, scanner: Scanner) -> ForensicReport:
    """One input, whole: the unit a distributed engine (Dask) maps over files; the caller persists findings."""
    report = ForensicReport()
    for batch in read_batches([name], report):
        report.merge(scan_batch(batch, scanner))
    return report


_worker_scanner: Scanner | None = None


def _install(scanner: Scanner) -> None:
    """Worker start: a forked worker gets the scanner as it is in memory, a spawned one as its canaries (rebuilt
    here, once per process)."""
    global _worker_scanner
    _worker_scanner = scanner
    gc.freeze()  # a spawned worker's rebuilt index, out of the collector's walks (a forked one's is already)


@contextmanager
def _frozen() -> Iterator[None]:
    """The objects made so far (the scanner's index: hundreds of thousands of them at 100,000 canaries) out of the
    garbage collector's full walks, which the scan's own short-lived objects set off every few answers; measured:
    a sixth of a scan's time in one process.  A forked worker inherits them frozen, so the collector never writes
    to (copies) the pages it shares."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def _pool(scanner: Scanner, workers: int) -> Iterator[ProcessPoolExecutor]:
    """Workers that share one scanner: forked after its indexes are built (and frozen: `_frozen`), they read the
    same pages (automata and arrays are never written), so memory does not grow with `workers`.  A scanner holding
    an embedding model is rebuilt in spawned workers instead: a fork of a process whose BLAS or torch thread pools
    are up can hang."""
    context = multiprocessing.get_context("fork" if scanner.embedder is None else "spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_install, initargs=(scanner,)) as pool:
        yield pool


def _scan_in_worker(batch: Batch) -> tuple[int, ForensicReport]:
    assert _worker_scanner is not None
    return batch.seq, scan_batch(batch, _worker_scanner)


def scan_inputs(names: list[str], scanner: Scanner, ledger: Ledger | None = None, *, workers: int = 1,
                progress: Callable[[int, int], None] | None = None) -> ForensicReport:
    """Scan every record of every input, in this process or in `workers` processes, with at most two batches
    per worker in flight (memory stays bounded whatever the input size).  Findings go to the ledger as each
    batch yields them; `progress(bytes, records)` is told after each batch."""
    report = ForensicReport()
    parts: dict[int, list[Finding]] = {}

    def absorb(seq: int, part: ForensicReport, size: int) -> None:
        if part.findings and ledger is not None:
            ledger.add_findings(part.findings)
        parts[seq] = part.findings
        part.findings = []
        report.merge(part)
        if progress is not None:
            progress(size, part.scanned)

    if workers <= 1:
        with _frozen():
            for batch in read_batches(names, report):
                absorb(batch.seq, scan_batch(batch, scanner), batch.size)
    else:
        with _frozen(), _pool(scanner, workers) as pool:
            pending: dict[Future[tuple[int, ForensicReport]], int] = {}
            for batch in read_batches(names, report):
                pending[pool.submit(_scan_in_worker, batch)] = batch.size
                while len(pending) >= 2 * workers:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        absorb(*future.result(), pending.pop(future))
            for future in as_completed(list(pending)):
                absorb(*future.result(), pending.pop(future))
    report.findings = [f for seq in sorted(parts) for f in parts[seq]]
    return report
