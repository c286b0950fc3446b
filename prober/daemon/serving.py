"""The daemon behind a socket and the process's signals: SIGTERM and SIGINT stop it (in-flight requests get the
grace), SIGHUP reloads its config; uvicorn serves its app on the same loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator

import uvicorn

from prober.config.sections import listen_address
from prober.daemon.http import make_app
from prober.daemon.service import Daemon
from prober.domain.errors import StartupError

log = logging.getLogger("leakprobe.daemon")


async def serve(daemon: Daemon) -> int:
    """Serve until SIGTERM/SIGINT; raises StartupError when the listen address cannot be bound."""
    sock = bind(daemon.config.daemon.listen)
    for handler in logging.getLogger().handlers:
        handler.addFilter(daemon.log_filter)
    await daemon.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stop)
    loop.add_signal_handler(signal.SIGHUP, daemon.reload_in_background)
    server = _QuietServer(uvicorn.Config(make_app(daemon.endpoints), log_level="warning", access_log=False,
                                         lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="http")
    host, port = sock.getsockname()[:2]
    log.info("leakprobe daemon listening on http://%s:%d (targets: %s; ledger %s)",
             f"[{host}]" if ":" in host else host, port, ", ".join(t.name for t in daemon.config.targets),
             daemon.ledger.description)
    await daemon.stopping.wait()
    await daemon.shutdown()
    server.should_exit = True
    await asyncio.gather(serving, return_exceptions=True)
    log.info("stopped")
    return 0


BACKLOG = 2048  # uvicorn's


def bind(listen: str) -> socket.socket:
    """The listening socket (raises StartupError when the address cannot be bound)."""
    host, port = listen_address(listen)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Inherited by every accepted connection: without it a response written in two parts waits for
        # the client's delayed ACK (measured: 44 ms per /metrics request instead of under 1 ms).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        # Listening from here, before the HTTP task runs and the address is logged: a client that reads the log
        # line may connect at once, and is then queued (a bound socket that does not listen refuses it).
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    return sock


class _QuietServer(uvicorn.Server):
    """uvicorn on the daemon's loop without its own signal handlers: the daemon owns SIGTERM and SIGHUP."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
