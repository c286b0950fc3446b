"""HTTP policy shared by every adapter: an idle timeout and a total deadline, bounded retries that honour
Retry-After, a cap on body size, TLS verification, redirects that never carry a credential to another
origin, and every secret the config knows scrubbed from what comes back before anyone reads it.

Adapters get bytes and timings back, or a `TargetError`; nothing here raises on a bad response.
"""

from __future__ import annotations

import asyncio
import email.utils
import json as json_module
import random
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from prober.scrub import Scrubber
from prober.targets.credentials import Secret
from prober.targets.decoding import ACCEPTED, BoundedDecoder, DecodingError
from prober.targets.outbox import Outbox
from prober.targets.result import ErrorKind, TargetError

RETRY_STATUSES = frozenset({429, 502, 503, 504})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
ERROR_BODY_CAP = 4_096
# An idle connection is dropped before the server drops it.  uvicorn (vLLM, SGLang) and llama.cpp's server close
# one after 5 s idle, httpx's own default: a request sent on it at that moment meets a hang-up, no response.
KEEPALIVE_EXPIRY_S = 2.0


@dataclass(frozen=True)
class TransportPolicy:
    timeout_s: float = 600.0  # idle: a 1M-token prefill takes minutes on real hardware
    deadline_s: float = 1_200.0  # total, connect to last byte, retries included: a stream that trickles ends
    connect_timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 120.0  # a longer Retry-After ends the request instead of stalling the audit
    max_body_bytes: int = 64 * 1024 * 1024
    max_redirects: int = 3
    verify_tls: bool = True


@dataclass
class HTTPExchange:
    """A finished HTTP exchange: the body is complete (or the error says why not)."""

    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | bytearray = b""
    first_byte_s: float | None = None
    total_s: float = 0.0
    attempts: int = 1
    error: TargetError | None = None

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
    started: float  # time.monotonic() when the exchange began: every timing is from here
    latest: HTTPExchange = field(default_factory=lambda: HTTPExchange(None))


