"""The cache map of a target straight at the reference engine: its prefix cache shared, per tenant (with the same
tenant's reuse as the control) or off, and no response cache in front (none seen on either route, never
"isolated").  Behind a gateway's response cache: tests/test_response_cache.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import invoke
from tests.support.testbed import SMALL, StartTestbed

TENANTS = {"tenant-a": "testbed-key-a", "tenant-b": "testbed-key-b"}


def cache_map(url: str, ledger: Path) -> tuple[int, dict[tuple[str, str], dict[str, Any]]]:
    result = invoke("audit", "--target", url + "/v1", "--tenant", "tenant-a=LP_A", "--tenant", "tenant-b=LP_B",
                    "--ledger", str(ledger), "-f", "json", "--no-semantic", "--check", "prefix-cache", "--check",
                    "response-cache")
    doc = json.loads(result.stdout)
    return result.exit_code, {(layer["layer"], layer["route"]): layer for layer in doc["targets"][0]["cache_map"]}


@pytest.mark.parametrize(("engine", "prefix", "code"), [
    ({}, "per_tenant", 0),
    ({"faults": {"shared_prefix_cache": True}}, "shared", 1),
    ({"prefix_cache_entries": 0}, "none_seen", 0),
])
def test_the_engines_prefix_cache_on_the_map_beside_its_control(testbed: StartTestbed, tmp_path: Path,
                                                                engine: dict[str, Any], prefix: str,
                                                                code: int) -> None:
    server = testbed("healthy", **{**SMALL, **engine}, tenants=TENANTS)
    exit_code, layers = cache_map(server.url, tmp_path / "l.sqlite")
    assert exit_code == code and layers[("prefix", "chat")]["state"] == prefix, (exit_code, layers)
    control = layers[("prefix", "chat")]["control"]
    assert ("in 2 of 2 repeats" if prefix != "none_seen" else "in 0 of 2 repeats") in control, control
    said_off = "the engine says its prefix cache is off (sglang /server_info disable_radix_cache)"
    assert (said_off in control) is (prefix == "none_seen"), control  # the reason beside the control, never a proof
    assert {layers[("response", route)]["state"] for route in ("chat", "completions")} == {"none_seen"}, layers


@pytest.mark.unit
def test_the_daemon_exports_each_layer_one_state_at_a_time() -> None:
    """`leakprobe_cache_layer_state` is 1 on the state the last test found and 0 on the others, per layer and route;
    the next run's word replaces it."""
    from prometheus_client import CollectorRegistry

    from prober.checks import REGISTRY
    from prober.daemon.metrics import CheckMetrics
    from prober.probing.cache_map import CacheVerdict, LayerState
    from prober.probing.results import CheckResult

    registry = CollectorRegistry()
    metrics = CheckMetrics(registry, REGISTRY)

    def states() -> dict[str, float]:
        return {s.labels["state"]: s.value for f in registry.collect() for s in f.samples
                if s.name == "leakprobe_cache_layer_state" and s.labels["route"] == "chat"}

    shared = CacheVerdict("response", "chat", LayerState.SHARED, "b served a's answer", 2)
    metrics.observe("t", CheckResult(check="response-cache", layers=[shared]))
    assert states() == {"shared": 1.0, "per_tenant": 0.0, "none_seen": 0.0, "undecided": 0.0}
    scoped = CacheVerdict("response", "chat", LayerState.PER_TENANT, "the same tenant's repeat served", 2)
    metrics.observe("t", CheckResult(check="response-cache", layers=[scoped]))
    assert states() == {"shared": 0.0, "per_tenant": 1.0, "none_seen": 0.0, "undecided": 0.0}


@pytest.mark.unit
def test_a_cache_that_differs_by_route_is_its_own_finding() -> None:
    """A gateway that keeps tenants apart on chat and shares on the Responses API (LiteLLM CVE-2026-89032) is a
    warning beside the shared route's own finding; a cache on one route only, info; routes that agree, or were not
    decided, nothing."""
    from prober.domain.types import FindingKind, Severity
    from prober.probing.cache_map import CacheVerdict, LayerState, by_route
    from prober.probing.plan import Step

    last = Step(id="r1rc-responses-2-control", role="control", tenant="tenant-b", length=48, stream=False,
                expect_served=True, boundary="response-cache")

    def layer(route: str, state: LayerState, name: str = "response") -> CacheVerdict:
        return CacheVerdict(name, route, state, "its control", 2)

    split = by_route([layer("chat", LayerState.PER_TENANT), layer("responses", LayerState.SHARED),
                      layer("completions", LayerState.PER_TENANT), layer("chat", LayerState.SHARED, "identity")],
                     "response", last)
    assert split is not None and split.kind is FindingKind.ROUTE_DEPENDENT_CACHE and split.severity is Severity.WARNING
    assert split.excerpt == "the response cache differs by route: shared on responses; per_tenant on chat, completions"
    assert (split.observer_tenant, split.context.boundary, split.victim_tenant) == ("tenant-b", "response-cache", None)
    one_route = by_route([layer("chat", LayerState.PER_TENANT), layer("responses", LayerState.NONE_SEEN)], "response",
                         last)
    assert one_route is not None and one_route.severity is Severity.INFO
    assert by_route([layer("chat", LayerState.SHARED), layer("responses", LayerState.SHARED),
                     layer("completions", LayerState.UNDECIDED)], "response", last) is None
