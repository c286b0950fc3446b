"""Judging answers: the envelope checked against what a correct engine does, the text scanned for every tenant's
canaries, and the findings stamped, scrubbed and made durable before anyone hears of them."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from prober.domain.evidence import EngineCounters, Evidence, Exchange, FromCache, PathRange, Traced, of_json
from prober.domain.types import DetectorName, Finding, FindingKind, ProbeContext, Record, Severity
from prober.probing.envelope import check_answer
from prober.probing.events import FindingRecorded, Listener, ignore
from prober.probing.plan import Step
from prober.probing.results import StepResult
from prober.probing.salts import salt_asserted
from prober.probing.wiring import Wiring
from prober.prompts import BuiltPrompt
from prober.targets.result import Completion
from prober.text.scrub import Scrubber

CATCH_UP_S = 900.0  # how far back to read the ledger for a verified token this process has not indexed
# Detectors that read an answer against the prompt it answered: a cache's copy answered another prompt (an earlier one
# of this tenant's, or someone's), so they say nothing of it; the canaries in it still do.
AGAINST_ITS_PROMPT = frozenset({DetectorName.VERBATIM, DetectorName.FOREIGN})


@dataclass(frozen=True)
class Judge:
    target: str
    wiring: Wiring
    scrubber: Scrubber
    salted: frozenset[str]  # tenants whose prefix cache on this target is meant to be salted

    async def persist(self, findings: list[Finding], engine: EngineCounters | None, on_event: Listener, *,
                      check: str) -> list[Finding]:
        """Stamped with target, check and time, scrubbed, the engine's telemetry added; durable, then announced."""
        now = time.time()
        findings = [replace(f, target=self.target, check=check, found_at=now, excerpt=self.scrubber.text(f.excerpt),
                            evidence=self._scrubbed(f.adding(engine).evidence if engine else f.evidence))
                    for f in findings]
        if findings:
            await asyncio.to_thread(self.wiring.ledger.add_findings, findings)  # durable before anyone is told
        for finding in findings:
            on_event(FindingRecorded(finding))
        return findings

    def _scrubbed(self, evidence: tuple[Evidence, ...]) -> tuple[Evidence, ...]:
        """Evidence as the ledger may keep it: no credential in any of its strings (a target's finish reason, its
        metrics' labels), through the one JSON form."""
        return tuple(of_json(self.scrubber.value(item.to_json())) for item in evidence)

    async def answer(self, step: Step, exchange: str, built: BuiltPrompt, answer: Completion, *, check: str,
                     engine: EngineCounters | None = None, also: list[Finding] | None = None,
                     path: PathRange | None = None) -> StepResult:
        """One answer's envelope and text (and `also`, what its cached tokens showed), its findings durable; `path`:
        what a varying path adds, against the limit (prober/probing/envelope.py's `undecided`).  An answer a cache
        in front served has no envelope of the engine's: its text is judged, each finding saying the cache served
        it, and a copy made for another tenant is that tenant's answer handed over (`stored_elsewhere`)."""
        stored = answer.from_cache
        context = ProbeContext(built.tokens, step.boundary, answer.status)
        checked = (check_answer(step, built.tokens, answer, path) + (also or []) if stored is None
                   else [replace(f, context=context) for f in stored_elsewhere(step, stored)])
        findings = [salt_asserted(f, self.salted) for f in checked]
        own = 0
        if answer.full_text:
            record = Record(step.id, step.tenant, answer.full_text, built.text)
            scanner = self.wiring.scanner
            scanned = await asyncio.to_thread(scanner.scan, record)
            if scanned.unindexed:
                # A token that verifies but is not in our index: another replica minted it moments ago.
                recent = await asyncio.to_thread(self.wiring.ledger.active_canaries, None, time.time() - CATCH_UP_S)
                scanner.add(recent)
                scanned = await asyncio.to_thread(scanner.scan, record)
            own = len(scanned.own_echoes)
            findings += [replace(f.adding(Exchange(exchange)), probe_id=f.probe_id or step.id, context=context)
                         for f in scanned.findings if stored is None or f.detector not in AGAINST_ITS_PROMPT]
        if (trace := Traced.of(answer.traceparent)) is not None:
            findings = [f.adding(trace) for f in findings]
        if stored is not None:
            findings = [f.adding(stored) for f in findings]
        findings = await self.persist(findings, engine, ignore, check=check)
        return StepResult(step=step, exchange=exchange, target=self.target, sent_tokens=built.tokens,
                          counted=built.counted, answer=answer, canary_ids=sorted({c.id for c in built.canaries}),
                          findings=findings, own_echoes=own)


def stored_elsewhere(step: Step, stored: FromCache) -> list[Finding]:
    """A cache's copy of an answer made for another tenant, served to this one: `cross_tenant_response_cache`."""
    if stored.first_tenant is None or stored.first_tenant == step.tenant:
        return []
    return [copied(step, stored.first_tenant, stored, f"answer {stored.answer_id}")]


def copied(step: Step, victim: str, stored: FromCache, how: str) -> Finding:
    """`victim`'s answer, which a cache in front stored, served to `step`'s tenant (`how`: what shows it was); at the
    step's boundary, where the check's next clean run re-checks it."""
    return Finding(record_id=step.id, kind=FindingKind.CROSS_TENANT_RESPONSE_CACHE, detector=DetectorName.ENVELOPE,
                   severity=Severity.HIGH, score=1.0, observer_tenant=step.tenant, victim_tenant=victim,
                   probe_id=step.id, excerpt=f"{stored.layer} cache ({stored.told}): {how}", evidence=(stored,),
                   context=ProbeContext(boundary=step.boundary))
