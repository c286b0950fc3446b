"""A ledger as the contract tests open it: another handle on the same ledger each call (as another replica's),
and a finding with every field set."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from prober.ledger import Ledger
from prober.types import Finding, FindingKind, ProbeContext, Severity

OpenLedger = Callable[[], Ledger]


def finding(**changes: object) -> Finding:
    base = Finding(record_id="r1", kind=FindingKind.CROSS_TENANT_ECHO, detector="exact", severity=Severity.HIGH,
                   score=0.97, observer_tenant="bob", victim_tenant="alice", canary_id="cn_1", probe_id="p1",
                   start=3, end=42, excerpt="S***: LPK-…", excerpt_sha256="ab" * 32, redacted=True,
                   context=ProbeContext(prompt_tokens=681_281, boundary="pool+1", status=200),
                   details={"exchange": "x1"}, target="sglang", found_at=1.7e9)
    return replace(base, **changes)  # type: ignore[arg-type]
