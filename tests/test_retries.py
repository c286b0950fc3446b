"""When the transport asks again, and where it follows, as policy in this process (httpx's MockTransport answers):
Retry-After honoured, retries bounded, a Retry-After past the limit ends the request, a same-origin redirect
is followed with its credential.  (What needs a real socket — a hang-up before any byte, a redirect to another
origin's server, a refused connection, a stall — is tests/test_targets.py's.)"""

from __future__ import annotations

import time

import httpx
import pytest

from prober.targets import ErrorKind, Prompt, Secret, TransportPolicy
from tests.support.mockhttp import Routes, ask, chat, send
from tests.support.policies import FAST
from tests.support.shaped import chat_answer

pytestmark = pytest.mark.unit


def test_429_storm_honours_retry_after_then_succeeds() -> None:
    calls: list[float] = []

    def limited(_: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        if len(calls) < 3:
            return send(429, {"error": {"message": "slow down"}}, {"Retry-After": "1"})
        return send(200, chat_answer("fine"))

    answer = ask(limited, Prompt("hi"), policy=TransportPolicy(retries=3, backoff_s=0.01))
    assert answer.ok and answer.text == "fine" and answer.attempts == 3
    assert calls[1] - calls[0] >= 0.95 and calls[2] - calls[1] >= 0.95


def test_429_forever_gives_up_after_bounded_retries() -> None:
    routes = chat(lambda _: send(429, {"error": {"message": "quota"}}, {"Retry-After": "0"}))
    answer = ask(routes, Prompt("hi"), policy=FAST)
    assert answer.error is not None and answer.error.kind is ErrorKind.RATE_LIMITED and answer.error.message == "quota"
    assert len(routes.seen) == FAST.retries + 1 == answer.attempts


def test_retry_after_beyond_the_limit_ends_the_request() -> None:
    routes = chat(lambda _: send(503, b"busy", {"Retry-After": "3600"}))
    answer = ask(routes, Prompt("hi"), policy=FAST)
    assert answer.error is not None and answer.error.kind is ErrorKind.SERVER_ERROR and len(routes.seen) == 1
    assert "3600" in answer.error.message


def test_same_origin_redirect_is_followed() -> None:
    routes = Routes({
        "POST /v1/chat/completions": lambda _: send(308, b"", {"Location": "/v2/chat/completions"}),
        "POST /v2/chat/completions": lambda r: send(200, chat_answer(r.headers.get("authorization", "")[:6]))})
    answer = ask(routes, Prompt("hi"), Secret("testbed-key-a"), policy=FAST)
    assert answer.ok and answer.text == "Bearer"
