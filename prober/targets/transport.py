"""HTTP policy shared by every adapter: an idle timeout, deadlines (each request's own, derived from its size, and
the run's: prober/targets/bounds.py), bounded retries that honour Retry-After, caps on body size, TLS
verification, redirects that never carry a credential to another origin, and every secret the config knows
scrubbed from what comes back before anyone reads it.

Adapters get bytes and timings back, or a `TargetError`; nothing here raises on a bad response.
"""

from __future__ import annotations

import asyncio
import json as json_module
import random
import secrets
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from prober.targets.bounds import NO_GENERATION, Size, current_deadline
from prober.targets.credentials import Secret
from prober.targets.decoding import ACCEPTED, BoundedDecoder, DecodingError
from prober.targets.outbox import Outbox
from prober.targets.pacing import Pacer, retry_after_s
from prober.targets.result import Cut, ErrorKind, TargetError
from prober.targets.spans import Spans
from prober.text.scrub import Scrubber

RETRY_STATUSES = frozenset({429, 502, 503, 504})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
ERROR_BODY_CAP = 4_096
# An idle connection is dropped before the server drops it.  uvicorn (vLLM, SGLang) and llama.cpp's server close
# one after 5 s idle, httpx's own default: a request sent on it at that moment meets a hang-up, no response.
KEEPALIVE_EXPIRY_S = 2.0


@dataclass(frozen=True)
class TransportPolicy:
    timeout_s: float = 600.0  # idle: a 1M-token prefill takes minutes on real hardware
    deadline_s: float = 1_200.0  # the most any request takes, connect to last byte, retries included
    connect_timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 120.0  # a longer Retry-After ends the request instead of stalling the audit
    max_body_bytes: int = 64 * 1024 * 1024
    max_redirects: int = 3
    verify_tls: bool = True
    end_user_header: str | None = None  # carries a key's end user beside it, where the gateway reads one there
    end_user_field: bool = True  # and the API's body field for it (OpenAI's `user`) on generation requests

    def client(self, http: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
        """The httpx client this policy implies (redirects are followed by hand: same origin only)."""
        return httpx.AsyncClient(
            transport=http,
            timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s),
            follow_redirects=False,
            verify=self.verify_tls,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16, keepalive_expiry=KEEPALIVE_EXPIRY_S),
            headers={"User-Agent": "leakprobe", "Accept-Encoding": ACCEPTED},
        )

    def delay(self, attempt: int, retry_after: str | None) -> float | None:
        """Before the next attempt: what Retry-After asks (None: longer than we wait), else jittered backoff."""
        if retry_after:
            wait = retry_after_s(retry_after)
            if wait is not None:
                return None if wait > self.retry_after_max_s else wait
        backoff: float = min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))
        return backoff * random.uniform(0.8, 1.2)


@dataclass
class HTTPExchange:
    """A finished HTTP exchange: the body is complete (or the error says why not)."""

    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | bytearray = b""
    first_byte_s: float | None = None
    total_s: float = 0.0
    attempts: int = 1  # 0: not sent, the run's deadline had passed
    paused_s: float = 0.0  # waited before it was sent: the target's rate-limit headers said its allowance was spent
    traceparent: str | None = None  # the W3C trace context it was sent with: the engine's traces name it by this
    error: TargetError | None = None
    streamed: bool = False  # a 200 body of server-sent events, given to the caller's reader as it came

    def json(self) -> tuple[Any, str | None]:
        """The body as JSON, or None and why not (not UTF-8, not JSON).  Once decoded, a body longer than an
        error snippet is released (its start stays for reports), so a huge answer is held as text once."""
        try:
            text = self.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, f"body is not valid UTF-8 (byte {exc.start})"
        if len(self.body) > ERROR_BODY_CAP:
            self.body = bytes(self.body[:ERROR_BODY_CAP])
        try:
            return json_module.loads(text), None
        except ValueError as exc:
            return None, f"body is not JSON ({exc})"
        except RecursionError:
            return None, "body is not JSON a client can read (nested too deeply)"

    def snippet(self) -> str:
        """The start of the body, for an error report."""
        return self.body[:ERROR_BODY_CAP].decode("utf-8", "replace")


# Called with each decoded piece of a 200 body and the seconds since the request began; an error it returns
# ends the request (a stream that says nothing but keep-alives, or far more than was asked for).
OnChunk = Callable[[bytes, float], TargetError | None]


