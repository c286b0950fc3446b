"""What one request to a target produced, normalised across APIs: the unit every later layer consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from prober.domain.evidence import FromCache


class ErrorKind(StrEnum):
    """Why a request did not yield a well-formed answer.  `refused` is the engine saying no (4xx): at a
    capacity boundary that is the *correct* outcome, so it is kept apart from transport failures."""

    REFUSED = "refused"  # HTTP 4xx other than 401/403/429, or an error object inside a 200 stream
    UNAUTHORIZED = "unauthorized"  # 401/403
    RATE_LIMITED = "rate_limited"  # 429 after every retry
    SERVER_ERROR = "server_error"  # 5xx after every retry
    TIMEOUT = "timeout"
    CONNECT = "connect"  # refused, reset or unroutable
    DNS = "dns"  # the host name does not resolve
    TLS = "tls"  # the TLS handshake failed (certificate, protocol)
    MALFORMED = "malformed"  # body is not the JSON/SSE the API promises
    TRUNCATED = "truncated"  # stream ended without its terminator
    TOO_LARGE = "too_large"  # body over the size cap
    REDIRECT = "redirect"  # redirect to another origin (credentials withheld)


class Cut(StrEnum):
    """Why a request was ended while the target was still on it (`leakprobe_requests_cut_total{reason}`).  All
    but `run_deadline` are the target's doing: an answer that never ends, or is far longer than was asked for."""

    DEADLINE = "deadline"  # past the request's own deadline, derived from its size (prober/targets/bounds.py)
    OVERLONG = "overlong"  # more text pieces or bytes than max_tokens allows, or over max_body_bytes
    KEEPALIVE = "keepalive"  # a stream of nothing but keep-alives
    RUN_DEADLINE = "run_deadline"  # the audit's or the daemon job's deadline for this target

    @property
    def targets_fault(self) -> bool:
        return self is not Cut.RUN_DEADLINE


TEMPLATE_TOKENS = 4_096  # what an engine may add to a prompt: chat template, system prompt, special tokens
GATEWAY_RETRIES = "x-litellm-attempted-retries"  # response headers in which gateways say they retried
GATEWAY_ATTEMPTS = "x-envoy-attempt-count"
TIER_FIELDS = ("local_cached_tokens", "external_cached_tokens")  # in the usage's token details, or beside them


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    # Which tier served the cached tokens, where the engine tells them apart (vLLM's names): its own prefix cache,
    # and a second tier (a KV connector, CPU offload, HiCache's host or storage tier).
    local_cached_tokens: int | None = None
    external_cached_tokens: int | None = None

    def implausible(self, *, prompt_bytes: int | None = None, sent_tokens: int | None = None,
                    max_tokens: int | None = None) -> str | None:
        """Why these figures cannot be true, or None.  A token covers at least one byte of text, so a prompt
        count beyond the prompt's bytes (or, where the tokens sent are known, beyond twice them) plus a
        template's worth is made up; so are negative counts, more cached tokens than prompt tokens, and a
        completion far longer than was asked for.  Budgets and the placeholder check must not trust them."""
        counts = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                  "cached_tokens": self.cached_tokens}
        for name, value in counts.items():
            if value is not None and value < 0:
                return f"usage.{name} is negative ({value:,})"
        prompt = self.prompt_tokens
        bounds = [(prompt_bytes, f"a prompt of {prompt_bytes:,} bytes")] if prompt_bytes is not None else []
        if sent_tokens is not None:
            bounds.append((2 * sent_tokens, f"{sent_tokens:,} tokens sent"))
        for bound, sent in bounds:
            if prompt is not None and bound is not None and prompt > bound + TEMPLATE_TOKENS:
                return f"usage.prompt_tokens is {prompt:,} for {sent}"
        if prompt is not None and self.cached_tokens is not None and self.cached_tokens > prompt:
            return f"usage says {self.cached_tokens:,} cached of {prompt:,} prompt tokens"
        if max_tokens is not None and self.completion_tokens is not None and (
                self.completion_tokens > 2 * max_tokens + 16):
            return f"usage.completion_tokens is {self.completion_tokens:,} for max_tokens {max_tokens:,}"
        return None

    @classmethod
    def parse(cls, raw: Any) -> Usage | None:
        if not isinstance(raw, dict):
            return None
        if "input_tokens" in raw and "prompt_tokens" not in raw:  # the Responses API's names
            details = raw.get("input_tokens_details")
            prompt, completion = raw.get("input_tokens"), raw.get("output_tokens")
        else:
            details = raw.get("prompt_tokens_details")
            prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
        details = details if isinstance(details, dict) else {}
        local, external = (_int(details.get(name, raw.get(name))) for name in TIER_FIELDS)
        return cls(_int(prompt), _int(completion), _int(details.get("cached_tokens")), local, external)


