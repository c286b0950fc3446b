"""The cache map: for each cache a run tested (a gateway's response or semantic cache, the engine's prefix cache),
on each route, whether tenants share it, each keeps its own, or no reuse was seen at all — and what that rests on."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from prober.domain.types import DetectorName, Finding, FindingKind, ProbeContext, Severity
from prober.probing.documents import CacheLayerDoc
from prober.probing.plan import Step
from prober.targets.api import Api

RouteName = Literal["chat", "completions", "responses"]
GENERATION_ROUTES: tuple[RouteName, ...] = ("chat", "completions", "responses")


class LayerState(StrEnum):
    """What a test of one cache layer found.  "Per tenant" needs the same tenant's reuse seen on that layer (the
    positive control); with no reuse seen at all the layer is "none seen", never "isolated"."""

    SHARED = "shared"  # one tenant was served what another's request left in it
    PER_TENANT = "per_tenant"  # a tenant's own reuse seen, no other tenant's
    NONE_SEEN = "none_seen"  # no reuse seen, not even a tenant's own: off, or keyed on something the test varied
    UNDECIDED = "undecided"  # the test could not be made (a route not served, answers missing)


@dataclass(frozen=True)
class CacheVerdict:
    """One layer of the cache map: a cache (in front of the engine, or the engine's own) on one route, its state,
    and what that rests on (`control`: the same-tenant reuse seen or not, the samples behind it)."""

    layer: str
    route: str
    state: LayerState
    control: str
    directions: int = 0  # tenant pairs tested, each way

    def to_json(self) -> CacheLayerDoc:
        return {"layer": self.layer, "route": self.route, "state": self.state.value, "control": self.control,
                "directions": self.directions}


def routes_to_test(configured: Api, names: Iterable[RouteName]) -> list[Api]:
    """The routes a cache check tests: the target's own first, then the other OpenAI routes named, since a gateway
    may scope its cache on one route and share it on another (LiteLLM CVE-2026-89032: the Responses API's alone)."""
    if not configured.openai_routes:
        return [configured]
    return list(dict.fromkeys([configured, *(Api(name) for name in names)]))


def by_route(layers: Sequence[CacheVerdict], layer: str, step: Step) -> Finding | None:
    """A cache whose state differs between the routes it was decided on (`route_dependent_cache`): tenants kept
    apart on one route and not on another, or a cache on one route only.  A warning where some route shares it: a
    fix tested on one route proves nothing for the others (LiteLLM CVE-2026-89032).  Drawn on the run's last request
    (`step`), at its boundary: the finding is about the layer, not that answer."""
    decided = [v for v in layers if v.layer == layer and v.state is not LayerState.UNDECIDED]
    states = [state for state in LayerState if any(v.state is state for v in decided)]
    if len(states) < 2:
        return None
    split = "; ".join(f"{state} on {', '.join(v.route for v in decided if v.state is state)}" for state in states)
    return Finding(record_id=step.id, kind=FindingKind.ROUTE_DEPENDENT_CACHE, detector=DetectorName.ENVELOPE,
                   severity=Severity.WARNING if LayerState.SHARED in states else Severity.INFO, score=1.0,
                   observer_tenant=step.tenant, probe_id=step.id, context=ProbeContext(boundary=step.boundary),
                   excerpt=f"the {layer} cache differs by route: {split}")
