"""A real Redis for the tests, as operators run it: Debian's `redis-server` on a free loopback port, without
persistence, in a temporary directory, stopped after the test.  The tests read it back over RESP (a few lines,
below) rather than through a client library the project does not otherwise need.  Where `redis-server` is missing
they skip with how to get it, except under CI, where they fail."""

from __future__ import annotations

import contextlib
import io
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_port
from tests.support.tools import need, terminate
from tests.support.waiting import wait_for

Reply = str | int | list["Reply"] | None


@dataclass(frozen=True)
class RedisServer:
    host: str
    port: int

    def command(self, *words: str) -> Reply:
        """One command's reply; a Redis error raises RuntimeError."""
        request = f"*{len(words)}\r\n" + "".join(f"${len(w.encode())}\r\n{w}\r\n" for w in words)
        with socket.create_connection((self.host, self.port), timeout=5) as sock, sock.makefile("rb") as stream:
            sock.sendall(request.encode())
            return _read(stream)

    def key_names(self) -> list[str]:
        """Every key's name (the tests' Redis holds a few dozen at most)."""
        found = self.command("KEYS", "*")
        assert isinstance(found, list)
        return sorted(str(key) for key in found)


def _read(stream: io.BufferedReader) -> Reply:
    line = stream.readline().decode().rstrip("\r\n")
    kind, rest = line[:1], line[1:]
    if kind == "+":
        return rest
    if kind == "-":
        raise RuntimeError(f"redis: {rest}")
    if kind == ":":
        return int(rest)
    if kind == "$":
        return None if rest == "-1" else stream.read(int(rest) + 2)[:-2].decode(errors="replace")
    if kind == "*":
        return None if rest == "-1" else [_read(stream) for _ in range(int(rest))]
    raise RuntimeError(f"redis: unexpected reply {line!r}")


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[RedisServer]:
    """A fresh `redis-server` on loopback, its log and working directory in `folder`, answering PING."""
    binary = need("redis-server")
    folder.mkdir(parents=True, exist_ok=True)
    server = RedisServer("127.0.0.1", free_port())
    log = folder / "redis.log"
    process = subprocess.Popen([binary, "--bind", server.host, "--port", str(server.port), "--save", "",
                                "--appendonly", "no", "--dir", str(folder), "--logfile", str(log)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited {process.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            return server.command("PING") == "PONG"
        except OSError:
            return False
    try:
        wait_for(answers, "redis-server to answer PING", idle_s=30,
                 context=lambda: log.read_text(errors="replace")[-2000:] if log.exists() else "")
        yield server
    finally:
        terminate(process, grace_s=10)
