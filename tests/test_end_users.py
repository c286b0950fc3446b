"""End users behind one key (issue 56): tenants that share a gateway key and differ by the end user named with it
(the OpenAI `user` field, and a header the target names).  The config and `load_secrets` take two such tenants as
two callers; the adapter puts the end user on the wire; and the real LiteLLM proxy (1.108.7) with one key for both,
its response cache keyed on model, messages and settings alone, serves one end user's answers to the other, while a
pre-call hook that scopes the cache per end user keeps them apart."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from prober.config.schema import assemble_config, parse_config
from prober.domain.errors import ConfigError, CredentialError
from prober.probing.secrets import load_secrets
from prober.targets import OpenAICompatible, Prompt, Secret, Transport, TransportPolicy
from prober.targets.api import Api
from tests.support.aio import run
from tests.support.keys import KEYS
from tests.support.litellm_proxy import Installation as LiteLLMInstallation
from tests.support.litellm_proxy import LiteLLMProxy
from tests.support.mockhttp import BASE, Routes, send
from tests.support.response_cache import audit, controlled, kinds, litellm_states, states, unsalted
from tests.support.shaped import chat_answer
from tests.support.testbed import StartTestbed

HEADER = "x-litellm-end-user-id"  # one of the headers LiteLLM 1.108.7 reads the end user from


def config(*tenants: dict[str, Any]) -> Any:
    return parse_config({"targets": [{"name": "t", "url": "http://gateway.test/v1"}], "tenants": list(tenants)})


@pytest.mark.unit
def test_one_key_is_two_tenants_only_as_two_end_users(keys_in_env: None) -> None:
    alice = {"name": "alice", "api_key_env": "LP_A", "end_user": "alice@example"}
    bob = {"name": "bob", "api_key_env": "LP_A", "end_user": "bob@example"}
    secrets = load_secrets(config(alice, bob))
    assert secrets == {"alice": Secret(KEYS["LP_A"], "alice@example"), "bob": Secret(KEYS["LP_A"], "bob@example")}
    assert secrets["alice"] != secrets["bob"] and "bob@example" in repr(secrets["bob"])
    assert KEYS["LP_A"] not in repr(secrets["bob"])
    for pair, said in (((alice, {**bob, "end_user": "alice@example"}), "end user 'alice@example'"),
                       (({"name": "a", "api_key_env": "LP_A"}, {"name": "b", "api_key_env": "LP_A"}),
                        "without an end user for each"),
                       ((alice, {"name": "b", "api_key_env": "LP_A"}), "without an end user for each")):
        with pytest.raises(CredentialError, match="give each its own key or its own end_user") as refused:
            load_secrets(config(*pair))
        assert said in str(refused.value)
    # Distinct keys need no end users; an end user needs a key to be sent beside.
    assert load_secrets(config({"name": "a", "api_key_env": "LP_A"}, {"name": "b", "api_key_env": "LP_B"}))
    with pytest.raises(ConfigError, match="end_user is sent beside a key"):
        config({"name": "a", "end_user": "alice"}, bob)


@pytest.mark.unit
def test_the_command_line_names_an_end_user_after_the_variable() -> None:
    cfg = assemble_config(None, target="http://gateway.test/v1",
                          tenants=["alice=LP_A@alice@example.com", "bob=LP_A@bob", "carol=LP_B"])
    assert [(t.name, t.api_key_env, t.end_user) for t in cfg.tenants] == [
        ("alice", "LP_A", "alice@example.com"), ("bob", "LP_A", "bob"), ("carol", "LP_B", None)]
    with pytest.raises(ConfigError, match="NAME=ENVVAR@END_USER"):
        assemble_config(None, target="http://gateway.test/v1", tenants=["alice=LP_A@"])


@pytest.mark.unit
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_the_end_user_is_on_the_wire_in_the_body_and_the_named_header(api: str) -> None:
    routes = Routes({f"POST /v1/{'chat/completions' if api == 'chat' else 'completions'}":
                     lambda _: send(200, chat_answer("ok") if api == "chat" else {
                         "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]})})

    async def go(policy: TransportPolicy, secret: Secret) -> None:
        async with Transport(policy, http=httpx.MockTransport(routes)) as transport:
            answer = await OpenAICompatible("t", BASE, transport, api=Api(api)).complete(Prompt("hi"), secret)
            assert answer.error is None and answer.text == "ok"

    header, alone = TransportPolicy(retries=0, end_user_header=HEADER), TransportPolicy(retries=0)
    run(go(header, Secret("sk-customer-key", "alice@example")))
    run(go(alone, Secret("sk-customer-key", "bob@example")))  # no header named: the field alone
    run(go(replace(header, end_user_field=False), Secret("sk-customer-key", "carol@example")))  # the header alone
    run(go(header, Secret("sk-customer-key")))  # no end user: neither
    sent = [(json.loads(r.content).get("user"), r.headers.get(HEADER), r.headers["authorization"])
            for r in routes.seen]
    assert sent == [("alice@example", "alice@example", "Bearer sk-customer-key"),
                    ("bob@example", None, "Bearer sk-customer-key"), (None, "carol@example", "Bearer sk-customer-key"),
                    (None, None, "Bearer sk-customer-key")]
    with pytest.raises(ConfigError, match="end_user_field: false needs an end_user_header"):
        parse_config({"targets": [{"name": "t", "url": BASE, "end_user_field": False}]})


END_USERS = [{"name": "alice", "api_key_env": "LP_A", "end_user": "alice@example.com"},
             {"name": "bob", "api_key_env": "LP_A", "end_user": "bob@example.com"}]
BOTH = {("cross_tenant_response_cache", "alice", "bob"), ("cross_tenant_response_cache", "bob", "alice")}


def through(proxy: LiteLLMProxy, engine: str, folder: Path, **target: Any) -> tuple[int, dict[str, Any]]:
    """The response-cache check through the gateway, as two end users of one customer key (each with a cache salt of
    its own, as a gateway that salts per end user adds: one upstream key would share the engine's prefix cache)."""
    return audit(proxy, engine, folder, "--check", "response-cache", tenants=END_USERS, **target)


def test_end_users_behind_one_litellm_key(testbed: StartTestbed, tmp_path: Path,
                                          litellm_install: LiteLLMInstallation) -> None:
    """One key, two end users, LiteLLM's response cache on.  Named by header alone, the end users share the cache
    (its key is model, messages and settings): each served the other's answer on every route, exit 1.  Named in the
    `user` field, they do not: LiteLLM keys its cache on `user` too, so the map is per tenant, its control the same
    end user's repeat.  Named by header, with the cache scoped per end user by a pre-call hook: per tenant.
    The engine sees one upstream key throughout: both end users are one tenant there."""
    engine = testbed("healthy", context_length=4_096, pool_tokens=16_384, page_size=16, prefill_ms_per_1k_tokens=0,
                     tenants={"tenant-a": KEYS["LP_A"], "tenant-b": KEYS["LP_B"]}, mode="monolithic")
    common: dict[str, Any] = {"models": {"fixed": engine.url + "/v1"}, "upstream_model": "testbed-quoter",
                              "keys": {"customer": KEYS["LP_A"]}, "upstream_key": KEYS["LP_A"],
                              "cache": {"type": "local"}}
    by_header = {"end_user_header": HEADER, "end_user_field": False}
    with LiteLLMProxy(litellm_install, tmp_path / "shared-proxy", **common) as proxy:
        code, doc = through(proxy, engine.url, tmp_path / "shared", **by_header)
    assert code == 1 and states(doc) == litellm_states("shared"), (code, doc["verdict"])
    assert kinds(doc, "cross_tenant_response_cache") == BOTH
    assert all("x-litellm-cache-key" in f["evidence"]["excerpt"] for f in doc["findings"]
               if f["kind"] == "cross_tenant_response_cache")

    # On the Responses API the gateway drops the cache salt: the engine's prefix cache is shared there (`unsalted`).
    with LiteLLMProxy(litellm_install, tmp_path / "field-proxy", **common) as proxy:
        code, doc = through(proxy, engine.url, tmp_path / "field")
    assert states(doc) == litellm_states("per_tenant"), (code, doc["verdict"])
    assert not kinds(doc, "cross_tenant_response_cache") and kinds(doc, "tenant_response_cache")
    assert all(unsalted(f) for f in doc["findings"] if f["severity"] not in ("info", "warning"))

    with LiteLLMProxy(litellm_install, tmp_path / "scoped-proxy", cache_per_end_user=True, **common) as proxy:
        code, doc = through(proxy, engine.url, tmp_path / "scoped", **by_header)
    assert states(doc) == litellm_states("per_tenant") and controlled(doc), (code, doc["verdict"])
    assert not kinds(doc, "cross_tenant_response_cache") and kinds(doc, "tenant_response_cache")
    assert all(unsalted(f) for f in doc["findings"] if f["severity"] not in ("info", "warning"))
