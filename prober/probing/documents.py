"""The JSON shapes of plans and results as the report document carries them: what `to_json` returns, and what
the renderers are type-checked against (prober/report/document.py builds the document from these)."""

from __future__ import annotations

from typing import TypedDict


class BoundaryDoc(TypedDict):
    label: str
    length: int
    expect: str  # served | refused


class ExchangeDoc(TypedDict):
    id: str
    victim: str
    observer: str
    concurrent: bool
    same_text: bool
    repeat: bool
    prime_tokens: int
    probe_tokens: int
    boundary: str
    stream: bool
    ask: str
    expect: str
    then: list[BoundaryDoc]  # further probes over the same pages, sent while the exchange is undecided
    unless_decided: str | None  # not sent where the exchange of this id had a probe as long refused


class PlanDoc(TypedDict):
    target: str
    tokens: int
    boundaries: list[BoundaryDoc]
    exchanges: list[ExchangeDoc]
    fact_share: float


class PlannedDoc(TypedDict):
    tokens: int  # prompt tokens sent
    served: int  # of those, what a correct engine prefills (it refuses the rest before prefill)
    requests: int
    seconds: float
    moot: str | None
    price: float | None  # the served tokens at the target's price_per_mtok (None: no price given)


class TrialDoc(TypedDict):
    shape: str
    sent: int
    served: int
    echoed: int
    error: str | None


class ShapeDoc(TypedDict):
    chosen: str
    blind: bool
    summary: str
    trials: list[TrialDoc]


class SightDoc(TypedDict):
    checked: int
    echoed: int
    blind: bool


class CoverageDoc(TypedDict):
    planned: int
    sent: int
    observed: int
    unobserved: dict[str, int]  # by outcome


class CheckDoc(TypedDict):
    check: str
    requests: int
    tokens: int
    findings: int
    sight: SightDoc | None
    errors: list[str]
    notes: list[str]
    skipped: dict[str, str]
    moot: str | None
    summary: str


class CacheLayerDoc(TypedDict):
    layer: str  # response | semantic | prefix
    route: str
    state: str  # shared | per_tenant | none_seen | undecided
    control: str
    directions: int
