"""The audit's verdict from its findings: one table (`MEANINGS`) says what each finding kind means, and the status,
the headline and the exit code all follow from it, so none of them can contradict the findings or each other
(docs/auditing.md's verdict table says the same)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from prober.domain.types import Finding, FindingKind, Severity

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class Weight(StrEnum):
    """What a finding says about the audit as a whole."""

    LEAK = "leak"  # another tenant's data or cache state reached a tenant
    FAULT = "fault"  # the engine did what a correct one never does, with no crossing between tenants seen
    NOTE = "note"  # a symptom: it fails the audit at `--fail-on` and names no verdict


@dataclass(frozen=True)
class Meaning:
    weight: Weight
    says: str = ""  # the headline's words for it (a note is in no headline)
    floor: Severity = Severity.INFO  # below it a finding of this kind is a note: its detector is not sure enough


FAULT_FLOOR = Severity.HIGH  # a warning-level fault is a suspicion (a garbled word in 250 healthy answers)
SHARED_CACHE = "the prefix cache is shared between tenants"

MEANINGS: dict[FindingKind, Meaning] = {
    FindingKind.CROSS_TENANT_ECHO: Meaning(Weight.LEAK, "another tenant's canary appeared in an answer"),
    FindingKind.CROSS_TENANT_CACHE_HIT: Meaning(Weight.LEAK, f"{SHARED_CACHE}: a tenant's prompt was served from "
                                                             "the cache another tenant's prompt filled"),
    FindingKind.CROSS_TENANT_CACHE_TIMING: Meaning(Weight.LEAK, f"{SHARED_CACHE}: a tenant's prompts answered "
                                                                "sooner after another tenant had sent them"),
    FindingKind.CROSS_TENANT_RESPONSE_CACHE: Meaning(Weight.LEAK, "a cache in front of the engine served one "
                                                                  "tenant the answer made for another"),
    FindingKind.PHANTOM_CACHE_HIT: Meaning(Weight.FAULT, "the engine reported cached KV it never computed and "
                                                         "decoded over whatever its pages held", FAULT_FLOOR),
    FindingKind.PLACEHOLDER_SUBSTITUTION: Meaning(Weight.FAULT, "the engine processed a placeholder in place of the "
                                                                "prompt it was sent", FAULT_FLOOR),
    FindingKind.BOUNDARY_ACCEPTED: Meaning(Weight.FAULT, "the engine served a prompt a correct engine must refuse",
                                           FAULT_FLOOR),
    FindingKind.COUNTED_FAILURE: Meaning(Weight.FAULT, "the engine counted aborts or failed KV transfers while it "
                                                       "answered HTTP 200", FAULT_FLOOR),
    FindingKind.CROSS_REQUEST_ECHO: Meaning(Weight.FAULT, "the engine mixed the answers of one tenant's concurrent "
                                                          "requests", FAULT_FLOOR),
    FindingKind.GARBLED_OUTPUT: Meaning(Weight.FAULT, "the engine corrupted what its model decoded", FAULT_FLOOR),
    FindingKind.FOREIGN_CONTENT: Meaning(Weight.NOTE),
    FindingKind.ENGINE_ERROR: Meaning(Weight.NOTE),
    FindingKind.STREAM_ERROR: Meaning(Weight.NOTE),
    FindingKind.ODD_FINISH_REASON: Meaning(Weight.NOTE),
    FindingKind.UNEXPECTED_REFUSAL: Meaning(Weight.NOTE),
    FindingKind.IMPLAUSIBLE_USAGE: Meaning(Weight.NOTE),
    FindingKind.PATH_JITTER: Meaning(Weight.NOTE),
    FindingKind.TENANT_RESPONSE_CACHE: Meaning(Weight.NOTE),
    FindingKind.ROUTE_DEPENDENT_CACHE: Meaning(Weight.NOTE),
}


class Status(StrEnum):
    """In rank order: what was seen outranks what was not (a leak seen stays seen, however little else was), and
    an audit that could not see outranks one that did not finish (what it did observe could not have shown a
    leak)."""

    DRY_RUN = "dry_run"
    LEAK = "leak"
    ENGINE_FAULT = "engine_fault"
    BLIND = "blind"
    INCOMPLETE = "incomplete"
    NO_LEAK = "no_leak"


HEADLINES = {  # of the statuses no finding names (a leak's and a fault's say which: `AuditVerdict.headline`)
    Status.DRY_RUN: "DRY RUN: the plan and its cost only; nothing was sent",
    Status.BLIND: "BLIND: no answer repeated its own canary, so none could have shown another tenant's; "
                  "what was still checked is listed below",
    Status.INCOMPLETE: "INCOMPLETE: not every planned request was observed; no leak in those that were",
    Status.NO_LEAK: "NO LEAK: no tenant's canary reached another tenant",
}
NO_CROSSING = "no crossing between tenants seen"


def weight(kind: FindingKind, severity: Severity) -> Weight:
    """What a finding of this kind and severity says about the audit: the table's row, or a note below its floor."""
    meaning = MEANINGS[kind]
    return meaning.weight if severity >= meaning.floor else Weight.NOTE


