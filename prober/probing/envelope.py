"""What an answer's envelope says, checked against what a correct engine does with that prompt length.
The scanner judges the text; these judge status, usage and finish reason."""

from __future__ import annotations

from prober.domain.evidence import Envelope, PathRange
from prober.domain.types import DetectorName, Finding, FindingKind, ProbeContext, Severity
from prober.probing.path import DRIFT
from prober.probing.plan import Aim, Step
from prober.targets.result import Completion, ErrorKind

PLACEHOLDER_SHARE = 0.5  # usage below half of what was sent: the engine did not process this prompt
USUAL_FINISH = frozenset({"stop", "length", "eos", "eos_token", "end_turn", "max_tokens", "stop_sequence",
                          "tool_calls", "content_filter"})


def undecided(step: Step, sent_tokens: int, answer: Completion, path: PathRange | None) -> PathRange | None:
    """Where a path whose prefix varies (`path`: the least and most it was seen to add, and the limit), not the engine,
    may have put this answer on the other side of the limit: the range, with what the engine saw where its usage says.
    A prompt aimed at a length was built for the most the path adds where it must fit and the least where it must be
    refused; the path can still step past what was seen by about its spread.  Served over the limit with usage that
    says the engine saw less than its limit, the engine was right; with usage at or over the limit, or a count no
    path explains (a placeholder's), it was not."""
    spread = path.high - path.low if path is not None else 0
    if path is None or step.aim is not Aim.LENGTH or not spread:
        return None
    if answer.served and not step.expect_served:
        usage = answer.counted_prompt_tokens
        if usage is None:
            return path if step.length - path.limit < spread else None
        added = usage - (sent_tokens - path.low)  # the prompt was built for the least the path adds
        return PathRange(path.low, path.high, path.limit, usage) if (
            usage < path.limit and added >= path.low - DRIFT) else None
    if answer.refused and step.expect_served:
        return path if path.limit - 1 - step.length < spread else None
    return None


def over_limit(answer: Completion, path: PathRange | None) -> PathRange | None:
    """A prompt served although the engine's own count of it is at or over the limit (`seen`): behind a path whose
    prefix is as long as the limit (a long operator prompt before a small KV pool), every request is over it, and an
    engine that serves them all is wrong whatever the plan aimed at."""
    usage = answer.counted_prompt_tokens
    if path is None or usage is None or usage < path.limit:
        return None
    return PathRange(path.low, path.high, path.limit, usage)


def added(path: PathRange) -> str:
    return f"{path.low:,}" if path.low == path.high else f"{path.low:,} to {path.high:,}"


def check_answer(step: Step, sent_tokens: int, answer: Completion, path: PathRange | None = None) -> list[Finding]:
    """The envelope of one answer (cached tokens are prober/probing/cached.py's, counters counters.py's); `path`:
    the range a varying path adds and the limit, for a prompt aimed at a length (`undecided`)."""
    findings: list[Finding] = []

    def add(kind: FindingKind, severity: Severity, message: str, envelope: Envelope | PathRange | None = None) -> None:
        findings.append(Finding(record_id=step.id, kind=kind, detector=DetectorName.ENVELOPE, severity=severity,
                                score=1.0, observer_tenant=step.tenant, probe_id=step.id, excerpt=message,
                                context=ProbeContext(sent_tokens, step.boundary, answer.status),
                                evidence=(envelope,) if envelope else ()))

    jitter = undecided(step, sent_tokens, answer, path)
    if jitter is not None:
        outcome = "served" if answer.served else "refused"
        seen = f"; the engine counted {jitter.seen:,}" if jitter.seen is not None else ""
        add(FindingKind.PATH_JITTER, Severity.INFO,
            f"{outcome} a {sent_tokens:,}-token prompt ({step.boundary}) at the limit of {jitter.limit:,}: undecidable "
            f"by the path's jitter, which adds +{jitter.low:,} to +{jitter.high:,} tokens per request{seen}", jitter)
    elif answer.served and not step.expect_served:
        add(FindingKind.BOUNDARY_ACCEPTED, Severity.HIGH,
            f"served a {sent_tokens:,}-token prompt ({step.boundary}) that a correct engine refuses",
            Envelope(expected="refused"))
    elif (over := over_limit(answer, path)) is not None:
        # Planned to fit, but what the path put in front took it over: the engine's own count says so.
        add(FindingKind.BOUNDARY_ACCEPTED, Severity.HIGH,
            f"served a prompt ({step.boundary}) that the engine itself counted at {over.seen:,} tokens, "
            f"{added(over)} of them the path's: over the limit of {over.limit:,}, where a correct engine refuses",
            Envelope(expected="refused", usage_prompt_tokens=over.seen))
    elif answer.refused and answer.error is not None and step.expect_served:
        add(FindingKind.UNEXPECTED_REFUSAL, Severity.INFO,
            f"refused a {sent_tokens:,}-token prompt ({step.boundary}) that the capacity says fits: "
            f"{answer.error.message}", Envelope(expected="served"))
    if answer.in_band_error and answer.error is not None:
        # Refusing in-band where a refusal is due (or the path may have made it due) is correct (SGLang does it);
        # elsewhere it hides a failure.
        severity = Severity.INFO if not step.expect_served or jitter is not None else Severity.WARNING
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
            Envelope(cut=cut.value, arrived_chars=len(answer.text)))
    implausible = answer.implausible_usage or (answer.usage.implausible(sent_tokens=sent_tokens)
                                               if answer.usage else None)
    if implausible:
        add(FindingKind.IMPLAUSIBLE_USAGE, Severity.WARNING,
            f"{implausible}: the engine's token accounting cannot be trusted (budgets, the placeholder check)")
    usage = answer.usage.prompt_tokens if answer.usage and not implausible else None
    if answer.status == 200 and usage is not None and usage < sent_tokens * PLACEHOLDER_SHARE:
        add(FindingKind.PLACEHOLDER_SUBSTITUTION, Severity.HIGH,
            f"usage.prompt_tokens is {usage:,} for a {sent_tokens:,}-token prompt: the prompt was replaced "
            "before it was processed", Envelope(usage_prompt_tokens=usage))
    if answer.served and answer.finish_reason is not None and answer.finish_reason not in USUAL_FINISH:
        add(FindingKind.ODD_FINISH_REASON, Severity.WARNING,
            f"finish_reason {answer.finish_reason!r} on an HTTP-200 answer",
            Envelope(finish_reason=answer.finish_reason))
    return findings
