"""A cache in front of the engine (prober/probing/provenance.py, prober/checks/response_cache.py): an answer served
again is known by the gateway's header or by repeating an earlier answer whole, never by text alone; the response-
cache check says, per route, whether such a cache is shared across tenants, scoped per tenant (with the same tenant's
reuse as its control) or not seen.  The real gateway: the LiteLLM proxy (1.108.7) with its in-memory cache in front
of the reference engine, shared (its key is model, messages and settings: LiteLLM #29955), scoped per tenant by a
pre-call hook that sets the cache `namespace` from the caller, and off."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from prober.checks.response_cache import said_again
from prober.domain.evidence import CacheLayer
from prober.probing.provenance import AnswerBook, hit_header
from prober.targets.result import Completion
from tests.support.cli import invoke
from tests.support.litellm_proxy import Installation as LiteLLMInstallation
from tests.support.litellm_proxy import LiteLLMProxy
from tests.support.response_cache import (
    BOTH_WAYS,
    LAYERS,
    TENANTS,
    audit,
    controlled,
    kinds,
    litellm_states,
    states,
    unsalted,
    upstream,
)
from tests.support.semantic_gateway import CHAT, COMPLETIONS, RESPONSES, Scope, SemanticGateway
from tests.support.shared import Gateway
from tests.support.testbed import StartTestbed

ENGINE_KINDS = {"boundary_accepted", "cross_tenant_cache_hit", "cross_tenant_cache_timing", "phantom_cache_hit",
                "unexpected_refusal", "counted_failure"}


def made(answer_id: str | None, text: str = "the answer", *, created: int = 1_790_000_000,
         headers: dict[str, str] | None = None) -> Completion:
    return Completion(200, text, answer_id=answer_id, created=created, headers=headers or {},
                      traceparent="00-" + "ab" * 16 + "-" + "cd" * 8 + "-01")


def test_an_answer_repeated_whole_was_stored_and_says_for_whom() -> None:
    book = AnswerBook()
    assert book.read("tenant-a", made("chatcmpl-1"), "q") is None
    stored = book.read("tenant-b", made("chatcmpl-1"), "q")
    assert stored is not None and stored.first_tenant == "tenant-a" and stored.first_trace == "ab" * 16
    assert stored.layer is CacheLayer.RESPONSE
    # Handed out for another question: a semantic cache matched the two.
    paraphrase = book.read("tenant-b", made("chatcmpl-1"), "q, put otherwise")
    assert paraphrase is not None and paraphrase.layer is CacheLayer.SEMANTIC and paraphrase.first_tenant == "tenant-a"


def test_the_same_text_under_a_new_id_is_a_deterministic_engine_not_a_cache() -> None:
    book = AnswerBook()
    assert book.read("tenant-a", made("chatcmpl-1"), "q") is None
    assert book.read("tenant-b", made("chatcmpl-2"), "q") is None
    # An engine that reuses ids (a counter reset by a restart) in another second, or for other text, is no cache.
    assert book.read("tenant-b", made("chatcmpl-1", created=1_790_000_009), "q") is None
    assert book.read("tenant-b", made("chatcmpl-1", "another answer"), "q") is None


def test_a_sample_said_again_byte_for_byte_is_a_copy_and_a_likely_one_is_not() -> None:
    """Under a fresh id, the same text as a sample the engine made to the same request: a copy where a fresh decode
    says it again with probability e^-30 or less by the sample's own log-probabilities; never where that chance is
    larger (a near-certain answer, a greedy or deterministic engine), unknown (no log-probabilities), or the text
    differs in a byte."""
    sample = replace(made("chatcmpl-1", "Sometimes he uses the ridge"), logprob=-64.6)
    told = said_again(made("chatcmpl-2", "Sometimes he uses the ridge"), sample)
    assert told == "a sampled answer said again byte for byte (a fresh decode says it with probability e^-65)"
    assert said_again(made("chatcmpl-2", "Sometimes he uses the ridge"), replace(sample, logprob=-3.0)) is None
    assert said_again(made("chatcmpl-2", "Sometimes he uses the ridge"), replace(sample, logprob=0.0)) is None
    assert said_again(made("chatcmpl-2", "Sometimes he uses the ridge"), replace(sample, logprob=None)) is None
    assert said_again(made("chatcmpl-2", "Sometimes he uses the ridge."), sample) is None


def test_answers_named_by_the_clients_request_id_are_not_read_as_repeats() -> None:
    """The request-ID check sends one ID from every tenant; vLLM names each answer by it.  A copy of an answer named
    by an earlier request's ID is still a copy."""
    book = AnswerBook()
    assert book.read("tenant-a", made("cmpl-shared-id"), "q", client_id="shared-id") is None
    assert book.read("tenant-b", made("cmpl-shared-id"), "q", client_id="shared-id") is None
    stored = book.read("tenant-b", made("cmpl-shared-id"), "q", client_id="the-next-id")
    assert stored is not None and stored.first_tenant == "tenant-a"