@dataclass
class _Call:
    """One exchange as it goes: what is sent and where (a redirect moves it on), and the attempt under way,
    which is what a deadline that cuts the exchange off reports."""

    method: str
    url: str
    json: Any
    secret: Secret | None
    headers: dict[str, str]
    on_chunk: OnChunk | None
    size: Size
    started: float  # time.monotonic() when the exchange began: every timing is from here
    paused_s: float = 0.0  # waited for the target's rate limit before it began
    latest: HTTPExchange = field(default_factory=lambda: HTTPExchange(None))


class Transport:
    """One async httpx client and the policy around it.  Use as an async context manager."""

    def __init__(self, policy: TransportPolicy | None = None, scrubber: Scrubber | None = None, *,
                 http: httpx.AsyncBaseTransport | None = None, spans: Spans | None = None) -> None:
        """`http` replaces the network: an in-process ASGI app (`httpx.ASGITransport`) in tests, a proxy.  `spans`:
        where each request sent is recorded as a span (leakprobe's own traces)."""
        self.policy = policy or TransportPolicy()
        self.spans = spans
        self.scrubber = scrubber or Scrubber()
        self.outbox = Outbox()  # what went out through this transport (the adapters record their prompts)
        self.client = self.policy.client(http)
        self.pacer = Pacer(self.policy.retry_after_max_s)

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.client.aclose()

    async def exchange(self, method: str, url: str, *, json: Any = None, secret: Secret | None = None,
                       headers: dict[str, str] | None = None, on_chunk: OnChunk | None = None,
                       size: Size = NO_GENERATION) -> HTTPExchange:
        """Send with retries and same-origin redirects; read the body under its bounds; give up at the request's
        deadline or the run's, whichever comes first.  A 200 body of server-sent events goes to `on_chunk` as it
        comes; any other body is kept (also what arrived of one cut short: it may carry a leak).  A pause the target's
        rate limit asked for comes first, outside the request's deadline but within the run's."""
        began = time.time_ns()
        result = await self._exchange(method, url, json, secret, headers, on_chunk, size)
        if self.spans is not None and result.attempts:
            self.spans.record(method, self.scrubber.text(url), result, began, time.time_ns())
        return result

    async def _exchange(self, method: str, url: str, json: Any, secret: Secret | None, headers: dict[str, str] | None,
                        on_chunk: OnChunk | None, size: Size) -> HTTPExchange:
        paused = await self.pacer.wait()
        headers = traced(headers or {})
        call = _Call(method, url, json, secret, headers, on_chunk, size, time.monotonic(), paused)
        p = self.policy
        limit = min(p.deadline_s, size.total_s(p.timeout_s, p.connect_timeout_s))
        why, cut = (f"deadline of {limit:.1f} s passed (connect to last byte, retries included, for "
                    f"{size.describe()})"), Cut.DEADLINE
        run = current_deadline()
        if run is not None and run.ends_at - call.started < limit:
            if run.ends_at <= call.started:
                return HTTPExchange(None, attempts=0, paused_s=paused, error=TargetError(ErrorKind.TIMEOUT,
                                                                        f"{run.name} passed before it was sent"))
            limit, why, cut = run.ends_at - call.started, f"{run.name} passed", Cut.RUN_DEADLINE
        try:
            async with asyncio.timeout(limit):
                return await self._with_retries(call)
        except TimeoutError:
            call.latest.attempts = max(1, call.latest.attempts)
            return _cut(call.latest, TargetError(ErrorKind.TIMEOUT, why, cut=cut), call.started, self.scrubber)

    async def _with_retries(self, call: _Call) -> HTTPExchange:
        """Attempts until one is final: answered, refused for good, or out of retries; each after the pause the
        target's rate-limit headers asked for (prober/targets/pacing.py)."""
        attempt, paused = 0, call.paused_s
        while True:
            attempt += 1
            if attempt > 1:
                paused += await self.pacer.wait()
            result = await _following_redirects(call, attempt, self._once, self.policy.max_redirects)
            result.paused_s = paused
            self.pacer.heard(result.headers)
            status = result.status
            # A peer that hung up before any response (a keep-alive connection it had just closed, a worker
            # restart) saw at most a request it never answered: sent again like a refused connection.
            kind = result.error.kind if result.error is not None else None
            retryable = status in RETRY_STATUSES or kind is ErrorKind.CONNECT or (
                kind is ErrorKind.TRUNCATED and status is None)
            if not retryable or attempt > self.policy.retries:
                return result
            delay = self.policy.delay(attempt, result.headers.get("retry-after"))
            if delay is None:
                return _failed(result, ErrorKind.RATE_LIMITED if status == 429 else ErrorKind.SERVER_ERROR,
                               f"Retry-After {result.headers.get('retry-after')} is beyond "
                               f"{self.policy.retry_after_max_s:.0f} s")
            await asyncio.sleep(delay)

    async def _once(self, call: _Call) -> HTTPExchange:
        result, started = call.latest, call.started
        result.traceparent = call.headers["traceparent"]
        send_headers = dict(call.headers)
        if call.secret is not None:
            send_headers["Authorization"] = f"Bearer {call.secret.reveal()}"
            if self.policy.end_user_header and call.secret.end_user is not None:
                send_headers[self.policy.end_user_header] = call.secret.end_user
        answer_s = call.size.answer_s(self.policy.timeout_s)
        clock = asyncio.timeout(None)  # the answer's own: from its first byte, however the bytes trickle
        try:
            async with clock, self.client.stream(call.method, call.url, json=call.json,
                                                 headers=send_headers) as response:
                return await _read(call, response, lambda: clock.reschedule(
                    asyncio.get_running_loop().time() + answer_s), self.policy, self.scrubber)
        except TimeoutError:
            if not clock.expired():
                raise
            return _cut(result, TargetError(
                ErrorKind.TIMEOUT, f"answer still arriving {answer_s:.1f} s after its first byte: once it answers, "
                f"{call.size.describe()} may take {call.size.answer_rule(self.policy.timeout_s)}", cut=Cut.DEADLINE),
                started, self.scrubber)
        except DecodingError as exc:
            kind, message = ErrorKind.MALFORMED, f"undecodable content encoding: {exc}"
        except httpx.TimeoutException as exc:
            kind, message = ErrorKind.TIMEOUT, f"{type(exc).__name__} after {time.monotonic() - started:.1f} s"
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            # A peer that closes mid-body is a truncation, not a refusal to connect.
            kind = _connect_kind(exc) if isinstance(exc, httpx.ConnectError) else ErrorKind.TRUNCATED
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except httpx.HTTPError as exc:
            kind, message = ErrorKind.CONNECT, f"{type(exc).__name__}: {exc}"
        # Keep the status and what arrived: a stream that stalls after a leak still carries the leak.
        result.body = self.scrubber.bytes(result.body)
        result.total_s = time.monotonic() - started
        result.error = TargetError(kind, self.scrubber.text(message), result.status)
        return result


