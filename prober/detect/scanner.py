"""The scanner: runs every detector over an answer and decides what is a finding.

A canary is a finding only when its owner (victim) differs from the tenant that received the answer
(observer); one's own canary echoed back is a positive control, counted but not reported.  Each
canary is reported once per answer, by the strongest detector that saw it (exact > fuzzy > semantic >
fragment); a probe's tag or a run of its prompt is not reported where one of that probe's canaries is.
Foreign-content hits that overlap a canary hit are dropped: the canary explains them.  An answer is garbled
(one finding, whatever else it holds) where the garbled-output detector says no healthy model wrote it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from prober.canaries.compact import compact
from prober.detect.base import BATCH, CanarySet, Detector, Hit
from prober.detect.exact import ExactDetector
from prober.detect.foreign import MAX_HITS_PER_RECORD, ForeignContentDetector
from prober.detect.fragment import FragmentDetector
from prober.detect.fuzzy import FuzzyDetector
from prober.detect.garbled import GarbledOutputDetector
from prober.detect.patterns import PatternIndex
from prober.detect.semantic import SemanticDetector
from prober.detect.values import SlotValues
from prober.detect.verbatim import VerbatimDetector
from prober.domain.evidence import Escaped, adding
from prober.domain.types import Canary, Finding, FindingKind, Record
from prober.embeddings import Embedder
from prober.text.escapes import Unescaped, unescape
from prober.text.shingles import PromptShingles

EXCERPT_CONTEXT = 40
MAX_EXCERPT = 240
WINDOW_CHARS = 65_536
WINDOW_OVERLAP = 4_096  # longer than any canary as a model renders it (spaced, broken, reworded)


def windows(text: str) -> Iterator[tuple[int, str]]:
    """(offset, slice) covering `text`: one slice for an everyday answer, overlapping ones for a huge one."""
    if len(text) <= WINDOW_CHARS:
        yield 0, text
        return
    for start in range(0, len(text) - WINDOW_OVERLAP, WINDOW_CHARS - WINDOW_OVERLAP):
        yield start, text[start : start + WINDOW_CHARS]


def mask(text: str) -> str:
    """Keep the shape of words, not their content: 'Card 4471 of Ann' -> 'C*** 4*** o* A**'."""
    return re.sub(r"(?<=\w)\w", "*", text)


@dataclass(slots=True)
class ScanResult:
    findings: list[Finding] = field(default_factory=list)
    own_echoes: list[Hit] = field(default_factory=list)  # positive controls
    unindexed: int = 0  # tokens whose MAC verifies but that no indexed canary is: minted elsewhere, moments ago

    @property
    def crossed(self) -> bool:
        """Another tenant's canary is in the answer (a finding about the answer alone, foreign or garbled, names no
        victim)."""
        return any(f.victim_tenant is not None for f in self.findings)


class Scanner:
    def __init__(self, canaries: CanarySet, *, prompts: Sequence[PromptShingles] = (),
                 embedder: Embedder | None = None, foreign: bool = True, redact: bool = True,
                 patterns: PatternIndex | None = None) -> None:
        """`canaries`: what to look for, with the key that verifies tokens and the tenants whose tags are known.
        `prompts`: the ledger's record of sent prompts, for verbatim runs of them (needs the key).  `foreign`:
        also judge the answer itself -- content its prompt cannot explain, garbled output -- which needs no
        canary (a runner with two scanners over one answer judges it in one).  `patterns`: the index of these
        canaries' patterns, built already (a pickled scanner's)."""
        self.canary_set = canaries
        self.embedder = embedder
        self.redact = redact
        self._made_with = (canaries.canaries, canaries.key, tuple(canaries.tenants), tuple(prompts), embedder,
                           foreign, redact)
        values = SlotValues(self.canary_set)  # one index of fact values, shared
        self.patterns = patterns = patterns or PatternIndex(self.canary_set)  # and one of the patterns
        self.detectors: list[Detector] = [ExactDetector(self.canary_set, patterns),
                                          FuzzyDetector(self.canary_set, patterns),
                                          FragmentDetector(self.canary_set, values, patterns)]
        if embedder is not None:
            self.detectors.append(SemanticDetector(self.canary_set, embedder, values))
        if prompts and canaries.key is not None:
            self.detectors.append(VerbatimDetector(prompts, canaries.key))
        if foreign:
            self.detectors += [ForeignContentDetector(), GarbledOutputDetector()]
        self._by_name = {d.name: d for d in self.detectors}

    def __reduce__(self) -> tuple[Callable[..., Scanner], tuple[object, ...]]:
        """Pickled as what it was built from and its pattern index, and rebuilt around that index where it lands (a
        worker process, a Dask worker): the index's tables travel as they are, its automata as their patterns
        (built again there), and an embedding model is loaded there."""
        return _rebuild, (*self._made_with, self.patterns)

    def scan(self, record: Record) -> ScanResult:
        """Every detector over the answer, its text escapes decoded, in overlapping windows, so that memory
        and time stay bounded per window whatever size a target sends (a canary is shorter than the overlap,
        so none is cut).  Spans are reported in the answer as it came."""
        return self.scan_many([record])[0]

    def scan_many(self, records: Sequence[Record]) -> list[ScanResult]:
        """`scan` of each record, handing each detector BATCH windows at a time (an embedding model encodes a
        batch's sentences in one call); memory stays bounded by the batch, whatever the answers' sizes."""
        decoded = [unescape(record.text) for record in records]
        hits: list[list[Hit]] = [[] for _ in records]
        parts: list[tuple[int, int, Record, str]] = []  # (record, offset, window, its compact form)

        def run_detectors() -> None:
            answers = [(window, compacted) for _, _, window, compacted in parts]
            for detector in self.detectors:
                for (n, offset, _, _), found in zip(parts, detector.detect_many(answers), strict=True):
                    if found:  # most answers: nothing
                        hits[n] += [replace(h, start=h.start + offset, end=h.end + offset) if offset else h
                                    for h in found]
            parts.clear()

        for n, (record, unescaped) in enumerate(zip(records, decoded, strict=True)):
            for offset, window in windows(unescaped.text if unescaped else record.text):
                part = record if window is record.text else Record(record.id, record.tenant, window, record.prompt)
                parts.append((n, offset, part, compact(window)))
                if len(parts) == BATCH:
                    run_detectors()
        if parts:
            run_detectors()
        return [ScanResult() if not found  # most answers
                else self._result(record, [_in_original(h, unescaped, record.text) for h in found]
                                  if unescaped is not None else found)
                for record, unescaped, found in zip(records, decoded, hits, strict=True)]

    def _result(self, record: Record, hits: list[Hit]) -> ScanResult:
        """The answer's findings and own echoes from its detectors' hits."""
        result = ScanResult()
        best: dict[str, Hit] = {}
        for hit in hits:
            if hit.kind is not None:
                continue
            if hit.key not in best or self._by_name[hit.detector].rank < self._by_name[best[hit.key].detector].rank:
                best[hit.key] = hit
        found = {(h.canary.tenant, h.canary.probe_id) for h in best.values() if h.canary is not None}
        for key, hit in list(best.items()):
            if hit.tenant is not None and (hit.tenant, hit.probe_id) in found:
                del best[key]  # a probe's tag, where one of its canaries is reported
        for hit in best.values():
            victim = _owner(hit)
            if victim == record.tenant:
                result.own_echoes.append(hit)
            else:
                result.findings.append(self._canary_finding(record, hit, victim))
                if hit.canary is None and hit.verified is not None:
                    result.unindexed += 1
        echoed = [(h.start, h.end) for h in best.values()]
        foreign: dict[tuple[int, int], Hit] = {}
        for hit in hits:
            if hit.kind is FindingKind.FOREIGN_CONTENT and not any(s < hit.end and hit.start < e for s, e in echoed):
                foreign.setdefault((hit.start, hit.end), hit)
        result.findings += [self._answer_finding(record, h) for h in list(foreign.values())[:MAX_HITS_PER_RECORD]]
        garbled = [h for h in hits if h.kind is FindingKind.GARBLED_OUTPUT]
        result.findings += [self._answer_finding(record, h) for h in garbled[:1]]  # once per answer, its windows too
        return result

    def _excerpt(self, text: str, start: int, end: int) -> str:
        left = text[max(0, start - EXCERPT_CONTEXT) : start]
        right = text[end : end + EXCERPT_CONTEXT]
        if self.redact:
            left, right = mask(left), mask(right)
        return (left + text[start:end] + right)[:MAX_EXCERPT]

    def _canary_finding(self, record: Record, hit: Hit, victim: str) -> Finding:
        canary = hit.canary
        return Finding(
            record_id=record.id, kind=FindingKind.CROSS_TENANT_ECHO, detector=hit.detector,
            severity=hit.severity or self._by_name[hit.detector].severity, score=hit.score,
            observer_tenant=record.tenant, victim_tenant=victim, canary_id=canary.id if canary else None,
            probe_id=(canary.probe_id if canary else hit.probe_id) or None,
            start=hit.start, end=hit.end,
            excerpt=self._excerpt(record.text, hit.start, hit.end),
            excerpt_sha256=hashlib.sha256(record.text[hit.start : hit.end].encode()).hexdigest(),
            redacted=self.redact, evidence=hit.evidence,
        )

    def _answer_finding(self, record: Record, hit: Hit) -> Finding:
        """A finding about the answer itself (foreign, garbled): no victim, its text masked (it may be someone's)."""
        assert hit.kind is not None
        span = record.text[hit.start : hit.end]
        return Finding(
            record_id=record.id, kind=hit.kind, detector=hit.detector,
            severity=self._by_name[hit.detector].severity, score=hit.score, observer_tenant=record.tenant,
            start=hit.start, end=hit.end, excerpt=(mask(span) if self.redact else span)[:MAX_EXCERPT],
            excerpt_sha256=hashlib.sha256(span.encode()).hexdigest(), redacted=self.redact,
            evidence=hit.evidence,
        )


def _rebuild(canaries: Sequence[Canary], key: bytes | None, tenants: tuple[str, ...],
             prompts: tuple[PromptShingles, ...], embedder: Embedder | None, foreign: bool, redact: bool,
             patterns: PatternIndex) -> Scanner:
    return Scanner(CanarySet(canaries, key=key, tenants=tenants), prompts=prompts, embedder=embedder,
                   foreign=foreign, redact=redact, patterns=patterns)


def _in_original(hit: Hit, decoded: Unescaped, original: str) -> Hit:
    """A hit on the decoded text, moved to the characters of the original that encode it; one that was
    written escaped says which escapes it was written in."""
    start, end = decoded.original_span(hit.start, hit.end)
    written = unescape(original[start:end])
    if written is None:
        return replace(hit, start=start, end=end)
    return replace(hit, start=start, end=end, evidence=adding(hit.evidence, Escaped(written.kinds)))


def _owner(hit: Hit) -> str:
    if hit.canary is not None:
        return hit.canary.tenant
    if hit.tenant is not None:
        return hit.tenant
    assert hit.verified is not None
    return hit.verified.tenant or f"unknown-tenant-tag:{hit.verified.tenant_tag}"
