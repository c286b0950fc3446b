"""`leakprobe testbed serve`: the reference engine as a real HTTP target."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer

from prober.cli.app import fail, testbed_app
from prober.errors import EngineConfigError


@testbed_app.command("serve")
def testbed_serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind (0 = any free port).")] = 8000,
    preset: Annotated[str | None, typer.Option(help="incident | fixed | healthy (default incident).")] = None,
    tenant: Annotated[list[str] | None, typer.Option(
        help="NAME=API_KEY, repeatable. Default: tenant-a=testbed-key-a, tenant-b=testbed-key-b.")] = None,
    config: Annotated[Path | None, typer.Option(help="YAML file: `preset` plus engine keys.")] = None,
) -> None:
    """Serve the reference engine until interrupted; prints the URL it listens on."""
    from prober.testbed import TestbedServer, build_config, load_config_file

    file_preset, overrides = load_config_file(config) if config else (None, {})
    if tenant:
        overrides["tenants"] = dict(_split_pair(item) for item in tenant)
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
        server.wait()
    except KeyboardInterrupt:
        server.stop()


def _split_pair(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name or not value:
        raise EngineConfigError(f"--tenant {item!r}: expected NAME=VALUE (a tenant and its API key)")
    return name, value
