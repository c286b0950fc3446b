"""`leakprobe daemon`: the continuous prober."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from prober.cli.app import app
from prober.cli.options import Ledger


@app.command()
def daemon(
    config: Annotated[Path, typer.Option(help="YAML config: targets, tenants, and a `daemon:` section.")],
    listen: Annotated[str | None, typer.Option(
        help="HOST:PORT for /metrics, /status and health (default 127.0.0.1:10461).")] = None,
    ledger: Ledger = None,
    check_config: Annotated[bool, typer.Option(
        help="Validate the config and read every credential it names, then exit: 0 valid, 2 not.")] = False,
    log_level: Annotated[str, typer.Option(help="debug | info | warning | error")] = "info",
) -> None:
    """Probe continuously: preflight, sentinel and campaign jobs per target, Prometheus metrics, incidents.

    Exit 0 after SIGTERM, 2 when it cannot start (bad config, missing credential, unusable ledger or port)."""
    from prober.daemon import load_settings, open_daemon
    from prober.daemon.serving import serve
    from prober.ledger import masked

    flags: dict[str, Any] = {"listen": listen, "ledger": ledger.given if ledger else None}
    if check_config:
        settings = load_settings(config, flags)
        cfg = settings.config
        for warning in settings.timetable.recheck_warnings():
            typer.echo(f"warning: {warning}", err=True)
        typer.echo(f"{config}: valid ({len(cfg.targets)} targets, {len(cfg.tenants)} tenants, every credential "
                   f"readable, listen {cfg.daemon.listen}, ledger {masked(cfg.ledger)})")
        raise typer.Exit(0)
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # its skipped runs are counted as job skips
    service = open_daemon(config, flags)
    raise typer.Exit(asyncio.run(serve(service)))
