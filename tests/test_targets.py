"""Adapters and transport against real loopback servers, where the behaviour is the socket's: the reference engine,
and fault-shaped servers that stall, hang up, let a keep-alive connection expire, redirect to another origin or
refuse the connection.  (How a body is read, and retry policy, are tests/test_answers.py's and
tests/test_retries.py's, in this process.)"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from prober.domain.errors import CredentialError
from prober.targets import (
    Completion,
    CredentialSource,
    ErrorKind,
    OpenAICompatible,
    Prompt,
    Secret,
    Transport,
    TransportPolicy,
)
from prober.targets.api import Api
from prober.targets.factory import make_target
from prober.targets.transport import KEEPALIVE_EXPIRY_S, HTTPExchange
from tests.support.aio import run
from tests.support.policies import FAST
from tests.support.shaped import Reply, Seen, ShapedServer, chat_answer, chat_chunk, sse
from tests.support.testbed import SMALL, StartTestbed

KEY_A = Secret("testbed-key-a")
CAPPED = TransportPolicy(timeout_s=5.0, retries=0, max_body_bytes=64 * 1024)


def ask(url: str, prompt: Prompt, secret: Secret | None = None, api: str = "chat",
        policy: TransportPolicy = FAST) -> Completion:
    async def go() -> Completion:
        async with Transport(policy) as transport:
            return await make_target(Api(api), "t", url, transport).complete(prompt, secret)
    return run(go())


@pytest.mark.parametrize("api", ["chat", "completions", "responses"])
def test_plain_and_streaming_agree_on_the_reference_engine(testbed: StartTestbed, api: str) -> None:
    server = testbed("healthy", **SMALL)
    prompt = "Quote the document.\nThe lighthouse keeper's code word is PELICAN-SEVEN."
    plain = ask(server.url + "/v1", Prompt(prompt, max_tokens=48), KEY_A, api)
    streamed = ask(server.url + "/v1", Prompt(prompt, max_tokens=48, stream=True), KEY_A, api)
    assert plain.ok and streamed.ok, (plain.error, streamed.error)
    assert plain.text == streamed.text and "PELICAN" in plain.text
    assert plain.usage is not None and streamed.usage is not None and plain.usage.prompt_tokens
    assert (plain.usage.prompt_tokens, plain.usage.completion_tokens) == (
        streamed.usage.prompt_tokens, streamed.usage.completion_tokens)
    assert streamed.streamed and streamed.ttft_s is not None and streamed.ttft_s <= streamed.total_s
    assert plain.finish_reason == streamed.finish_reason


def test_error_inside_a_200_stream_is_an_error(testbed: StartTestbed) -> None:
    server = testbed("fixed", **SMALL)  # disaggregated: the scheduler's abort arrives inside the stream
    over = "Quote.\n" + "word " * (server.engine.config.max_req_input_len + 50)
    answer = ask(server.url + "/v1", Prompt(over, stream=True), KEY_A, "completions")
    assert answer.status == 200 and answer.in_band_error and not answer.served
    assert answer.error is not None and "exceeds the maximum" in answer.error.message


def test_refusal_and_unauthorized_are_typed(testbed: StartTestbed) -> None:
    server = testbed("fixed", **SMALL)
    too_long = "x " * (SMALL["context_length"] + 10)
    refused = ask(server.url + "/v1", Prompt(too_long), KEY_A)
    assert refused.status == 400 and refused.error is not None and refused.error.kind is ErrorKind.REFUSED
    assert "context length" in refused.error.message
    denied = ask(server.url + "/v1", Prompt("hi"), Secret("wrong"))
    assert denied.error is not None and denied.error.kind is ErrorKind.UNAUTHORIZED


def _route(handler: Any) -> dict[str, Any]:
    return {"POST /v1/chat/completions": handler}


def test_a_stall_past_the_timeout() -> None:
    # The stream stalls until the server closes, after the client has given up, so the answer's return proves
    # the timeout fired however slow the machine; 2 s leaves the first chunk time to arrive beside a CPU hog.
    def stall(r: Reply, _: Seen) -> None:
        r.start_stream()
        r.write(sse(chat_chunk("first")))
        r.hold()

    with ShapedServer(_route(stall)) as srv:
        answer = ask(srv.url + "/v1", Prompt("hi", stream=True), policy=TransportPolicy(timeout_s=2, retries=0))
    assert answer.error is not None and answer.error.kind is ErrorKind.TIMEOUT
    assert answer.text == "first"


def _reasoning(text: str) -> str:
    """One event of a reasoning model's stream: its reasoning, before any content."""
    return sse({"object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"reasoning_content": text}, "finish_reason": None}]})


def _hang_up_mid_body(r: Reply, _: Seen) -> None:
    """A chunked body whose server goes away after the reasoning: its end never comes (an engine's worker died)."""
    r.handler.send_response(200)
    r.handler.send_header("Content-Type", "text/event-stream")
    r.handler.send_header("Transfer-Encoding", "chunked")
    r.handler.end_headers()
    for text in ("The code word is ", "PELICAN-SEVEN."):
        event = _reasoning(text).encode()
        r.write(b"%x\r\n%s\r\n" % (len(event), event))
    r.handler.close_connection = True


def _stall_after_reasoning(r: Reply, _: Seen) -> None:
    r.start_stream()
    for text in ("The code word is ", "PELICAN-SEVEN."):
        r.write(_reasoning(text))
    r.hold()


@pytest.mark.parametrize(("route", "kind"), [(_hang_up_mid_body, ErrorKind.TRUNCATED),
                                             (_stall_after_reasoning, ErrorKind.TIMEOUT)])
def test_a_stream_cut_after_the_reasoning_keeps_it(route: Any, kind: ErrorKind) -> None:
    """Cut before any content, by a hang-up or a stall: the reasoning that came is kept for the scanner (another
    tenant's canary there has left the engine), and the answer is marked cut, not served."""
    with ShapedServer(_route(route)) as srv:
        answer = ask(srv.url + "/v1", Prompt("hi", stream=True), policy=TransportPolicy(timeout_s=2, retries=0))
    assert answer.status == 200 and not answer.served and answer.error is not None and answer.error.kind is kind
    assert answer.text == "" and answer.other_text == "The code word is PELICAN-SEVEN."
    assert "PELICAN-SEVEN" in answer.full_text and answer.ttft_s is not None


def test_a_hang_up_before_any_response_is_retried_then_typed() -> None:
    """llama.cpp once closed a connection without a byte mid-audit (CI): that request is sent again."""
    calls: list[int] = []

    def flaky(r: Reply, _: Seen) -> None:
        calls.append(1)
        if len(calls) == 1:
            r.handler.close_connection = True  # no status line, no byte: the connection just ends
        else:
            r.send(200, chat_answer("fine"))

    with ShapedServer(_route(flaky)) as srv:
        answer = ask(srv.url + "/v1", Prompt("hi"))
    assert answer.ok and answer.text == "fine" and answer.attempts == 2

    def hang_up(r: Reply, _: Seen) -> None:
        r.handler.close_connection = True

    with ShapedServer(_route(hang_up)) as srv:
        answer = ask(srv.url + "/v1", Prompt("hi"))
        hits = len(srv.seen)
    assert answer.error is not None and answer.error.kind is ErrorKind.TRUNCATED and answer.status is None
    assert hits == FAST.retries + 1 == answer.attempts


def test_an_idle_connection_is_dropped_before_the_server_drops_it() -> None:
    """Servers close a keep-alive connection after 5 s idle (uvicorn, llama.cpp); a request sent on it as it closes
    meets a hang-up (seen in CI, on the reference engine).  Busy connections are reused; idle ones not for long."""
    with ShapedServer(_route(lambda r, _: r.send(200, chat_answer("fine")))) as srv:
        async def three() -> list[Completion]:
            async with Transport(CAPPED) as transport:
                target = OpenAICompatible("t", srv.url + "/v1", transport)
                answers = [await target.complete(Prompt("hi"), None), await target.complete(Prompt("hi"), None)]
                await asyncio.sleep(KEEPALIVE_EXPIRY_S + 0.5)
                return [*answers, await target.complete(Prompt("hi"), None)]

        answers = run(three())
        ports = [seen.port for seen in srv.seen]
    assert all(a.ok for a in answers)
    assert ports[0] == ports[1] != ports[2]


def test_redirect_to_another_host_carries_no_credential() -> None:
    with ShapedServer(_route(lambda r, _: r.send(200, chat_answer("stolen")))) as elsewhere:
        def bounce(r: Reply, _: Seen) -> None:
            r.send(307, b"", headers={"Location": elsewhere.url + "/v1/chat/completions"})

        with ShapedServer(_route(bounce)) as srv:
            answer = ask(srv.url + "/v1", Prompt("hi"), KEY_A)
        assert not elsewhere.seen
    assert answer.error is not None and answer.error.kind is ErrorKind.REDIRECT
    assert "another origin" in answer.error.message


def test_connection_refused_is_typed() -> None:
    with ShapedServer({}) as srv:
        url = srv.url
    answer = ask(url + "/v1", Prompt("hi"), policy=TransportPolicy(retries=1, backoff_s=0.01, connect_timeout_s=1))
    assert answer.error is not None and answer.error.kind is ErrorKind.CONNECT and answer.attempts == 2


@pytest.mark.unit
def test_credentials_come_from_env_or_file_and_never_print(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LP_TEST_KEY", "sk-live-123\n")
    secret = CredentialSource(env="LP_TEST_KEY").load()
    assert secret is not None and secret.reveal() == "sk-live-123"
    assert "sk-live" not in f"{secret} {secret!r} {[secret]} {secret:>20}"
    (tmp_path / "key").write_text("file-key-9")
    from_file = CredentialSource(file=tmp_path / "key").load()
    assert from_file is not None and from_file.reveal() == "file-key-9"
    for source, message in ((CredentialSource(env="LP_TEST_MISSING"), "not set"),
                            (CredentialSource(file=tmp_path / "nope"), "cannot read"),
                            (CredentialSource(file=tmp_path / "key2"), "cannot read")):
        with pytest.raises(CredentialError, match=message):
            source.load()
    monkeypatch.setenv("LP_EMPTY", "  ")
    with pytest.raises(CredentialError, match="empty"):
        CredentialSource(env="LP_EMPTY").load()


def test_every_request_carries_a_trace_context_of_its_own_unless_the_caller_gave_one() -> None:
    """A fresh W3C `traceparent` per request (vLLM and SGLang continue it in the traces they export), the same on
    the wire as on the answer; a caller's own (the request-ID check's) is sent as it is."""
    with ShapedServer(_route(lambda r, _: r.send(200, chat_answer("fine")))) as srv:
        async def asks() -> tuple[list[Completion], HTTPExchange]:
            async with Transport(FAST) as transport:
                target = OpenAICompatible("t", srv.url + "/v1", transport)
                answers = [await target.complete(Prompt("hi"), None) for _ in range(2)]
                mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                given = await transport.exchange("POST", srv.url + "/v1/chat/completions", json={},
                                                 headers={"TraceParent": mine})
                return answers, given

        answers, given = run(asks())
        sent = [seen.headers["traceparent"] for seen in srv.seen]
    assert sent[:2] == [a.traceparent for a in answers] and sent[0] != sent[1]
    assert all(re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", t) for t in sent[:2])
    assert sent[2] == given.traceparent == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
