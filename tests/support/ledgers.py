"""A ledger as the contract tests open it: another handle on the same ledger each call (as another replica's),
and a finding with every field set."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from prober.domain.evidence import Change, EngineCounters, Exchange, Fragment, FragmentKind, SaltAsserted
from prober.domain.types import DetectorName, Finding, FindingKind, ProbeContext, Severity
from prober.ledger import Ledger

OpenLedger = Callable[[], Ledger]


def finding(**changes: object) -> Finding:
    base = Finding(record_id="r1", kind=FindingKind.CROSS_TENANT_ECHO, detector=DetectorName.FRAGMENT,
                   severity=Severity.HIGH, score=0.97, observer_tenant="bob", victim_tenant="alice", canary_id="cn_1",
                   probe_id="p1", start=3, end=42, excerpt="S***: LPK-…", excerpt_sha256="ab" * 32, redacted=True,
                   context=ProbeContext(prompt_tokens=681_281, boundary="pool+1", status=200),
                   evidence=(Fragment(FragmentKind.TOKEN_PART, groups=(0, 1, 2)), Exchange("x1"),
                             EngineCounters({"sglang:num_aborted_requests_total": Change.between(3.0, 4.0)}),
                             SaltAsserted(("alice",))),
                   target="sglang", check="campaign", found_at=1.7e9)
    return replace(base, **changes)  # type: ignore[arg-type]
