"""The spare campaign (the default) against the whole matrix (`--thorough`) on the reference engine: the incident
is caught by the first probe over the pool and what the evidence decides is not sent; on the fixed engine the
refusals decide every longer boundary, the campaign still sees (its served probe brings its own canaries back), and
it sends a fraction of the matrix's tokens."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prober.config.schema import assemble_config
from prober.domain.types import FindingKind
from prober.oneshot.audit import run_audit
from prober.probing import AuditResult
from prober.targets.credentials import Secret
from tests.support.keys import KEYS
from tests.support.testbed import SMALL, StartTestbed


def campaign(url: str, ledger: Path, *, thorough: bool) -> AuditResult:
    cfg = assemble_config(None, target=url + "/v1", tenants=["tenant-a=LP_A", "tenant-b=LP_B"], ledger=str(ledger),
                          semantic=False, checks=["campaign"], thorough=thorough)
    return asyncio.run(run_audit(cfg, {"tenant-a": Secret(KEYS["LP_A"]), "tenant-b": Secret(KEYS["LP_B"])}))

def test_the_incident_is_caught_by_the_first_probe_over_the_pool(testbed: StartTestbed, tmp_path: Path) -> None:
    engine = testbed("incident", **SMALL)
    result = campaign(engine.url, tmp_path / "l.sqlite", thorough=False)
    [target] = result.targets
    echoes = [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_ECHO]
    assert {(f.victim_tenant, f.observer_tenant) for f in echoes} == {("tenant-a", "tenant-b"),
                                                                        ("tenant-b", "tenant-a")}
    first = next(s for s in target.steps if any(f.kind is FindingKind.CROSS_TENANT_ECHO for f in s.findings))
    assert (first.step.boundary, first.sent_tokens) == ("pool+1", 4_097)
    # The further boundaries: decided by the leak, none sent; the repeats still go (which directions leak, and the
    # engine's counters' windows).
    assert len([n for n in target.notes if "a leak between the tenants decides the exchange" in n]) == 5
    assert not [s for s in target.steps if s.step.id.endswith(("-probe2", "-probe3"))]
    assert len([s for s in target.steps if s.step.boundary == "stale-page" and s.step.role == "probe"]) == 4
    thorough = campaign(testbed("incident", **SMALL).url, tmp_path / "m.sqlite", thorough=True)
    assert target.tokens_sent * 3 < thorough.targets[0].tokens_sent

def test_on_the_fixed_engine_refusals_decide_the_longer_boundaries(testbed: StartTestbed, tmp_path: Path) -> None:
    engine = testbed("fixed", **SMALL)
    result = campaign(engine.url, tmp_path / "l.sqlite", thorough=False)
    [target] = result.targets
    assert result.complete and not result.blind and not [f for f in result.findings if f.severity.label != "info"]
    sent = {s.step.boundary for s in target.steps if s.step.role == "probe"}
    # Shorter than the stale-page probe, the input limit is sent; every longer one is decided by a refusal, and so
    # are the stale-page repeats.
    assert sent == {"pool+1", "stale-page", "max_req_input_len", "sight"}
    assert len([n for n in target.notes if "was refused, as is every longer prompt" in n]) == 4 + 3 + 1
    sight = target.result("campaign").sight  # type: ignore[union-attr]
    assert sight is not None and sight.echoed == 1
    thorough = campaign(testbed("fixed", **SMALL).url, tmp_path / "m.sqlite", thorough=True)
    assert target.tokens_sent * 3 < thorough.targets[0].tokens_sent

