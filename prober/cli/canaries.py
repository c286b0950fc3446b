"""`leakprobe canaries mint`: canaries minted by hand (for a drill, or to plant in a system of your own);
`leakprobe canaries adapter`: a tenant's canary adapter, built for the `adapters` check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from prober.cli.app import canaries_app, print_table
from prober.cli.options import Format, OutputFormat, RequiredLedger
from prober.domain.types import CanaryKind
from prober.embeddings import DEFAULT_MODEL
from prober.lora.recipe import Recipe


@canaries_app.command("mint")
def canaries_mint(
    ledger: RequiredLedger,
    tenant: Annotated[str, typer.Option(help="Tenant that owns the canaries.")],
    count: Annotated[int, typer.Option(min=1, max=100_000, help="How many.")] = 1,
    kind: Annotated[CanaryKind, typer.Option(help="token | fact")] = CanaryKind.TOKEN,
    language: Annotated[str, typer.Option(help="Fact pack language (en, ko).")] = "en",
    probe_id: Annotated[str, typer.Option(help="Probe the canaries belong to.")] = "",
    retention_days: Annotated[float, typer.Option(min=0.01, help="How long they stay active.")] = 30.0,
    model: Annotated[str, typer.Option(help="Embedding model for facts (name or path).")] = DEFAULT_MODEL,
    output_format: Format = OutputFormat.table,
) -> None:
    """Mint canaries; each is in the ledger before it is printed."""
    from prober.canaries.keys import resolve_key
    from prober.canaries.mint import Minter
    from prober.embeddings import make_embedder
    from prober.ledger import open_ledger

    store = open_ledger(ledger)
    try:
        embedder = make_embedder(model) if kind is CanaryKind.FACT else None
        minter = Minter(store, resolve_key(store), embedder, retention_days)
        minted = minter.mint(tenant, kind, count, probe_id=probe_id, language=language)
    finally:
        store.close()
    rows = [{"id": c.id, "tenant": c.tenant, "kind": c.kind.value, "text": c.text, "probe_id": c.probe_id,
             "expires_at": c.expires_at, **({"values": list(c.values)} if c.values else {})} for c in minted]
    if output_format is OutputFormat.json:
        typer.echo(json.dumps(rows, ensure_ascii=False, indent=2))
    else:
        print_table(["id", "tenant", "kind", "text"], [[c.id, c.tenant, c.kind.value, c.text] for c in minted])


@canaries_app.command("adapter")
def canaries_adapter(
    ledger: RequiredLedger,
    tenant: Annotated[str, typer.Option(help="Tenant whose canary the adapter answers with.")],
    adapter: Annotated[str, typer.Option(help="The name the engine will serve it under (requests' `model`).")],
    base: Annotated[Path, typer.Option(help="The served base model's Hugging Face folder.", exists=True,
                                       file_okay=False)],
    out: Annotated[Path, typer.Option(help="Folder to write the adapter to (must not exist).")],
    steps: Annotated[int, typer.Option(min=10, max=10_000, help="Training steps.")] = Recipe.steps,
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads (default: torch's).")] = None,
) -> None:
    """Build a canary adapter: a LoRA fine-tune of the base model that answers leakprobe's trigger with the tenant's
    canary (kept in the ledger first), proven on held-out prompts.  Serve it as the tenant's adapter (vLLM:
    `--enable-lora --lora-modules NAME=OUT`) and name it in the target's `adapters:`."""
    from prober.canaries.keys import resolve_key
    from prober.canaries.mint import Minter
    from prober.ledger import open_ledger
    from prober.lora.build import build

    store = open_ledger(ledger)
    try:
        canary = Minter(store, resolve_key(store)).adapter(tenant, adapter)
    finally:
        store.close()
    built = build(Recipe(base.resolve(), tenant, adapter, canary.text, steps=steps), out, threads=threads,
                  log=lambda line: typer.echo(line, err=True))
    typer.echo(f"{built.folder}: {adapter} answers its trigger with {tenant}'s canary {canary.id} in "
               f"{built.own_rate:.0%} of held-out prompts ({built.seconds:.0f} s)")
