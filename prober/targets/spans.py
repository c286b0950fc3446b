"""leakprobe's own spans, exported over OTLP: each request it sends is a client span whose trace and span ids are the
W3C `traceparent` the request carried.  vLLM and SGLang continue that context in the spans they export, so the
engine's span of a request is a child of leakprobe's, and a finding's trace id opens both in the operator's trace
view: what leakprobe sent, when, how it ended, and what the engine did with it.
"""

from __future__ import annotations

from typing import Protocol

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from prober import __version__
from prober.targets.result import TargetError

EXPORT_TIMEOUT_S = 10.0  # one batch's export; a receiver that is down costs this at most, in the exporter's thread


class Sent(Protocol):
    """What a span says of a finished request (prober/targets/transport.py's exchange)."""

    status: int | None
    attempts: int
    traceparent: str | None
    error: TargetError | None


class Spans:
    """A sink of finished requests as client spans, batched and sent from a thread of the OpenTelemetry SDK (a
    receiver that is slow or down never holds a request up); `close` sends what is left."""

    def __init__(self, endpoint: str, service: str) -> None:
        """`endpoint`: an OTLP/HTTP traces URL (`http://collector:4318/v1/traces`)."""
        self._processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S))
        self._resource = Resource.create({"service.name": service, "service.version": __version__})
        self._scope = InstrumentationScope("prober", __version__)

    def record(self, method: str, url: str, exchange: Sent, started_ns: int, ended_ns: int) -> None:
        """The request to `url` (its secrets masked by the caller) as one span, from its first attempt to its last
        byte (retries share its trace context)."""
        context = _context(exchange.traceparent)
        if context is None:
            return
        target = httpx.URL(url)
        attributes: dict[str, str | int] = {
            "http.request.method": method, "url.full": url,
            "server.address": target.host, "server.port": target.port or (443 if target.scheme == "https" else 80)}
        if exchange.attempts > 1:
            attributes["http.request.resend_count"] = exchange.attempts - 1
        if exchange.status is not None:
            attributes["http.response.status_code"] = exchange.status
        failed = exchange.error is not None or (exchange.status or 0) >= 400
        if exchange.error is not None:
            attributes["error.type"] = exchange.error.kind.value
        elif failed:
            attributes["error.type"] = str(exchange.status)
        status = Status(StatusCode.ERROR, exchange.error.message if exchange.error else None) if failed else Status()
        self._processor.on_end(ReadableSpan(
            name=f"{method} {target.path}", context=context, kind=SpanKind.CLIENT,
            resource=self._resource, instrumentation_scope=self._scope, attributes=attributes, status=status,
            start_time=started_ns, end_time=ended_ns))

    def close(self) -> None:
        """Send the spans still queued (blocking: call from a thread where a loop runs)."""
        self._processor.shutdown()  # type: ignore[no-untyped-call]  # (the SDK leaves it unannotated)


def _context(traceparent: str | None) -> SpanContext | None:
    """The span context a `traceparent` header names (version 00), or None where it names none."""
    parts = (traceparent or "").split("-")
    if len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace, span, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace or not span:
        return None
    return SpanContext(trace, span, is_remote=False, trace_flags=TraceFlags(flags | TraceFlags.SAMPLED))