def test_gateways_say_so_in_headers() -> None:
    assert hit_header({"x-litellm-cache-key": "abc"}) == ("x-litellm-cache-key", CacheLayer.RESPONSE)
    assert hit_header({"x-litellm-semantic-similarity": "0.93"}) == ("x-litellm-semantic-similarity",
                                                                   CacheLayer.SEMANTIC)
    assert hit_header({"cf-aig-cache-status": "HIT"}) == ("cf-aig-cache-status", CacheLayer.RESPONSE)
    assert hit_header({"x-portkey-cache-status": "SEMANTIC HIT"}) == ("x-portkey-cache-status", CacheLayer.SEMANTIC)
    assert hit_header({"cf-aig-cache-status": "MISS", "x-cache": "Miss from cloudfront"}) is None
    book = AnswerBook()
    stored = book.read("tenant-b", made("chatcmpl-9", headers={"x-litellm-cache-key": "k"}), "q")
    assert stored is not None and stored.first_tenant is None and stored.told == "header x-litellm-cache-key"


def test_litellms_response_cache_shared_scoped_and_off(testbed: StartTestbed, tmp_path: Path,
                                                       litellm_install: LiteLLMInstallation) -> None:
    """Shared across two keys: each tenant served the other's answer, on every route, exit 1, and no engine finding
    drawn from a stored copy in the whole audit; scoped per tenant by the gateway's hook: per tenant (info), its
    control the same tenant's repeat; off: none seen, never "isolated".  On the Responses API the gateway drops the
    cache salt, and the engine's shared prefix cache is found there alone."""
    engine = testbed("healthy", context_length=4_096, pool_tokens=16_384, page_size=16, prefill_ms_per_1k_tokens=0,
                     tenants=TENANTS, mode="monolithic")
    models = {"fixed": engine.url + "/v1"}
    common: dict[str, Any] = {"models": models, "upstream_model": "testbed-quoter", "keys": TENANTS,
                              "upstream_key": TENANTS["tenant-a"]}
    with LiteLLMProxy(litellm_install, tmp_path / "shared-proxy", cache={"type": "local"}, **common) as proxy:
        shared = audit(proxy, engine.url, tmp_path / "shared", "--skip", "timing")
    with LiteLLMProxy(litellm_install, tmp_path / "scoped-proxy", cache={"type": "local"}, cache_per_tenant=True,
                      **common) as proxy:
        scoped = audit(proxy, engine.url, tmp_path / "scoped", "--check", "response-cache")
    with LiteLLMProxy(litellm_install, tmp_path / "off-proxy", **common) as proxy:
        off = audit(proxy, engine.url, tmp_path / "off", "--check", "response-cache")

    code, doc = shared
    assert code == 1 and states(doc) == litellm_states("shared"), (code, doc["verdict"], states(doc))
    assert kinds(doc, "cross_tenant_response_cache") == BOTH_WAYS
    stored = [f for f in doc["findings"] if f["kind"] == "cross_tenant_response_cache"]
    assert all("x-litellm-cache-key" in f["evidence"]["excerpt"] for f in stored)
    # Every engine finding is the media-cache check's uuid-only probe (one upstream key: the gateway does not scope
    # the uuid), none drawn from an answer the cache served.
    engine_findings = [f for f in doc["findings"] if f["kind"] in ENGINE_KINDS]
    assert all(f["record_id"].endswith("uuid-only-probe") or unsalted(f) for f in engine_findings), engine_findings
    assert not [f for f in doc["findings"] if f["kind"] in ENGINE_KINDS and any(
        e["type"] == "from_cache" for e in f["details"])]
    # The engine's prefix cache is still tested through it: the prefix-cache check's observer resends the victim's
    # prompt with another completion length than the victim's, which LiteLLM keys on, so the engine answers it (and
    # keeps the tenants apart by their salts, with the same tenant's reuse as the control).
    prefix = [layer for layer in doc["targets"][0]["cache_map"] if layer["layer"] == "prefix"]
    assert [layer["state"] for layer in prefix] == ["per_tenant"], prefix

    code, doc = scoped
    assert code == 1 and states(doc) == litellm_states("per_tenant"), (code, doc["verdict"], states(doc))
    assert not kinds(doc, "cross_tenant_response_cache") and kinds(doc, "tenant_response_cache")
    hits = [f for f in doc["findings"] if f["severity"] not in ("info", "warning")]
    assert hits and all(unsalted(f) for f in hits) and controlled(doc), hits

    code, doc = off
    assert states(doc) == dict.fromkeys(LAYERS, "none_seen"), (code, doc["verdict"], states(doc))
    # Every request reached the engine: the salt keeps the tenants apart upstream on chat and completions (each
    # tenant's repeat reused its own prefix), not on the Responses API, where the gateway drops it.
    assert upstream(doc) == {**dict.fromkeys(LAYERS, "per_tenant"), "responses": "shared",
                             "responses-stream": "shared"}, upstream(doc)
    assert not kinds(doc, "cross_tenant_response_cache", "tenant_response_cache")
    assert all(unsalted(f) for f in doc["findings"] if f["severity"] not in ("info", "warning"))



