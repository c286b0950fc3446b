"""What the path between leakprobe and the engine adds to every prompt, measured rather than assumed.

A gateway in front of an engine often puts the operator's system prompt or a preamble before every conversation:
hundreds of tokens the engine counts and leakprobe never wrote.  A token-exact prompt aimed just below the KV pool
then lands above it, and that prefix, cached from everyone's requests, looks like cached tokens nobody sent.  So
each route is measured once per survey: each tenant sends a short prompt of a fresh nonce twice (one answer token),
and the engine's `usage.prompt_tokens` minus leakprobe's own count of it is what the path added.  Every prompt is
then built that much shorter, so that what the engine sees is the planned length; the phantom check counts the
path's prefix as shared.  A tenant whose two measurements differ has a varying overhead, reported as such (the
smaller is used, so that a prompt meant to be over a limit stays over it).  With a usage-calibrated counter the
measurement is relative to the first tenant's path, through which that counter counts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from secrets import token_hex
from typing import TypedDict

from prober.prompts.counter import TokenCounter
from prober.targets.api import Api
from prober.targets.base import Prompt
from prober.targets.result import Completion

MEASUREMENTS = 2  # per tenant: two that differ show a varying overhead
PROBE = "Reply with one word. Reference {nonce}."

Send = Callable[[str, Prompt], Awaitable[Completion]]  # as this tenant, on the route being measured


@dataclass(frozen=True)
class PathOverhead:
    api: Api
    by_tenant: dict[str, tuple[int, ...]] = field(default_factory=dict)  # usage minus our count, per measurement
    problem: str | None = None  # why it was not measured (no usage in the answers, a refusal)

    def of(self, tenant: str) -> int:
        """Tokens the path adds to this tenant's prompts (the smaller of its measurements; 0 where unmeasured)."""
        measured = self.by_tenant.get(tenant) or min(self.by_tenant.values(), default=())
        return min(measured, default=0)

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
            return f"{self.api.value}: {added} tokens per prompt" + (" (varies between requests)" if self.varying
                                                                      else "")
        each = ", ".join(f"{t} +{lo:,}" + (f" to +{hi:,}" if hi != lo else "") for t, (lo, hi) in sorted(spans.items()))
        return f"{self.api.value}: {each} tokens per prompt" + (" (varies between requests)" if self.varying else "")

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
    """Each tenant's short prompts through the route, usage against our count."""
    by_tenant: dict[str, tuple[int, ...]] = {}
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
                continue
            values.append(usage - counted)
        if values:
            by_tenant[tenant] = tuple(values)
    return PathOverhead(api, by_tenant, None if by_tenant else problem)


def behind_path(paths: Sequence[PathOverhead], tenants: Sequence[str]) -> str | None:
    """What the path adds to these tenants' prompts, where it adds anything: why an aimed prompt cannot be built."""
    adding = [p.describe() for p in paths if any(p.of(t) for t in tenants)]
    return f"behind a path that adds {'; '.join(adding)}" if adding else None
