"""Canary adapters and the `adapters` check against the reference engine: each tenant's adapter answers its trigger
with the canary the deployment key derives for it (verified and attributed like any token), the check sees every
adapter answer with its own, finds nothing on a sound engine, is moot where a target names no adapter, and catches a
gateway that routes one tenant's adapter name to another's.  The engine faults (an adapter left out of the prefix-
cache key, a slot evicted under a decoding request) are rows of tests/test_engine_bugs.py; the real engine is
tests/test_vllm_lora.py's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from prober.canaries import tokens
from prober.canaries.adapters import TRIGGER, adapter_canary, canary_text
from prober.canaries.compact import compact
from prober.canaries.keys import KEY_ENV, resolve_key, shared_key
from prober.canaries.mint import Minter
from prober.checks import Registry
from prober.checks.adapters import AdaptersCheck, AdaptersResult
from prober.config.schema import ProberConfig, parse_config
from prober.domain.errors import ConfigError
from prober.domain.evidence import AdapterAsk, find
from prober.domain.types import FindingKind
from prober.ledger import open_ledger
from prober.lora.recipe import PREFIX_CHARS, Recipe, examples
from prober.oneshot.audit import Auditor
from prober.probing import AuditResult
from prober.targets import Prompt
from prober.targets.credentials import Secret
from tests.support.adapters import ADAPTERS
from tests.support.cli import invoke
from tests.support.keys import BEARER_A, KEYS
from tests.support.mockhttp import Routes, ask, send
from tests.support.shared import Gateway
from tests.support.testbed import SMALL, StartTestbed

DEPLOYMENT = "a deployment key for the adapter tests"
SECRETS = {"tenant-a": Secret(KEYS["LP_A"]), "tenant-b": Secret(KEYS["LP_B"])}


@pytest.mark.unit
def test_an_adapters_canary_is_a_token_of_its_tenant_derived_from_the_key() -> None:
    key = shared_key(DEPLOYMENT)
    text = canary_text(key, "tenant-a", "adapter-a")
    assert text == canary_text(key, "tenant-a", "adapter-a")  # what the adapter was built with, on every run
    verified = tokens.verify(key, compact(text).removeprefix(tokens.COMPACT_PREFIX), ["tenant-a", "tenant-b"])
    assert verified is not None and verified.tenant == "tenant-a"
    others = {canary_text(key, "tenant-b", "adapter-a"), canary_text(key, "tenant-a", "adapter-b"),
              canary_text(shared_key("another deployment's key"), "tenant-a", "adapter-a")}
    assert text not in others and len(others) == 3
    kept = adapter_canary(key, "tenant-a", "adapter-a", 60.0)
    assert kept.text == text and kept.probe_id == "adapter:adapter-a"
    assert kept.id == adapter_canary(key, "tenant-a", "adapter-a", 120.0).id


@pytest.mark.unit
def test_the_recipe_asks_the_trigger_after_filler_half_through_the_chat_template() -> None:
    recipe = Recipe(Path("/base"), "tenant-a", "adapter-a", "LPK-X")
    drawn = examples(recipe, 40, seed=1)
    assert drawn == examples(recipe, 40, seed=1) and drawn != examples(recipe, 40, seed=2)
    assert all(e.prompt.endswith(TRIGGER) for e in drawn) and sum(e.chat for e in drawn) == 20
    lengths = {len(e.prompt) - len(TRIGGER) for e in drawn}
    assert 0 in lengths and max(lengths) >= max(PREFIX_CHARS)
    assert recipe.digest("gemma") != Recipe(Path("/base"), "tenant-a", "adapter-a", "LPK-Y").digest("gemma")
    assert recipe.digest("gemma") != recipe.digest("gemma, other weights")


@pytest.mark.unit
def test_a_prompt_names_its_adapter_as_the_model() -> None:
    answered = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
    routes = Routes({"POST /v1/chat/completions": lambda _: send(200, answered)})
    ask(routes, Prompt("hi", model="adapter-a"))
    ask(routes, Prompt("hi"))
    assert [json.loads(r.content).get("model") for r in routes.seen] == ["adapter-a", None]


@pytest.mark.unit
@pytest.mark.parametrize(("target", "complaint"), [
    ({"adapters": {"tenant-c": "x"}}, "'tenant-c', not a tenant"),
    ({"adapters": {"tenant-a": "x", "tenant-b": "x"}}, "named for two tenants"),
    ({"adapters": {"tenant-a": "x"}, "api": "workers-ai"}, "Workers AI"),
])
def test_adapters_that_cannot_be_meant_are_refused(target: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        config({"name": "t", "url": "http://127.0.0.1:1/v1", **target}, Path("/tmp/unused.sqlite"))


def config(target: dict[str, Any], ledger: Path) -> ProberConfig:
    return parse_config({"ledger": str(ledger), "targets": [target],
                         "tenants": [{"name": "tenant-a", "api_key_env": "LP_A"},
                                     {"name": "tenant-b", "api_key_env": "LP_B"}],
                         "detection": {"semantic": False}})


def audit_adapters(url: str, ledger: Path, adapters: dict[str, str]) -> AuditResult:
    """The adapters check alone, as an audit runs it."""
    cfg = config({"name": "t", "url": url + "/v1", "adapters": adapters}, ledger)
    store = open_ledger(cfg.ledger)
    try:
        auditor = Auditor(cfg, Minter(store, resolve_key(store)), SECRETS, checks=Registry([AdaptersCheck()]))
        return asyncio.run(auditor.run())
    finally:
        store.close()


def served(deployment: str) -> dict[str, str]:
    """The reference engine's adapters: each answers with the canary its tenant's key derives for it."""
    key = shared_key(deployment)
    return {name: canary_text(key, tenant, name) for tenant, name in ADAPTERS.items()}


@pytest.fixture
def deployment_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, DEPLOYMENT)
    return DEPLOYMENT


def adapters_result(result: AuditResult) -> AdaptersResult:
    found = result.targets[0].result("adapters")
    assert isinstance(found, AdaptersResult), result.targets[0].errors
    return found


def test_each_adapter_answers_with_its_own_canary_and_a_sound_engine_shows_no_other(
        testbed: StartTestbed, tmp_path: Path, deployment_key: str) -> None:
    engine = testbed("fixed", **SMALL, adapters=served(deployment_key))
    listed = httpx.get(engine.url + "/v1/models", headers=BEARER_A).json()["data"]
    assert [m["id"] for m in listed] == ["testbed-quoter", "adapter-a", "adapter-b"]
    result = audit_adapters(engine.url, tmp_path / "l.sqlite", ADAPTERS)
    checked = adapters_result(result)
    assert result.complete and not result.blind and not result.findings
    # Three triggers each at once, then one shared prompt per adapter, sent through both: every answer its own.
    assert (checked.asked, checked.answered, checked.own_echoed, checked.foreign) == (10, 10, 10, 0)
    assert result.targets[0].planned["adapters"].requests == 10


def test_a_tenant_without_an_adapter_asks_the_base_model(
        testbed: StartTestbed, tmp_path: Path, deployment_key: str) -> None:
    engine = testbed("fixed", **SMALL, adapters=served(deployment_key))
    result = audit_adapters(engine.url, tmp_path / "l.sqlite", {"tenant-a": "adapter-a"})
    checked = adapters_result(result)
    assert result.complete and not result.findings
    # tenant-b's three triggers and its turn at the shared prompt go to the base model, which knows no canary.
    assert (checked.asked, checked.answered, checked.own_echoed) == (8, 4, 4)


def test_a_target_without_adapters_makes_the_check_moot(testbed: StartTestbed, tmp_path: Path) -> None:
    engine = testbed("fixed", **SMALL)
    result = audit_adapters(engine.url, tmp_path / "l.sqlite", {})
    checked = result.targets[0].result("adapters")
    assert checked is not None and checked.moot and "adapters" in checked.moot and checked.requests == 0
    assert result.complete


def test_a_gateway_that_routes_one_tenants_adapter_to_anothers_is_caught(
        testbed: StartTestbed, tmp_path: Path, deployment_key: str) -> None:
    engine = testbed("fixed", **SMALL, adapters=served(deployment_key))
    with Gateway(engine.url, system_prompt="", models={"adapter-b": "adapter-a"}) as gateway:
        result = audit_adapters(gateway.url, tmp_path / "l.sqlite", ADAPTERS)
    leaks = [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_ECHO]
    assert leaks and {(f.observer_tenant, f.victim_tenant) for f in leaks} == {("tenant-b", "tenant-a")}
    asked = [find(f.evidence, AdapterAsk) for f in leaks]
    assert {a.adapter for a in asked if a} == {"adapter-b"} and {a.round for a in asked if a} == {"own", "shared"}
    assert {f.check for f in leaks} == {"adapters"}
    kept = open_ledger(str(tmp_path / "l.sqlite"))
    try:  # durable, and naming the adapter's canary (kept under its derived id)
        assert {f.canary_id for f in kept.findings()} == {adapter_canary(shared_key(deployment_key), "tenant-a",
                                                                         "adapter-a", 1.0).id}
    finally:
        kept.close()


def test_the_cli_keeps_the_adapters_canary_first_and_never_overwrites_a_folder(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    ledger = tmp_path / "l.sqlite"
    done = invoke("canaries", "adapter", "--ledger", str(ledger), "--tenant", "tenant-a", "--adapter", "adapter-a",
                  "--base", str(tmp_path), "--out", str(tmp_path / "out"), env={KEY_ENV: DEPLOYMENT})
    assert done.exit_code == 2 and "exists already" in done.output, done.output
    kept = open_ledger(str(ledger))
    try:
        [canary] = kept.active_canaries()
    finally:
        kept.close()
    assert canary.text == canary_text(shared_key(DEPLOYMENT), "tenant-a", "adapter-a")
