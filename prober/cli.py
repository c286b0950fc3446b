"""The `leakprobe` command line.  Each command is a thin shell over a library call."""

from __future__ import annotations

import json
import signal
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from prober import __version__
from prober.embeddings import DEFAULT_MODEL
from prober.report import ReportFormat
from prober.types import CanaryKind, Severity

app = typer.Typer(
    name="leakprobe",
    help="Catch one tenant's data in another tenant's LLM answer.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
testbed_app = typer.Typer(help="The reference multi-tenant paged-KV engine (a real HTTP target).",
                          no_args_is_help=True)
canaries_app = typer.Typer(help="Mint and inspect canaries.", no_args_is_help=True)
app.add_typer(testbed_app, name="testbed")
app.add_typer(canaries_app, name="canaries")

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
    from prober.testbed import EngineConfigError, TestbedServer, build_config, load_config_file

    try:
        file_preset, overrides = load_config_file(config) if config else (None, {})
        if tenant:
            overrides["tenants"] = dict(_split_pair(item) for item in tenant)
        cfg = build_config(preset or file_preset or "incident", overrides)
    except (EngineConfigError, ValueError) as exc:
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


class OutputFormat(StrEnum):
    json = "json"
    table = "table"


@canaries_app.command("mint")
def canaries_mint(
    ledger: Annotated[Path, typer.Option(help="Ledger file (SQLite; created if absent).")],
    tenant: Annotated[str, typer.Option(help="Tenant that owns the canaries.")],
    count: Annotated[int, typer.Option(min=1, max=100_000, help="How many.")] = 1,
    kind: Annotated[CanaryKind, typer.Option(help="token | fact")] = CanaryKind.TOKEN,
    language: Annotated[str, typer.Option(help="Fact pack language (en, ko).")] = "en",
    probe_id: Annotated[str, typer.Option(help="Probe the canaries belong to.")] = "",
    retention_days: Annotated[float, typer.Option(min=0.01, help="How long they stay active.")] = 30.0,
    model: Annotated[str, typer.Option(help="Embedding model for facts (name or path).")] = DEFAULT_MODEL,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="json | table")] = OutputFormat.table,
) -> None:
    """Mint canaries; each is in the ledger before it is printed."""
    from prober.canaries.keys import CanaryKeyError, resolve_key
    from prober.canaries.mint import Minter
    from prober.canaries.packs import PackError
    from prober.embeddings import EmbedderError, make_embedder
    from prober.ledger import LedgerError, open_ledger

    try:
        store = open_ledger(ledger)
        embedder = make_embedder(model) if kind is CanaryKind.FACT else None
        minter = Minter(store, resolve_key(store), embedder, retention_days)
        minted = minter.mint(tenant, kind, count, probe_id=probe_id, language=language)
    except (LedgerError, CanaryKeyError, PackError, EmbedderError) as exc:
        raise _fail(str(exc)) from None
    rows = [{"id": c.id, "tenant": c.tenant, "kind": c.kind.value, "text": c.text, "probe_id": c.probe_id,
             "expires_at": c.expires_at, **({"slots": list(c.slots)} if c.slots else {})} for c in minted]
    if output_format is OutputFormat.json:
        typer.echo(json.dumps(rows, ensure_ascii=False, indent=2))
    else:
        _table(["id", "tenant", "kind", "text"], [[c.id, c.tenant, c.kind.value, c.text] for c in minted])


