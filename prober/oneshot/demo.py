"""`leakprobe demo` (what `make demo` runs): the incident, found by the audit, on one machine.

The reference engine starts in this process with the `incident` preset (advertised context 1,048,576
tokens, KV pool 681,280), and the audit probes it with two tenants; then the same with `fixed`.  Reports
and the ledger go to a directory the user can open afterwards.  No network beyond loopback.

With `model="gemma3-270m"` the same story runs on a real language model over real K/V pages (the
real-LM presets: context 2,048, pool 1,024); each decoded token costs a pass over the model on the CPU,
so the audit asks for shorter answers and leaves out its two statistical checks (cache timing, cross-talk
bursts), which need hundreds of requests.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rich.console import Console

from prober.config.schema import ProberConfig, assemble_config
from prober.domain.errors import StartupError
from prober.domain.types import FindingKind
from prober.domain.verdicts import Weight, weight
from prober.oneshot.audit import run_audit
from prober.oneshot.progress import AuditProgress
from prober.probing import AuditResult
from prober.report import ReportFormat, render
from prober.targets.credentials import Secret
from prober.testbed import DEFAULT_TENANTS, TestbedServer, build_config
from prober.testbed.backend import ModelState
from prober.testbed.config import QUOTER


async def _audit(console: Console, preset: str, out: Path, overrides: dict[str, Any]) -> AuditResult:
    config = build_config(preset, overrides)
    with TestbedServer(config) as server:
        console.rule(f"preset [bold]{preset}[/]: {config.model_name}, advertised context {config.context_length:,} "
                     f"tokens, KV pool {config.pool_tokens:,} tokens, {server.url}/v1")
        await _loaded(console, server)
        cfg = assemble_config(None, target=server.url + "/v1", target_name=f"testbed-{preset}",
                              tenants=[f"{n}=unused" for n in DEFAULT_TENANTS],
                              ledger=str(out / "ledger.sqlite"), streaming="both", concurrent=True)
        if config.model != QUOTER:
            cfg = _affordable(cfg)
        secrets: dict[str, Secret | None] = {name: Secret(key) for name, key in DEFAULT_TENANTS.items()}
        with AuditProgress() as progress:
            result = await run_audit(cfg, secrets, on_event=progress)
    for fmt, suffix in ((ReportFormat.html, "html"), (ReportFormat.json, "json")):
        (out / f"{preset}.{suffix}").write_text(render(result, fmt), encoding="utf-8")
    return result


REAL_MODEL_MAX_TOKENS = 48  # enough for a canary sentence; each token is a pass over the model
REAL_MODEL_DEADLINE_S = 3_600.0


async def _loaded(console: Console, server: TestbedServer) -> None:
    backend = server.engine.backend
    if backend.state is ModelState.LOADING:
        console.print(f"loading {backend.name} (the first run on a machine converts it: a few minutes)")
    if await asyncio.to_thread(backend.wait) is ModelState.FAILED:
        raise StartupError(str(backend.error))


def _affordable(cfg: ProberConfig) -> ProberConfig:
    """Shorter answers, no statistical checks, and a deadline for a CPU (the one derived from the plan assumes
    an accelerator): an audit a real model on a CPU serves in minutes."""
    audit = cfg.audit.model_copy(update={"max_tokens": REAL_MODEL_MAX_TOKENS, "target_deadline": REAL_MODEL_DEADLINE_S})
    return cfg.model_copy(update={"audit": audit,
                                  "timing": cfg.timing.model_copy(update={"audit": False}),
                                  "crosstalk": cfg.crosstalk.model_copy(update={"audit": False})})


def _summary(console: Console, preset: str, result: AuditResult, out: Path) -> None:
    findings = result.findings
    echoes = [f for f in findings if f.kind is FindingKind.CROSS_TENANT_ECHO]
    if echoes:
        first = echoes[0]
        console.print(f"[bold red]{len(echoes)} cross-tenant echoes[/]: e.g. canary {first.canary_id} of "
                      f"[bold]{first.victim_tenant}[/] in the HTTP 200 answer to [bold]{first.observer_tenant}[/] "
                      f"({first.context.prompt_tokens or 0:,}-token prompt, {first.context.boundary})")
    kinds = sorted({f.kind.value for f in findings})
    console.print(f"{preset}: {len(findings)} findings ({', '.join(kinds) or 'none'}); "
                  f"report {out / (preset + '.html')}, JSON {out / (preset + '.json')}, ledger {out / 'ledger.sqlite'}")


async def run_demo(out: Path = Path("leakprobe-demo"), overrides: dict[str, Any] | None = None) -> int:
    """0 when the incident preset leaks and is caught and the fixed preset comes out clean.  `overrides`
    are engine keys (`{"model": "gemma3-270m"}` for a real model)."""
    console = Console(highlight=False, stderr=True)
    out.mkdir(parents=True, exist_ok=True)
    incident = await _audit(console, "incident", out, overrides or {})
    _summary(console, "incident", incident, out)
    fixed = await _audit(console, "fixed", out, overrides or {})
    _summary(console, "fixed", fixed, out)
    caught = any(f.kind is FindingKind.CROSS_TENANT_ECHO for f in incident.findings)
    clean = all(weight(f.kind, f.severity) is Weight.NOTE for f in fixed.findings)  # no leak, no engine fault
    console.rule()
    console.print(f"incident preset: leak {'caught' if caught else 'NOT caught'}; fixed preset: "
                  f"{'clean' if clean else 'NOT clean'}.  Open {out / 'incident.html'} to read the evidence.")
    return 0 if caught and clean and incident.complete and fixed.complete else 1
