"""A hostile OpenAI-compatible engine on loopback: it answers like SGLang (server_info, tokenize, chat) but
echoes the request's credentials everywhere it can — answers, error bodies, headers, model ids, in every
encoding a gateway or a log formatter might apply — and can stream forever, trickle its body, or send a
huge answer, on any of its routes (the routes here answer whatever they are asked, so one serves any path).

The encoders here are written independently of `prober.text.scrub` (plain stdlib calls), so a test that checks
the scrubber against them checks it against what servers do, not against itself."""

from __future__ import annotations

import base64
import binascii
import html
import itertools
import json
import re
import select
import struct
import threading
import zlib
from collections.abc import Callable
from functools import cache
from typing import Any
from urllib.parse import unquote

from prober.targets.bounds import Size
from tests.support.shaped import Reply, Seen, ShapedServer, sse
from tests.support.waiting import wait_for

CONTEXT, POOL = 2_048, 1_024
LIMIT = min(CONTEXT - 1, POOL - 1) - 5  # SGLang's max_req_input_len


def count(text: str) -> int:
    """The engine's tokenizer: whitespace-separated words."""
    return len(text.split())


def _prompt(body: dict[str, Any]) -> str:
    return " ".join(str(m.get("content", "")) for m in body.get("messages", [])) or str(body.get("prompt", ""))


def _auth(seen: Seen) -> str:
    return seen.headers.get("authorization", "")


def answer(text: str, prompt_tokens: int) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "model": "echo",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 8, "total_tokens": prompt_tokens + 8}}


ChatRoute = Callable[[Reply, Seen], None]

# Each encoder turns a credential into what a careless server might print.  `embed` ones hide it inside a
# longer string (as `Authorization: Bearer KEY` or Basic `user:KEY` would be), at every byte alignment.
ENCODERS: dict[str, Callable[[str], str]] = {
    "raw": lambda k: k,
    "upper": str.upper,
    "lower": str.lower,
    "swapcase": str.swapcase,
    "reversed": lambda k: k[::-1],
    "reversed-upper": lambda k: k[::-1].upper(),
    "spaced": " ".join,
    "dashed": "-".join,
    "dotted": ". ".join,
    "zero-width": "\u200b".join,
    "hex": lambda k: k.encode().hex(),
    "hex-upper": lambda k: k.encode().hex().upper(),
    "hex-colons": lambda k: binascii.hexlify(k.encode(), ":").decode(),
    "percent": lambda k: "".join(f"%{b:02X}" for b in k.encode()),
    "percent-lower": lambda k: "".join(f"%{b:02x}" for b in k.encode()),
    "entities-decimal": lambda k: "".join(f"&#{ord(c)};" for c in k),
    "entities-hex": lambda k: "".join(f"&#x{ord(c):X};" for c in k),
    "u-escapes": lambda k: "".join(f"\\u{ord(c):04x}" for c in k),
    "json-ascii": lambda k: json.dumps(k, ensure_ascii=True)[1:-1],
    "base64": lambda k: base64.b64encode(k.encode()).decode(),
    "base64url": lambda k: base64.urlsafe_b64encode(k.encode()).decode().rstrip("="),
    "base64-bearer": lambda k: base64.b64encode(f"Bearer {k}".encode()).decode(),
    "base64url-bearer": lambda k: base64.urlsafe_b64encode(f"Bearer {k}".encode()).decode(),
    "base64-basic": lambda k: base64.b64encode(f"tenant:{k}".encode()).decode(),
    "base64-basic-1": lambda k: base64.b64encode(f"ops1:{k}".encode()).decode(),
    "base64-basic-2": lambda k: base64.b64encode(f"ops12:{k}".encode()).decode(),
    "base64url-basic": lambda k: base64.urlsafe_b64encode(f"u:{k}".encode()).decode(),
    "base64-mime": lambda k: base64.encodebytes(f"Authorization: Bearer {k}".encode() * 3).decode(),
    "base64-of-header-line": lambda k: base64.b64encode(f"Authorization: Bearer {k}\r\n".encode()).decode(),
}


def echoes(secret: str) -> dict[str, str]:
    """Every encoding of `secret` (a bare key or a whole `Bearer KEY` header value: both are echoed)."""
    key = secret.removeprefix("Bearer ")
    return {name: encode(key) for name, encode in ENCODERS.items()}