def _number(value: str | None) -> int:
    return int(value) if value is not None and value.strip().isdigit() else 0


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class TargetError:
    kind: ErrorKind
    message: str
    status: int | None = None
    body: str = ""  # the raw error body (capped), for the report
    cut: Cut | None = None  # the request was ended while the target was still on it

    def __str__(self) -> str:
        where = f"HTTP {self.status}: " if self.status else ""
        return f"{self.kind.value}: {where}{self.message}"


@dataclass(frozen=True)
class Completion:
    """One answer.  `status` is the HTTP status (a 200 stream can still carry an `error`)."""

    status: int | None
    # Not in the repr: an answer can be megabytes, and reprs get made where nobody reads them (Python 3.11's
    # asyncio formats the finished main task, result and all, when it restores SIGINT: measured 100 MiB).
    text: str = field(default="", repr=False)
    usage: Usage | None = None
    finish_reason: str | None = None
    ttft_s: float | None = None
    total_s: float = 0.0
    streamed: bool = False
    error: TargetError | None = None
    attempts: int = 1
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    implausible_usage: str | None = None  # why the engine's usage figures were set aside (`usage` is None then)
    # What the API returned as text beside the content: a reasoning model's reasoning, a refusal, tool-call
    # arguments.  A canary there has left the engine as surely as one in the content.
    other_text: str = field(default="", repr=False)
    answer_id: str | None = None  # the id the target named the answer by (OpenAI's `id`), where it gave one
    created: int | None = None  # when the target says it made the answer (OpenAI's `created`, unix seconds)
    traceparent: str | None = None  # the W3C trace context it was asked with (prober/targets/transport.py `traced`)
    from_cache: FromCache | None = None  # served from a cache in front of the engine (prober/probing/provenance.py)
    # The sum of the answer's token log-probabilities, where it was asked for them and the target gave them: a fresh
    # decode of the same request says the same text again with probability e^logprob (at the temperature it was asked
    # with), so a sampled answer repeated byte for byte at a tiny one was stored, not made.
    logprob: float | None = None

    @property
    def retried(self) -> bool:
        """More than one attempt reached the engine: ours, or a gateway's that says so (LiteLLM's
        `x-litellm-attempted-retries`, Envoy's `x-envoy-attempt-count`).  The first may have been served, so the
        engine may hold this prompt in its cache, and may have counted the dropped attempt as an abort."""
        return self.attempts > 1 or _number(self.headers.get(GATEWAY_RETRIES)) > 0 or _number(
            self.headers.get(GATEWAY_ATTEMPTS)) > 1

    @property
    def full_text(self) -> str:
        """Everything the answer says, content first: what is scanned."""
        return f"{self.text}\n{self.other_text}" if self.other_text else self.text

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def served(self) -> bool:
        """HTTP 200 and a well-formed answer: the engine accepted the prompt."""
        return self.status == 200 and self.error is None

    @property
    def counted_prompt_tokens(self) -> int | None:
        """What the engine says it prefilled, where it served the prompt and its usage is plausible: its own count
        of what it saw, path and all."""
        return self.usage.prompt_tokens if self.served and self.usage and not self.implausible_usage else None

    @property
    def refused(self) -> bool:
        """The engine said no (a 4xx, or an error inside a 200 body or stream): at a boundary, correct."""
        return self.error is not None and self.error.kind is ErrorKind.REFUSED

    @property
    def in_band_error(self) -> bool:
        """An error object inside an HTTP-200 body or stream: a client that checks status codes misses it."""
        return self.status == 200 and self.refused
