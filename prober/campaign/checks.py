"""What an answer's envelope says, checked against what a correct engine does with that prompt length.
The scanner judges the text; these judge status, usage and finish reason."""

from __future__ import annotations

from collections.abc import Mapping

from prober.campaign.plan import Step
from prober.targets.result import Completion, ErrorKind
from prober.types import Finding, FindingKind, ProbeContext, Severity

PLACEHOLDER_SHARE = 0.5  # usage below half of what was sent: the engine did not process this prompt
CACHE_SHARE = 0.5  # an observer served half of another tenant's prompt from cache
USUAL_FINISH = frozenset({"stop", "length", "eos", "eos_token", "end_turn", "max_tokens", "stop_sequence",
                          "tool_calls", "content_filter"})


def phantom_cached(answer: Completion, fresh_from: int | None) -> int | None:
    """Cached tokens the engine reports beyond what any earlier prompt can have shared with this one (its
    `fresh_from`): KV the engine says it reused but never computed, or None."""
    cached = answer.usage.cached_tokens if answer.usage else None
    if fresh_from is None or not answer.served or not cached or cached <= fresh_from:
        return None
    return cached


def check_answer(step: Step, sent_tokens: int, answer: Completion, *, primed_by: str | None = None,
                 fresh_from: int | None = None) -> list[Finding]:
    """`primed_by`: this prompt is that tenant's, sent again by another (the prefix-cache check).  `fresh_from`:
    where this prompt's never-sent content begins (the phantom cache-hit check)."""
    findings: list[Finding] = []

    def add(kind: FindingKind, severity: Severity, message: str, victim: str | None = None,
            **details: object) -> None:
        findings.append(Finding(record_id=step.id, kind=kind, detector="envelope", severity=severity, score=1.0,
                                observer_tenant=step.tenant, victim_tenant=victim, probe_id=step.id,
                                excerpt=message, context=ProbeContext(sent_tokens, step.boundary, answer.status),
                                details=details))

    if answer.served and not step.expect_served:
        add(FindingKind.BOUNDARY_ACCEPTED, Severity.HIGH,
            f"served a {sent_tokens:,}-token prompt ({step.boundary}) that a correct engine refuses",
            expected="refused")
    if answer.refused and answer.error is not None and step.expect_served:
        add(FindingKind.UNEXPECTED_REFUSAL, Severity.INFO,
            f"refused a {sent_tokens:,}-token prompt ({step.boundary}) that the capacity says fits: "
            f"{answer.error.message}", expected="served")
    if answer.in_band_error and answer.error is not None:
        # Refusing in-band where a refusal is due is correct (SGLang does it); elsewhere it hides a failure.
        severity = Severity.INFO if not step.expect_served else Severity.WARNING
        add(FindingKind.STREAM_ERROR, severity,
            f"error inside an HTTP-200 {'stream' if answer.streamed else 'body'}: {answer.error.message}")
    if answer.error is not None and answer.error.kind is ErrorKind.SERVER_ERROR and answer.status:
        add(FindingKind.ENGINE_ERROR, Severity.WARNING,
            f"HTTP {answer.status} on a {sent_tokens:,}-token prompt ({step.boundary}): {answer.error.message}")
    cut = answer.error.cut if answer.error is not None else None
    if answer.error is not None and cut is not None and cut.targets_fault:
        # An answer that would not end: cut, and what had arrived scanned like any answer.
        add(FindingKind.STREAM_ERROR if answer.streamed else FindingKind.ENGINE_ERROR, Severity.WARNING,
            f"{'stream' if answer.streamed else 'answer'} cut on a {sent_tokens:,}-token prompt ({step.boundary}) "
            f"after {answer.total_s:.1f} s, {len(answer.text):,} characters in: {answer.error.message}",
            cut=cut.value, arrived_chars=len(answer.text))
    cached = answer.usage.cached_tokens if answer.usage else None
    # Half the prompt, not any hit: chat-template tokens every request starts with are cached legitimately.
    if primed_by is not None and cached and cached >= sent_tokens * CACHE_SHARE:
        add(FindingKind.CROSS_TENANT_CACHE_HIT, Severity.WARNING,
            f"{cached:,} of {sent_tokens:,} tokens came from a prefix cache filled by {primed_by}: a timing "
            "side channel (per-tenant cache salts close it)", victim=primed_by, cached_tokens=cached)
    phantom = phantom_cached(answer, fresh_from)
    if phantom is not None:
        add(FindingKind.PHANTOM_CACHE_HIT, Severity.HIGH,
            f"{phantom:,} of {sent_tokens:,} tokens reported as cached, but no prompt sent before shares more than the "
            f"first {fresh_from:,}: the engine attended over KV it never computed for this prompt (a hand-off or "
            "cache tier that claims what it did not write)", cached_tokens=phantom, fresh_from=fresh_from)
    implausible = answer.implausible_usage or (answer.usage.implausible(sent_tokens=sent_tokens)
                                               if answer.usage else None)
    if implausible:
        add(FindingKind.IMPLAUSIBLE_USAGE, Severity.WARNING,
            f"{implausible}: the engine's token accounting cannot be trusted (budgets, the placeholder check)")
    usage = answer.usage.prompt_tokens if answer.usage and not implausible else None
    if answer.status == 200 and usage is not None and usage < sent_tokens * PLACEHOLDER_SHARE:
        add(FindingKind.PLACEHOLDER_SUBSTITUTION, Severity.HIGH,
            f"usage.prompt_tokens is {usage:,} for a {sent_tokens:,}-token prompt: the prompt was replaced "
            "before it was processed", usage_prompt_tokens=usage)
    if answer.served and answer.finish_reason is not None and answer.finish_reason not in USUAL_FINISH:
        add(FindingKind.ODD_FINISH_REASON, Severity.WARNING,
            f"finish_reason {answer.finish_reason!r} on an HTTP-200 answer", finish_reason=answer.finish_reason)
    return findings


def counted_failure(step: Step, sent_tokens: int, answer: Completion, failures: Mapping[str, float],
                    unserved: int) -> Finding | None:
    """The engine's abort or transfer-failure counters rose by more than the requests in the same window that
    were refused or failed (whose aborts it counts rightly) while this answer came back served: the engine gave
    up on a request its client was told succeeded (the incident's abort, counted by the scheduler, HTTP 200)."""
    rose = {name: delta for name, delta in failures.items() if delta > unserved}
    if not answer.served or not rose:
        return None
    named = ", ".join(f"{name} +{delta:g}" for name, delta in sorted(rose.items()))
    return Finding(record_id=step.id, kind=FindingKind.COUNTED_FAILURE, detector="engine_counters",
                   severity=Severity.HIGH, score=1.0, observer_tenant=step.tenant, probe_id=step.id,
                   excerpt=f"{named} while this answer came back HTTP 200 ({unserved} other requests in the same "
                           "window were refused or failed): the engine gave up on a request it answered",
                   context=ProbeContext(sent_tokens, step.boundary, answer.status),
                   details={"counters": rose, "unserved_in_window": unserved})
