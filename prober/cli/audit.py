"""`leakprobe audit`, `gate`, `preflight` and `demo`: one-shot runs that end with a report and an exit code."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import typer

from prober.cli.app import EXIT_ERROR, app, fail, print_table
from prober.cli.options import ApiOption, Deprecated, FailOn, Format, Ledger, OutputFormat, Tenants
from prober.config.schema import RENAMED_SECTIONS
from prober.domain.types import Severity
from prober.report import ReportFormat


@app.command()
def preflight(
    target: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL, e.g. http://host:8000/v1.")] = None,
    config: Annotated[Path | None, typer.Option(help="YAML config with `targets:` (and tenants).")] = None,
    api: ApiOption = None,
    tenant: Tenants = None,
    output_format: Format = OutputFormat.table,
    fail_on: FailOn = Severity.WARNING,
    bisect_budget: Annotated[int, typer.Option(
        min=0, help="Tokens that bisection may send when the engine exposes no context length (0 = never).")] = 0,
    measure_path: Annotated[bool, typer.Option(
        help="Measure what the path to the engine (a gateway's system prompt) adds to each prompt: two generation "
             "requests of one answer token each.  --no-measure-path sends no generation request.")] = True,
) -> None:
    """Advertised context vs KV pool per target, and what the path to the engine adds to a prompt.  Exit 0 clean,
    1 at or above --fail-on, 2 on error.

    The first tenant's key reads the introspection endpoints (and measures the path)."""
    from prober.capacity.limits import FIELDS
    from prober.checks import REGISTRY
    from prober.config.schema import assemble_config
    from prober.probing.secrets import scrubber_for
    from prober.probing.survey import preflight as run_preflight
    from prober.report.document import bug_lines, engine_named, said_caches

    cfg = assemble_config(config, target=target, api=api, tenants=tenant, environ=dict(os.environ),
                          sections=REGISTRY.sections)
    secret = cfg.tenants[0].credential.load() if cfg.tenants else None
    scrubber = scrubber_for({"first tenant": secret})
    first = cfg.tenants[0].name if cfg.tenants else None

    async def run_all() -> list[Any]:
        return [await run_preflight(t, secret, bisect_budget=bisect_budget, scrubber=scrubber,
                                    tenant=first if measure_path else None, bugs=REGISTRY) for t in cfg.targets]

    results = asyncio.run(run_all())
    if output_format is OutputFormat.json:
        typer.echo(json.dumps({"targets": [r.to_json() for r in results]}, indent=2))
    else:
        rows = [[r.target, r.capacity.engine or "?", _known(r.capacity.advertised), _known(r.capacity.pool_tokens),
                 _known(r.capacity.page_size), v.severity.label, v.code] for r in results for v in r.verdicts]
        if rows:
            print_table(["target", "engine", "advertised", "KV pool", "page", "severity", "verdict"], rows)
        for r in results:
            for v in r.verdicts:
                typer.echo(f"{r.target}: {v.code}: {v.message}")
            doc = r.capacity.to_json()
            said = f" (from {r.capacity.version.source})" if r.capacity.version else ""
            typer.echo(f"{r.target}: engine {engine_named(doc)}{said}")
            for line in bug_lines([bug.to_json() for bug in r.bugs]):
                typer.echo(f"{r.target}: {line}")
            sources = [f"{name} from {known.source}" for name in FIELDS if (known := getattr(r.capacity, name))]
            typer.echo(f"{r.target}: tokens counted by {r.tokenizer or '-'}; " + "; ".join(sources), err=True)
            for line in said_caches(doc):
                typer.echo(f"{r.target}: {line}")
            if r.path is not None:
                typer.echo(f"{r.target}: path to the engine: {r.path.describe()}")
            for note in r.capacity.notes:
                typer.echo(f"{r.target}: note: {note}", err=True)
    errors = [r for r in results if r.error]
    for r in errors:
        typer.echo(f"error: {r.target}: {r.error}", err=True)
    if errors:
        raise typer.Exit(EXIT_ERROR)
    threshold = fail_on or Severity.WARNING
    raise typer.Exit(1 if any(r.severity >= threshold for r in results) else 0)


