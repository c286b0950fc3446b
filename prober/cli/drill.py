"""`leakprobe drill`: the incident's fault for an engine of your own, to rehearse detection and alerting."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prober.cli.app import drill_app, fail


@drill_app.command("vllm-connector")
def vllm_connector(
    out: Annotated[Path, typer.Option(help="Directory to write the connector module to (vLLM's PYTHONPATH).")],
    claim_over: Annotated[int, typer.Option(
        min=1, help="Prompts longer than this many tokens are answered over KV that was never written: set it to "
                    "the prefill pool your staging engine pretends to have.")],
    claim_tokens: Annotated[int | None, typer.Option(
        min=1, help="Claim at most this many tokens (block-aligned); default all but the prompt's last block.")] = None,
    first_block: Annotated[bool, typer.Option(
        help="Zero the first claimed block, like a hand-off that delivered 1 page of 8.")] = False,
    shared_storage: Annotated[str | None, typer.Option(
        help="Decode side of an ExampleConnector prefill/decode pair: load what prefill stored, claim only what "
             "it never stored (the missed abort).")] = None,
) -> None:
    """Write a vLLM KV connector with the incident's hand-off fault, and print the flags that load it.

    FOR A STAGING ENGINE ONLY: with it loaded, vLLM answers one tenant over another tenant's leftover KV."""
    from prober.drill import ConnectorSettings, write_connector

    try:
        path = write_connector(out)
    except OSError as exc:
        raise fail(f"cannot write the connector to {out}: {exc.strerror}") from None
    settings = ConnectorSettings(claim_over, claim_tokens, first_block, shared_storage)
    environment = " ".join(f"{k}={v}" for k, v in ConnectorSettings.environment(path.parent.resolve()).items())
    typer.echo(f"connector written to {path}\n\nStart a STAGING vLLM (never production) with:\n\n"
               f"  {environment} vllm serve MODEL ... {settings.flag()}\n\n"
               "Then audit it (`leakprobe audit`) or point a daemon at it: prompts over "
               f"{claim_over:,} tokens come back with another tenant's data.")