async def _read(call: _Call, response: httpx.Response, begun: Callable[[], None], policy: TransportPolicy,
                scrub: Scrubber) -> HTTPExchange:
    """The response's body under the caps (`begun` starts the answer's clock at its first byte)."""
    result, started = call.latest, call.started
    result.status = response.status_code
    result.headers = {scrub.text(k.lower()): scrub.text(v) for k, v in response.headers.items()}
    cap, over = policy.max_body_bytes, f"over the {policy.max_body_bytes:,}-byte cap"
    needed = call.size.answer_bytes() if response.status_code == 200 else None  # an error may echo anything
    if needed is not None and needed < cap:
        cap, over = needed, f"over the {needed:,} bytes {call.size.describe()} needs"
    declared = response.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > cap:
        return _cut(result, TargetError(ErrorKind.TOO_LARGE, f"declared body of {int(declared):,} bytes is {over}",
                                        cut=Cut.OVERLONG), started, scrub)
    try:
        decoder = BoundedDecoder(response.headers.get("content-encoding"))
    except DecodingError as exc:
        return _failed(result, ErrorKind.MALFORMED, scrub.text(str(exc)), started)
    feed = call.on_chunk if response.status_code == 200 and _sse(response.headers.get("content-type"),
                                                                call.size.stream) else None
    result.streamed = feed is not None
    body = _Body(result, cap, over, started, feed)
    received = 0  # raw bytes: a body that decodes to nothing still ends at the cap
    async for raw in response.aiter_raw():
        if not received and raw:
            begun()
        received += len(raw)
        if received > cap:
            return _cut(result, TargetError(ErrorKind.TOO_LARGE, f"body {over}", cut=Cut.OVERLONG), started, scrub)
        for chunk in decoder.feed(raw):
            if stop := body.take(chunk):
                return _cut(result, stop, started, scrub)
    for chunk in decoder.flush():
        if stop := body.take(chunk):
            return _cut(result, stop, started, scrub)
    result.body = scrub.bytes(result.body)
    result.total_s = time.monotonic() - started
    return result


