"""How an answer is read, as parsing in this process (httpx's MockTransport answers as engines and gateways do):
text beside the content (a reasoning model's reasoning, a refusal, tool-call arguments), an engine's over-length
refusal that a gateway wrapped in a 5xx, a gateway that says it retried.  (The same against real servers: the
reference engine's reasoning mode in tests/test_audit.py, the LiteLLM proxy in tests/test_shared_endpoint.py.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from prober.targets import Completion, ErrorKind, OpenAICompatible, Prompt, Transport, TransportPolicy
from tests.support.aio import run

Handler = Callable[[httpx.Request], httpx.Response]


def ask(handler: Handler, *, stream: bool = False) -> Completion:
    async def go() -> Completion:
        async with Transport(TransportPolicy(retries=0), http=httpx.MockTransport(handler)) as transport:
            return await OpenAICompatible("t", "http://gateway/v1", transport).complete(
                Prompt("Quote the document.", stream=stream), None)
    return run(go())


class _Body(httpx.AsyncByteStream):
    """A body that arrives as a server sends it (httpx reads a body given as bytes at once, and the transport reads
    raw chunks)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> Any:
        yield self.data


def respond(status: int, body: dict[str, Any] | bytes, **headers: str) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    kind = "text/event-stream" if isinstance(body, bytes) else "application/json"
    return httpx.Response(status, headers={"content-type": kind, **headers}, stream=_Body(data))


def sse(*events: dict[str, Any]) -> bytes:
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"


def delta(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def test_a_reasoning_models_reasoning_and_tool_arguments_are_read_like_content() -> None:
    message = {"role": "assistant", "content": "Done.", "reasoning_content": "The code is LPK-A.",
               "tool_calls": [{"function": {"name": "save", "arguments": "{\"code\": \"LPK-B\"}"}}]}
    plain = ask(lambda _: respond(200, {"choices": [{"message": message, "finish_reason": "stop"}]}))
    assert plain.text == "Done." and "LPK-A" in plain.full_text and "LPK-B" in plain.full_text
    streamed = ask(lambda _: respond(200, sse(delta(reasoning_content="The code is "), delta(reasoning="LPK-A."),
                                              delta(content="Done."), delta(refusal="I will not say LPK-C."))),
                   stream=True)
    assert streamed.served and streamed.text == "Done." and streamed.ttft_s is not None
    assert "The code is LPK-A." in streamed.other_text and "LPK-C" in streamed.full_text


def test_an_over_length_refusal_a_gateway_wrapped_in_a_5xx_is_a_refusal() -> None:
    wrapped = ask(lambda _: respond(500, {"error": {"message": "litellm.APIConnectionError: OpenAIException - Input "
                                                               "length (4095 tokens) exceeds the maximum allowed "
                                                               "length (4090 tokens)."}}))
    assert wrapped.error is not None and wrapped.error.kind is ErrorKind.REFUSED and wrapped.refused
    failed = ask(lambda _: respond(500, {"error": {"message": "CUDA error: an illegal memory access"}}))
    assert failed.error is not None and failed.error.kind is ErrorKind.SERVER_ERROR


def test_a_gateway_that_says_it_retried_makes_a_retried_answer() -> None:
    answer = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
    assert not ask(lambda _: respond(200, answer, **{"x-litellm-attempted-retries": "0"})).retried
    assert ask(lambda _: respond(200, answer, **{"x-litellm-attempted-retries": "1"})).retried
    assert ask(lambda _: respond(200, answer, **{"x-envoy-attempt-count": "2"})).retried
