"""How an answer is read, as parsing in this process (httpx's MockTransport answers as engines and gateways do):
bodies that are not JSON, not UTF-8 or lack the expected fields, streams cut short or without their end, bodies
over the cap, text beside the content (a reasoning model's reasoning, a refusal, tool-call arguments), an
engine's over-length refusal that a gateway wrapped in a 5xx, a gateway that says it retried, and Workers AI's
envelope.  (The same against real servers: the reference engine in tests/test_targets.py and its reasoning mode in
tests/test_audit.py, the LiteLLM proxy in tests/test_shared_endpoint.py.)"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from prober.targets import Completion, ErrorKind, Prompt, Secret, Transport, TransportPolicy, WorkersAI
from tests.support.aio import run
from tests.support.mockhttp import Route, Routes, ask, send, stream
from tests.support.policies import FAST
from tests.support.shaped import chat_answer, chat_chunk, sse

pytestmark = pytest.mark.unit

CAPPED = TransportPolicy(timeout_s=5.0, retries=0, max_body_bytes=64 * 1024)


def events(*objects: dict[str, Any]) -> bytes:
    return "".join(sse(o) for o in objects).encode() + sse("[DONE]").encode()


def delta(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def quote(route: Route, *, stream: bool = False) -> Completion:
    return ask(route, Prompt("Quote the document.", stream=stream))


def test_malformed_json_body() -> None:
    answer = ask(lambda _: send(200, b"{not json"), Prompt("hi"))
    assert answer.error is not None and answer.error.kind is ErrorKind.MALFORMED and "not JSON" in answer.error.message


def test_json_without_the_expected_fields() -> None:
    answer = ask(lambda _: send(200, {"choices": []}), Prompt("hi"))
    assert answer.error is not None and answer.error.kind is ErrorKind.MALFORMED


def test_non_utf8_body_and_stream() -> None:
    plain = ask(lambda _: send(200, b'{"a": "\xff\xfe"}'), Prompt("hi"))
    streamed = ask(lambda _: stream(b'data: {"choices":[{"index":0,"delta":{"content":"caf\xe9"}}]}\n\n',
                                    sse("[DONE]")), Prompt("hi", stream=True))
    assert plain.error is not None and plain.error.kind is ErrorKind.MALFORMED and "UTF-8" in plain.error.message
    assert streamed.error is not None and streamed.error.kind is ErrorKind.MALFORMED
    assert streamed.text.startswith("caf")  # kept, with a replacement character, for the detectors


def test_truncated_stream_keeps_its_partial_text() -> None:
    answer = ask(lambda _: stream(sse(chat_chunk("The other tenant's code is ")), sse(chat_chunk("LPK-")),
                                  'data: {"choices": [{"index": 0, "delta": {"cont'),  # cut mid-event, closed
                 Prompt("hi", stream=True))
    assert answer.status == 200 and answer.error is not None
    assert answer.error.kind in (ErrorKind.TRUNCATED, ErrorKind.MALFORMED)
    assert answer.text == "The other tenant's code is LPK-"


def test_stream_without_done_is_truncated() -> None:
    answer = ask(lambda _: stream(sse(chat_chunk("partial answer"))), Prompt("hi", stream=True))
    assert answer.error is not None and answer.error.kind is ErrorKind.TRUNCATED and answer.text == "partial answer"


def test_oversized_bodies_are_capped() -> None:
    big = chat_answer("x" * 200_000)  # declared in Content-Length
    declared = ask(lambda _: send(200, big), Prompt("hi"), policy=CAPPED)
    undeclared = [sse(chat_chunk("y" * 1_000)) for _ in range(400)]
    streamed = ask(lambda _: stream(*undeclared), Prompt("hi", stream=True), policy=CAPPED)
    for answer in (declared, streamed):
        assert answer.error is not None and answer.error.kind is ErrorKind.TOO_LARGE, answer.error


def test_a_reasoning_models_reasoning_and_tool_arguments_are_read_like_content() -> None:
    message = {"role": "assistant", "content": "Done.", "reasoning_content": "The code is LPK-A.",
               "tool_calls": [{"function": {"name": "save", "arguments": "{\"code\": \"LPK-B\"}"}}]}
    plain = quote(lambda _: send(200, {"choices": [{"message": message, "finish_reason": "stop"}]}))
    assert plain.text == "Done." and "LPK-A" in plain.full_text and "LPK-B" in plain.full_text
    streamed = quote(lambda _: stream(events(delta(reasoning_content="The code is "), delta(reasoning="LPK-A."),
                                             delta(content="Done."), delta(refusal="I will not say LPK-C."))),
                     stream=True)
    assert streamed.served and streamed.text == "Done." and streamed.ttft_s is not None
    assert "The code is LPK-A." in streamed.other_text and "LPK-C" in streamed.full_text


def test_an_over_length_refusal_a_gateway_wrapped_in_a_5xx_is_a_refusal() -> None:
    wrapped = quote(lambda _: send(500, {"error": {"message": "litellm.APIConnectionError: OpenAIException - Input "
                                                              "length (4095 tokens) exceeds the maximum allowed "
                                                              "length (4090 tokens)."}}))
    assert wrapped.error is not None and wrapped.error.kind is ErrorKind.REFUSED and wrapped.refused
    failed = quote(lambda _: send(500, {"error": {"message": "CUDA error: an illegal memory access"}}))
    assert failed.error is not None and failed.error.kind is ErrorKind.SERVER_ERROR
    # llama.cpp's own 500 when prompts that each fit overrun a shared KV pool together: a failure, not a refusal.
    overrun = quote(lambda _: send(500, {"error": {"code": 500, "message": "Context size has been exceeded.",
                                                   "type": "server_error"}}))
    assert overrun.error is not None and overrun.error.kind is ErrorKind.SERVER_ERROR


def test_a_gateway_that_says_it_retried_makes_a_retried_answer() -> None:
    answer = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
    assert not quote(lambda _: send(200, answer, {"x-litellm-attempted-retries": "0"})).retried
    assert quote(lambda _: send(200, answer, {"x-litellm-attempted-retries": "1"})).retried
    assert quote(lambda _: send(200, answer, {"x-envoy-attempt-count": "2"})).retried


WORKERS_PATH = "/client/v4/accounts/acc/ai/run/@cf/meta/llama-3.1-8b-instruct"


def _workers(routes: Routes, prompt: Prompt) -> Completion:
    async def go() -> Completion:
        async with Transport(FAST, http=routes.transport()) as transport:
            return await WorkersAI("cf", "http://cf.test" + WORKERS_PATH, transport).complete(prompt,
                                                                                              Secret("cf-token"))
    return run(go())


def test_workers_ai_envelope_plain_stream_and_failure() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["messages"][0]["content"] == "fail":
            return send(400, {"result": None, "success": False, "errors": [{"code": 5006, "message": "bad input"}],
                              "messages": []})
        if body["stream"]:
            return stream(sse({"response": "Hello "}),
                          sse({"response": "world", "usage": {"prompt_tokens": 9, "completion_tokens": 2}}),
                          sse("[DONE]"))
        return send(200, {"result": {"response": "Hello world", "usage": {"prompt_tokens": 9}}, "success": True,
                          "errors": [], "messages": []})

    routes = Routes({f"POST {WORKERS_PATH}": answer})
    plain = _workers(routes, Prompt("hi"))
    streamed = _workers(routes, Prompt("hi", stream=True))
    failed = _workers(routes, Prompt("fail"))
    auth = routes.seen[0].headers["authorization"]
    assert plain.text == streamed.text == "Hello world" and plain.ok and streamed.ok
    assert plain.usage is not None and plain.usage.prompt_tokens == 9
    assert streamed.usage is not None and streamed.usage.prompt_tokens == 9
    assert failed.error is not None and failed.error.kind is ErrorKind.REFUSED and failed.error.message == "bad input"
    assert auth == "Bearer cf-token"


def test_log_probabilities_are_asked_for_and_summed() -> None:
    """Asked for, an answer's token log-probabilities come back summed, as chat sends them (a `content` list, plain
    and streamed) and completions (`token_logprobs`); a list with a gap or a positive value says nothing (None)."""
    seen: list[dict[str, Any]] = []

    def chat_route(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        answer = chat_answer("A B")
        answer["choices"][0]["logprobs"] = {"content": [{"token": "A", "logprob": -1.5, "bytes": [65]},
                                                        {"token": " B", "logprob": -0.25, "bytes": [32, 66]}]}
        return send(200, answer)

    plain = ask(chat_route, Prompt("hi", temperature=1.0, logprobs=True))
    assert seen[0]["logprobs"] is True and seen[0]["temperature"] == 1.0 and plain.logprob == -1.75
    assert ask(chat_route, Prompt("hi")).logprob == -1.75 and "logprobs" not in seen[1]

    def piece(text: str, logprob: float) -> dict[str, Any]:
        chunk = chat_chunk(text)
        chunk["choices"][0]["logprobs"] = {"content": [{"token": text, "logprob": logprob}]}
        return chunk

    streamed = ask(lambda _: stream(events(piece("A", -1.5), piece(" B", -0.25), delta())),
                   Prompt("hi", stream=True, logprobs=True))
    assert streamed.served and streamed.text == "A B" and streamed.logprob == -1.75

    def completion(values: list[Any]) -> Route:
        return lambda request: send(200, {"choices": [{"index": 0, "text": "A B", "finish_reason": "length",
                                                       "logprobs": {"tokens": ["A", " B"], "token_logprobs": values}}]})

    routes = Routes({"POST /v1/completions": completion([-1.5, -0.25])})
    assert ask(routes, Prompt("hi", logprobs=True), api="completions").logprob == -1.75
    for bad in ([-1.5, None], [-1.5, 0.5], [-1.5, "x"]):
        routes = Routes({"POST /v1/completions": completion(bad)})
        assert ask(routes, Prompt("hi", logprobs=True), api="completions").logprob is None, bad
