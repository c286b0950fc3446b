"""Every row of the engine-bug table (`REGISTRY.bugs`: each check's rows, rendered into docs/testbed.md): the
reference engine with that row's fault, audited as an operator would, reports the row's finding between the two
tenants; the fault-free engine, audited the same ways, reports none of them.  A row whose audit names canary adapters
gets an engine that serves them, each answering its trigger with the canary the deployment key (set for every row, as
an operator sets the key the adapters were built under) derives for its tenant."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from prober.canaries.keys import KEY_ENV
from prober.checks import REGISTRY
from prober.checks.bugs import EngineBug
from prober.config.schema import TargetConfig, assemble_config
from prober.domain.types import FindingKind, Severity
from prober.oneshot.audit import exit_code, run_audit
from prober.probing import AuditResult
from prober.report import document
from prober.targets.credentials import Secret
from tests.support.keys import KEYS
from tests.support.testbed import DEPLOYMENT_KEY, StartTestbed, bug_engine

TENANTS = {"tenant-a", "tenant-b"}
PAIRED = {FindingKind.CROSS_TENANT_ECHO, FindingKind.CROSS_TENANT_CACHE_HIT}  # name a victim as well
BUGS = REGISTRY.bugs
SHARED_CACHES = [b for b in BUGS if b.kind is FindingKind.CROSS_TENANT_CACHE_HIT]


def audit(url: str, ledger: Path, target: dict[str, Any]) -> AuditResult:
    cfg = assemble_config(None, target=url + "/v1", tenants=["tenant-a=LP_A", "tenant-b=LP_B"], ledger=str(ledger),
                          semantic=False, timing=False)
    cfg = cfg.model_copy(update={"targets": [TargetConfig.model_validate({**cfg.targets[0].model_dump(), **target})]})
    return asyncio.run(run_audit(cfg, {"tenant-a": Secret(KEYS["LP_A"]), "tenant-b": Secret(KEYS["LP_B"])}))


@pytest.mark.slow
@pytest.mark.parametrize("bug", BUGS, ids=[b.public.split(",")[0].replace(" ", "-") for b in BUGS])
def test_each_engine_bug_is_caught_by_its_probe(testbed: StartTestbed, tmp_path: Path, bug: EngineBug,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, DEPLOYMENT_KEY)
    faulty = testbed("fixed", **bug_engine(bug), faults=bug.faults)
    result = audit(faulty.url, tmp_path / "faulty.sqlite", bug.audit)
    found = [f for f in result.findings if f.kind is bug.kind]
    assert found, sorted({f.kind.value for f in result.findings})
    for finding in found:
        assert finding.observer_tenant in TENANTS and finding.target
        if bug.kind in PAIRED:
            assert finding.victim_tenant in TENANTS - {finding.observer_tenant}, finding.describe()
    fixed = testbed("fixed", **bug_engine(bug))
    clean = audit(fixed.url, tmp_path / "fixed.sqlite", bug.audit)
    assert not [f for f in clean.findings if f.kind is bug.kind], [f.describe() for f in clean.findings]
    assert clean.complete and not clean.blind


@pytest.mark.slow
@pytest.mark.parametrize("bug", SHARED_CACHES, ids=[b.public.split(",")[0].replace(" ", "-") for b in SHARED_CACHES])
def test_a_shared_prefix_cache_alone_is_a_leak_that_its_headline_names(testbed: StartTestbed, tmp_path: Path,
                                                                        bug: EngineBug) -> None:
    """The rows of a prefix cache shared between tenants (vLLM #16016, CVE-2025-46570): an audit whose findings are
    that cache's hits alone exits 1 whatever --fail-on says, under a headline that names the shared cache."""
    faulty = testbed("fixed", **bug_engine(bug), faults=bug.faults)
    result = audit(faulty.url, tmp_path / "faulty.sqlite", bug.audit)
    serious = {f.kind for f in result.findings if f.severity >= Severity.WARNING}  # beside refusals due (info)
    assert serious == {FindingKind.CROSS_TENANT_CACHE_HIT}, [f.describe() for f in result.findings]
    verdict = document(result)["verdict"]
    assert verdict["status"] == "leak", verdict
    assert verdict["headline"].startswith("LEAK: the prefix cache is shared between tenants"), verdict
    assert [exit_code(result, fail_on) for fail_on in Severity] == [1] * len(Severity)