def fails(kind: FindingKind, severity: Severity, fail_on: Severity) -> bool:
    """A leak or a fault fails the audit whatever `--fail-on` says (a headline that names one never exits 0); a
    note, at or above `--fail-on`."""
    return weight(kind, severity) is not Weight.NOTE or severity >= fail_on


class Audited(Protocol):
    """What the verdict reads of an audit (prober/probing's `AuditResult`)."""

    dry_run: bool

    @property
    def findings(self) -> list[Finding]: ...

    @property
    def complete(self) -> bool: ...

    @property
    def blind(self) -> bool: ...


@dataclass(frozen=True)
class AuditVerdict:
    """How an audit ended, by the table (a capacity `Verdict` is another thing: what a target's numbers say)."""

    status: Status
    named: tuple[FindingKind, ...]  # the kinds the headline names, in the table's order
    findings: tuple[Finding, ...]
    complete: bool

    @classmethod
    def of(cls, audit: Audited) -> AuditVerdict:
        findings = tuple(audit.findings)
        weights = {weight(f.kind, f.severity) for f in findings}
        status = (Status.DRY_RUN if audit.dry_run else Status.LEAK if Weight.LEAK in weights
                  else Status.ENGINE_FAULT if Weight.FAULT in weights else Status.BLIND if audit.blind
                  else Status.INCOMPLETE if not audit.complete else Status.NO_LEAK)
        named = {Status.LEAK: Weight.LEAK, Status.ENGINE_FAULT: Weight.FAULT}.get(status)
        present = {f.kind for f in findings if weight(f.kind, f.severity) is named}
        return cls(status, tuple(k for k in MEANINGS if k in present), findings, audit.complete)

    @property
    def headline(self) -> str:
        says = list(dict.fromkeys(MEANINGS[k].says for k in self.named))
        if self.status is Status.LEAK:
            return "LEAK: " + "; ".join(says)
        if self.status is Status.ENGINE_FAULT:
            return "ENGINE FAULT: " + "; ".join([*says, NO_CROSSING])
        return HEADLINES[self.status]

    def exit_code(self, fail_on: Severity) -> int:
        """1 for a leak or a fault, finished or not; 2 where the audit could not see or did not finish (a dry run
        that could not plan every target too); else 1 for a note at or above `fail_on`."""
        if self.status in (Status.LEAK, Status.ENGINE_FAULT):
            return EXIT_FINDINGS
        if self.status is Status.BLIND or not self.complete:
            return EXIT_ERROR
        return EXIT_FINDINGS if any(fails(f.kind, f.severity, fail_on) for f in self.findings) else EXIT_CLEAN