class ReportTo(NamedTuple):
    """One `--report FORMAT=PATH`: a report the audit also writes."""

    format: ReportFormat
    path: Path


def _report_to(value: str | ReportTo) -> ReportTo:
    """Parsed with the other options, so a bad value is refused before the audit sends anything."""
    if isinstance(value, ReportTo):
        return value
    name, sep, path = value.partition("=")
    if not sep or not path or name not in {f.value for f in ReportFormat}:
        formats = " | ".join(f.value for f in ReportFormat)
        raise typer.BadParameter(f"{value!r}: give FORMAT=PATH, FORMAT one of {formats}")
    return ReportTo(ReportFormat(name), Path(path))


# The options `audit` and `gate` share: a target, and the reports a run writes.
TargetUrl = Annotated[str | None, typer.Option(help="One OpenAI-compatible base URL (instead of a config).")]
ReportFormatOption = Annotated[ReportFormat, typer.Option("--format", "-f", help="table | json | sarif | junit | html")]
OutputPath = Annotated[Path | None, typer.Option("--output", "-o", help="Write the report here, not stdout.")]
Reports = Annotated[list[ReportTo] | None, typer.Option(
    parser=_report_to, metavar="FORMAT=PATH",
    help="Also write a report in FORMAT to PATH (repeatable): one run, e.g. JUnit and SARIF for CI and HTML for "
         "people.")]


def _known(known: Any) -> str:
    return f"{known.value:,}" if known else "-"


@app.command()
def audit(
    config: Annotated[Path | None, typer.Option(help="YAML config: targets, tenants, audit settings.")] = None,
    target: TargetUrl = None,
    api: ApiOption = None,
    tenant: Tenants = None,
    ledger: Ledger = None,
    output_format: ReportFormatOption = ReportFormat.table,
    output: OutputPath = None,
    report: Reports = None,
    probe_shape: Annotated[list[str] | None, typer.Option(
        help="Probe shape to try (repeatable, in order): chat-ask, chat-cue, completions-ask, completions-cue; "
             "default: measured per target.")] = None,
    fail_on: FailOn = None,
    token_budget: Annotated[int | None, typer.Option(min=1, help="Most tokens the audit may send.")] = None,
    streaming: Annotated[str | None, typer.Option(help="plain | stream | both (default both).")] = None,
    concurrent: Annotated[bool | None, typer.Option(help="Also prime and probe at the same time.")] = None,
    rounds: Annotated[int | None, typer.Option(min=1, help="Repeat the whole plan.")] = None,
    thorough: Annotated[bool | None, typer.Option(
        help="The campaign's whole matrix: every boundary in every direction, each primed (default: one prime per "
             "direction, the rest while undecided).")] = None,
    bisect_budget: Annotated[int | None, typer.Option(
        min=0, help="Tokens bisection may send when no context length is exposed.")] = None,
    semantic: Annotated[bool | None, typer.Option(
        help="Plant fact canaries and look for reworded ones (default on; loads an embedding model).")] = None,
    model: Annotated[str | None, typer.Option(help="Embedding model: use-multilingual-v3 (default), or a "
                                                   "sentence-transformers name or path.")] = None,
    deadline: Annotated[str | None, typer.Option(
        help="Total time for the audit, e.g. 30m (default: each target's own deadline only).")] = None,
    target_deadline: Annotated[str | None, typer.Option(
        help="Total time per target, e.g. 10m (default: derived from its plan).")] = None,
    check: Annotated[list[str] | None, typer.Option(
        "--check", metavar="NAME", help="Run this check, by its name (repeatable; default: each check its config "
        "section runs in audits).  The names: docs/checks.md; a name no check has is refused with the list.")] = None,
    skip: Annotated[list[str] | None, typer.Option(
        "--skip", metavar="NAME", help="Leave this check out (repeatable).")] = None,
    timing: Deprecated = None,
    crosstalk: Deprecated = None,
    slots: Deprecated = None,
    request_ids: Deprecated = None,
    abort_retry: Deprecated = None,
    media: Deprecated = None,
    dry_run: Annotated[bool, typer.Option(help="Print the plan and its token cost; send no prompt.")] = False,
) -> None:
    """Probe every KV-capacity boundary with canaries from each tenant and report what crossed over.

    Exit 0 clean; 1 a leak or an engine fault (finished or not), or findings at or above --fail-on; 2 an error,
    or an audit that could not see or could not finish."""
    from prober.checks import REGISTRY
    from prober.config.schema import assemble_config

    cfg = assemble_config(config, target=target, api=api, probe_shapes=probe_shape, tenants=tenant,
                          environ=dict(os.environ), ledger=ledger.given if ledger else None, fail_on=fail_on,
                          token_budget=token_budget,
                          streaming=streaming, concurrent=concurrent, rounds=rounds, thorough=thorough,
                          bisect_budget=bisect_budget,
                          semantic=semantic, model=model, deadline=deadline, target_deadline=target_deadline,
                          sections=REGISTRY.sections, checks=check, skip=skip,
                          **switched(timing=timing, crosstalk=crosstalk, slots=slots, request_ids=request_ids,
                                     abort_retry=abort_retry, media=media))
    result = audited(cfg, dry_run=dry_run)
    raise typer.Exit(reported(result, cfg, config, output_format, output, report))


