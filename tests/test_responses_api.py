"""OpenAI's Responses API as the adapter reads it (httpx's MockTransport answering as OpenAI and vLLM write it): the
request's `input` items and `max_output_tokens`, an answer's `output` items and `input_tokens` usage, a stream of
typed events that ends on `response.completed` with no `[DONE]`, and each way such a stream goes wrong.  The same
against the reference engine's `/v1/responses`: tests/test_targets.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prober.targets import ErrorKind, Prompt
from tests.support.mockhttp import Routes, ask, send, stream

pytestmark = pytest.mark.unit

RESPONSE = {"id": "resp_7f3a", "object": "response", "created_at": 1796600000, "status": "completed",
            "model": "m", "error": None, "incomplete_details": None,
            "output": [{"type": "reasoning", "id": "rs_1", "summary": [],
                        "content": [{"type": "reasoning_text", "text": "thinking of LPK-42"}]},
                       {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": "The code is ", "annotations": []},
                                    {"type": "output_text", "text": "PELICAN.", "annotations": []}]}],
            "usage": {"input_tokens": 40, "input_tokens_details": {"cached_tokens": 16}, "output_tokens": 5,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 45}}


def responses(route: Any) -> Routes:
    return Routes({"POST /v1/responses": route})


def event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"


def text(piece: str) -> str:
    return event("response.output_text.delta", item_id="msg_1", output_index=0, content_index=0, delta=piece)


def test_the_request_is_input_items_and_the_answer_output_items() -> None:
    routes = responses(lambda _: send(200, RESPONSE))
    answer = ask(routes, Prompt("Quote it.", max_tokens=24, turns=(("system", "Be brief."),)), api="responses")
    body = json.loads(routes.seen[0].content)
    assert body["input"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Quote it."}]
    assert body["max_output_tokens"] == 24 and body["store"] is False
    assert "max_tokens" not in body and "messages" not in body and "stream_options" not in body
    assert answer.ok and answer.text == "The code is PELICAN." and answer.other_text == "thinking of LPK-42"
    assert answer.usage is not None and (answer.usage.prompt_tokens, answer.usage.completion_tokens,
                                         answer.usage.cached_tokens) == (40, 5, 16)
    assert (answer.answer_id, answer.created, answer.finish_reason) == ("resp_7f3a", 1796600000, "stop")


def test_a_stream_ends_on_its_final_event_and_carries_the_usage() -> None:
    done = {**RESPONSE, "output": []}
    routes = responses(lambda _: stream(event("response.created", response={**done, "status": "in_progress"}),
                                        event("response.reasoning_text.delta", delta="hmm "), text("The code "),
                                        text("is PELICAN."), event("response.completed", response=done)))
    answer = ask(routes, Prompt("Quote it.", stream=True), api="responses")
    assert answer.ok, answer.error
    assert answer.text == "The code is PELICAN." and answer.other_text == "hmm " and answer.ttft_s is not None
    assert answer.usage is not None and answer.usage.prompt_tokens == 40 and answer.finish_reason == "stop"
    assert (answer.answer_id, answer.created) == ("resp_7f3a", 1796600000)
    assert json.loads(routes.seen[0].content)["stream"] is True


def test_an_answer_cut_at_max_output_tokens_is_length() -> None:
    cut = {**RESPONSE, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    plain = ask(responses(lambda _: send(200, cut)), Prompt("Quote it."), api="responses")
    streamed = ask(responses(lambda _: stream(text("The code"), event("response.incomplete", response=cut))),
                   Prompt("Quote it.", stream=True), api="responses")
    assert plain.finish_reason == streamed.finish_reason == "length" and plain.ok and streamed.ok


def test_a_stream_without_its_final_event_is_truncated_and_keeps_its_text() -> None:
    answer = ask(responses(lambda _: stream(text("Another tenant's code is "), text("LPK-"))),
                 Prompt("Quote it.", stream=True), api="responses")
    assert answer.error is not None and answer.error.kind is ErrorKind.TRUNCATED
    assert answer.text == "Another tenant's code is LPK-"


@pytest.mark.parametrize("last", [event("error", code="context_length_exceeded", message="too long", param=None),
                                  event("response.failed", response={**RESPONSE, "status": "failed", "output": [],
                                                                     "error": {"message": "too long"}})])
def test_a_failure_inside_a_200_stream_is_an_in_band_error(last: str) -> None:
    answer = ask(responses(lambda _: stream(last)), Prompt("Quote it.", stream=True), api="responses")
    assert answer.status == 200 and answer.in_band_error and not answer.served
    assert answer.error is not None and answer.error.kind is ErrorKind.REFUSED and "too long" in answer.error.message


def test_an_error_body_is_read_as_the_others_are() -> None:
    refusal = {"error": {"message": "This model's maximum context length is 8192 tokens", "type": "invalid_request"}}
    answer = ask(responses(lambda _: send(400, refusal)), Prompt("Quote it."), api="responses")
    assert answer.error is not None and answer.error.kind is ErrorKind.REFUSED
    assert "maximum context length" in answer.error.message


def test_an_output_that_is_not_a_list_of_items_is_malformed() -> None:
    answer = ask(responses(lambda _: send(200, {**RESPONSE, "output": "PELICAN"})), Prompt("Quote it."),
                 api="responses")
    assert answer.error is not None and answer.error.kind is ErrorKind.MALFORMED

