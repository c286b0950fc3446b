"""The prefix cache's second tier (SGLang HiCache, vLLM CPU offload or a KV connector, LMCache): the reference engine
moves what its first tier evicts into a second, keyed by tenant and salt (or, with `storage_tier_ignores_salt`, by
content alone) and says in its usage which tier served the cached tokens; the prefix-cache check sees the split in
its own answers, evicts the first tier with filler, resends, and puts the tier on the cache map."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from prober.capacity.limits import EngineCache
from prober.checks.prefix_cache import CONNECTOR_LOOKUPS, EVICTED, FILLER, OWN_AGAIN, second_tier
from prober.config.schema import TargetConfig, assemble_config
from prober.domain.types import FindingKind
from prober.oneshot.audit import run_audit
from prober.probing import AuditResult
from prober.probing.results import CheckResult
from prober.targets.credentials import Secret
from prober.targets.result import Usage
from prober.targets.telemetry import parse
from prober.testbed.config import build_config
from prober.testbed.prefixes import Prefixes
from tests.support.keys import KEYS
from tests.support.testbed import SMALL, StartTestbed

SALTED = {"cache_salt": "per-tenant"}


def audit(url: str, ledger: Path, target: dict[str, Any]) -> AuditResult:
    cfg = assemble_config(None, target=url + "/v1", tenants=["tenant-a=LP_A", "tenant-b=LP_B"], ledger=str(ledger),
                          semantic=False, timing=False, checks=["prefix-cache"])
    cfg = cfg.model_copy(update={"targets": [TargetConfig.model_validate({**cfg.targets[0].model_dump(), **target})]})
    return asyncio.run(run_audit(cfg, {"tenant-a": Secret(KEYS["LP_A"]), "tenant-b": Secret(KEYS["LP_B"])}))


def layers(result: AuditResult) -> dict[str, Any]:
    return {layer.layer: layer for r in result.targets[0].results for layer in r.layers}


@pytest.mark.unit
def test_the_engine_moves_what_its_first_tier_evicts_into_the_second_and_says_which_served() -> None:
    """A prompt evicted from the first tier comes back from the second for its own tenant and salt (reported as
    external); another salt misses there, unless the fault keys that tier by content alone."""
    ids = np.arange(1, 65, dtype=np.int32)  # four pages of 16
    filler = np.arange(1_000, 1_000 + 4_096, dtype=np.int32)  # the whole first tier (pool 4,096 tokens)
    for fault, other in ((False, 0), (True, 63)):
        prefixes = Prefixes(build_config("fixed", {**SMALL, "storage_tier_entries": 1_024,
                                                   "faults": {"storage_tier_ignores_salt": fault}}))
        prefixes.admit("tenant-a", "salt-a", ids).written(len(ids), 16)
        assert (prefixes.admit("tenant-a", "salt-a", ids).external, prefixes.first.capacity) == (0, 256)  # first tier
        prefixes.admit("tenant-a", "salt-a", filler).written(len(filler), 16)
        mine = prefixes.admit("tenant-a", "salt-a", ids)
        assert (mine.cached, mine.external) == (63, 63)
        theirs = prefixes.admit("tenant-b", "salt-b", ids)
        assert (theirs.cached, theirs.external) == (other, other), fault


@pytest.mark.unit
def test_usage_tells_the_tiers_apart_where_the_engine_does() -> None:
    details = {"cached_tokens": 96, "local_cached_tokens": 64, "external_cached_tokens": 32}
    told = Usage.parse({"prompt_tokens": 200, "completion_tokens": 1, "prompt_tokens_details": details})
    assert told == Usage(200, 1, 96, 64, 32)
    untold = Usage.parse({"prompt_tokens": 200, "prompt_tokens_details": {"cached_tokens": 96}})
    assert untold is not None and (untold.local_cached_tokens, untold.external_cached_tokens) == (None, None)


@pytest.mark.parametrize(("fault", "state"), [(False, "per_tenant"), (True, "shared")])
def test_the_check_evicts_the_first_tier_and_names_the_tier_that_answered(testbed: StartTestbed, tmp_path: Path,
                                                                          fault: bool, state: str) -> None:
    """Per-tenant salts and a correct second tier: the observer's own resend comes back from the second tier (the
    positive control) and no other tenant's prompt does.  The tier keyed without the salt: the observer is served
    the victim's prompt from it, and the finding says the second tier served it."""
    server = testbed("fixed", **SMALL, storage_tier_entries=1_024, faults={"storage_tier_ignores_salt": fault})
    usage = httpx.post(server.url + "/v1/chat/completions", headers={"Authorization": "Bearer testbed-key-a"},
                       json={"model": "testbed-quoter", "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens_details"]["external_cached_tokens"] == 0, usage
    result = audit(server.url, tmp_path / "l.sqlite", SALTED)
    tier = layers(result)["prefix-tier2"]
    assert tier.state.value == state and "2 of 2 resends" in tier.control, tier
    assert "usage.external_cached_tokens" in tier.control and "filler tokens" in tier.control, tier.control
    assert layers(result)["prefix"].state.value == "per_tenant", layers(result)["prefix"]
    crossed = [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_CACHE_HIT]
    steps = {s.step.id: s.step for r in result.targets[0].results for s in r.steps}
    assert {s.role for s in steps.values() if s.boundary == FILLER} == {"filler"}
    if fault:
        assert {(f.observer_tenant, f.victim_tenant) for f in crossed} == {("tenant-a", "tenant-b"),
                                                                            ("tenant-b", "tenant-a")}
        assert all(steps[f.record_id].boundary == EVICTED and "second tier" in f.excerpt for f in crossed), crossed
    else:
        assert not crossed, [f.describe() for f in crossed]
    assert sum(s.boundary == OWN_AGAIN for s in steps.values()) == 2


@pytest.mark.parametrize(("tier", "said", "evicted"), [(0, None, False), (1_024, False, False), (1_024, True, True)])
def test_the_target_setting_decides_where_the_usage_cannot(testbed: StartTestbed, tmp_path: Path, tier: int,
                                                           said: bool | None, evicted: bool) -> None:
    """An engine whose usage names no second tier gets no filler; `lower_tier: false` none either; `lower_tier: true`
    puts the eviction in the plan, so that its tokens are in the budget before anything is sent."""
    server = testbed("fixed", **SMALL, storage_tier_entries=tier)
    result = audit(server.url, tmp_path / "l.sqlite", {**SALTED, "lower_tier": said})
    filler = [s for r in result.targets[0].results for s in r.steps if s.step.role == "filler"]
    assert ("prefix-tier2" in layers(result), bool(filler)) == (evicted, evicted)
    planned = result.targets[0].planned["prefix-cache"].tokens
    assert planned == (26_624 if evicted else 0) + 10_240, planned


def test_vllms_count_of_connector_lookups_shows_a_second_tier(testbed: StartTestbed, tmp_path: Path) -> None:
    """vLLM 0.32 keeps the tier split out of its usage and counts a KV connector's lookups in its metrics: the
    reference engine under vLLM's metric names counts them only with a second tier, and that count is evidence of
    one where no answer's usage is."""
    counted: dict[int, float] = {}
    for tier in (0, 1_024):
        server = testbed("fixed", **SMALL, metrics="vllm", storage_tier_entries=tier)
        audit(server.url, tmp_path / f"{tier}.sqlite", SALTED)
        values, _ = parse(httpx.get(server.url + "/metrics").text)
        counted[tier] = values.get(CONNECTOR_LOOKUPS, 0.0)
    assert counted[0] == 0 and counted[1_024] > 0, counted
    assert second_tier(CheckResult(check="prefix-cache"), counted[0]) is None
    assert CONNECTOR_LOOKUPS in (second_tier(CheckResult(check="prefix-cache"), counted[1_024]) or "")


@pytest.mark.unit
def test_a_second_tier_the_engine_says_it_runs_is_tested_where_no_answer_shows_it() -> None:
    """SGLang's HiCache or vLLM's CPU offload, as the survey read the engine's configuration: the eviction and
    resend run on the engine's word where neither its usage nor its lookups show the tier; a tier said off, not."""
    nothing = CheckResult(check="prefix-cache")
    said = EngineCache("prefix-tier2", True, "sglang /server_info enable_hierarchical_cache", "host memory")
    assert second_tier(nothing, 0.0, said) == ("the engine says it runs a second cache tier (host memory) "
                                               "(sglang /server_info enable_hierarchical_cache)")
    assert second_tier(nothing, 0.0, EngineCache("prefix-tier2", False, "sglang /server_info …")) is None
