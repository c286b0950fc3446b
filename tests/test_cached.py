"""Cached tokens explained by what was sent before, as policy: the outbox, the explainer and a tokenizer in this
process.  (The same against a real vLLM with a shared, a salted and a phantom-claiming cache: tests/test_vllm.py and
tests/test_vllm_fault.py; behind a gateway: tests/test_shared_endpoint.py.)"""

from __future__ import annotations

import asyncio

import pytest

from prober.domain.evidence import CacheUsage
from prober.domain.types import FindingKind, Severity
from prober.probing.cached import CacheExplainer
from prober.probing.plan import Step
from prober.prompts import BuiltPrompt, LocalCounter
from prober.targets.credentials import Secret
from prober.targets.outbox import Outbox, common_prefix
from prober.targets.result import Completion, Usage
from prober.testbed import tokenizer

pytestmark = pytest.mark.unit

A, B = Secret("key-of-tenant-a-000"), Secret("key-of-tenant-b-000")
COUNTER = LocalCounter(tokenizer.count)
WORDS = " ".join(f"word{i}" for i in range(400))


def step(tenant: str = "b") -> Step:
    return Step(id=f"probe-{tenant}", role="probe", tenant=tenant, length=300, stream=False, expect_served=True,
                boundary="pool")


def built(text: str, fresh_from: int | None = 12, overhead: int = 0) -> BuiltPrompt:
    """Led by a nonce (its first word) when `fresh_from` is given."""
    unique = len(text.split(" ", 1)[0]) if fresh_from is not None else None
    return BuiltPrompt(text, 0, tokenizer.count(text), True, "local", fresh_from=fresh_from,
                       unique_at=unique).through(overhead)


def judge(outbox: Outbox, prompt: BuiltPrompt, cached: int, *, attempts: int = 1, overhead: int = 0,
          tenant: str = "b") -> list[FindingKind]:
    explainer = CacheExplainer(outbox, {"a": A, "b": B})
    answer = Completion(status=200, text="x", usage=Usage(prompt_tokens=prompt.tokens, cached_tokens=cached),
                        attempts=attempts)
    before = outbox.started
    with outbox.sending(B if tenant == "b" else A, prompt.text):
        pass
    findings = asyncio.run(explainer.judge(step(tenant), prompt, answer, before=before, counter=COUNTER,
                                           overhead=overhead))
    return [f.kind for f in findings]


def sent(outbox: Outbox, secret: Secret, text: str) -> None:
    with outbox.sending(secret, text):
        pass


def test_common_prefix_is_exact_at_every_length() -> None:
    text = "abcdef" * 1000
    for cut in (0, 1, 5, 2999, 5999, 6000):
        other = text[:cut] + ("!" if cut < len(text) else "")
        assert common_prefix(text, other) == cut


def test_cached_tokens_within_the_fresh_start_are_nothing() -> None:
    assert judge(Outbox(), built("nonce1 " + WORDS), cached=12) == []


def test_cached_tokens_past_anything_sent_are_a_phantom_hit_that_names_the_longest_share() -> None:
    outbox = Outbox()
    sent(outbox, A, "nonce0 " + WORDS[:40])
    explainer = CacheExplainer(outbox, {"a": A, "b": B})
    prompt = built("nonce1 " + WORDS)
    before = outbox.started
    sent(outbox, B, prompt.text)
    answer = Completion(status=200, text="x", usage=Usage(prompt_tokens=prompt.tokens, cached_tokens=128))
    (found,) = asyncio.run(explainer.judge(step(), prompt, answer, before=before, counter=COUNTER, overhead=0))
    assert found.kind is FindingKind.PHANTOM_CACHE_HIT and found.severity is Severity.HIGH
    usage = found.evidence_of(CacheUsage)
    assert usage is not None and usage.cached_tokens == 128 and found.victim_tenant is None
    assert usage.fresh_from is not None and usage.longest_shared is not None and usage.shared_with is None
    assert "longest prefix any earlier prompt shares" in found.excerpt


def test_cached_tokens_the_observers_own_prompt_explains_are_nothing() -> None:
    outbox = Outbox()
    prompt = built("nonce1 " + WORDS)
    sent(outbox, B, prompt.text[:600])
    assert judge(outbox, prompt, cached=tokenizer.count(prompt.text[:600]) - 4) == []


def test_cached_tokens_another_tenants_prompt_explains_are_a_shared_cache_naming_both() -> None:
    outbox = Outbox()
    prompt = built("nonce1 " + WORDS)
    explainer = CacheExplainer(outbox, {"a": A, "b": B})
    explainer.sent(outbox.started, prompt)
    sent(outbox, A, prompt.text)  # the victim's prompt, resent by the observer
    before = outbox.started
    sent(outbox, B, prompt.text)
    answer = Completion(status=200, text="x", usage=Usage(prompt_tokens=prompt.tokens, cached_tokens=256))
    (found,) = asyncio.run(explainer.judge(step(), prompt, answer, before=before, counter=COUNTER, overhead=0))
    assert found.kind is FindingKind.CROSS_TENANT_CACHE_HIT
    usage = found.evidence_of(CacheUsage)
    assert (found.victim_tenant, found.observer_tenant) == ("a", "b")
    assert usage is not None and usage.shared_with is not None and usage.shared_with.tenant == "a"


def test_a_retried_answer_and_a_gateways_prefix_are_never_phantom() -> None:
    prompt = built("nonce1 " + WORDS)
    assert judge(Outbox(), prompt, cached=prompt.tokens - 1, attempts=2) == []  # its own first attempt, cached
    behind = built("nonce1 " + WORDS, overhead=265)  # the gateway's system prompt, cached from everyone's requests
    assert behind.fresh_from == 12 + 265
    assert judge(Outbox(), behind, cached=272, overhead=265) == []


def test_a_prompt_not_known_to_be_new_is_never_phantom_nor_pinned_on_another_tenant() -> None:
    assert judge(Outbox(), built(WORDS, fresh_from=None), cached=256) == []
    outbox = Outbox()
    sent(outbox, A, WORDS)  # the same words, with nothing only tenant a's: the observer may have sent them before
    assert judge(outbox, built(WORDS, fresh_from=None), cached=256) == []
