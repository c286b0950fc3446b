"""LiteLLM's response cache in Redis, as operators run it: the LiteLLM proxy (1.108.7) with `cache_params` of type
`redis` on Debian's `redis-server`, in front of the reference engine, between two tenants' keys; shared, and scoped
per tenant by the pre-call hook that sets the cache `namespace` from the caller.  What the proxy stored is read back
from Redis itself, so the test shows the answers went through Redis and not an in-memory fallback."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.support.litellm_proxy import Installation as LiteLLMInstallation
from tests.support.litellm_proxy import LiteLLMProxy
from tests.support.redis import RedisServer
from tests.support.response_cache import (
    BOTH_WAYS,
    TENANTS,
    audit,
    controlled,
    kinds,
    litellm_states,
    states,
    unsalted,
)
from tests.support.testbed import StartTestbed

# A stored answer's key: LiteLLM's SHA-256 of model, messages and settings, after the namespace where one is set.
# (The proxy keeps its usage counters in the same Redis, `{api_key:…}:tokens` and the like: not answers.)
ENTRY = re.compile(r"(?:(?P<namespace>[\w-]+):)?(?P<hash>[0-9a-f]{64})")


def entries(redis: RedisServer) -> dict[str, list[str]]:
    """The stored answers' hashes by namespace ("" for none)."""
    found: dict[str, list[str]] = {}
    for key in redis.key_names():
        if match := ENTRY.fullmatch(key):
            found.setdefault(match["namespace"] or "", []).append(match["hash"])
    return found


def test_litellms_redis_cache_shared_and_scoped(testbed: StartTestbed, tmp_path: Path,
                                                litellm_install: LiteLLMInstallation, redis: RedisServer) -> None:
    """Shared across two keys: each tenant served the other's answer on every route, exit 1, every answer in Redis
    under a bare hash, the copies served among them; scoped by the hook: per tenant with its control, every answer
    under its tenant's namespace, and each probe both tenants sent stored once under each (the engine's prefix cache
    is still shared on the Responses API, where the gateway drops the salt: `unsalted`)."""
    engine = testbed("healthy", context_length=4_096, pool_tokens=16_384, page_size=16, prefill_ms_per_1k_tokens=0,
                     tenants=TENANTS, mode="monolithic")
    common: dict[str, Any] = {"models": {"fixed": engine.url + "/v1"}, "upstream_model": "testbed-quoter",
                              "keys": TENANTS, "upstream_key": TENANTS["tenant-a"],
                              "cache": {"type": "redis", "host": redis.host, "port": redis.port}}
    with LiteLLMProxy(litellm_install, tmp_path / "shared-proxy", **common) as proxy:
        code, doc = audit(proxy, engine.url, tmp_path / "shared", "--check", "response-cache")
    assert code == 1 and states(doc) == litellm_states("shared"), (code, doc["verdict"])
    assert kinds(doc, "cross_tenant_response_cache") == BOTH_WAYS
    stored = entries(redis)
    assert list(stored) == [""] and stored[""], redis.key_names()
    values = [str(redis.command("GET", key)) for key in stored[""]]
    # Those told by the answer repeated name it (on the Responses API LiteLLM's copy carries a new id: told by its
    # cache header alone).
    served = [f["evidence"]["excerpt"].rsplit(" ", 1)[-1] for f in doc["findings"]
              if f["kind"] == "cross_tenant_response_cache" and ": answer " in f["evidence"]["excerpt"]]
    assert served and all(any(answer in value for value in values) for answer in served), served

    redis.command("FLUSHALL")
    with LiteLLMProxy(litellm_install, tmp_path / "scoped-proxy", cache_per_tenant=True, **common) as proxy:
        code, doc = audit(proxy, engine.url, tmp_path / "scoped", "--check", "response-cache")
    assert states(doc) == litellm_states("per_tenant"), (code, doc["verdict"])
    assert not kinds(doc, "cross_tenant_response_cache") and kinds(doc, "tenant_response_cache")
    assert controlled(doc) and all(unsalted(f) for f in doc["findings"] if f["severity"] not in ("info", "warning"))
    stored = entries(redis)
    assert sorted(stored) == ["tenant-tenant-a", "tenant-tenant-b"], redis.key_names()
    # The check's probe on each route in each direction, sent by both tenants: the same hash in both namespaces.
    cached = [layer for layer, state in litellm_states("per_tenant").items() if state == "per_tenant"]
    assert len(set(stored["tenant-tenant-a"]) & set(stored["tenant-tenant-b"])) == 2 * len(cached), redis.key_names()