def test_a_cache_shared_on_one_route_only_is_found_on_that_route(testbed: StartTestbed, tmp_path: Path) -> None:
    """As LiteLLM CVE-2026-89032 had it: the cache keeps each tenant apart on chat and completions and shares on the
    Responses API.  The map is per route, and the findings name the Responses API's requests alone."""
    engine = testbed("healthy", context_length=4_096, pool_tokens=16_384, page_size=16, prefill_ms_per_1k_tokens=0,
                     tenants=TENANTS, mode="monolithic")
    routes: dict[str, Scope] = {CHAT: "tenant", COMPLETIONS: "tenant", RESPONSES: "shared"}
    with SemanticGateway(engine.url, tmp_path / "cache", routes=routes, threshold=0.99) as gateway:
        result = invoke("audit", "--target", gateway.url + "/v1", "--tenant", "tenant-a=LP_A", "--tenant",
                        "tenant-b=LP_B", "--ledger", str(tmp_path / "l.sqlite"), "-f", "json", "--no-semantic",
                        "--check", "response-cache")
    doc = json.loads(result.stdout)
    # The gateway passes streams to the engine: those layers see no cache.
    expected = {**dict.fromkeys(LAYERS, "none_seen"), "chat": "per_tenant", "completions": "per_tenant",
                "responses": "shared"}
    assert result.exit_code == 1 and states(doc) == expected, (
        result.exit_code, doc["verdict"], states(doc))
    copies = [f for f in doc["findings"] if f["kind"] == "cross_tenant_response_cache"]
    assert {(f["victim_tenant"], f["observer_tenant"]) for f in copies} == {("tenant-a", "tenant-b"),
                                                                           ("tenant-b", "tenant-a")}
    assert all("rc-responses-" in f["record_id"] and "-stream-" not in f["record_id"] for f in copies), [
        f["record_id"] for f in copies]
    # The cache's scope depends on the route: its own finding, a warning, naming each state's routes; every finding
    # at the check's boundary, where its next clean run re-checks it (else the daemon's incident never closes).
    [split] = [f for f in doc["findings"] if f["kind"] == "route_dependent_cache"]
    assert split["severity"] == "warning" and split["evidence"]["excerpt"] == (
        "the response cache differs by route: shared on responses; per_tenant on chat, completions; none_seen on "
        "chat-stream, completions-stream, responses-stream"), split
    assert {f["boundary"] for f in doc["findings"] if f["check"] == "response-cache"} == {"response-cache"}


