"""Per-tenant prefix-cache salts, and what a cross-tenant cache hit means where the config promises them.

vLLM shares its prefix cache between all requests unless they carry a `cache_salt`: the salt goes into the
first block's hash, so only requests with equal salts share blocks.  A multi-tenant gateway should add one
per tenant.  `cache_salt: per-tenant` on a target makes the prober do that itself (a random 256-bit salt per
tenant, for the life of the runner); `cache_salted: true` on a tenant is the operator's word that its
gateway does.  Either way, a cross-tenant hit that involves such a tenant is a broken promise, not a
configuration gap, and the finding says so.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import replace

from prober.config.schema import TargetConfig, TenantConfig
from prober.domain.evidence import SaltAsserted, adding
from prober.domain.types import Finding, FindingKind, Severity

SALT_BYTES = 32  # vLLM's docs ask for a random salt of 256 bits (43 characters of base64)
CACHE_KINDS = frozenset({FindingKind.CROSS_TENANT_CACHE_HIT, FindingKind.CROSS_TENANT_CACHE_TIMING})


def tenant_salts(target: TargetConfig, tenants: Sequence[str]) -> dict[str, str]:
    """tenant -> the `cache_salt` its requests to this target carry (none unless the target asks for it)."""
    if target.cache_salt != "per-tenant":
        return {}
    return {tenant: secrets.token_urlsafe(SALT_BYTES) for tenant in tenants}


def claimed_salted(tenants: Sequence[TenantConfig]) -> frozenset[str]:
    """The tenants whose gateway, the config says, salts their prefix cache (on every target)."""
    return frozenset(t.name for t in tenants if t.cache_salted)


def salted_tenants(target: TargetConfig, tenants: Sequence[str], claimed: frozenset[str]) -> frozenset[str]:
    """The tenants whose prefix cache on this target is meant to be salted: all of them where the prober salts
    itself, else those the config says a gateway salts."""
    return frozenset(tenants) if target.cache_salt == "per-tenant" else claimed & frozenset(tenants)


def salt_asserted(finding: Finding, salted: frozenset[str]) -> Finding:
    """A cross-tenant cache finding that involves a salted tenant: say so, and raise it to HIGH."""
    involved = sorted({finding.observer_tenant, finding.victim_tenant or ""} & salted)
    if finding.kind not in CACHE_KINDS or not involved:
        return finding
    who = " and ".join(involved)
    note = f"; the config says {who} {'is' if len(involved) == 1 else 'are'} cache-salted: the salt does not isolate"
    return replace(finding, severity=max(finding.severity, Severity.HIGH), excerpt=finding.excerpt + note,
                   evidence=adding(finding.evidence, SaltAsserted(tuple(involved))))