async def _following_redirects(call: _Call, attempt: int, once: Callable[[_Call], Awaitable[HTTPExchange]],
                               most: int) -> HTTPExchange:
    """One attempt: the request, sent on where same-origin redirects say (the call keeps the last place)."""
    redirects = 0
    while True:
        call.latest = HTTPExchange(None, attempts=attempt)
        result = await once(call)
        result.attempts = attempt
        if result.status not in REDIRECT_STATUSES or result.error is not None:
            return result
        location = result.headers.get("location")
        if not location:
            return _failed(result, ErrorKind.MALFORMED, "redirect without a Location header")
        target = httpx.URL(call.url).join(location)
        if _origin(target) != _origin(httpx.URL(call.url)):
            return _failed(result, ErrorKind.REDIRECT,
                           f"redirected to another origin ({_origin(target)}); credentials not sent")
        redirects += 1
        if redirects > most:
            return _failed(result, ErrorKind.REDIRECT, f"more than {most} redirects")
        call.url = str(target)


def _cut(result: HTTPExchange, error: TargetError, started: float, scrub: Scrubber) -> HTTPExchange:
    """Ended before its body did: what arrived is kept, scrubbed, and the error says why."""
    result.body = scrub.bytes(result.body)
    result.total_s = time.monotonic() - started
    result.error = TargetError(error.kind, scrub.text(error.message), result.status, result.snippet(), error.cut)
    return result


class _Body:
    """A body as its decoded pieces arrive: grown as bytes come, never sized from a declared length (a length is
    a claim, not a body), counted decoded against the cap.  A 200 stream goes to its reader as it comes, and
    only its start is kept, for an error report: a huge stream is never held twice."""

    def __init__(self, result: HTTPExchange, cap: int, over: str, started: float, on_chunk: OnChunk | None) -> None:
        self.result, self.cap, self.over, self.started, self.on_chunk = result, cap, over, started, on_chunk
        self.data = result.body = bytearray()
        self.decoded = 0

    def take(self, chunk: bytes) -> TargetError | None:
        """An error when this piece takes the body over the cap, or when the stream's reader ends it."""
        self.decoded += len(chunk)
        if self.decoded > self.cap:
            return TargetError(ErrorKind.TOO_LARGE, f"body {self.over} (counted decoded)", cut=Cut.OVERLONG)
        now = time.monotonic() - self.started
        if self.result.first_byte_s is None and chunk:
            self.result.first_byte_s = now
        if self.on_chunk is None:
            self.data += chunk
            return None
        if len(self.data) < ERROR_BODY_CAP:
            self.data += chunk[: ERROR_BODY_CAP - len(self.data)]
        return self.on_chunk(chunk, now)


def _sse(content_type: str | None, asked: bool) -> bool:
    """Whether a 200 body is server-sent events: as its Content-Type says (JSON answering a stream request is read
    as JSON, a stream answering a plain request as a stream), else as the request asked."""
    kind = (content_type or "").partition(";")[0].strip().lower()
    if kind == "text/event-stream":
        return True
    if kind == "application/json" or kind.endswith("+json"):
        return False
    return asked


def _connect_kind(exc: BaseException) -> ErrorKind:
    """A connection that failed: DNS and TLS apart from the rest (they need other fixes), by its cause."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, socket.gaierror):
            return ErrorKind.DNS
        if isinstance(cause, ssl.SSLError):
            return ErrorKind.TLS
        cause = cause.__cause__ or cause.__context__
    return ErrorKind.CONNECT


def _failed(result: HTTPExchange, kind: ErrorKind, message: str, started: float | None = None) -> HTTPExchange:
    if started is not None:
        result.total_s = time.monotonic() - started
    result.error = TargetError(kind, message, result.status, result.snippet())
    return result


def _origin(url: httpx.URL) -> str:
    port = url.port or {"http": 80, "https": 443}.get(url.scheme, 0)
    return f"{url.scheme}://{url.host}:{port}"


def traced(headers: dict[str, str]) -> dict[str, str]:
    """With a W3C `traceparent` of its own (a fresh trace, sampled), unless the caller set one: vLLM and SGLang
    continue it in the traces they export, so a finding names the engine's request in its operator's trace view."""
    given = next((value for name, value in headers.items() if name.lower() == "traceparent"), None)
    rest = {name: value for name, value in headers.items() if name.lower() != "traceparent"}
    return {**rest, "traceparent": given or f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"}