class Transport:
    """One async httpx client and the policy around it.  Use as an async context manager."""

    def __init__(self, policy: TransportPolicy | None = None, scrubber: Scrubber | None = None, *,
                 http: httpx.AsyncBaseTransport | None = None) -> None:
        """`http` replaces the network: an in-process ASGI app (`httpx.ASGITransport`) in tests, a proxy."""
        self.policy = policy or TransportPolicy()
        self.scrubber = scrubber or Scrubber()
        # When every exchange must have ended (time.monotonic()): an audit's deadline for its target.
        self.ends_at: float | None = None
        self.outbox = Outbox()  # what went out through this transport (the adapters record their prompts)
        p = self.policy
        self.client = httpx.AsyncClient(
            transport=http,
            timeout=httpx.Timeout(p.timeout_s, connect=p.connect_timeout_s),
            follow_redirects=False,
            verify=p.verify_tls,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16, keepalive_expiry=KEEPALIVE_EXPIRY_S),
            headers={"User-Agent": "leakprobe", "Accept-Encoding": ACCEPTED},
        )

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.client.aclose()

    async def exchange(self, method: str, url: str, *, json: Any = None, secret: Secret | None = None,
                       headers: dict[str, str] | None = None, on_chunk: OnChunk | None = None) -> HTTPExchange:
        """Send with retries and same-origin redirects; read the whole body under the size cap; give up at the
        deadline (what a stream delivered until then has reached `on_chunk`)."""
        call = _Call(method, url, json, secret, headers or {}, on_chunk, time.monotonic())
        limit, why = self.policy.deadline_s, f"deadline of {self.policy.deadline_s:g} s passed (connect to last byte)"
        if self.ends_at is not None and self.ends_at - call.started < limit:
            limit, why = max(0.0, self.ends_at - call.started), "the audit's deadline for this target passed"
        try:
            async with asyncio.timeout(limit):
                return await self._with_retries(call)
        except TimeoutError:
            call.latest.attempts = max(1, call.latest.attempts)
            return _failed(call.latest, ErrorKind.TIMEOUT, why, call.started)

    def expired(self) -> bool:
        """Whether the deadline for every exchange (`ends_at`) has passed."""
        return self.ends_at is not None and time.monotonic() >= self.ends_at

    async def _with_retries(self, call: _Call) -> HTTPExchange:
        """Attempts until one is final: answered, refused for good, or out of retries."""
        attempt = 0
        while True:
            attempt += 1
            result = await self._following_redirects(call, attempt)
            status = result.status
            # A peer that hung up before any response (a keep-alive connection it had just closed, a worker
            # restart) saw at most a request it never answered: sent again like a refused connection.
            kind = result.error.kind if result.error is not None else None
            retryable = status in RETRY_STATUSES or kind is ErrorKind.CONNECT or (
                kind is ErrorKind.TRUNCATED and status is None)
            if not retryable or attempt > self.policy.retries:
                return result
            delay = self._delay(attempt, result.headers.get("retry-after"))
            if delay is None:
                return _failed(result, ErrorKind.RATE_LIMITED if status == 429 else ErrorKind.SERVER_ERROR,
                               f"Retry-After {result.headers.get('retry-after')} is beyond "
                               f"{self.policy.retry_after_max_s:.0f} s")
            await asyncio.sleep(delay)

    async def _following_redirects(self, call: _Call, attempt: int) -> HTTPExchange:
        """One attempt: the request, sent on where same-origin redirects say (the call keeps the last place)."""
        redirects = 0
        while True:
            call.latest = HTTPExchange(None, attempts=attempt)
            result = await self._once(call)
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
            if redirects > self.policy.max_redirects:
                return _failed(result, ErrorKind.REDIRECT, f"more than {self.policy.max_redirects} redirects")
            call.url = str(target)

    def _delay(self, attempt: int, retry_after: str | None) -> float | None:
        p = self.policy
        if retry_after:
            wait = _parse_retry_after(retry_after)
            if wait is not None:
                return None if wait > p.retry_after_max_s else wait
        backoff: float = min(p.backoff_max_s, p.backoff_s * 2 ** (attempt - 1))
        return backoff * random.uniform(0.8, 1.2)

    async def _once(self, call: _Call) -> HTTPExchange:
        result, started = call.latest, call.started
        send_headers = dict(call.headers)
        if call.secret is not None:
            send_headers["Authorization"] = f"Bearer {call.secret.reveal()}"
        cap = self.policy.max_body_bytes
        scrub = self.scrubber
        try:
            async with self.client.stream(call.method, call.url, json=call.json, headers=send_headers) as response:
                result.status = response.status_code
                result.headers = {scrub.text(k.lower()): scrub.text(v) for k, v in response.headers.items()}
                declared = response.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > cap:
                    return _failed(result, ErrorKind.TOO_LARGE, f"declared body of {int(declared):,} bytes "
                                   f"is over the {cap:,}-byte cap", started)
                try:
                    decoder = BoundedDecoder(response.headers.get("content-encoding"))
                except DecodingError as exc:
                    return _failed(result, ErrorKind.MALFORMED, scrub.text(str(exc)), started)
                body = _Body(result, cap, started, call.on_chunk if response.status_code == 200 else None)
                received = 0  # raw bytes: a body that decodes to nothing still ends at the cap
                async for raw in response.aiter_raw():
                    received += len(raw)
                    if received > cap:
                        return _failed(result, ErrorKind.TOO_LARGE, f"body over the {cap:,}-byte cap", started)
                    for chunk in decoder.feed(raw):
                        if stop := body.take(chunk):
                            return _failed(result, stop.kind, stop.message, started)
                for chunk in decoder.flush():
                    if stop := body.take(chunk):
                        return _failed(result, stop.kind, stop.message, started)
                result.body = scrub.bytes(body.data)
                result.total_s = time.monotonic() - started
                return result
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
        result.total_s = time.monotonic() - started
        result.error = TargetError(kind, scrub.text(message), result.status)
        return result


class _Body:
    """A body as its decoded pieces arrive: grown as bytes come, never sized from a declared length (a length is
    a claim, not a body), counted decoded against the cap.  A 200 stream goes to its reader as it comes, and
    only its start is kept here, for an error report: a huge stream is never held twice."""

    def __init__(self, result: HTTPExchange, cap: int, started: float, on_chunk: OnChunk | None) -> None:
        self.result, self.cap, self.started, self.on_chunk = result, cap, started, on_chunk
        self.data = bytearray()
        self.decoded = 0

    def take(self, chunk: bytes) -> TargetError | None:
        """An error when this piece takes the body over the cap, or when the stream's reader ends it."""
        self.decoded += len(chunk)
        if self.decoded > self.cap:
            return TargetError(ErrorKind.TOO_LARGE, f"body over the {self.cap:,}-byte cap (counted decoded)",
                               self.result.status)
        now = time.monotonic() - self.started
        if self.result.first_byte_s is None and chunk:
            self.result.first_byte_s = now
        if self.on_chunk is None:
            self.data += chunk
            return None
        if len(self.data) < ERROR_BODY_CAP:
            self.data += chunk[: ERROR_BODY_CAP - len(self.data)]
        return self.on_chunk(chunk, now)


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


def _parse_retry_after(value: str) -> float | None:
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
