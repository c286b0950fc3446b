"""Property-based fuzzing of the parsers users and targets feed: SSE streams, answer JSON, JSONL records, YAML
config.  Whatever the bytes, each parser returns a value or its own one-line error, never a traceback.

A few hundred examples each in the suite; `make fuzz` (LEAKPROBE_FUZZ=long) runs thousands.  A crash found
becomes an `@example` here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from prober.config import ConfigError, load_config, parse_config
from prober.forensics import ForensicReport, parse, read_batches
from prober.targets import Api, OpenAICompatible, Transport, WorkersAI
from prober.targets.base import HTTPTarget, _StreamReader
from prober.targets.result import Completion
from prober.targets.sse import SSEDecoder
from prober.targets.transport import HTTPExchange

settings.register_profile("suite", max_examples=150, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("long", max_examples=20_000, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile(os.environ.get("LEAKPROBE_FUZZ", "suite"))

TRANSPORT = Transport()  # never sends: the parsers are fed bytes directly
TARGETS: list[HTTPTarget] = [OpenAICompatible("t", "http://t/v1", TRANSPORT, api=Api.CHAT),
                             OpenAICompatible("t", "http://t/v1", TRANSPORT, api=Api.COMPLETIONS),
                             WorkersAI("t", "http://t/run", TRANSPORT)]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["choices", "message", "delta", "content", "text", "usage", "prompt_tokens", "error",
                         "finish_reason", "result", "response", "success", "errors", "object", "message"])
        | st.text(max_size=10), inner, max_size=6),
    max_leaves=30)
answer_bodies = (st.binary(max_size=2_000) | json_values.map(lambda v: json.dumps(v).encode())
                 | st.integers(1, 3_000).map(lambda n: b"[" * n + b"]" * n))


@given(st.lists(st.binary(max_size=300), max_size=30))
@example([b"data: {}\r", b"\n\r\n", b"data: [DONE]\n\n"])
@example([b"\xff\xfe data: x\n\n"])
def test_sse_decoder_takes_any_bytes(chunks: list[bytes]) -> None:
    decoder = SSEDecoder()
    events = [e for chunk in chunks for e in decoder.feed(chunk)] + decoder.close()
    assert all(isinstance(e, str) for e in events)


@given(st.sampled_from(TARGETS), answer_bodies, st.sampled_from([200, 400, 429, 500, 503]))
@example(TARGETS[0], b"[" * 5_000 + b"]" * 5_000, 200)
def test_any_answer_body_becomes_a_completion(target: HTTPTarget, body: bytes, status: int) -> None:
    answer = target._plain(HTTPExchange(status, body=body))
    assert isinstance(answer, Completion)
    assert answer.served or answer.error is not None


@given(st.sampled_from(TARGETS), st.lists(json_values.map(json.dumps) | st.text(max_size=60)
                                          | st.just("[DONE]"), max_size=12), st.booleans())
@example(TARGETS[0], ["[" * 4_000 + "]" * 4_000], True)
def test_any_event_stream_becomes_a_completion(target: HTTPTarget, events: list[str], ended: bool) -> None:
    stream = _StreamReader(target)
    for i, data in enumerate(events):
        stream.feed(f"data: {data}\n\n".encode(), float(i))
    answer = stream.finish(HTTPExchange(200))
    assert isinstance(answer, Completion) and isinstance(answer.text, str)


@given(st.lists(st.binary(max_size=400) | json_values.map(lambda v: json.dumps(v).encode()), max_size=20))
@example([b'{"id": "a", "tenant": "b", "text": "c"}', b"[" * 100_000])
def test_any_jsonl_gives_records_or_counted_problems(tmp_path_factory: Any, lines: list[bytes]) -> None:
    path = Path(tmp_path_factory.mktemp("jsonl")) / "in.jsonl"
    path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n")
    report = ForensicReport()
    records = [r for batch in read_batches([str(path)], report, lines=7) for r in parse(batch, report)]
    assert len(records) + report.skipped <= len(lines)
    assert all(isinstance(r.text, str) for r in records)


@given(st.text(max_size=600))
@example("targets: " + "[" * 3_000)
@example("a: &x [*x]")
@example("targets:\n  - {name: t, url: 'http://[::1'}\n")
def test_any_yaml_config_is_a_config_or_a_config_error(tmp_path_factory: Any, text: str) -> None:
    path = Path(tmp_path_factory.mktemp("yaml")) / "c.yaml"
    path.write_text(text, encoding="utf-8", errors="replace")
    try:
        parse_config(load_config(path), str(path))
    except ConfigError as exc:
        assert "\n" not in str(exc)


@given(st.dictionaries(st.sampled_from(["targets", "tenants", "ledger", "audit", "daemon", "extra"]), json_values,
                       max_size=5))
def test_any_mapping_is_a_config_or_a_config_error(data: dict[str, Any]) -> None:
    try:
        parse_config(data)
    except ConfigError as exc:
        assert "\n" not in str(exc)
