"""Property-based fuzzing of the parsers users and targets feed: SSE streams, answer JSON, content decoders,
the secret scrubber, JSONL records, YAML config.  Whatever the bytes, each parser returns a value or its own
one-line error, never a traceback.

A few hundred examples each in the suite; `make fuzz` (LEAKPROBE_FUZZ=long) runs thousands.  A crash found
becomes an `@example` here.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from prober.config.schema import load_config, parse_config
from prober.domain.errors import ConfigError
from prober.oneshot.forensics import ForensicReport, _problem, _read, parse, read_batches
from prober.targets import Api, OpenAICompatible, Transport, WorkersAI
from prober.targets.base import HTTPTarget, _StreamReader
from prober.targets.decoding import STEP, BoundedDecoder, DecodingError
from prober.targets.result import Completion
from prober.targets.sse import SSEDecoder
from prober.targets.transport import HTTPExchange
from prober.text.scrub import Scrubber
from tests.support.hostile import ENCODERS as ECHOES
from tests.support.hostile import key_traces

pytestmark = pytest.mark.unit

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


records = st.fixed_dictionaries({"id": st.text(max_size=8), "tenant": st.text(max_size=8),
                                  "text": st.text(max_size=80)}, optional={"prompt": st.none() | st.text(max_size=20),
                                                                          "extra": json_values})


@given(records.map(json.dumps) | json_values.map(json.dumps)
       | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
@example('{"id": "a", "tenant": "b", "text": "\\ud800", "n": NaN, "big": -9223372036854775809}')
@example("[" * 2_000 + "]" * 2_000)
@example(' \t{"id": "a", "tenant": "b", "text": "c"}\r ')
def test_a_log_line_is_the_record_the_standard_library_reads(line: str) -> None:
    """orjson reads the lines it takes, what it refuses is read by json: either way the same record, or the same
    problem, or the same kind of failure (whose message the report keeps).  (Beside a record's fields orjson may
    read a number otherwise: an integer past 64 bits as a float; nothing reads them.)"""
    def outcome(read: Any) -> Any:
        try:
            item = read()
        except (json.JSONDecodeError, RecursionError) as exc:
            return type(exc)
        problem = _problem(item)
        return problem or tuple(item.get(key) for key in ("id", "tenant", "text", "prompt"))
    raw = line.encode("utf-8", "surrogatepass")
    assert outcome(lambda: _read(raw)) == outcome(lambda: json.loads(line.strip(" \t\n\r")))


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


# -- decoders: text escapes undone before detection and scrubbing (prober/text/escapes.py) --------------------------

from collections.abc import Callable  # noqa: E402

from prober.canaries import tokens as canary_tokens  # noqa: E402
from prober.canaries.compact import compact  # noqa: E402
from prober.canaries.hangul import romanization_key, romanization_key_positions  # noqa: E402
from prober.detect import CanarySet, Scanner  # noqa: E402
from prober.domain.evidence import Escaped  # noqa: E402
from prober.domain.types import Canary, CanaryKind, Record  # noqa: E402
from prober.text.escapes import unescape  # noqa: E402

_ESCAPY = st.text(alphabet=st.sampled_from("&#%\\xXuU{};0123456789abcdefABCDEF:nt/\"'가 LPK-"), max_size=80)
_PLAIN = st.text(alphabet=st.characters(blacklist_characters="&%\\", codec="utf-8"), max_size=60)


def _html_dec(text: str) -> str:
    return "".join(f"&#{ord(ch)};" for ch in text)


def _html_hex(text: str) -> str:
    return "".join(f"&#x{ord(ch):X}" for ch in text)  # the semicolon is optional to a browser, and to us


def _percent(text: str) -> str:
    return "".join(f"%{byte:02x}" for byte in text.encode("utf-8"))


def _json_u(text: str) -> str:
    """Every UTF-16 code unit as \\uXXXX, as JSON writes what it escapes (a pair for a character past U+FFFF)."""
    units = text.encode("utf-16-be")
    return "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))


ENCODERS: list[Callable[[str], str]] = [_html_dec, _html_hex, _percent, _json_u,
                                        lambda t: _html_dec(_percent(t)), lambda t: _percent(_html_hex(t))]


@given(_ESCAPY | st.text(max_size=200))
@example("\\ud800\\u0041 %e2%82 &#0; &#x110000; &#55296; &bogus; &amp &lt;")
@example("%" * 3 + "\\" * 3 + "&" * 3)
def test_unescape_takes_any_text_and_maps_every_span_inside_the_original(text: str) -> None:
    decoded = unescape(text)
    if decoded is None:
        return
    assert isinstance(decoded.text, str) and len(decoded.text) <= len(text)
    last = (0, 0)
    for start in range(len(decoded.text) + 1):
        span = decoded.original_span(start, min(len(decoded.text), start + 3))
        assert 0 <= span[0] <= span[1] <= len(text)
        assert span >= last  # later spans never map before earlier ones
        last = span


@given(_PLAIN, st.sampled_from(range(len(ENCODERS))))
@example("LPK-탁윤슬😀", 3)
def test_every_encoding_decodes_back_and_each_character_maps_to_its_own_escape(text: str, which: int) -> None:
    encoded = ENCODERS[which](text)
    decoded = unescape(encoded)
    assert (decoded.text if decoded else encoded) == text
    if decoded is None:
        return
    for i, char in enumerate(text):
        start, end = decoded.original_span(i, i + 1)
        written = unescape(encoded[start:end])
        assert (written.text if written else encoded[start:end]) == char


_KEY = b"f" * 32
_TOKEN = canary_tokens.display(canary_tokens.mint_body(_KEY, "tenant-a", "p1"))
_SCANNER = Scanner(CanarySet([Canary(id="c1", tenant="tenant-a", kind=CanaryKind.TOKEN, text=_TOKEN, expires_at=2**40)],
                             key=_KEY), foreign=False)


@given(_PLAIN, _PLAIN, st.sampled_from(range(len(ENCODERS))))
def test_a_canary_written_in_any_escape_is_found_where_it_was_written(before: str, after: str, which: int) -> None:
    encoded = ENCODERS[which](_TOKEN)
    text = f"{before} {encoded} {after}"
    findings = _SCANNER.scan(Record("r", "tenant-b", text)).findings
    assert [f.canary_id for f in findings] == ["c1"]
    start, end = findings[0].start, findings[0].end
    assert len(before) < start and end <= len(before) + 1 + len(encoded)
    escaped = findings[0].evidence_of(Escaped)
    assert escaped is not None and escaped.kinds


@given(st.text(alphabet=st.sampled_from("AEIOUYWHRLGKDTBPJCNMS0123456789-"), max_size=60))
@example("CHAEE00HYRAI")
def test_the_romanization_key_and_its_positions_agree(text: str) -> None:
    compacted = compact(text)
    key, positions = romanization_key_positions(compacted)
    assert key == romanization_key(compacted) and len(positions) == len(key)
    assert positions == sorted(positions) and all(0 <= p < len(compacted) for p in positions)


@given(st.sampled_from(["gzip", "deflate", "x-gzip", "identity", "gzip, gzip", "br", "", "GZIP , identity"]),
       st.lists(st.binary(max_size=300), max_size=10), st.binary(max_size=3_000))
@example("gzip", [b"\x1f\x8b\x08\x00garbage"], b"")
def test_any_body_under_any_coding_decodes_in_bounded_pieces_or_is_refused(header: str, chunks: list[bytes],
                                                                             plain: bytes) -> None:
    for body in (chunks, [zlib.compress(plain), gzip.compress(plain)]):
        try:
            decoder = BoundedDecoder(header)
            pieces = [p for chunk in body for p in decoder.feed(chunk)] + list(decoder.flush())
        except DecodingError as exc:
            assert "\n" not in str(exc)
            continue
        assert all(len(p) <= STEP for p in pieces)


SECRET = "sk-fuzz-7Qm2xV9pL4tR8wZ1"
SCRUBBER = Scrubber({"key": SECRET})


@given(st.text(max_size=400), st.sampled_from(sorted(ECHOES)), st.integers(0, 400), st.booleans())
@example("%%%&&&\\\\u", "percent", 3, False)
@example("\\", "entities-decimal", 1, False)  # `\&#115;`: a backslash, then an entity
def test_any_text_with_a_key_spliced_in_loses_every_form_of_it(text: str, encoding: str, at: int,
                                                                as_bytes: bool) -> None:
    if key_traces(text, [SECRET]):
        return  # the drawn text holds the key already
    spliced = text[:at] + ECHOES[encoding](SECRET) + text[at:]
    scrubbed = (SCRUBBER.bytes(spliced.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogatepass")
                if as_bytes else SCRUBBER.text(spliced))
    assert not key_traces(scrubbed, [SECRET]), scrubbed
    assert SCRUBBER.text(text) == text  # no false positive on the text around it