def _fingerprints(key: str) -> tuple[list[str], list[str]]:
    """Substrings that betray `key` even where only part of an echo was masked: the middle of the key folded
    (case and separators ignored) and reversed, to look for in folded text; and for each base64 alignment a
    stretch of the middle of its base64 and base64url, to look for in text without whitespace."""
    middle = re.sub(r"[\W_]", "", key[len(key) // 4 : len(key) - len(key) // 4]).lower()
    cores = []
    for prefix in ("", "u", "us"):
        encoded = base64.b64encode((prefix + key).encode()).decode()
        core = encoded[len(encoded) // 4 : len(encoded) - len(encoded) // 4]
        cores += [core, core.replace("+", "-").replace("/", "_")]
    return [middle, middle[::-1]], cores


def key_traces(data: str | bytes, keys: list[str]) -> list[str]:
    """Which encodings of which keys `data` holds: a whole echo, or a fingerprint after undoing the escapes
    and separators a reader could undo."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    plain = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), html.unescape(unquote(text)))
    folded = re.sub(r"[\W_\u200b]", "", plain).lower()
    nows = re.sub(r"\s", "", plain)
    traces = []
    for n, key in enumerate(keys):
        traces += [f"the {name} echo of key {n}" for name, echo in echoes(key).items() if echo in text]
        in_folded, in_base64 = _fingerprints(key)
        traces += [f"key {n} (folded)" for f in in_folded if f in folded]
        traces += [f"key {n} (base64)" for f in in_base64 if f in nows]
    return traces


def assert_no_key(where: str, data: str | bytes, keys: list[str]) -> None:
    traces = key_traces(data, keys)
    assert not traces, f"{where} holds {', '.join(traces)}"


def echoing_chat(reply: Reply, seen: Seen) -> None:
    """Echo the Authorization header in the answer, or in the error body above the limit."""
    body = seen.json()
    prompt = _prompt(body)
    n = count(prompt)
    leak = f"debug: your request carried Authorization: {_auth(seen)}"
    if n >= LIMIT:
        reply.send(400, {"object": "error", "message": f"Input length ({n} tokens) exceeds the maximum. {leak}",
                         "type": "BadRequestError", "code": 400}, headers={"X-Debug-Auth": _auth(seen)})
        return
    if body.get("stream"):
        reply.start_stream()
        reply.write(sse({"choices": [{"index": 0, "delta": {"content": f"Quoting: {leak}"}, "finish_reason": None}]}))
        reply.write(sse({"choices": [], "usage": {"prompt_tokens": n, "completion_tokens": 8}}))
        reply.write(sse("[DONE]"))
        return
    reply.send(200, answer(f"Quoting the document: {prompt.split(chr(10))[0][:200]}. {leak}", n),
               headers={"X-Debug-Auth": _auth(seen)})


def every_echo(seen: Seen) -> str:
    """The caller's credentials in every encoding, one per line (what the echoing routes print)."""
    return "\n".join(f"{name}: {echo}" for name, echo in echoes(_auth(seen)).items())


def echo_headers(seen: Seen) -> dict[str, str]:
    """Every encoding that fits in an HTTP header value (latin-1, one line)."""
    return {f"X-Echo-{name}": echo for name, echo in echoes(_auth(seen)).items()
            if echo.isascii() and "\n" not in echo}


def echoing_every_status() -> ChatRoute:
    """Answers in turn 200, 400, 500, 401, 200, ... each carrying every encoding of the caller's key in its
    body and headers; above the input limit, a 400 that does the same."""
    statuses = itertools.cycle([200, 400, 500, 200, 401])
    lock = threading.Lock()

    def route(reply: Reply, seen: Seen) -> None:
        body = seen.json()
        n = count(_prompt(body))
        with lock:
            status = 400 if n >= LIMIT else next(statuses)
        if status != 200:
            reply.send(status, {"object": "error", "message": f"request refused; it carried\n{every_echo(seen)}",
                                "type": "BadRequestError", "code": status}, headers=echo_headers(seen))
            return
        text = f"Quoting the document: {_prompt(body).split(chr(10))[0][:200]}.\n{every_echo(seen)}"
        if body.get("stream"):
            reply.start_stream()
            for line in text.splitlines(keepends=True):
                reply.write(sse({"choices": [{"index": 0, "delta": {"content": line}, "finish_reason": None}]}))
            reply.write(sse({"choices": [], "usage": {"prompt_tokens": n, "completion_tokens": 8}}))
            reply.write(sse("[DONE]"))
            return
        reply.send(200, answer(text, n), headers=echo_headers(seen))
    return route


# How late a cut may come on a busy machine: the client's timer, then this server's thread, each waiting for a CPU
# (seen: up to 2.7 s, at a load of about 15 on 2 cores); far below any later bound that would otherwise end it.
LATE_S = 5.0


def answer_bound_s(seen: Seen, timeout_s: float) -> float:
    """How long leakprobe reads this request's answer after its first byte (prober/targets/bounds.py): max_tokens at
    the decode floor on top of min(timeout_s, 30 s); for a request that generates nothing, the latter alone."""
    body = seen.json() if seen.body else {}
    return Size(max_tokens=int(body.get("max_tokens") or 0) if isinstance(body, dict) else 0).answer_s(timeout_s)


def hung_up(requests: list[Seen]) -> list[Seen]:
    """The requests, once the engine has seen the client hang up on each (the client has exited: at once)."""
    assert requests, "no request reached the route"
    wait_for(lambda: all(r.ended is not None for r in requests), "the engine to see every cut request hung up",
             idle_s=30)
    return requests


def assert_cut_in_time(requests: list[Seen], timeout_s: float) -> None:
    """Each request to a route that answers at once and never finishes was cut (the client hung up) within its own
    bound: the engine's side of the clock, which counts no time spent starting leakprobe or writing its report."""
    hung_up(requests)
    late = [(r.path, round(r.held_s or 0, 2), answer_bound_s(r, timeout_s)) for r in requests
            if (r.held_s or 0) > answer_bound_s(r, timeout_s) + LATE_S]
    assert not late, f"held past their bounds (path, seconds, bound): {late}"


def endless_stream(reply: Reply, seen: Seen) -> None:
    """One SSE chunk a second, forever (until the client hangs up), whether a stream was asked for or not."""
    reply.start_stream()
    try:
        while True:
            reply.write(sse({"choices": [{"index": 0, "delta": {"content": "still going "}, "finish_reason": None}]}))
            if reply.hung_up(1):
                return
    except OSError:
        return


def endless_json(reply: Reply, seen: Seen) -> None:
    """A JSON answer (`application/json`, no declared length) that never closes: a piece a second, no newline ever,
    whether a stream was asked for or not."""
    reply.start_stream(content_type="application/json")
    try:
        reply.write('{"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "')
        while True:
            reply.write("still going ")
            if reply.hung_up(1):
                return
    except OSError:
        return


def keepalive_only(reply: Reply, seen: Seen) -> None:
    """An SSE stream of keep-alive comments, a few a second, and never an event."""
    reply.start_stream()
    try:
        while True:
            reply.write(": keep-alive\n\n")
            if reply.hung_up(0.2):
                return
    except OSError:
        return


def flooding_stream(reply: Reply, seen: Seen) -> None:
    """Text pieces as fast as the socket takes them, forever: far more than any max_tokens."""
    reply.start_stream()
    piece = sse({"choices": [{"index": 0, "delta": {"content": "more "}, "finish_reason": None}]}) * 50
    try:
        while True:
            reply.write(piece)
    except OSError:
        return


def refusing_everything(reply: Reply, seen: Seen) -> None:
    """A gateway that knows no such model: 400 to every prompt, whatever its length."""
    reply.send(400, {"error": {"message": "The model `default` does not exist.", "type": "invalid_request_error",
                               "code": "model_not_found"}})


def implausible_usage(prompt_tokens: int) -> ChatRoute:
    """Answers as usual, but reports `prompt_tokens` as its usage."""
    def route(reply: Reply, seen: Seen) -> None:
        reply.send(200, answer("A summary of the document.", prompt_tokens))
    return route


def trickling_body(reply: Reply, seen: Seen) -> None:
    """A plain answer whose body arrives a byte every half second."""
    data = json.dumps(answer("slow", 5)).encode()
    reply.handler.send_response(200)
    reply.handler.send_header("Content-Type", "application/json")
    reply.handler.send_header("Content-Length", str(len(data)))
    reply.handler.end_headers()
    try:
        for byte in data:
            reply.write(bytes([byte]))
            if reply.hung_up(0.5):
                return
    except OSError:
        return


def huge_first_answer(size: int) -> ChatRoute:
    """The first answer to a prompt that carries a canary (the probe shape's first control; the path's measurements
    before it carry none) is `size` bytes of bulk text, its length not declared, written a megabyte at a time;
    the rest echo."""
    served = threading.Event()

    def route(reply: Reply, seen: Seen) -> None:
        if served.is_set() or "LPK-" not in _prompt(seen.json()):
            echoing_chat(reply, seen)
            return
        served.set()
        filler = ("The quarterly ledger lists lumber, twine and lamp oil for the valley depot. " * (size // 78 + 1))
        data = json.dumps(answer(filler[:size], count(_prompt(seen.json())))).encode()
        reply.start_stream(content_type="application/json")
        try:
            for at in range(0, len(data), 1 << 20):
                reply.write(data[at : at + (1 << 20)])
        except OSError:
            return
    return route


@cache
def gzip_of_zeros(size: int, block: int = 16 * 1024 * 1024) -> bytes:
    """A gzip member of `size` zero bytes, built in seconds: one deflate block of `block` zeros (fully flushed,
    so it is the same bytes each time) repeated, then the end block and the gzip trailer."""
    assert size % block == 0
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    zeros = bytes(block)
    chunk = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size // block):
        crc = zlib.crc32(zeros, crc)
    end = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS).flush()
    return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + chunk * (size // block) + end
            + struct.pack("<II", crc, size & 0xFFFFFFFF))


def compressed_answer(body: bytes, encoding: str) -> ChatRoute:
    """Every chat answer is `body` as sent, with this Content-Encoding (a bomb, when `body` is one)."""
    def route(reply: Reply, seen: Seen) -> None:
        reply.send(200, body, headers={"Content-Encoding": encoding})
    return route


def declared_but_stalled(length: int) -> ChatRoute:
    """Declares a body of `length` bytes, sends its first bytes, then nothing until the client hangs up."""
    def route(reply: Reply, seen: Seen) -> None:
        reply.handler.send_response(200)
        reply.handler.send_header("Content-Type", "application/json")
        reply.handler.send_header("Content-Length", str(length))
        reply.handler.end_headers()
        try:
            reply.write(b'{"choices": [{"message": {"content": "')
            select.select([reply.handler.connection], [], [], 120)  # readable: the client hung up
        except OSError:
            return
    return route


def hostile_engine(chat: ChatRoute = echoing_chat, **hostile: ChatRoute) -> ShapedServer:
    """`hostile`: routes to replace by name (`completions`, `tokenize`, `metrics`, `server_info`, `models`); the
    completions route is absent unless given."""
    def models(reply: Reply, seen: Seen) -> None:
        reply.send(200, {"object": "list", "data": [{"id": f"echo {_auth(seen)}", "max_model_len": CONTEXT,
                                                     "owned_by": every_echo(seen)}]},
                   headers={"X-Debug-Auth": _auth(seen), **echo_headers(seen)})

    def server_info(reply: Reply, seen: Seen) -> None:
        reply.send(200, {"context_length": CONTEXT, "max_total_num_tokens": POOL, "max_req_input_len": LIMIT,
                         "page_size": 1, "model_path": _auth(seen), "debug": every_echo(seen)})

    def tokenize(reply: Reply, seen: Seen) -> None:
        body = seen.json()
        text = _prompt(body)
        reply.send(200, {"count": count(text), "tokens": list(range(count(text))), "echo": _auth(seen)})

    def metrics(reply: Reply, seen: Seen) -> None:
        lines = "".join(f"# {line}\n" for line in every_echo(seen).splitlines())
        reply.send(200, f"# {_auth(seen)}\n{lines}sglang:num_aborted_requests_total 0\n", content_type="text/plain")

    routes = {"models": models, "server_info": server_info, "tokenize": tokenize, "metrics": metrics, **hostile}
    paths = {"models": "GET /v1/models", "server_info": "GET /server_info", "tokenize": "POST /v1/tokenize",
             "metrics": "GET /metrics", "completions": "POST /v1/completions"}
    return ShapedServer({paths[name]: route for name, route in routes.items()} | {"POST /v1/chat/completions": chat})
