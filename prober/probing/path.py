"""What the path between leakprobe and the engine adds to every prompt, measured rather than assumed.

A gateway in front of an engine often puts the operator's system prompt or a preamble before every conversation:
hundreds of tokens the engine counts and leakprobe never wrote.  A token-exact prompt aimed just below the KV pool
then lands above it, and that prefix, cached from everyone's requests, looks like cached tokens nobody sent.  So
each route is measured when first used: each tenant sends a few short prompts of a fresh nonce (one answer token),
and the engine's `usage.prompt_tokens` minus leakprobe's own count of it is what the path added.  Many paths add a
different amount each time (an operator prompt that ends with the date or a request reference; replicas behind one
address), so what is kept is a range, and every served answer whose prompt was counted exactly adds to it while the
run goes on.  A prompt that must fit is built for the most the path was seen to add, one that must be refused for
the least; an answer within the range's width of the limit is undecided by the path (prober/probing/envelope.py).
With a usage-calibrated counter the measurement is relative to the first tenant's path, through which that counter
counts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from secrets import token_hex
from typing import TypedDict

from prober.prompts.counter import TokenCounter
from prober.targets.api import Api
from prober.targets.base import Prompt
from prober.targets.result import Completion

MEASUREMENTS = 4  # per tenant when a route is first used; every served, exactly counted prompt adds one more
KEPT = 64  # per tenant, the most recent: a path can change under a long-lived daemon
DRIFT = 64  # tokens beyond the range that an answer's figure may add to it: more is the engine's count, not the path
PROBE = "Reply with one word. Reference {nonce}."

Send = Callable[[str, Prompt], Awaitable[Completion]]  # as this tenant, on the route being measured


@dataclass
class PathOverhead:
    api: Api
    by_tenant: dict[str, deque[int]] = field(default_factory=dict)  # usage minus our count, the latest KEPT each
    problem: str | None = None  # why it was not measured (no usage in the answers, a refusal)

    @classmethod
    def measured(cls, api: Api, values: Mapping[str, Iterable[int]], problem: str | None = None) -> PathOverhead:
        return cls(api, {t: deque(v, maxlen=KEPT) for t, v in values.items()}, problem)

    def _values(self, tenant: str) -> Sequence[int]:
        """This tenant's measurements, else every tenant's (a tenant measured on no request of its own)."""
        return self.by_tenant.get(tenant) or [v for values in self.by_tenant.values() for v in values]

    def low(self, tenant: str) -> int:
        """The least the path was seen to add to this tenant's prompts (0 where unmeasured)."""
        return min(self._values(tenant), default=0)

    def high(self, tenant: str) -> int:
        """The most the path was seen to add to this tenant's prompts (0 where unmeasured)."""
        return max(self._values(tenant), default=0)

    def spread(self, tenant: str) -> int:
        """How far the path's prefix moves a prompt's length from one request to the next."""
        return self.high(tenant) - self.low(tenant)

    def aimed(self, tenant: str, *, must_fit: bool) -> int:
        """What to build a token-exact prompt for: the most the path adds where the engine must see no more than the
        planned length, the least where it must see no less."""
        return self.high(tenant) if must_fit else self.low(tenant)

    def observe(self, tenant: str, added: int) -> bool:
        """One more measurement, from a served answer whose prompt was counted exactly; kept only within DRIFT of
        what the path was seen to add (an engine that reports a placeholder's count is not the path).  Returns
        whether it was kept."""
        values = self.by_tenant.get(tenant)
        if values is None or not (min(values) - DRIFT <= added <= max(values) + DRIFT):
            return False
        values.append(added)
        return True

    @property
    def varying(self) -> bool:
        return any(len(set(values)) > 1 for values in self.by_tenant.values())

    def describe(self) -> str:
        if self.problem:
            return f"{self.api.value}: not measured ({self.problem}); prompts assume the path adds nothing"
        spans = {tenant: (min(v), max(v)) for tenant, v in self.by_tenant.items() if v}
        if len({span for span in spans.values()}) == 1:
            low, high = next(iter(spans.values()))
            added = f"+{low:,}" if low == high else f"+{low:,} to +{high:,}"
            said = f"{self.api.value}: {added} tokens per prompt"
        else:
            said = f"{self.api.value}: " + ", ".join(f"{t} +{lo:,}" + (f" to +{hi:,}" if hi != lo else "")
                                                     for t, (lo, hi) in sorted(spans.items())) + " tokens per prompt"
        if not self.varying:
            return said
        return (f"{said} (varies between requests: prompts that must fit are built for the most, those that must be "
                "refused for the least)")

    def to_json(self) -> PathDoc:
        return {"api": self.api.value, "by_tenant": {t: list(v) for t, v in self.by_tenant.items()},
                "varying": self.varying, "problem": self.problem, "summary": self.describe()}


class PathDoc(TypedDict):
    api: str
    by_tenant: dict[str, list[int]]  # usage minus our count, per measurement
    varying: bool
    problem: str | None
    summary: str


async def measure(api: Api, counter: TokenCounter, tenants: Sequence[str], send: Send) -> PathOverhead:
    """Each tenant's short prompts through the route, usage against our count; a tenant's first answer without usage
    ends its measurements (a target that never answers would hold the survey for every one of them at its bound)."""
    by_tenant: dict[str, list[int]] = {}
    problem = None
    for tenant in tenants:
        values = []
        for _ in range(MEASUREMENTS):
            text = PROBE.format(nonce=token_hex(6))
            counted = await counter.count(text)
            answer = await send(tenant, Prompt(text, max_tokens=1))
            usage = answer.usage.prompt_tokens if answer.usage else None
            if usage is None:
                problem = (f"{tenant}'s answer gave no usage.prompt_tokens "
                           f"({answer.implausible_usage or answer.error or f'HTTP {answer.status}'})")
                break
            values.append(usage - counted)
        if values:
            by_tenant[tenant] = values
    return PathOverhead.measured(api, by_tenant, None if by_tenant else problem)


def behind_path(paths: Sequence[PathOverhead], tenants: Sequence[str]) -> str | None:
    """What the path adds to these tenants' prompts, where it adds anything: why an aimed prompt cannot be built."""
    adding = [p.describe() for p in paths if any(p.high(t) for t in tenants)]
    return f"behind a path that adds {'; '.join(adding)}" if adding else None
