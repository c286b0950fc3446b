"""The `leakprobe` command line.  Each command is a thin shell over a library call."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer

from prober import __version__

app = typer.Typer(
    name="leakprobe",
    help="Catch one tenant's data in another tenant's LLM answer.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
testbed_app = typer.Typer(help="The reference multi-tenant paged-KV engine (a real HTTP target).",
                          no_args_is_help=True)
app.add_typer(testbed_app, name="testbed")

EXIT_ERROR = 2


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_ERROR)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"leakprobe {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """leakprobe: a semantic cross-tenant leakage detector and canary prober."""


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
    from prober.testbed import ConfigError, TestbedServer, build_config, load_config_file

    try:
        file_preset, overrides = load_config_file(config) if config else (None, {})
        if tenant:
            overrides["tenants"] = dict(_split_pair(item) for item in tenant)
        cfg = build_config(preset or file_preset or "incident", overrides)
    except (ConfigError, ValueError) as exc:
        raise _fail(str(exc)) from None
    server = TestbedServer(cfg, host=host, port=port)
    try:
        server.start()
    except (OSError, RuntimeError) as exc:
        raise _fail(f"cannot listen on {host}:{port}: {exc}") from None
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
        raise ValueError("expected NAME=VALUE")
    return name, value


@app.command()
def demo() -> None:
    """Reproduce the incident on the reference engine and show the leaked text."""
    from prober.demo import run_demo

    raise typer.Exit(run_demo())


def main() -> None:
    app()
