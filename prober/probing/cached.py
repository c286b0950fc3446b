"""Cached tokens, explained by what was sent before (`cross_tenant_cache_hit`, `phantom_cache_hit`).

A prefix cache can only serve tokens some earlier prompt shared: vLLM and SGLang cache whole blocks whose whole
prefix chain matched.  So when an answer reports cached tokens, the longest prefix this prompt shares with every
prompt this process sent the target (every tenant, every check, the probe-shape controls, the counters' own
calibration requests; the target's outbox keeps them) says who could have filled that cache, counted with the
target's own tokenizer, the path's overhead (a gateway's system prompt, which everyone's requests share) included:

- explained by the observer's own earlier prompts (or by the path's prefix, or by the request's own earlier
  attempt): nothing to report;
- explained only by another tenant's prompt: that tenant's prompt filled a cache the observer read, so the two
  share one prefix cache (`cross_tenant_cache_hit`, naming both) — a timing side channel, and on an endpoint that
  claims per-tenant salts a broken isolation;
- explained by nothing anyone sent, on a prompt known to be new past its first tokens (led by a fresh nonce or a
  fresh canary): the engine attended over KV it never computed for this prompt (`phantom_cache_hit`), with the
  longest prefix that was shared and with whom, so an operator can check.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prober.domain.evidence import CacheUsage, SharedPrefix
from prober.domain.types import DetectorName, Finding, FindingKind, ProbeContext, Severity
from prober.probing.plan import Step
from prober.prompts import BuiltPrompt
from prober.prompts.counter import TokenCounter
from prober.targets.credentials import Secret
from prober.targets.outbox import Outbox, SentPrompt
from prober.targets.result import Completion

# A prefix counted through a chat template's form carries the turn's end, and a cut may merge differently.
SLACK_TOKENS = 8
MIN_SHARED_TOKENS = 16  # another tenant's share that counts: at least a block beyond what the observer explains
EVICTED = "prefix-tier2"  # the boundary of a resend sent after filler evicted the first tier (the prefix-cache check)


@dataclass(frozen=True)
class Shared:
    """The longest prefix a prompt shares with one tenant's earlier prompts, in the engine's tokens."""

    tokens: int
    tenant: str | None  # None: no tenant this run knows (an earlier replica's, a credential no longer configured)
    sent: SentPrompt | None = None
    unique: bool = False  # the share holds what only that prompt held (its nonce, its first canary)

    def describe(self) -> str:
        if self.sent is None:
            return "no earlier prompt"
        whose = self.tenant or "an unknown sender"
        return f"a prompt {whose} sent at {_utc(self.sent.at)} ({self.tokens:,} tokens)"

    def evidence(self) -> SharedPrefix:
        return SharedPrefix(self.tokens, self.tenant, self.sent.at if self.sent else None)


class CacheExplainer:
    """One per target: its outbox, and whose credential each prompt was sent with."""

    def __init__(self, outbox: Outbox, tenants: Mapping[str, Secret | None]) -> None:
        self.outbox = outbox
        self._tenant_of: Callable[[Secret | None], str | None] = {s: t for t, s in tenants.items()}.get
        self._unique_at: dict[int, int] = {}  # a sent prompt's number -> where what only it holds ends

    def sent(self, number: int, built: BuiltPrompt) -> None:
        """A built prompt went out as the outbox's `number`: another tenant's answer served from a cache with more of
        it than `built.unique_at` can only have been served what this prompt left there."""
        if built.unique_at is not None:
            self._unique_at[number] = built.unique_at
        if len(self._unique_at) > 2 * self.outbox.kept:  # of prompts the outbox no longer keeps
            oldest = number - self.outbox.kept
            self._unique_at = {n: at for n, at in self._unique_at.items() if n >= oldest}

    async def judge(self, step: Step, built: BuiltPrompt, answer: Completion, *, before: int,
                    counter: TokenCounter, overhead: int, fresh: bool = True) -> list[Finding]:
        """`before`: the outbox's count when this request was sent (what came after cannot have filled the cache);
        `overhead`: what the path adds before the prompt; `fresh`: whether a claim beyond every earlier prompt is a
        phantom (off where decode counts what a prefill instance sent it as cached)."""
        cached = answer.usage.cached_tokens if answer.served and answer.usage else None
        # Where the path adds more than the prompt was built for, its new part starts that much later.
        floor = built.fresh_from + max(0, overhead - built.path) if fresh and built.fresh_from is not None else None
        if not cached or (floor is not None and cached <= floor + SLACK_TOKENS) or answer.retried:
            return []  # the template, the path's prefix and the instruction; or its own first attempt, retried
        if cached <= overhead + await counter.count(built.text[:1]) + SLACK_TOKENS:
            return []  # what every prompt on this path starts with: the path's prefix and the template's start
        own, others = await self._explain(step.tenant, built.text, before, counter, overhead)
        if cached <= own.tokens + SLACK_TOKENS:
            return []
        context = ProbeContext(built.tokens, step.boundary, answer.status)
        other = max((o for o in others if o.tokens + SLACK_TOKENS >= cached), key=lambda o: o.tokens, default=None)
        if other is not None:
            if not other.unique or cached - max(own.tokens, floor or 0) < MIN_SHARED_TOKENS:
                # Text the observer may have sent itself in an earlier run (no nonce or canary of the other's in
                # it), a sender this run cannot name, or no more than a block beyond what the observer explains.
                return []
            return [Finding(
                record_id=step.id, kind=FindingKind.CROSS_TENANT_CACHE_HIT, detector=DetectorName.ENVELOPE,
                severity=Severity.WARNING, score=1.0, observer_tenant=step.tenant, victim_tenant=other.tenant,
                probe_id=step.id, context=context,
                excerpt=f"{cached:,} of {built.tokens:,} tokens{tier(step, answer)} came from a prefix cache that "
                        f"{other.describe()} "
                        f"filled; none of {step.tenant}'s own earlier prompts shares more than {own.tokens:,}: one "
                        "prefix cache serves both tenants (a timing side channel; per-tenant cache salts close it)",
                evidence=(CacheUsage(cached, shared_with=other.evidence(), own_shared=own.evidence()),))]
        if floor is None:
            return []  # not known to be new: a prompt this process no longer keeps, or another sender's
        best = max([own, *others], key=lambda s: s.tokens)
        return [Finding(
            record_id=step.id, kind=FindingKind.PHANTOM_CACHE_HIT, detector=DetectorName.ENVELOPE,
            severity=Severity.HIGH, score=1.0, observer_tenant=step.tenant, probe_id=step.id, context=context,
            excerpt=f"{cached:,} of {built.tokens:,} tokens{tier(step, answer)} reported as cached, but the longest "
                    "prefix any earlier "
                    f"prompt shares with this one is {best.describe() if best.sent else f'its first {floor:,} tokens'}"
                    ": the engine attended over KV it never computed for this prompt (a hand-off or cache tier that "
                    "claims what it did not write)",
            evidence=(CacheUsage(cached, fresh_from=floor, longest_shared=best.evidence()),))]

    async def _explain(self, tenant: str, text: str, before: int, counter: TokenCounter,
                       overhead: int) -> tuple[Shared, list[Shared]]:
        """The longest share with the tenant's own earlier prompts, and with each other sender's."""
        longest: dict[str | None, tuple[SentPrompt, int]] = {}
        for sent, chars in self.outbox.shared(text, before):
            whose = self._tenant_of(sent.secret)
            if chars > longest.get(whose, (sent, 0))[1]:
                longest[whose] = (sent, chars)
        shares = {whose: Shared(await counter.count(text[:chars]) + overhead, whose, sent,
                                whose is not None and chars >= self._unique_at.get(sent.number, len(sent.text) + 1))
                  for whose, (sent, chars) in longest.items()}
        own = shares.pop(tenant, Shared(0, tenant))
        return own, list(shares.values())


def tier(step: Step, answer: Completion) -> str:
    """Which tier of the engine's cache served the cached tokens, where that is known: the engine's usage says (vLLM's
    `external_cached_tokens`: a KV connector's or offload tier's hits), or the first tier was evicted before this
    resend, so that a lower tier must have."""
    external = answer.usage.external_cached_tokens if answer.usage else None
    if external:
        return f" ({external:,} of them from the engine's second tier, by its usage.external_cached_tokens)"
    if step.boundary == EVICTED:
        return " (sent after filler evicted the first tier: a lower tier served them)"
    return ""


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))
