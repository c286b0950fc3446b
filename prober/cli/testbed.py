"""`leakprobe testbed serve`: the reference engine as a real HTTP target."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from prober.cli.app import fail, testbed_app
from prober.domain.errors import EngineConfigError

if TYPE_CHECKING:
    from prober.testbed import TestbedServer


@testbed_app.command("serve")
def testbed_serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind (0 = any free port).")] = 8000,
    preset: Annotated[str | None, typer.Option(help="incident | fixed | healthy (default incident).")] = None,
    tenant_key: Annotated[list[str] | None, typer.Option(
        help="NAME=API_KEY: a tenant and the key it sends, repeatable (the engine's side of `audit --tenant "
             "NAME=ENVVAR`). Default: tenant-a=testbed-key-a, tenant-b=testbed-key-b.")] = None,
    config: Annotated[Path | None, typer.Option(help="YAML file: `preset` plus engine keys.")] = None,
    model: Annotated[str | None, typer.Option(
        help="quoter (default, fast) | gemma3-270m: a real language model over real K/V pages (the lm extra).")] = None,
) -> None:
    """Serve the reference engine until interrupted; prints the URL it listens on."""
    from prober.testbed import TestbedServer, build_config, load_config_file

    file_preset, overrides = load_config_file(config) if config else (None, {})
    if tenant_key:
        overrides["tenants"] = dict(_split_pair(item) for item in tenant_key)
    if model:
        overrides["model"] = model
    cfg = build_config(preset or file_preset or "incident", overrides)
    server = TestbedServer(cfg, host=host, port=port)
    try:
        server.start()
    except (OSError, RuntimeError) as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc}") from None
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    typer.echo(f"leakprobe testbed ({cfg.mode}, context {cfg.context_length:,}, pool {cfg.pool_tokens:,}, "
               f"tenants: {', '.join(cfg.tenants)}) listening on {server.url}/v1", err=True)
    typer.echo(f"{server.url}/v1")
    try:
        _await_model(server)
        server.wait()
    except KeyboardInterrupt:
        server.stop()


def _await_model(server: TestbedServer) -> None:
    """A real model loads while the port already answers (/health: 503 until it is ready)."""
    from prober.testbed.backend import ModelState

    backend, started = server.engine.backend, time.monotonic()
    loading = backend.state is ModelState.LOADING
    if loading:
        typer.echo(f"loading {backend.name} (the first run on a machine converts it: a few minutes)", err=True)
    while backend.wait(0.5) is ModelState.LOADING and server.running:
        pass
    if backend.state is ModelState.FAILED:
        server.stop()
        raise fail(str(backend.error))
    if loading:
        typer.echo(f"{backend.name} ready in {time.monotonic() - started:.0f} s", err=True)


def _split_pair(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name or not value:
        raise EngineConfigError(f"--tenant-key {item!r}: expected NAME=API_KEY (a tenant and its API key)")
    return name, value
