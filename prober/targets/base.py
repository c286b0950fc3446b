"""The target interface, and the request/answer cycle every HTTP adapter shares.

An adapter says where to send a prompt, how to phrase the body, and how to read one JSON answer or one
stream event; `HTTPTarget.complete` does the rest (transport, SSE, timings, error typing), so each API
is a few small methods.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any

from prober.targets.bounds import ANSWER_BASE_S, OVERLONG, Size
from prober.targets.credentials import Secret
from prober.targets.request_ids import RequestId
from prober.targets.result import Completion, Cut, ErrorKind, TargetError, Usage
from prober.targets.sse import SSEDecoder
from prober.targets.transport import ERROR_BODY_CAP, HTTPExchange, Transport


@dataclass(frozen=True)
class Media:
    """An image part of a chat prompt: its URL (a `data:` URL carries the image itself) and vLLM's `uuid`, the
    client's name for it that vLLM caches its features under; no URL with a uuid refers to an image sent before."""

    url: str | None
    uuid: str | None = None


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int = 64
    stream: bool = False
    temperature: float = 0.0  # probes are greedy, so a rerun asks the same question the same way
    seed: int | None = None
    logprobs: bool = False  # ask for the answer's token log-probabilities (OpenAI's chat and completions)
    cache_salt: str | None = None  # vLLM: only requests with the same salt share prefix-cache blocks
    request_id: RequestId | None = None  # the client's ID for the request (the engine names its own without one)
    model: str | None = None  # named in place of the target's model: a tenant's LoRA adapter (vLLM serves each as one)
    media: tuple[Media, ...] = ()  # images after the text (chat only)
    # The prompt as vLLM's `prompt_embeds` (completions only), sent in place of the text: a base64 string of a
    # `torch.save`d tensor [tokens, hidden] (prober/input_embeds); `text` is then what the rows spell.
    embeds: str | None = None
    # The conversation before `text`, as (role, text): a system prompt, earlier turns (chat; completions read them as
    # lines before the text).
    turns: tuple[tuple[str, str], ...] = ()


@dataclass
class Piece:
    """What one JSON answer or one stream event contributes."""

    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    other: str = ""  # text beside the content (reasoning, refusal, tool-call arguments)
    ends: bool = False  # the stream's last event (the Responses API ends on one; chat and completions on [DONE])
    logprob: float | None = None  # the sum of its tokens' log-probabilities, where the target gave them


class Target(ABC):
    """Something that answers prompts on behalf of a tenant."""

    name: str

    @abstractmethod
    async def complete(self, prompt: Prompt, secret: Secret | None) -> Completion: ...