def test_a_cache_that_names_each_copy_afresh_is_told_by_the_engines_counters(testbed: StartTestbed,
                                                                              tmp_path: Path) -> None:
    """A cache that rebuilds each stored answer with a fresh `id` and `created` and sends no header: nothing in the
    answer tells it from one the engine made.  The engine's prompt counter, read around each request, does: it did
    not move.  Shared on chat, it is found there both ways; on the routes it does not cache, every answer is the
    engine's and no cache is seen."""
    engine = testbed("healthy", context_length=4_096, pool_tokens=16_384, page_size=16, prefill_ms_per_1k_tokens=0,
                     tenants=TENANTS, mode="monolithic")
    with SemanticGateway(engine.url, tmp_path / "cache", scope="shared", threshold=0.99, restamp=True) as gateway:
        result = invoke("audit", "--target", gateway.url + "/v1", "--tenant", "tenant-a=LP_A", "--tenant",
                        "tenant-b=LP_B", "--ledger", str(tmp_path / "l.sqlite"), "-f", "json", "--no-semantic",
                        "--check", "response-cache")
        served = gateway.served_from_cache
    doc = json.loads(result.stdout)
    assert result.exit_code == 1 and states(doc) == {**dict.fromkeys(LAYERS, "none_seen"), "chat": "shared"}, (
        result.exit_code, doc["verdict"], states(doc), served)
    copies = [f for f in doc["findings"] if f["kind"] == "cross_tenant_response_cache"]
    assert {(f["victim_tenant"], f["observer_tenant"]) for f in copies} == {("tenant-a", "tenant-b"),
                                                                           ("tenant-b", "tenant-a")}
    told = {d["told"] for f in copies for d in f["details"] if d["type"] == "from_cache"}
    assert told == {"the engine counted no prompt"}, told
    [check] = [c for c in doc["targets"][0]["checks"] if c["check"] == "response-cache"]
    assert "(36 with the engine's prompt counter read;" in check["summary"], check["summary"]
    assert not kinds(doc, *ENGINE_KINDS), [f["kind"] for f in doc["findings"]]


def test_replicas_whose_counters_the_reads_miss_are_not_taken_for_a_cache(testbed: StartTestbed,
                                                                           tmp_path: Path) -> None:
    """Two engines behind one address, requests and metrics reads balanced in turn (a Kubernetes Service), no cache:
    every request goes to the replica the reads around it do not reach, whose prompt counter then stands still as
    a cache's would.  The first requests, which no cache can answer, show it: no copy is read from the counters,
    every layer is `none_seen`, and the report says why."""
    engines = [testbed("healthy", context_length=4_096, pool_tokens=16_384, page_size=16, prefill_ms_per_1k_tokens=0,
                       tenants=TENANTS, mode="monolithic") for _ in range(2)]
    with Gateway(engines[0].url, system_prompt="", replicas=[e.url for e in engines], balanced=True) as front:
        result = invoke("audit", "--target", front.url + "/v1", "--tenant", "tenant-a=LP_A", "--tenant",
                        "tenant-b=LP_B", "--ledger", str(tmp_path / "l.sqlite"), "-f", "json", "--no-semantic",
                        "--check", "response-cache")
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and states(doc) == dict.fromkeys(LAYERS, "none_seen"), (
        result.exit_code, doc["verdict"], states(doc))
    assert not kinds(doc, "cross_tenant_response_cache", "tenant_response_cache")
    [check] = [c for c in doc["targets"][0]["checks"] if c["check"] == "response-cache"]
    assert any("counters missed a prompt" in note for note in check["notes"]), check["notes"]
