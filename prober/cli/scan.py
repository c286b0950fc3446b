"""`leakprobe scan`: the forensic log audit over recorded answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from prober.cli.app import app, fail, print_table
from prober.cli.options import Format, OutputFormat, RequiredLedger
from prober.embeddings import DEFAULT_MODEL


@app.command()
def scan(
    inputs: Annotated[list[str], typer.Argument(
        help="JSONL files ({id, tenant, text, prompt?} per line), .jsonl.gz, or - for standard input.")],
    ledger: RequiredLedger,
    output_format: Format = OutputFormat.table,
    semantic: Annotated[bool, typer.Option(help="Also look for paraphrased facts (loads a model).")] = True,
    model: Annotated[str, typer.Option(help="Embedding model (name or path).")] = DEFAULT_MODEL,
    threshold: Annotated[float | None, typer.Option(
        min=0.01, max=1.0, help="Paraphrase cosine threshold (default: the model's measured one).")] = None,
    tenant: Annotated[list[str] | None, typer.Option(
        help="Tenant names that MAC-verified tokens are attributed to, beyond the ledger's.")] = None,
    redact: Annotated[bool, typer.Option(help="Mask text around matches in excerpts.")] = True,
    strict: Annotated[bool, typer.Option(help="Exit 2 when any line could not be read as a record.")] = False,
    workers: Annotated[int, typer.Option(min=1, max=256, help="Scanning processes, each with its own copy of "
                                         "the canary index (and model); try one per CPU for large logs.")] = 1,
) -> None:
    """Forensic log audit: scan recorded answers for other tenants' canaries.

    Exit 0 clean, 1 findings, 2 when nothing (or, with --strict, not everything) could be checked."""
    from prober.canaries.keys import resolve_key
    from prober.detect import CanarySet, Scanner
    from prober.embeddings import make_embedder
    from prober.ledger import open_ledger
    from prober.oneshot.forensics import scan_inputs
    from prober.oneshot.progress import ScanProgress

    for name in inputs:
        if name != "-" and not Path(name).is_file():
            raise fail(f"{name}: no such file")
    if ledger.path is not None and not ledger.path.is_file():
        raise fail(f"{ledger}: no such ledger")
    store = open_ledger(ledger)
    try:
        embedder = make_embedder(model, threshold=threshold) if semantic else None
        scanner = Scanner(CanarySet(store.active_canaries(), key=resolve_key(store), tenants=tenant or ()),
                          prompts=store.prompt_shingles(), embedder=embedder, redact=redact)
        plain = all(name != "-" and not name.endswith(".gz") for name in inputs)
        with ScanProgress(sum(Path(n).stat().st_size for n in inputs) if plain else None) as progress:
            report = scan_inputs(inputs, scanner, store, workers=workers, progress=progress)
    finally:
        store.close()
    for problem in report.errors:
        typer.echo(f"warning: {problem}", err=True)
    if output_format is OutputFormat.json:
        typer.echo(json.dumps(report.to_json(), ensure_ascii=False, indent=2))
    else:
        print_table(["record", "kind", "detector", "severity", "victim", "observer", "canary", "score"],
                    [[f.record_id, f.kind.value, f.detector, f.severity.label, f.victim_tenant or "-",
                      f.observer_tenant, f.canary_id or "-", f"{f.score:.3f}"] for f in report.findings])
    typer.echo(f"{report.scanned:,} records scanned, {report.skipped:,} lines skipped ({report.invalid:,} not "
               f"records, {report.oversized:,} too large to read), {len(report.findings):,} findings, "
               f"{report.own_echoes:,} own canaries echoed (positive controls)", err=True)
    code = report.exit_code(strict=strict)
    if code == 2:
        why = ("no record could be read" if report.scanned == 0 else
               "some records were too large to read" if report.oversized else
               "an input could not be read to its end" if report.unfinished else "some lines were skipped (--strict)")
        typer.echo(f"error: {why}: the input was not fully checked", err=True)
    raise typer.Exit(code)