@app.command()
def scan(
    inputs: Annotated[list[str], typer.Argument(
        help="JSONL files ({id, tenant, text, prompt?} per line), .jsonl.gz, or - for standard input.")],
    ledger: Annotated[str, typer.Option(help="Ledger holding the canaries (path or URL).")],
    output_format: Annotated[OutputFormat, typer.Option("--format", help="json | table")] = OutputFormat.table,
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
    from prober.canaries.keys import CanaryKeyError, resolve_key
    from prober.detect import Scanner
    from prober.embeddings import EmbedderError, make_embedder
    from prober.forensics import scan_inputs
    from prober.ledger import LedgerError, open_ledger
    from prober.progress import ScanProgress

    for name in inputs:
        if name != "-" and not Path(name).is_file():
            raise _fail(f"{name}: no such file")
    if "://" not in ledger and not Path(ledger).is_file():
        raise _fail(f"{ledger}: no such ledger")
    try:
        store = open_ledger(ledger)
        embedder = make_embedder(model, threshold=threshold) if semantic else None
        scanner = Scanner(store.active_canaries(), key=resolve_key(store), tenants=tenant or (),
                          embedder=embedder, redact=redact)
        plain = all(name != "-" and not name.endswith(".gz") for name in inputs)
        with ScanProgress(sum(Path(n).stat().st_size for n in inputs) if plain else None) as progress:
            report = scan_inputs(inputs, scanner, store, workers=workers, progress=progress)
    except (LedgerError, CanaryKeyError, EmbedderError) as exc:
        raise _fail(str(exc)) from None
    for problem in report.errors:
        typer.echo(f"warning: {problem}", err=True)
    if output_format is OutputFormat.json:
        typer.echo(json.dumps(report.to_json(), ensure_ascii=False, indent=2))
    else:
        _table(["record", "kind", "detector", "severity", "victim", "observer", "canary", "score"],
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


def _table(header: list[str], rows: list[list[str]]) -> None:
    from prober.report.terminal import Terminal

    typer.echo(Terminal.of(sys.stdout).table(header, rows), nl=False)


def _severity(value: str) -> Severity:
    try:
        return Severity.parse(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


@app.command()
def preflight(
    target: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL, e.g. http://host:8000/v1.")] = None,
    config: Annotated[Path | None, typer.Option(help="YAML config with `targets:` (and tenants).")] = None,
    api: Annotated[str | None, typer.Option(help="chat | completions | workers-ai (with --target).")] = None,
    tenant: Annotated[list[str] | None, typer.Option(
        help="NAME=ENVVAR: the first tenant's key is used to read introspection endpoints.")] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="table | json")] = OutputFormat.table,
    fail_on: Annotated[str, typer.Option(help="Exit 1 at or above: info | warning | high | critical.")] = "warning",
    bisect_budget: Annotated[int, typer.Option(
        min=0, help="Tokens that bisection may send when the engine exposes no context length (0 = never).")] = 0,
) -> None:
    """Advertised context vs KV pool per target.  Exit 0 clean, 1 at or above --fail-on, 2 on error."""
    import asyncio
    import os

    from prober.campaign.survey import preflight as run_preflight
    from prober.config import ConfigError, assemble_config
    from prober.secrets import scrubber_for
    from prober.targets.credentials import CredentialError

    threshold = _severity(fail_on)
    try:
        cfg = assemble_config(config, target=target, api=api, tenants=tenant, environ=dict(os.environ))
        secret = cfg.tenants[0].credential.load() if cfg.tenants else None
    except (ConfigError, CredentialError) as exc:
        raise _fail(str(exc)) from None

    scrubber = scrubber_for({"first tenant": secret})

    async def run_all() -> list[Any]:
        return [await run_preflight(t, secret, bisect_budget=bisect_budget, scrubber=scrubber) for t in cfg.targets]

    results = asyncio.run(run_all())
    if output_format is OutputFormat.json:
        typer.echo(json.dumps({"targets": [r.to_json() for r in results]}, indent=2))
    else:
        rows = [[r.target, r.capacity.engine or "?", _known(r.capacity.advertised), _known(r.capacity.pool_tokens),
                 _known(r.capacity.page_size), v.severity.label, v.code] for r in results for v in r.verdicts]
        if rows:
            _table(["target", "engine", "advertised", "KV pool", "page", "severity", "verdict"], rows)
        for r in results:
            for v in r.verdicts:
                typer.echo(f"{r.target}: {v.code}: {v.message}")
            sources = [f"{name} from {known.source}" for name in ("context_length", "pool_tokens",
                                                                    "max_req_input_len", "page_size", "slots",
                                                                    "accept_limit")
                       if (known := getattr(r.capacity, name))]
            typer.echo(f"{r.target}: tokens counted by {r.tokenizer or '-'}; " + "; ".join(sources), err=True)
    errors = [r for r in results if r.error]
    for r in errors:
        typer.echo(f"error: {r.target}: {r.error}", err=True)
    if errors:
        raise typer.Exit(EXIT_ERROR)
    raise typer.Exit(1 if any(r.severity >= threshold for r in results) else 0)


def _known(known: Any) -> str:
    return f"{known.value:,}" if known else "-"


@app.command()
def audit(
    config: Annotated[Path | None, typer.Option(help="YAML config: targets, tenants, audit settings.")] = None,
    target: Annotated[str | None, typer.Option(help="One OpenAI-compatible base URL (instead of a config).")] = None,
    api: Annotated[str | None, typer.Option(help="chat | completions | workers-ai (with --target).")] = None,
    tenant: Annotated[list[str] | None, typer.Option(
        help="NAME=ENVVAR, repeatable: a tenant and the variable holding its API key.")] = None,
    ledger: Annotated[Path | None, typer.Option(help="Ledger file (default leakprobe.sqlite).")] = None,
    output_format: Annotated[ReportFormat, typer.Option(
        "--format", "-f", help="table | json | sarif | junit | html")] = ReportFormat.table,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the report here, not stdout.")] = None,
    fail_on: Annotated[str | None, typer.Option(help="Exit 1 at or above: info | warning | high | critical.")] = None,
    token_budget: Annotated[int | None, typer.Option(min=1, help="Most tokens the audit may send.")] = None,
    streaming: Annotated[str | None, typer.Option(help="plain | stream | both (default both).")] = None,
    concurrent: Annotated[bool | None, typer.Option(help="Also prime and probe at the same time.")] = None,
    rounds: Annotated[int | None, typer.Option(min=1, help="Repeat the whole plan.")] = None,
    bisect_budget: Annotated[int | None, typer.Option(
        min=0, help="Tokens bisection may send when no context length is exposed.")] = None,
    semantic: Annotated[bool | None, typer.Option(
        help="Plant fact canaries and look for reworded ones (default on; loads an embedding model).")] = None,
    model: Annotated[str | None, typer.Option(help="Embedding model: use-multilingual-v3 (default), or a "
                                                   "sentence-transformers name or path.")] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the plan and its token cost; send no prompt.")] = False,
) -> None:
    """Probe every KV-capacity boundary with canaries from each tenant and report what crossed over.

    Exit 0 clean, 1 findings at or above --fail-on, 2 error or an audit that could not finish."""
    import asyncio
    import os

    from prober.audit import exit_code, run_audit
    from prober.config import ConfigError, assemble_config
    from prober.embeddings import EmbedderError, make_embedder
    from prober.ledger import LedgerError, masked
    from prober.progress import AuditProgress
    from prober.report import Terminal, render
    from prober.secrets import load_secrets, scrubber_for
    from prober.targets.credentials import CredentialError

    try:
        cfg = assemble_config(config, target=target, api=api, tenants=tenant, environ=dict(os.environ),
                              ledger=ledger, fail_on=fail_on, token_budget=token_budget, streaming=streaming,
                              concurrent=concurrent, rounds=rounds, bisect_budget=bisect_budget, semantic=semantic,
                              model=model)
        secrets = load_secrets(cfg)
        detection = cfg.detection
        embedder = make_embedder(detection.model, detection.device, detection.threshold) if detection.semantic else None
        with AuditProgress() as progress:
            result = asyncio.run(run_audit(cfg, secrets, dry_run=dry_run, embedder=embedder, on_event=progress))
    except (ConfigError, CredentialError, LedgerError, EmbedderError, OSError) as exc:
        raise _fail(str(exc)) from None
    threshold = cfg.audit.fail_on
    terminal = Terminal.of(sys.stdout) if output is None else Terminal()
    scrubber = scrubber_for(secrets, ledger=cfg.ledger)
    report = scrubber.text(render(result, output_format, config_uri=str(config or "leakprobe.yaml"),
                                  fail_on=threshold, terminal=terminal))
    if output is not None:
        try:
            output.write_text(report, encoding="utf-8")
        except OSError as exc:
            raise _fail(f"cannot write {output}: {exc.strerror}") from None
        typer.echo(f"report written to {output}; findings are also in the ledger {masked(cfg.ledger)}", err=True)
    else:
        typer.echo(report, nl=False)
    code = exit_code(result, threshold)
    if code == 2:
        typer.echo("error: the audit did not finish; see the errors above", err=True)
    raise typer.Exit(code)


@app.command()
def daemon(
    config: Annotated[Path, typer.Option(help="YAML config: targets, tenants, and a `daemon:` section.")],
    listen: Annotated[str | None, typer.Option(
        help="HOST:PORT for /metrics, /status and health (default 127.0.0.1:10461).")] = None,
    ledger: Annotated[str | None, typer.Option(help="Ledger path (overrides the config's `ledger`).")] = None,
    check_config: Annotated[bool, typer.Option(help="Validate the config and exit: 0 valid, 2 invalid.")] = False,
    log_level: Annotated[str, typer.Option(help="debug | info | warning | error")] = "info",
) -> None:
    """Probe continuously: preflight, sentinel and campaign jobs per target, Prometheus metrics, incidents.

    Exit 0 after SIGTERM, 2 when it cannot start (bad config, missing credential, unusable ledger or port)."""
    import asyncio
    import logging
    import os

    from prober.config import ConfigError, assemble_config
    from prober.daemon import Daemon, StartupError
    from prober.ledger import masked
    from prober.targets.credentials import CredentialError

    flags: dict[str, Any] = {"listen": listen, "ledger": ledger}
    if check_config:
        try:
            cfg = assemble_config(config, environ=dict(os.environ), **flags)
            if len(cfg.tenants) < 2:
                raise ConfigError(f"{config}: tenants: the daemon needs at least two (a victim and an observer)")
        except ConfigError as exc:
            raise _fail(str(exc)) from None
        for tenant in cfg.tenants:
            try:
                tenant.credential.load()
            except CredentialError as exc:
                typer.echo(f"note: tenant {tenant.name}: {exc} (read at start, not needed to check the config)",
                           err=True)
        typer.echo(f"{config}: valid ({len(cfg.targets)} targets, {len(cfg.tenants)} tenants, "
                   f"listen {cfg.daemon.listen}, ledger {masked(cfg.ledger)})")
        raise typer.Exit(0)
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # its skipped runs are counted as job skips
    try:
        service = Daemon(config, flags)
        code = asyncio.run(service.run())
    except (ConfigError, CredentialError, StartupError) as exc:
        raise _fail(str(exc)) from None
    raise typer.Exit(code)


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Directory for the reports and the ledger.")] = Path("leakprobe-demo"),
) -> None:
    """Audit the reference engine with the incident preset, then the fixed one; show what was caught."""
    import asyncio

    from prober.demo import run_demo

    raise typer.Exit(asyncio.run(run_demo(out)))


def main() -> None:
    app()
