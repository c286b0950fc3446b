"""A semantic cache in front of the reference engine (tests/support/semantic_gateway.py: GPTCache with its faiss
store, embedding with leakprobe's own embedder): shared between tenants, tenant B's ladder of requests is answered
with tenant A's stored answer, A's canary and all — a `cross_tenant_echo` and a `cross_tenant_response_cache` in the
semantic layer — at the rungs the threshold lets through, never at a clearly different question; scoped per tenant,
the map says per tenant (A's own reuse is the control) and nothing of warning or worse is found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.support.cli import invoke
from tests.support.semantic_gateway import CHAT, RESPONSES, Scope, SemanticGateway
from tests.support.testbed import SMALL, StartTestbed

TENANTS = {"tenant-a": "testbed-key-a", "tenant-b": "testbed-key-b"}
PAIRS = {("tenant-a", "tenant-b"), ("tenant-b", "tenant-a")}


def audit(url: str, folder: Path) -> tuple[int, dict[str, Any]]:
    result = invoke("audit", "--target", url + "/v1", "--tenant", "tenant-a=LP_A", "--tenant", "tenant-b=LP_B",
                    "--ledger", str(folder / "l.sqlite"), "-f", "json", "--no-semantic", "--check", "semantic-cache")
    return result.exit_code, json.loads(result.stdout)


def semantic(doc: dict[str, Any], route: str = "chat") -> dict[str, Any]:
    [layer] = [layer for layer in doc["targets"][0]["cache_map"] if layer["layer"] == "semantic"
               and layer["route"] == route]
    return layer


def test_a_shared_semantic_cache_hands_one_tenant_anothers_answer(testbed: StartTestbed, tmp_path: Path) -> None:
    engine = testbed("healthy", context_length=4_096, pool_tokens=16_384, page_size=16, prefill_ms_per_1k_tokens=0,
                     tenants=TENANTS, mode="monolithic")
    with SemanticGateway(engine.url, tmp_path / "strict", threshold=0.8) as gateway:
        code, doc = audit(gateway.url, tmp_path / "strict")
        # Again over the same stores, as the daemon runs it: where a prime draws a question the first run asked, the
        # cache answers it with that run's stored answer, and the rungs handed the same answer still decide.
        again, second = audit(gateway.url, tmp_path / "strict")
    assert again == 1 and semantic(second)["state"] == "shared", (again, second["verdict"], semantic(second))
    assert {(f["victim_tenant"], f["observer_tenant"]) for f in second["findings"]
            if f["kind"] == "cross_tenant_echo"} == PAIRS
    echoes = {(f["victim_tenant"], f["observer_tenant"]) for f in doc["findings"] if f["kind"] == "cross_tenant_echo"}
    copies = [f for f in doc["findings"] if f["kind"] == "cross_tenant_response_cache"]
    assert code == 1 and echoes == PAIRS and semantic(doc)["state"] == "shared", (code, doc["verdict"], echoes)
    assert all(any(e["type"] == "from_cache" and e["layer"] == "semantic" for e in f["details"]) for f in copies)
    assert {(f["victim_tenant"], f["observer_tenant"]) for f in copies} == PAIRS
    ladder = semantic(doc)["control"]
    # At semantic-router's 0.8: A's words with another canary match (USE similarity about 0.92), a rewording (0.6 to
    # 0.7) and another question (about 0.2) do not; the last question alone is the key, so another system prompt or
    # an earlier turn changes nothing.
    assert ladder.startswith("tenant-a->tenant-b at same-words, other-system, other-turn;"), ladder
    assert "paraphrase" not in ladder and "other-question" not in ladder, ladder

    with SemanticGateway(engine.url, tmp_path / "loose", threshold=0.5) as gateway:
        code, doc = audit(gateway.url, tmp_path / "loose")
    assert code == 1 and "tenant-a->tenant-b at same-words, paraphrase," in semantic(doc)["control"], semantic(doc)
    assert "other-question" not in semantic(doc)["control"]
    # So loose a cache reads the second direction's question, in the same wording, as the first's (USE similarity
    # 0.52 to 0.81 between the questions so worded): that prime is answered with a stored answer, and asked anew.
    [check] = [c for c in doc["targets"][0]["checks"] if c["check"] == "semantic-cache"]
    assert any("answered with a stored answer before tenant-b asked it (asked anew)" in n for n in check["notes"]), (
        check["notes"])


def test_a_semantic_cache_per_tenant_is_said_so_beside_its_control(testbed: StartTestbed, tmp_path: Path) -> None:
    engine = testbed("healthy", context_length=4_096, pool_tokens=16_384, page_size=16, prefill_ms_per_1k_tokens=0,
                     tenants=TENANTS, mode="monolithic")
    with SemanticGateway(engine.url, tmp_path / "scoped", scope="tenant", threshold=0.5) as gateway:
        code, doc = audit(gateway.url, tmp_path / "scoped")
        served = gateway.served_from_cache
    assert code == 0 and semantic(doc)["state"] == "per_tenant", (code, doc["verdict"], semantic(doc))
    assert "served from the cache in 2 of 2" in semantic(doc)["control"] and served >= 2
    assert not [f for f in doc["findings"] if f["severity"] != "info"]
    with SemanticGateway(engine.url, tmp_path / "off", scope="tenant", threshold=1.0) as gateway:
        code, doc = audit(gateway.url, tmp_path / "off")
    assert code == 0 and semantic(doc)["state"] == "none_seen", semantic(doc)


def test_a_semantic_cache_shared_on_the_responses_route_alone(testbed: StartTestbed, tmp_path: Path) -> None:
    """LiteLLM CVE-2026-89032's shape: the cache keeps tenants apart on chat and shares on the Responses API.  The
    ladder on every route finds it there alone, the map says so per route, and the echoes name that route's
    requests."""
    engine = testbed("healthy", context_length=4_096, pool_tokens=16_384, page_size=16, prefill_ms_per_1k_tokens=0,
                     tenants=TENANTS, mode="monolithic")
    routes: dict[str, Scope] = {CHAT: "tenant", RESPONSES: "shared"}
    with SemanticGateway(engine.url, tmp_path / "cache", routes=routes, threshold=0.8) as gateway:
        code, doc = audit(gateway.url, tmp_path)
    states = {layer["route"]: layer["state"] for layer in doc["targets"][0]["cache_map"] if layer["layer"] ==
              "semantic"}
    assert code == 1 and states == {"chat": "per_tenant", "completions": "none_seen", "responses": "shared"}, (
        code, doc["verdict"], states)
    echoes = [f for f in doc["findings"] if f["kind"] == "cross_tenant_echo"]
    assert {(f["victim_tenant"], f["observer_tenant"]) for f in echoes} == PAIRS
    assert all("sc-responses-" in f["record_id"] for f in echoes), [f["record_id"] for f in echoes]


def test_end_users_behind_one_key_share_a_bucket_scoped_by_the_key(testbed: StartTestbed, tmp_path: Path) -> None:
    """Two tenants that are end users of one customer key, named in the `user` field: a semantic cache scoped by key
    (LiteLLM's `semantic_cache_scope` default) is one bucket for both, and each is answered with the other's stored
    answer; scoped by end user, each keeps its own (the control seen), nothing of warning or worse."""
    engine = testbed("healthy", context_length=4_096, pool_tokens=16_384, page_size=16, prefill_ms_per_1k_tokens=0,
                     tenants=TENANTS, mode="monolithic")
    end_users = [{"name": "alice", "api_key_env": "LP_A", "end_user": "alice@example.com"},
                 {"name": "bob", "api_key_env": "LP_A", "end_user": "bob@example.com"}]
    results = {}
    for scope in ("tenant", "end_user"):
        folder = tmp_path / scope
        folder.mkdir()
        with SemanticGateway(engine.url, folder / "cache", scope=scope, threshold=0.8) as gateway:
            (folder / "c.yaml").write_text(yaml.safe_dump({
                "targets": [{"name": "behind-a-cache", "url": gateway.url + "/v1"}], "tenants": end_users,
                "ledger": str(folder / "l.sqlite"), "detection": {"semantic": False}}))
            result = invoke("audit", "--config", str(folder / "c.yaml"), "-f", "json", "--check", "semantic-cache")
        results[scope] = result.exit_code, json.loads(result.stdout)
    code, doc = results["tenant"]
    echoes = {(f["victim_tenant"], f["observer_tenant"]) for f in doc["findings"] if f["kind"] == "cross_tenant_echo"}
    assert code == 1 and semantic(doc)["state"] == "shared", (code, doc["verdict"], semantic(doc))
    assert echoes == {("alice", "bob"), ("bob", "alice")}, echoes
    code, doc = results["end_user"]
    assert code == 0 and semantic(doc)["state"] == "per_tenant", (code, doc["verdict"], semantic(doc))
    assert not [f for f in doc["findings"] if f["severity"] != "info"]


def full_audit(url: str, folder: Path) -> tuple[int, dict[str, Any]]:
    """Every check but timing, the two cache checks among them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "c.yaml").write_text(yaml.safe_dump({
        "targets": [{"name": "behind-a-cache", "url": url + "/v1"}],
        "tenants": [{"name": "tenant-a", "api_key_env": "LP_A"}, {"name": "tenant-b", "api_key_env": "LP_B"}],
        "ledger": str(folder / "l.sqlite"), "detection": {"semantic": False}, "timing": {"audit": False},
        "response-cache": {"audit": True}, "semantic-cache": {"audit": True}}))
    result = invoke("audit", "--config", str(folder / "c.yaml"), "-f", "json")
    return result.exit_code, json.loads(result.stdout)