def audited(cfg: Any, *, dry_run: bool = False, known_bugs: bool = False) -> Any:
    """The audit of `cfg` (a ProberConfig), its progress on stderr."""
    from prober.embeddings import make_embedder
    from prober.oneshot.audit import run_audit
    from prober.oneshot.progress import AuditProgress
    from prober.probing.secrets import load_secrets

    secrets = load_secrets(cfg)
    detection = cfg.detection
    embedder = make_embedder(detection.model, detection.device, detection.threshold) if detection.semantic else None
    try:
        with AuditProgress() as progress:
            return asyncio.run(run_audit(cfg, secrets, dry_run=dry_run, embedder=embedder, on_event=progress,
                                         known_bugs=known_bugs))
    except OSError as exc:
        raise fail(str(exc)) from None


def reported(result: Any, cfg: Any, config: Path | None, output_format: ReportFormat, output: Path | None,
              report: list[ReportTo] | None) -> int:
    """Every report asked for written (stdout's unless `output` is given), secrets masked; the exit code."""
    from prober.ledger import masked
    from prober.oneshot.audit import exit_code
    from prober.probing.secrets import load_secrets, scrubber_for
    from prober.report import Terminal, render

    threshold = cfg.audit.fail_on
    scrubber = scrubber_for(load_secrets(cfg), ledger=cfg.ledger)

    def rendered(fmt: ReportFormat, terminal: Terminal) -> str:
        return scrubber.text(render(result, fmt, config_uri=str(config or "leakprobe.yaml"), fail_on=threshold,
                                    terminal=terminal))

    for fmt, path in [*(report or []), *([ReportTo(output_format, output)] if output is not None else [])]:
        try:
            path.write_text(rendered(fmt, Terminal()), encoding="utf-8")
        except OSError as exc:
            raise fail(f"cannot write {path}: {exc.strerror}") from None
        typer.echo(f"{fmt.value} report written to {path}; findings are also in the ledger {masked(cfg.ledger)}",
                   err=True)
    if output is None:
        typer.echo(rendered(output_format, Terminal.of(sys.stdout)), nl=False)
    code: int = exit_code(result, threshold)
    if code == 2:
        typer.echo("error: the audit was blind: no answer repeated its own canary (see why above)" if result.blind
                   else "error: the audit did not finish; see the errors above", err=True)
    return code


