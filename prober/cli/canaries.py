"""`leakprobe canaries mint`: canaries minted by hand (for a drill, or to plant in a system of your own)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from prober.cli.app import canaries_app, print_table
from prober.cli.options import Format, OutputFormat, RequiredLedger
from prober.embeddings import DEFAULT_MODEL
from prober.types import CanaryKind


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
             "expires_at": c.expires_at, **({"slots": list(c.slots)} if c.slots else {})} for c in minted]
    if output_format is OutputFormat.json:
        typer.echo(json.dumps(rows, ensure_ascii=False, indent=2))
    else:
        print_table(["id", "tenant", "kind", "text"], [[c.id, c.tenant, c.kind.value, c.text] for c in minted])