class HTTPTarget(Target):
    # The body field that names the end user a key is sent for, where the API has one (OpenAI's `user`).
    end_user_field: str | None = None

    def __init__(self, name: str, transport: Transport) -> None:
        self.name = name
        self.transport = transport

    @property
    def takes_media(self) -> bool:
        """Whether its API carries images (OpenAI's chat does)."""
        return False

    @property
    def takes_embeds(self) -> bool:
        """Whether its API carries a prompt as embeddings (vLLM's completions route does)."""
        return False

    @abstractmethod
    def endpoint(self) -> str: ...

    @abstractmethod
    def body(self, prompt: Prompt) -> dict[str, Any]: ...

    @abstractmethod
    def read_answer(self, obj: Any) -> Piece: ...

    @abstractmethod
    def read_event(self, obj: Any) -> Piece: ...

    def answer_id(self, obj: Any) -> str | None:
        """The id the target named an answer (or a stream event) by, where its API has one."""
        return None

    def answer_created(self, obj: Any) -> int | None:
        """When the target says it made an answer (or a stream event), where its API says."""
        return None

    async def complete(self, prompt: Prompt, secret: Secret | None) -> Completion:
        """The answer read as what arrived: a stream as a stream, JSON as JSON, whichever was asked for (a
        mismatch is named in the error of an answer that failed)."""
        if prompt.media and not self.takes_media:
            raise ValueError(f"{type(self).__name__} on this API takes no images")
        if prompt.embeds is not None and not self.takes_embeds:
            raise ValueError(f"{type(self).__name__} on this API takes no prompt embeddings")
        with self.transport.outbox.sending(secret, prompt.text):
            stream = _StreamReader(self, max_tokens=prompt.max_tokens,
                                   idle_s=min(self.transport.policy.timeout_s, ANSWER_BASE_S))
            size = Size(len(prompt.text.encode("utf-8", "surrogatepass")), prompt.max_tokens, prompt.stream)
            headers = prompt.request_id.headers() if prompt.request_id else None
            body = self.body(prompt)
            if self.end_user_field and self.transport.policy.end_user_field and secret and secret.end_user is not None:
                body[self.end_user_field] = secret.end_user
            exchange = await self.transport.exchange("POST", self.endpoint(), json=body, secret=secret,
                                                     headers=headers, on_chunk=stream.feed, size=size)
            answer = stream.finish(exchange) if exchange.streamed else self._plain(exchange)
            if answer.error is not None and exchange.status == 200 and exchange.streamed != prompt.stream:
                sent = "server-sent events to a plain" if exchange.streamed else "a JSON body to a stream"
                answer = replace(answer, error=replace(answer.error, message=f"answered {sent} request: "
                                                                             f"{answer.error.message}"))
            return _plausible(self._scrubbed(answer), prompt)

    def _scrubbed(self, answer: Completion) -> Completion:
        """Streamed text arrives in pieces that may split a secret: scrub the assembled answer too."""
        scrub = self.transport.scrubber
        if not scrub:
            return answer
        error = answer.error
        if error is not None:
            error = replace(error, message=scrub.text(error.message), body=scrub.text(error.body))
        return replace(answer, text=scrub.text(answer.text), other_text=scrub.text(answer.other_text), error=error)

    def _plain(self, exchange: HTTPExchange) -> Completion:
        common = _common(exchange)
        if exchange.error is not None and exchange.error.cut is not None:
            # What arrived before the cut, as it came (JSON and all): a body that stalls after a leak carries it.
            return Completion(**common, text=exchange.body.decode("utf-8", "replace"), error=exchange.error)
        if exchange.error is not None or exchange.status != 200:
            return Completion(**common, error=exchange.error or _http_error(exchange))
        obj, problem = exchange.json()
        if problem:
            return Completion(**common, error=TargetError(ErrorKind.MALFORMED, problem, 200, exchange.snippet()))
        try:
            piece = self.read_answer(obj)
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            return Completion(**common, error=TargetError(
                ErrorKind.MALFORMED, f"answer lacks the expected fields ({type(exc).__name__}: {exc})", 200,
                exchange.snippet()))
        error = TargetError(ErrorKind.REFUSED, piece.error, 200, exchange.snippet()) if piece.error else None
        return Completion(**common, text=piece.text, usage=piece.usage, finish_reason=piece.finish_reason,
                          ttft_s=exchange.total_s, error=error, other_text=piece.other, answer_id=self.answer_id(obj),
                          created=self.answer_created(obj), logprob=piece.logprob)


class _StreamReader:
    """Decode SSE as bytes arrive, so TTFT is the moment the first text arrived, not the first byte.

    It also ends a stream that cannot be observed, early: one that says nothing but keep-alive comments (or
    empty events) for `idle_s` — those bytes reset the transport's idle timeout, they are not an answer — and
    one that sends far more pieces of text than `max_tokens` allows (the transport cuts one that never ends)."""

    def __init__(self, target: HTTPTarget, *, max_tokens: int | None = None, idle_s: float | None = None) -> None:
        self.target = target
        self.max_pieces = None if max_tokens is None else OVERLONG * max_tokens + 16
        self.idle_s = idle_s
        # Seconds since the request began when an event last carried something, or the stream's first byte came
        # (before it, silence is the idle timeout's: a long prefill sends nothing).
        self.last_progress: float | None = None
        self.decoder = SSEDecoder()
        self.parts: list[str] = []
        self.others: list[str] = []
        self.ttft: float | None = None
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.error: TargetError | None = None
        self.answer_id: str | None = None
        self.created: int | None = None
        self.logprob: float | None = None
        self.done = False

    def feed(self, chunk: bytes, at: float) -> TargetError | None:
        if self.last_progress is None:
            self.last_progress = at
        for event in self.decoder.feed(chunk):
            self._event(event, at)
        pieces = len(self.parts) + len(self.others)
        if self.max_pieces is not None and pieces > self.max_pieces:
            return TargetError(ErrorKind.MALFORMED, f"stream sent {pieces:,} pieces of text for "
                               f"max_tokens {(self.max_pieces - 16) // OVERLONG:,}: far more than was asked for", 200,
                               cut=Cut.OVERLONG)
        if self.idle_s is not None and at - self.last_progress > self.idle_s:
            return TargetError(ErrorKind.TIMEOUT, f"nothing but keep-alives for {self.idle_s:g} s", 200,
                               cut=Cut.KEEPALIVE)
        return None

    def _event(self, data: str, at: float) -> None:
        if data.strip() == "[DONE]":
            self.done = True
            return
        if self.error is not None and self.error.kind is ErrorKind.MALFORMED:
            return
        try:
            obj = json.loads(data)
            piece = self.target.read_event(obj)
            self.answer_id = self.answer_id or self.target.answer_id(obj)
            self.created = self.created or self.target.answer_created(obj)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
            self.error = TargetError(ErrorKind.MALFORMED, f"stream event is not valid ({type(exc).__name__}: {exc})",
                                     200, data[:ERROR_BODY_CAP])
            return
        self.done = self.done or piece.ends
        if piece.text or piece.other or piece.finish_reason or piece.usage or piece.error:
            self.last_progress = at
        if (piece.text or piece.other) and self.ttft is None:
            self.ttft = at
        if piece.text:
            self.parts.append(piece.text)
        if piece.other:
            self.others.append(piece.other)
        self.finish_reason = piece.finish_reason or self.finish_reason
        self.usage = piece.usage or self.usage
        if piece.logprob is not None:
            self.logprob = (self.logprob or 0.0) + piece.logprob
        if piece.error and self.error is None:
            self.error = TargetError(ErrorKind.REFUSED, piece.error, 200, data[:ERROR_BODY_CAP])

    def finish(self, exchange: HTTPExchange) -> Completion:
        common = _common(exchange)
        if exchange.status != 200 or (exchange.error is not None and not self.parts and not self.others):
            return Completion(**common, streamed=True, error=exchange.error or _http_error(exchange))
        if exchange.error is None:  # a cut-off tail is not an event; flush only a cleanly ended stream
            for event in self.decoder.close():
                self._event(event, exchange.total_s)
        in_band = self.error if self.error is not None and self.error.kind is ErrorKind.REFUSED else None
        error = in_band or exchange.error or self.error
        if error is None and self.decoder.invalid_utf8:
            error = TargetError(ErrorKind.MALFORMED, "stream is not valid UTF-8", 200)
        if error is None and not self.done:
            error = TargetError(ErrorKind.TRUNCATED, "stream ended before its final event ([DONE], response.completed)",
                                200)
        # Partial text stays, reasoning before any content too: a cut answer can still carry someone else's data.
        return Completion(**common, text="".join(self.parts), usage=self.usage, finish_reason=self.finish_reason,
                          ttft_s=self.ttft, streamed=True, error=error, other_text="".join(self.others),
                          answer_id=self.answer_id, created=self.created, logprob=self.logprob)


