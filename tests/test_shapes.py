"""Probe shapes and blindness as policy: pure functions of answers, checked in-process.
(What real models do with each shape is tests/test_llamacpp.py's and tests/test_vllm_fault.py's.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

import pytest

from prober.checks.shapes import choose_shape
from prober.domain.errors import CountError
from prober.domain.types import Canary, CanaryKind, DetectorName, Finding, FindingKind, Severity
from prober.domain.verdicts import EXIT_ERROR, EXIT_FINDINGS
from prober.oneshot.audit import exit_code
from prober.probing import AuditResult, CheckResult, StepResult, TargetReport
from prober.probing.plan import Step
from prober.probing.results import ShapeResult
from prober.prompts import LocalCounter, PromptBuilder
from prober.prompts.builder import CUE
from prober.prompts.shape import Layout, Shape, candidates
from prober.report import document
from prober.targets.api import Api
from prober.targets.result import Completion, ErrorKind, TargetError, Usage
from prober.testbed import tokenizer

pytestmark = pytest.mark.unit

T = TypeVar("T")
Role = Literal["prime", "probe", "control"]
CHAT_ASK, COMPLETIONS_ASK, COMPLETIONS_CUE, CHAT_CUE = candidates(Api.CHAT)
SERVED = Completion(status=200, text="an answer", usage=Usage(prompt_tokens=300, cached_tokens=0))


def step(role: Role = "control", tenant: str = "a") -> Step:
    return Step(id=f"{role}-{tenant}", role=role, tenant=tenant, length=300, stream=False, expect_served=True,
                boundary="shape:x")


def result(echoed: bool, answer: Completion = SERVED, role: Role = "control", tenant: str = "a") -> StepResult:
    return StepResult(step=step(role, tenant), exchange="x", target="t", sent_tokens=300, counted=True,
                      answer=answer, canary_ids=[], findings=[], own_echoes=int(echoed))


def choose(echoes: dict[Shape, bool | Completion | Exception], stopped: Callable[[], bool] = lambda: False
           ) -> tuple[Shape, list[tuple[Shape, str]]]:
    tried: list[tuple[Shape, str]] = []

    async def trial(shape: Shape, tenant: str) -> StepResult:
        tried.append((shape, tenant))
        outcome = echoes[shape]
        if isinstance(outcome, Exception):
            raise outcome
        if isinstance(outcome, Completion):
            return result(False, outcome)
        return result(outcome)

    choice = asyncio.run(choose_shape(candidates(Api.CHAT), ["a", "b"], trial, CountError, stopped))
    return choice.chosen, tried


def test_the_order_of_shapes_follows_the_route() -> None:
    assert [s.name for s in candidates(Api.CHAT)] == ["chat-ask", "completions-ask", "completions-cue", "chat-cue"]
    assert [s.name for s in candidates(Api.COMPLETIONS)] == ["completions-ask", "chat-ask", "completions-cue",
                                                             "chat-cue"]
    assert [s.name for s in candidates(Api.WORKERS_AI)] == ["workers-ai-ask", "workers-ai-cue"]
    assert candidates(Api.CHAT, (COMPLETIONS_CUE,)) == [COMPLETIONS_CUE]
    assert Shape.parse("workers-ai-cue") == Shape(Api.WORKERS_AI, Layout.CUE)
    with pytest.raises(ValueError, match="unknown probe shape 'chat-quote'"):
        Shape.parse("chat-quote")


def test_the_first_shape_that_brings_every_canary_back_is_taken_at_once() -> None:
    chosen, tried = choose({CHAT_ASK: True, COMPLETIONS_ASK: True, COMPLETIONS_CUE: True, CHAT_CUE: True})
    assert chosen == CHAT_ASK and tried == [(CHAT_ASK, "a"), (CHAT_ASK, "b")]
    chosen, tried = choose({CHAT_ASK: False, COMPLETIONS_ASK: False, COMPLETIONS_CUE: True, CHAT_CUE: True})
    assert chosen == COMPLETIONS_CUE and len(tried) == 6


def test_a_shape_that_cannot_be_tried_is_passed_over_and_none_that_echoes_keeps_the_first() -> None:
    chosen, tried = choose({CHAT_ASK: False, COMPLETIONS_ASK: CountError("no tokenizer"),
                            COMPLETIONS_CUE: CountError("no tokenizer"), CHAT_CUE: True})
    assert chosen == CHAT_CUE and [s for s, _ in tried].count(COMPLETIONS_CUE) == 1
    chosen, tried = choose({CHAT_ASK: False, COMPLETIONS_ASK: False, COMPLETIONS_CUE: False, CHAT_CUE: False})
    assert chosen == CHAT_ASK and len(tried) == 8  # blind: every shape tried, the first kept


def test_a_target_that_does_not_answer_ends_the_choice() -> None:
    """No answer and no refusal to the first control: no other shape would fare better, and the campaign's
    breaker and deadline deal with it; a refusal (no completions route, say) moves on to the next shape."""
    silent = Completion(status=None, error=TargetError(ErrorKind.TIMEOUT, "timed out"))
    chosen, tried = choose({CHAT_ASK: silent, COMPLETIONS_ASK: True, COMPLETIONS_CUE: True, CHAT_CUE: True})
    assert chosen == CHAT_ASK and tried == [(CHAT_ASK, "a")]
    refused = Completion(status=404, error=TargetError(ErrorKind.REFUSED, "no such route", 404))
    chosen, _ = choose({CHAT_ASK: refused, COMPLETIONS_ASK: True, COMPLETIONS_CUE: True, CHAT_CUE: True})
    assert chosen == COMPLETIONS_ASK
    _, tried = choose({CHAT_ASK: True, COMPLETIONS_ASK: True, COMPLETIONS_CUE: True, CHAT_CUE: True},
                      stopped=lambda: True)
    assert tried == []


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_a_cue_ends_the_prompt_and_a_lead_keeps_canaries_to_its_first_unit() -> None:
    builder = PromptBuilder(LocalCounter(tokenizer.count))
    minted: list[Canary] = []

    async def mint(count: int) -> list[Canary]:
        made = [Canary(id=f"c{len(minted) + i}", tenant="a", kind=CanaryKind.TOKEN,
                       text=f"LPK-TEST{len(minted) + i:04d}-ABCD") for i in range(count)]
        minted.extend(made)
        return made

    every = run(builder.build(600, instruction="Quote the document.", mint=mint, page_size=64, cue=True))
    lead = run(builder.build(600, instruction="Quote the document.", mint=mint, page_size=64, cue=True, lead=True))
    for built in (every, lead):
        assert built.exact and built.text.endswith("\n" + CUE)
    assert len(every.canaries) > 4 and len(lead.canaries) == 1
    first = lead.text.index(lead.canaries[0].text)
    assert lead.fresh_from is not None and tokenizer.count(lead.text[:first]) < lead.fresh_from < 600
    nonce = run(builder.build(300, instruction="Quote the document.", nonce="0a1b2c"))
    assert nonce.text.startswith("0a1b2c ")
    assert nonce.fresh_from == tokenizer.count("0a1b2c Quote the document.\n the") - 1


def audit_of(*steps: StepResult, findings: list[Finding] | None = None) -> AuditResult:
    """Controls as the probe-shape check's, the rest as the campaign's."""
    controls = ShapeResult(check="shapes", steps=[s for s in steps if s.step.role == "control"])
    campaign = CheckResult(check="campaign", steps=[s for s in steps if s.step.role != "control"])
    if findings:
        campaign.steps[0].findings = findings
    return AuditResult(targets=[TargetReport("t", "http://t/v1", results=[controls, campaign], complete=True)],
                       finished=1.0)


def test_an_audit_whose_answers_never_repeat_their_canary_is_blind_not_clean() -> None:
    probe = result(False, role="probe", tenant="b")
    blind = audit_of(result(False), result(False, tenant="b"), probe)
    doc = document(blind)
    assert doc["verdict"]["status"] == "blind" and exit_code(blind, Severity.WARNING) == EXIT_ERROR
    assert doc["verdict"]["reasons"] == ["t: campaign blind: none of 1 probe answers repeated its own tenant's "
                                         "canary, so another tenant's would not have shown either; still checked: "
                                         "campaign (1 probes: refusals, usage, finish reasons)"]
    vouched = audit_of(result(True), probe)  # a control picked for echoing does not vouch for the probes
    assert document(vouched)["verdict"]["status"] == "blind" and exit_code(vouched, Severity.WARNING) == EXIT_ERROR
    seeing = audit_of(result(False), result(True, role="probe", tenant="b"))
    assert document(seeing)["verdict"]["status"] == "no_leak" and exit_code(seeing, Severity.WARNING) == 0
    echo = Finding(record_id="probe-b", kind=FindingKind.CROSS_TENANT_ECHO, detector=DetectorName.EXACT,
                   severity=Severity.CRITICAL, score=1.0, observer_tenant="b", victim_tenant="a")
    leaked = audit_of(probe, findings=[echo])  # a leak seen is seen, even by an audit otherwise blind
    assert document(leaked)["verdict"]["status"] == "leak" and exit_code(leaked, Severity.WARNING) == EXIT_FINDINGS
