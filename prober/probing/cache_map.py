"""The cache map: for each cache a run tested (a gateway's response or semantic cache, the engine's prefix cache),
on each route, whether tenants share it, each keeps its own, or no reuse was seen at all — and what that rests on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from prober.probing.documents import CacheLayerDoc


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