GATE_POOLS = 3  # the gate's default token ceiling, in KV pools: one prime and one probe fill about two


@app.command()
def gate(
    config: Annotated[Path | None, typer.Option(help="YAML config: targets, tenants.")] = None,
    target: TargetUrl = None,
    api: ApiOption = None,
    tenant: Tenants = None,
    ledger: Ledger = None,
    max_tokens: Annotated[int | None, typer.Option(
        min=1, help=f"Most prompt tokens the gate may send (default: {GATE_POOLS} x each target's KV pool as its "
                    "survey finds it, else its advertised context).")] = None,
    max_time: Annotated[str, typer.Option(help="Most time the gate may take, e.g. 10m.")] = "10m",
    output_format: ReportFormatOption = ReportFormat.table,
    output: OutputPath = None,
    report: Reports = None,
    fail_on: FailOn = None,
    semantic: Annotated[bool, typer.Option(help="Also plant fact canaries (loads an embedding model).")] = False,
) -> None:
    """The deploy gate: preflight, then the fewest probes that decide whether the engine leaks at its acceptance
    limit (one tenant's pool-filling prime, another's prompt just over the limit) and the checks of the known bugs
    its release is in, under a hard ceiling on tokens and time.

    Exit 0 pass; 1 fail (a leak, an engine fault, findings at or above --fail-on); 2 could not decide (unreachable,
    blind, over a ceiling, unfinished): never 0 without a decision."""
    from prober.checks import REGISTRY
    from prober.config.schema import assemble_config
    from prober.probing.survey import preflight as run_preflight

    cfg = assemble_config(config, target=target, api=api, tenants=tenant, environ=dict(os.environ),
                          ledger=ledger.given if ledger else None, fail_on=fail_on, semantic=semantic,
                          deadline=max_time, sections=REGISTRY.sections, checks=["shapes", "gate"], skip=["campaign"])
    if max_tokens is None:
        secret = cfg.tenants[0].credential.load() if cfg.tenants else None

        async def surveyed() -> list[Any]:
            return [await run_preflight(t, secret) for t in cfg.targets]

        sizes = [s.capacity.pool_tokens or s.capacity.advertised for s in asyncio.run(surveyed())]
        max_tokens = max(1, sum(GATE_POOLS * size.value for size in sizes if size))
    cfg = cfg.model_copy(update={"audit": cfg.audit.model_copy(update={"token_budget": max_tokens})})
    result = audited(cfg, known_bugs=True)
    served = sum(s.sent_tokens for t in result.targets for s in t.steps if s.answer.served)
    typer.echo(f"gate: {sum(t.tokens_sent for t in result.targets):,} prompt tokens sent ({served:,} served) of a "
               f"ceiling of {max_tokens:,}, in {result.finished - result.started:.1f} s of {max_time}", err=True)
    raise typer.Exit(reported(result, cfg, config, output_format, output, report))


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Directory for the reports and the ledger.")] = Path("leakprobe-demo"),
    model: Annotated[str | None, typer.Option(
        help="quoter (default, fast) | gemma3-270m: the same story on a real language model (the lm extra).")] = None,
) -> None:
    """Audit the reference engine with the incident preset, then the fixed one; show what was caught."""
    from prober.oneshot.demo import run_demo

    raise typer.Exit(asyncio.run(run_demo(out, {"model": model} if model else None)))


def switched(**given: bool | None) -> dict[str, Any]:
    """The per-check switches of earlier releases, still honoured for one (each given one says what replaces it)."""
    for flag, value in given.items():
        if value is not None:
            name = RENAMED_SECTIONS.get(flag, flag)
            instead = (f"use --skip {name}" if not value else
                       f"checks run by default (`{name}: {{audit: true}}` in the config overrides `audit: false`)")
            typer.echo(f"warning: --{'' if value else 'no-'}{flag.replace('_', '-')} is deprecated: {instead}",
                       err=True)
    return given
