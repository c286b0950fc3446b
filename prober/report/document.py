"""The audit as one JSON-ready document: the single source every report format renders from.

It answers first what an on-call engineer asks first — did tenant data cross, between whom, at which prompt
length — as a verdict, a victim x observer matrix per target and incidents; the requests and findings
follow as evidence."""

from __future__ import annotations

from collections import Counter
from typing import TypedDict

from prober import __version__
from prober.capacity.known_bugs import KnownBugDoc, Standing
from prober.capacity.limits import CapacityDoc, CapacityVerdictDoc, EngineCacheDoc
from prober.domain.incidents import Incident, IncidentDoc
from prober.domain.types import Finding, FindingDoc
from prober.domain.verdicts import AuditVerdict, Status, Weight, weight
from prober.probing.documents import CacheLayerDoc, CheckDoc, CoverageDoc, PlanDoc, PlannedDoc, ShapeDoc, SightDoc
from prober.probing.path import PathDoc
from prober.probing.results import AuditResult, StepResult, TargetReport
from prober.probing.survey import Survey


class VerdictDoc(TypedDict):
    status: Status
    headline: str
    worst: str | None
    complete: bool
    reasons: list[str]
    tokens_sent: int
    duration_s: float


class MatrixDoc(TypedDict):
    tenants: list[str]
    cells: dict[str, dict[str, int]]  # victim -> observer -> findings of a crossing (echoes, shared-cache hits)


class StepDoc(TypedDict):
    id: str
    check: str  # the check that sent it
    exchange: str
    role: str
    tenant: str
    boundary: str
    prompt_tokens: int
    counted: bool
    expect: str
    outcome: str
    status: int | None
    stream: bool
    usage_prompt_tokens: int | None
    token_error: int | None
    finish_reason: str | None
    ttft_s: float | None
    total_s: float
    error: str | None
    canaries: int
    own_echoes: int
    findings: int


class TargetDoc(TypedDict):
    name: str
    url: str
    complete: bool
    capacity: CapacityDoc
    verdicts: list[CapacityVerdictDoc]
    known_bugs: list[KnownBugDoc]  # the bug table's rows for its engine, as its release stands
    tokenizer: str | None
    tokens_sent: int
    matrix: MatrixDoc
    coverage: CoverageDoc
    sight: dict[str, SightDoc]  # per content check: probe answers checked, how many echoed their own canary, blind
    paths: list[PathDoc]  # what the path to the engine adds, per route used
    cache_map: list[CacheLayerDoc]  # each cache layer tested, per route: shared, per tenant, none seen, undecided
    skipped: dict[str, str]  # exchanges that could not be built behind the path, and why
    notes: list[str]  # what the run set aside, and why
    price_per_mtok: float | None  # the target's, from the config: what `planned`'s prices are at
    planned: dict[str, PlannedDoc]  # by check, what it was to send: tokens, requests, seconds, or why it was moot
    checks: list[CheckDoc]  # each check that ran: requests, tokens, findings, sight, errors, its summary
    shape: ShapeDoc | None
    plan: PlanDoc | None
    steps: list[StepDoc]
    errors: list[str]


class SummaryDoc(TypedDict):
    findings: int
    worst: str | None
    by_kind: dict[str, int]
    by_severity: dict[str, int]
    incidents: int
    tokens_sent: int


class ToolDoc(TypedDict):
    name: str
    version: str


class IncidentEntry(IncidentDoc):
    """An incident (`Incident.to_json`) with the boundaries its findings were at and their indices in `findings`."""

    boundaries: list[str]
    findings: list[int]


class Document(TypedDict):
    """The report every format renders (findings and incidents in their own JSON forms: `Finding.to_json`,
    `Incident.to_json`)."""

    tool: ToolDoc
    started: float
    finished: float
    dry_run: bool
    complete: bool
    verdict: VerdictDoc
    summary: SummaryDoc
    incidents: list[IncidentEntry]
    findings: list[FindingDoc]
    targets: list[TargetDoc]


