"""Rows <-> values for the SQL ledger (the same columns and encodings in SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from prober.domain.incidents import Acknowledgement, Incident, IncidentKey, Recheck
from prober.domain.types import Canary, CanaryKind, DetectorName, Finding, FindingKind, Severity
from prober.ledger import details
from prober.text.shingles import PromptShingles

CANARY_COLUMNS = ("id, tenant, kind, text, probe_id, pack, slots, created_at, expires_at, embedding, "
                  "embedding_model, aliases")
INCIDENT_KEY = "target, kind, victim, observer"
CHECK_COLUMNS = f"{INCIDENT_KEY}, job, boundary, prompt_tokens, last_found, last_clean"
ACK_COLUMNS = f"{INCIDENT_KEY}, acked_at, acked_by, note"
SHINGLE_COLUMNS = "tenant, probe_id, created_at, expires_at, hashes"
FINDING_COLUMNS = ("created_at, target, record_id, kind, detector, severity, score, observer_tenant, victim_tenant, "
                   "canary_id, probe_id, start_offset, end_offset, excerpt, excerpt_sha256, redacted, details")


def canary_row(c: Canary) -> tuple[Any, ...]:
    return (c.id, c.tenant, c.kind.value, c.text, c.probe_id, c.pack, json.dumps(list(c.values)), c.created_at,
            c.expires_at, c.embedding, c.embedding_model, json.dumps([list(a) for a in c.aliases]))


def canary_of(row: Sequence[Any]) -> Canary:
    return Canary(id=row[0], tenant=row[1], kind=CanaryKind(row[2]), text=row[3], probe_id=row[4], pack=row[5],
                  values=tuple(json.loads(row[6])), created_at=row[7], expires_at=row[8],
                  embedding=bytes(row[9]) if row[9] is not None else None, embedding_model=row[10],
                  aliases=tuple((int(i), str(a)) for i, a in json.loads(row[11])))


def finding_row(f: Finding, now: float) -> tuple[Any, ...]:
    return (f.found_at or now, f.target, f.record_id, f.kind.value, f.detector.value, f.severity.label, f.score,
            f.observer_tenant, f.victim_tenant, f.canary_id, f.probe_id, f.start, f.end, f.excerpt, f.excerpt_sha256,
            int(f.redacted), details.written(f))


def finding_of(r: Sequence[Any]) -> Finding:
    context, check, evidence = details.read(r[16])
    return Finding(found_at=r[0], target=r[1], record_id=r[2], kind=FindingKind(r[3]), detector=DetectorName(r[4]),
                   severity=Severity.parse(r[5]), score=r[6], observer_tenant=r[7], victim_tenant=r[8],
                   canary_id=r[9], probe_id=r[10], start=r[11], end=r[12], excerpt=r[13], excerpt_sha256=r[14],
                   redacted=bool(r[15]), check=check, context=context, evidence=evidence)


def incident_row(f: Finding, now: float) -> tuple[Any, ...]:
    key = IncidentKey.of(f)
    at = f.found_at or now
    return (key.target, key.kind.value, key.victim, key.observer, int(f.severity), at, at)


def key_of(row: Sequence[Any]) -> IncidentKey:
    return IncidentKey(row[0], FindingKind(row[1]), row[2], row[3])


def key_row(key: IncidentKey) -> tuple[str, str, str, str]:
    return key.target, key.kind.value, key.victim, key.observer


def incident_of(row: Sequence[Any]) -> Incident:
    return Incident(key_of(row), Severity(row[4]), row[5], row[6], row[7])


def check_of(row: Sequence[Any]) -> Recheck:
    return Recheck(job=row[4], boundary=row[5], prompt_tokens=None if row[6] is None else int(row[6]),
                 last_found=row[7], last_clean=row[8])


def ack_of(row: Sequence[Any]) -> Acknowledgement:
    return Acknowledgement(by=row[5], at=row[4], note=row[6])


def shingles_row(r: PromptShingles) -> tuple[Any, ...]:
    return (r.tenant, r.probe_id, r.created_at, r.expires_at, r.hashes)


def shingles_of(row: Sequence[Any]) -> PromptShingles:
    return PromptShingles(tenant=row[0], probe_id=row[1], created_at=row[2], expires_at=row[3], hashes=bytes(row[4]))
