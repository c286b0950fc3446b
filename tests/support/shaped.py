"""Small real HTTP servers on loopback, shaped like an engine's answer or like a fault.

Each route is a function of the request that writes whatever bytes it likes to the socket, so truncated
streams, bad encodings, stalls and redirects are real network behaviour, not patched client code.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    port: int = 0  # the client's: which connection the request came on
    arrived: float = field(default_factory=time.time)  # when its headers and body had been read (wall clock)
    ended: float | None = None  # when its route returned: for a route that answers until the client hangs up, then

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def held_s(self) -> float | None:
        """How long the route was on it: for a never-ending answer, how long the client read before it hung up."""
        return None if self.ended is None else self.ended - self.arrived


Handler = Callable[["Reply", Seen], None]


class Reply:
    """What a route uses to answer: whole responses, or raw writes for misbehaviour."""

    def __init__(self, handler: BaseHTTPRequestHandler, closing: threading.Event) -> None:
        self.handler = handler
        self._closing = closing

    def hung_up(self, wait_s: float) -> bool:
        """Wait up to `wait_s` (instead of a sleep between writes) and say whether the client hung up meanwhile: a
        route that answers until then returns as it happens, so `Seen.ended` is when the client cut the answer."""
        connection = self.handler.connection
        if not select.select([connection], [], [], wait_s)[0]:
            return False
        try:
            if connection.recv(1, socket.MSG_PEEK):  # more from the client (not a hang-up): wait out the time
                time.sleep(wait_s)
                return False
        except OSError:
            pass
        return True

    def hold(self) -> None:
        """Send nothing more until the server closes: a stall that outlasts any client timeout however slow the
        machine, without a sleep for the test to wait out."""
        self._closing.wait()

    def send(self, status: int, body: bytes | str | dict[str, Any] | list[Any] = b"",
             headers: dict[str, str] | None = None, content_type: str = "application/json") -> None:
        data = json.dumps(body).encode() if isinstance(body, dict | list) else (
            body.encode() if isinstance(body, str) else body)
        self.handler.send_response(status)
        self.handler.send_header("Content-Type", content_type)
        self.handler.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.handler.send_header(name, value)
        self.handler.end_headers()
        self.handler.wfile.write(data)

    def start_stream(self, status: int = 200, content_type: str = "text/event-stream") -> None:
        """A body of no declared length, written as it comes and ended by closing the connection."""
        self.handler.send_response(status)
        self.handler.send_header("Content-Type", content_type)
        self.handler.send_header("Connection", "close")
        self.handler.end_headers()
        self.handler.close_connection = True

    def write(self, data: bytes | str) -> None:
        self.handler.wfile.write(data.encode() if isinstance(data, str) else data)
        self.handler.wfile.flush()


@dataclass
class ShapedServer:
    routes: dict[str, Handler]
    seen: list[Seen] = field(default_factory=list)
    closing: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        routes, seen, closing = self.routes, self.seen, self.closing

        class _H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else each response waits ~40 ms for the client's delayed ACK

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                               self.rfile.read(length), self.client_address[1])
                seen.append(request)
                handler = routes.get(f"{self.command} {self.path.split('?')[0]}")
                if handler is None:
                    Reply(self, closing).send(404, {"detail": "Not Found"})
                    return
                try:
                    handler(Reply(self, closing), request)
                finally:
                    request.ended = time.time()

            do_GET = do_POST = _any

            def log_message(self, *args: Any) -> None:
                pass

        class _Server(ThreadingHTTPServer):
            # socketserver's listen backlog is 5: while this thread waits for the CPU on a busy machine, a
            # seventh connection in flight (introspection opens five at once, retries add more) gets no SYN-ACK
            # and meets the client's connect timeout.  The kernel completes queued handshakes by itself.
            request_queue_size = 128

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # the client hung up on a fault route: expected

        self._server = _Server(("127.0.0.1", 0), _H)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ShapedServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def sse(obj: dict[str, Any] | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def chat_answer(text: str, prompt_tokens: int = 5) -> dict[str, Any]:
    return {"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                                      "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2, "total_tokens": prompt_tokens + 2}}


def chat_chunk(text: str) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text},
                                                            "finish_reason": None}]}
