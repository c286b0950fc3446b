"""The scanner: runs every detector over an answer and decides what is a finding.

A canary is a finding only when its owner (victim) differs from the tenant that received the answer
(observer); one's own canary echoed back is a positive control, counted but not reported.  Each
canary is reported once per answer, by the strongest detector that saw it (exact > fuzzy > semantic).
Foreign-content hits that overlap a canary hit are dropped: the canary explains them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prober.canaries.compact import compact
from prober.detect.base import CanarySet, Detector, Hit
from prober.detect.exact import ExactDetector
from prober.detect.foreign import ForeignContentDetector
from prober.detect.fuzzy import FuzzyDetector
from prober.detect.semantic import SemanticDetector
from prober.embeddings import Embedder
from prober.types import Canary, Finding, FindingKind, Record

EXCERPT_CONTEXT = 40
MAX_EXCERPT = 240


def mask(text: str) -> str:
    """Keep the shape of words, not their content: 'Card 4471 of Ann' -> 'C*** 4*** o* A**'."""
    return re.sub(r"(?<=\w)\w", "*", text)


@dataclass
class ScanResult:
    findings: list[Finding] = field(default_factory=list)
    own_echoes: list[Hit] = field(default_factory=list)  # positive controls


class Scanner:
    def __init__(
        self,
        canaries: Sequence[Canary],
        *,
        key: bytes | None = None,
        tenants: Iterable[str] = (),
        embedder: Embedder | None = None,
        foreign: bool = True,
        redact: bool = True,
    ) -> None:
        self.canary_set = CanarySet(canaries, key=key, tenants=tenants)
        self.redact = redact
        self.detectors: list[Detector] = [ExactDetector(self.canary_set), FuzzyDetector(self.canary_set)]
        if embedder is not None:
            self.detectors.append(SemanticDetector(self.canary_set, embedder))
        if foreign:
            self.detectors.append(ForeignContentDetector())
        self._by_name = {d.name: d for d in self.detectors}

    def scan(self, record: Record) -> ScanResult:
        compacted = compact(record.text)
        hits = [hit for detector in self.detectors for hit in detector.detect(record, compacted)]
        result = ScanResult()
        best: dict[str, Hit] = {}
        for hit in hits:
            if hit.foreign:
                continue
            key = hit.canary.id if hit.canary else f"mac:{hit.verified.body if hit.verified else ''}"
            if key not in best or self._by_name[hit.detector].rank < self._by_name[best[key].detector].rank:
                best[key] = hit
        for hit in best.values():
            victim = _owner(hit)
            if victim == record.tenant:
                result.own_echoes.append(hit)
            else:
                result.findings.append(self._canary_finding(record, hit, victim))
        echoed = [(h.start, h.end) for h in best.values()]
        for hit in hits:
            if hit.foreign and not any(s < hit.end and hit.start < e for s, e in echoed):
                result.findings.append(self._foreign_finding(record, hit))
        return result

    def _excerpt(self, text: str, start: int, end: int) -> str:
        left = text[max(0, start - EXCERPT_CONTEXT) : start]
        right = text[end : end + EXCERPT_CONTEXT]
        if self.redact:
            left, right = mask(left), mask(right)
        return (left + text[start:end] + right)[:MAX_EXCERPT]

    def _canary_finding(self, record: Record, hit: Hit, victim: str) -> Finding:
        canary = hit.canary
        details = dict(hit.details)
        if canary is None and hit.verified is not None:
            details["probe_tag"] = hit.verified.probe_tag
        return Finding(
            record_id=record.id, kind=FindingKind.CROSS_TENANT_ECHO, detector=hit.detector,
            severity=self._by_name[hit.detector].severity, score=hit.score, observer_tenant=record.tenant,
            victim_tenant=victim, canary_id=canary.id if canary else None,
            probe_id=(canary.probe_id or None) if canary else None, start=hit.start, end=hit.end,
            excerpt=self._excerpt(record.text, hit.start, hit.end),
            excerpt_sha256=hashlib.sha256(record.text[hit.start : hit.end].encode()).hexdigest(),
            redacted=self.redact, details=details,
        )

    def _foreign_finding(self, record: Record, hit: Hit) -> Finding:
        span = record.text[hit.start : hit.end]
        return Finding(
            record_id=record.id, kind=FindingKind.FOREIGN_CONTENT, detector=hit.detector,
            severity=self._by_name[hit.detector].severity, score=hit.score, observer_tenant=record.tenant,
            start=hit.start, end=hit.end, excerpt=(mask(span) if self.redact else span)[:MAX_EXCERPT],
            excerpt_sha256=hashlib.sha256(span.encode()).hexdigest(), redacted=self.redact,
            details=dict(hit.details),
        )


def _owner(hit: Hit) -> str:
    if hit.canary is not None:
        return hit.canary.tenant
    assert hit.verified is not None
    return hit.verified.tenant or f"unknown-tenant-tag:{hit.verified.tenant_tag}"