def incident_json(incident: Incident, findings: list[Finding]) -> IncidentEntry:
    """An incident with the indices (into the document's `findings`) of the findings under it."""
    index = {id(f): i for i, f in enumerate(findings)}
    boundaries = sorted({f.context.boundary for f in incident.findings if f.context.boundary})
    return {**incident.to_json(), "boundaries": boundaries, "findings": [index[id(f)] for f in incident.findings]}


def trace_of(finding: FindingDoc) -> str | None:
    """The trace id of the request that drew the finding (its `trace` detail): where the engine, and leakprobe
    itself where it exports spans, keep that request in the operator's trace view."""
    trace = next((d for d in finding["details"] if d.get("type") == "trace"), None)
    return str(trace["trace_id"]) if trace else None


def verdict(result: AuditResult) -> VerdictDoc:
    """Status and headline by the verdict table (prober/domain/verdicts.py); the reasons say what was not observed
    or could not be seen, whatever the status."""
    judged = AuditVerdict.of(result)
    worst = result.worst()
    # Why not complete, target by target: the first error of each is the one-line reason the runner gave.
    reasons = [f"{t.name}: {t.errors[0]}" for t in result.targets if not t.complete and t.errors]
    reasons += [f"{t.name}: {'; '.join(t.sights[check].reason(check) for check in t.blind)}; still checked: "
                f"{', '.join(still_checked(t))}" for t in result.targets if t.blind and not result.dry_run]
    return {"status": judged.status, "headline": judged.headline, "worst": worst.label if worst else None,
            "complete": result.complete, "reasons": reasons, "tokens_sent": sum(t.tokens_sent for t in result.targets),
            "duration_s": round(max(0.0, result.finished - result.started), 1)}


def advertised_and_pool(capacity: CapacityDoc) -> tuple[int | None, int | None]:
    """The advertised context (else the longest prompt seen served) and the KV pool, where known."""
    advertised = capacity["context_length"] or capacity["accept_limit"]
    pool = capacity["pool_tokens"]
    return advertised["value"] if advertised else None, pool["value"] if pool else None


def engine_named(capacity: CapacityDoc) -> str:
    """The engine and the release it says it is (`?` where it says neither)."""
    engine, version = capacity["engine"], capacity["version"]
    if engine is None:
        return "?"
    if version is None:
        return f"{engine} (release not said)"
    return f"{engine} {version['release'] or version['text'] + ' (no release named)'}"


def said_caches(capacity: CapacityDoc) -> list[str]:
    """The caches the engine says it runs or has off, each with where it says so."""
    def one(c: EngineCacheDoc) -> str:
        what = "prefix cache" if c["layer"] == "prefix" else "second prefix-cache tier"
        kind = f" ({c['kind']})" if c["kind"] else ""
        return f"the engine says: {what} {'on' if c['on'] else 'off'}{kind}, from {c['source']}"
    return [one(c) for c in capacity["caches"]]


def bug_lines(known: list[KnownBugDoc]) -> list[str]:
    """The bug table as it stands for a target: each row its release is in, then how many could not be told."""
    def count(standing: Standing) -> int:
        return sum(bug["standing"] == standing for bug in known)

    lines = [f"known bug {bug['public']} applies ({bug['releases']}): {bug['what']}; probed by "
             f"{', '.join(bug['checks']) or 'every check that reads answers'}"
             for bug in known if bug["standing"] == Standing.APPLIES]
    if unknown := count(Standing.UNKNOWN):
        lines.append(f"known bugs: {unknown} of the bug table's rows for this engine may apply (its release is not "
                     "known); every check runs")
    if fixed := count(Standing.FIXED):
        lines.append(f"known bugs: {fixed} of the bug table's rows for this engine are fixed in its release")
    return lines