def _plausible(answer: Completion, prompt: Prompt) -> Completion:
    """Usage figures no engine could report for this prompt are set aside (and said why), so no budget,
    calibration or check downstream counts 10^30 tokens."""
    if answer.usage is None:
        return answer
    problem = answer.usage.implausible(prompt_bytes=len(prompt.text.encode("utf-8", "surrogatepass")),
                                       max_tokens=prompt.max_tokens)
    return replace(answer, usage=None, implausible_usage=problem) if problem else answer


def _common(exchange: HTTPExchange) -> dict[str, Any]:
    return {"status": exchange.status, "total_s": exchange.total_s, "attempts": exchange.attempts,
            "headers": exchange.headers, "traceparent": exchange.traceparent}


def error_message(obj: Any) -> str | None:
    """The message of any engine's error shape: OpenAI/vLLM/llama.cpp `{"error": {...}}`, SGLang
    `{"object": "error", "message"}`, TGI `{"error": "..."}`, Workers AI `{"errors": [{"message"}]}`."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err.get("type") or err)
    if isinstance(err, str) and err:
        return err
    if obj.get("object") == "error":
        return str(obj.get("message", "error"))
    errors = obj.get("errors")
    if isinstance(errors, list) and errors:
        first = errors[0]
        return str(first.get("message", first)) if isinstance(first, dict) else str(first)
    return None


# Every engine's words for a prompt over its length (SGLang, vLLM, llama.cpp's 400, TGI): a gateway that wraps one
# in a 5xx (LiteLLM answers a refusal inside a 200 stream with a 500) still passes on the engine's refusal.  Not
# llama.cpp's own 500 "Context size has been exceeded": prompts that each fit, together overrunning a shared KV
# pool, a failure under concurrency.
OVER_LENGTH = re.compile(r"context length|maximum (?:allowed|input) length|reduce the length|"
                         r"exceed_context_size|must have less than \d+ tokens|tokens \+ `max_new_tokens` must be",
                         re.IGNORECASE)


def _http_error(exchange: HTTPExchange) -> TargetError:
    status = exchange.status or 0
    obj, _ = exchange.json()
    message = error_message(obj) or exchange.snippet()[:300] or f"HTTP {status}"
    if status in (401, 403):
        kind = ErrorKind.UNAUTHORIZED
    elif status == 429:
        kind = ErrorKind.RATE_LIMITED
    elif status >= 500 and OVER_LENGTH.search(message):
        kind = ErrorKind.REFUSED
    elif status >= 500:
        kind = ErrorKind.SERVER_ERROR
    elif 300 <= status < 400:
        kind = ErrorKind.REDIRECT
    else:
        kind = ErrorKind.REFUSED
    return TargetError(kind, message, status, exchange.snippet())
