"""A target's rate limit, read from its answers: the next request waits for the reset its headers give (OpenAI's
`x-ratelimit-*`, the IETF draft's `ratelimit-*`) instead of meeting a 429, within the run's deadline, and the wait is
counted; a reset longer than the transport waits for a Retry-After is left to the 429 it brings."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client import CollectorRegistry

from prober.config.schema import parse_config
from prober.daemon.metrics import Metrics
from prober.targets import OpenAICompatible, Prompt, Transport
from prober.targets.bounds import run_deadline
from prober.targets.pacing import hold_of, reset_s
from prober.targets.transport import HTTPExchange
from tests.support.aio import run
from tests.support.mockhttp import send
from tests.support.policies import FAST
from tests.support.shaped import Reply, Seen, ShapedServer, chat_answer

SPENT = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s",
         "x-ratelimit-remaining-tokens": "39000", "x-ratelimit-reset-tokens": "6m0s"}


@pytest.mark.unit
@pytest.mark.parametrize(("value", "seconds"), [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5),
                                                ("2.5", 2.5), ("soon", None), ("", None), ("-1", None)])
def test_a_reset_is_read_as_a_duration_or_seconds(value: str, seconds: float | None) -> None:
    assert reset_s(value) == seconds


@pytest.mark.unit
def test_only_a_spent_allowance_holds_the_next_request() -> None:
    assert hold_of(SPENT) == (1.0, "x-ratelimit-remaining-requests: 0")
    assert hold_of({**SPENT, "x-ratelimit-remaining-requests": "3"}) is None  # something left
    assert hold_of({"ratelimit-remaining": "0", "ratelimit-reset": "7"}) == (7.0, "ratelimit-remaining: 0")
    assert hold_of({"x-ratelimit-remaining-tokens": "0"}) == (1.0, "x-ratelimit-remaining-tokens: 0")  # no reset
    assert hold_of({"x-ratelimit-remaining-requests": "none"}) is None
    assert hold_of({}) is None


def answering(headers: dict[str, str], sent: list[float]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(time.monotonic())
        return send(200, chat_answer("fine"), headers=headers)
    return httpx.MockTransport(handler)


@pytest.mark.unit
def test_the_request_after_a_spent_allowance_waits_for_its_reset() -> None:
    sent: list[float] = []

    async def two() -> tuple[HTTPExchange, HTTPExchange]:
        async with Transport(FAST, http=answering({**SPENT, "x-ratelimit-reset-requests": "300ms"}, sent)) as t:
            return await t.exchange("GET", "http://t/v1/models"), await t.exchange("GET", "http://t/v1/models")

    first, second = run(two())
    assert first.paused_s == 0 and first.error is None and second.error is None
    assert sent[1] - sent[0] >= 0.29 and 0.25 <= second.paused_s <= sent[1] - sent[0]


@pytest.mark.unit
def test_the_wait_never_outlasts_the_run_and_a_long_reset_is_left_to_the_429() -> None:
    sent: list[float] = []

    async def within_a_deadline() -> HTTPExchange:
        async with Transport(FAST, http=answering({**SPENT, "x-ratelimit-reset-requests": "60s"}, sent)) as t:
            with run_deadline(0.3, "the test's deadline"):
                await t.exchange("GET", "http://t/v1/models")
                return await t.exchange("GET", "http://t/v1/models")

    started = time.monotonic()
    late = run(within_a_deadline())
    assert time.monotonic() - started < 5 and late.attempts == 0 and late.error is not None
    assert "the test's deadline passed" in late.error.message and len(sent) == 1

    async def beyond_the_policy() -> float:
        async with Transport(FAST, http=answering({**SPENT, "x-ratelimit-reset-requests": "1h"}, sent)) as t:
            await t.exchange("GET", "http://t/v1/models")
            return (await t.exchange("GET", "http://t/v1/models")).paused_s

    assert run(beyond_the_policy()) == 0  # FAST waits 120 s at most for a Retry-After


@pytest.mark.unit
def test_each_target_sets_the_longest_pause_it_takes() -> None:
    """`pause_max_s` in a target's config: a hosted API whose resets run to minutes may be waited for, or a shared
    one's not at all beyond a moment."""
    target = parse_config({"targets": [{"name": "t", "url": "http://t/v1", "pause_max_s": 0.2}]}).targets[0]
    assert target.policy().retry_after_max_s == 0.2
    sent: list[float] = []

    async def two() -> float:
        async with Transport(target.policy(), http=answering({**SPENT, "x-ratelimit-reset-requests": "300ms"},
                                                             sent)) as t:
            await t.exchange("GET", "http://t/v1/models")
            return (await t.exchange("GET", "http://t/v1/models")).paused_s

    assert run(two()) == 0 and len(sent) == 2  # a 300 ms reset is beyond its 200 ms: left to the 429 it brings


@pytest.mark.unit
def test_the_daemon_counts_the_seconds_waited_per_target() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.exchanged("t", HTTPExchange(200, paused_s=1.5), True)
    metrics.exchanged("t", HTTPExchange(200, paused_s=0.5), True)
    assert registry.get_sample_value("leakprobe_rate_limit_pause_seconds_total", {"target": "t"}) == 2.0


def test_a_server_that_says_its_allowance_is_spent_sees_the_next_request_after_the_reset() -> None:
    """On the wire: the second chat request arrives a reset's length after the first answer, and is answered."""
    def route(r: Reply, _: Seen) -> None:
        r.send(200, chat_answer("fine"), headers={"x-ratelimit-remaining-requests": "0",
                                                  "x-ratelimit-reset-requests": "800ms"})

    with ShapedServer({"POST /v1/chat/completions": route}) as srv:
        async def two() -> list[bool]:
            async with Transport(FAST) as transport:
                target = OpenAICompatible("t", srv.url + "/v1", transport)
                return [(await target.complete(Prompt("hi"), None)).ok for _ in range(2)]

        answered = run(two())
        arrived = [seen.arrived for seen in srv.seen]
    assert answered == [True, True] and arrived[1] - arrived[0] >= 0.75