def still_checked(report: TargetReport) -> list[str]:
    """What a target's run observed without reading answers for canaries: envelopes, caches, timing."""
    return [said for r in report.results if (said := r.still_checked()) is not None] or ["nothing"]


def matrix(report: TargetReport) -> MatrixDoc:
    """One target's findings that another tenant's data or cache state crossed (the verdict table's leaks), by
    victim (rows) and observer (columns)."""
    tenants = sorted({s.step.tenant for s in report.steps}
                     | {f.victim_tenant for f in report.findings if f.victim_tenant}
                     | ({e.victim for e in report.plan.exchanges} if report.plan else set()))
    cells = {v: dict.fromkeys((o for o in tenants if o != v), 0) for v in tenants}
    for f in report.findings:
        if weight(f.kind, f.severity) is Weight.LEAK and f.victim_tenant in cells and f.observer_tenant in cells:
            cells[f.victim_tenant][f.observer_tenant] += 1
    return {"tenants": tenants, "cells": cells}


def step_json(step: StepResult, check: str) -> StepDoc:
    answer = step.answer
    return {
        "id": step.step.id, "check": check, "exchange": step.exchange, "role": step.step.role,
        "tenant": step.step.tenant, "boundary": step.step.boundary, "prompt_tokens": step.sent_tokens,
        "counted": step.counted,
        "expect": "served" if step.step.expect_served else "refused", "outcome": step.outcome,
        "status": answer.status, "stream": step.step.stream,
        "usage_prompt_tokens": answer.usage.prompt_tokens if answer.usage else None,
        "token_error": step.token_error, "finish_reason": answer.finish_reason,
        "ttft_s": None if answer.ttft_s is None else round(answer.ttft_s, 4), "total_s": round(answer.total_s, 4),
        "error": str(answer.error) if answer.error else None, "canaries": len(step.canary_ids),
        "own_echoes": step.own_echoes, "findings": len(step.findings),
    }


def target_json(report: TargetReport) -> TargetDoc:
    survey = report.survey or Survey(report.name, report.url)
    return {"name": report.name, "url": report.url, "complete": report.complete,
            "capacity": survey.capacity.to_json(), "verdicts": [v.to_json() for v in survey.verdicts],
            "known_bugs": [bug.to_json() for bug in survey.bugs], "tokenizer": survey.tokenizer,
            "tokens_sent": report.tokens_sent, "matrix": matrix(report),
            "coverage": report.coverage().to_json(),
            "sight": {check: sight.to_json() for check, sight in report.sights.items()},
            "paths": [p.to_json() for p in report.paths],
            "cache_map": [layer.to_json() for r in report.results for layer in r.layers], "skipped": report.skipped,
            "notes": report.notes,
            "price_per_mtok": report.price_per_mtok,
            "planned": {name: p.to_json(report.price_per_mtok) for name, p in report.planned.items()},
            "checks": [r.to_json() for r in report.results],
            "shape": report.shape.to_json() if report.shape else None,
            "plan": report.plan.to_json() if report.plan else None,
            "steps": [step_json(s, r.check) for r in report.results for s in r.steps], "errors": report.errors}


def document(result: AuditResult) -> Document:
    findings = result.findings
    incidents = result.incidents
    worst = result.worst()
    return {
        "tool": {"name": "leakprobe", "version": __version__},
        "started": result.started, "finished": result.finished, "dry_run": result.dry_run,
        "complete": result.complete,
        "verdict": verdict(result),
        "summary": {"findings": len(findings), "worst": worst.label if worst else None,
                    "by_kind": dict(Counter(f.kind.value for f in findings)),
                    "by_severity": dict(Counter(f.severity.label for f in findings)),
                    "incidents": len(incidents), "tokens_sent": sum(t.tokens_sent for t in result.targets)},
        "incidents": [incident_json(i, findings) for i in incidents],
        "findings": [f.to_json() for f in findings],
        "targets": [target_json(t) for t in result.targets],
    }