def test_behind_a_per_tenant_cache_no_check_judges_the_engine_by_a_copy(testbed: StartTestbed,
                                                                         tmp_path: Path) -> None:
    """Every check behind a semantic cache scoped per tenant, which answers many of a tenant's requests from that
    tenant's earlier answers (over-limit prompts among them, which the engine never sees): the healthy engine is
    clean, as at the engine itself; the incident's engine is still caught, through the requests that reached it."""
    healthy = testbed("healthy", **SMALL, tenants=TENANTS)
    with SemanticGateway(healthy.url, tmp_path / "healthy", scope="tenant") as gateway:
        code, doc = full_audit(gateway.url, tmp_path / "healthy")
        served = gateway.served_from_cache
    serious = [(f["kind"], f["check"], f["record_id"]) for f in doc["findings"] if f["severity"] != "info"]
    assert code == 0 and not serious and served > 10, (code, doc["verdict"], serious, served)
    incident = testbed("incident", **SMALL, tenants=TENANTS)
    with SemanticGateway(incident.url, tmp_path / "incident", scope="tenant") as gateway:
        code, doc = full_audit(gateway.url, tmp_path / "incident")
    echoes = {(f["victim_tenant"], f["observer_tenant"]) for f in doc["findings"]
              if f["kind"] == "cross_tenant_echo" and f["check"] == "campaign"}
    assert code == 1 and echoes == PAIRS, (code, doc["verdict"], echoes)
