"""An audit of the LiteLLM proxy's response cache between two tenants, read back as the tests compare it: the
proxy in front of the reference engine, `response-cache` and `semantic-cache` audited, and the JSON report's cache
map and findings (tests/test_response_cache.py: its in-memory cache; tests/test_response_cache_redis.py: Redis)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.support.cli import invoke
from tests.support.litellm_proxy import LiteLLMProxy

TENANTS = {"tenant-a": "testbed-key-a", "tenant-b": "testbed-key-b"}
ROUTES = ("chat", "completions", "responses")
# The response-cache check's layers: each route, plain and streamed.
LAYERS = (*ROUTES, *(f"{route}-stream" for route in ROUTES))


def litellm_states(state: str) -> dict[str, str]:
    """The map where LiteLLM's cache in front of the reference engine is `state`: every layer but a streamed Responses
    API request, which LiteLLM 1.108.7 leaves uncached there (`none_seen` whatever the cache's scope; in front of
    vLLM it caches that too: tests/test_vllm.py).  What in the engine's stream it does not take is not known."""
    return {**dict.fromkeys(LAYERS, state), "responses-stream": "none_seen"}
# Both tenants served each other's stored answer: what a cache shared across keys is found as.
BOTH_WAYS = {("cross_tenant_response_cache", "tenant-a", "tenant-b"),
             ("cross_tenant_response_cache", "tenant-b", "tenant-a")}


def audit(proxy: LiteLLMProxy, engine: str, folder: Path, *args: str, tenants: list[dict[str, str]] | None = None,
          **target: Any) -> tuple[int, dict[str, Any]]:
    """An audit through the proxy, each tenant with a cache salt of its own; `tenants` and `target` (its settings)
    where a test names others."""
    folder.mkdir()
    (folder / "c.yaml").write_text(yaml.safe_dump({
        "targets": [{"name": "behind-litellm", "url": proxy.url + "/v1", "model": "fixed", "introspection_url": engine,
                     "cache_salt": "per-tenant", **target}],
        "tenants": tenants or [{"name": name, "api_key_env": env} for name, env in (("tenant-a", "LP_A"),
                                                                                  ("tenant-b", "LP_B"))],
        "ledger": str(folder / "l.sqlite"), "detection": {"semantic": False},
        "response-cache": {"audit": True}, "semantic-cache": {"audit": True}}))
    result = invoke("audit", "--config", str(folder / "c.yaml"), "-f", "json", *args)
    return result.exit_code, json.loads(result.stdout)


def states(doc: dict[str, Any]) -> dict[str, str]:
    return {layer["route"]: layer["state"] for layer in doc["targets"][0]["cache_map"]
            if layer["layer"] == "response"}


def upstream(doc: dict[str, Any]) -> dict[str, str]:
    """The identity layer by route: whether the path keeps the tenants apart on the way to the engine."""
    return {layer["route"]: layer["state"] for layer in doc["targets"][0]["cache_map"] if layer["layer"] == "identity"}


def kinds(doc: dict[str, Any], *names: str) -> set[tuple[str, str | None, str]]:
    return {(f["kind"], f["victim_tenant"], f["observer_tenant"]) for f in doc["findings"] if f["kind"] in names}


def controlled(doc: dict[str, Any]) -> bool:
    """Every layer said per tenant rests on its positive control: the same tenant's repeat served from the cache in
    both directions."""
    scoped = [layer for layer in doc["targets"][0]["cache_map"] if layer["layer"] == "response"
              and layer["state"] == "per_tenant"]
    return bool(scoped) and all("same tenant's repeat served from the cache in 2 of 2" in layer["control"]
                                for layer in scoped)


def unsalted(finding: dict[str, Any]) -> bool:
    """The engine's prefix cache shared between tenants on the Responses API: LiteLLM 1.108.7 passes vLLM's
    `cache_salt` upstream from chat and completions and drops it from that route, and behind its one upstream key the
    engine sees every tenant as one (B's request, a miss in B's part of a scoped cache, reaches the engine)."""
    return finding["kind"] == "cross_tenant_cache_hit" and "-responses-" in finding["record_id"]
