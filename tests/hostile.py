"""A hostile OpenAI-compatible engine on loopback: it answers like SGLang (server_info, tokenize, chat) but
echoes the request's credentials everywhere it can — answers, error bodies, headers, model ids — and can
stream forever, trickle its body, or send a huge answer."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.shaped import Reply, Seen, ShapedServer, sse

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


def endless_stream(reply: Reply, seen: Seen) -> None:
    """One SSE chunk a second, forever (until the client hangs up)."""
    reply.start_stream()
    try:
        while True:
            reply.write(sse({"choices": [{"index": 0, "delta": {"content": "still going "}, "finish_reason": None}]}))
            time.sleep(1)
    except OSError:
        return


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
            time.sleep(0.5)
    except OSError:
        return


def huge_first_answer(size: int) -> ChatRoute:
    """The first answer is `size` bytes of text (with another tenant's... nothing: just bulk); the rest echo."""
    served = threading.Event()

    def route(reply: Reply, seen: Seen) -> None:
        if served.is_set():
            echoing_chat(reply, seen)
            return
        served.set()
        filler = ("The quarterly ledger lists lumber, twine and lamp oil for the valley depot. " * (size // 78 + 1))
        reply.send(200, answer(filler[:size], count(_prompt(seen.json()))))
    return route


def hostile_engine(chat: ChatRoute = echoing_chat) -> ShapedServer:
    def models(reply: Reply, seen: Seen) -> None:
        reply.send(200, {"object": "list", "data": [{"id": f"echo {_auth(seen)}", "max_model_len": CONTEXT}]},
                   headers={"X-Debug-Auth": _auth(seen)})

    def server_info(reply: Reply, seen: Seen) -> None:
        reply.send(200, {"context_length": CONTEXT, "max_total_num_tokens": POOL, "max_req_input_len": LIMIT,
                         "page_size": 1, "model_path": _auth(seen)})

    def tokenize(reply: Reply, seen: Seen) -> None:
        body = seen.json()
        text = _prompt(body)
        reply.send(200, {"count": count(text), "tokens": list(range(count(text))), "echo": _auth(seen)})

    def metrics(reply: Reply, seen: Seen) -> None:
        reply.send(200, f"# {_auth(seen)}\nsglang:num_aborted_requests_total 0\n", content_type="text/plain")

    return ShapedServer({"GET /v1/models": models, "GET /server_info": server_info, "POST /v1/tokenize": tokenize,
                         "GET /metrics": metrics, "POST /v1/chat/completions": chat})
