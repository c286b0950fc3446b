"""`leakprobe audit` as a library call: credentials, ledger and key in; result and exit code out."""

from __future__ import annotations

from prober.campaign import Auditor, AuditResult
from prober.campaign.events import Listener, ignore
from prober.canaries.keys import resolve_key
from prober.canaries.mint import Minter
from prober.config import ProberConfig
from prober.embeddings import Embedder
from prober.ledger import open_ledger
from prober.run_secrets import scrubber_for
from prober.targets.credentials import Secret
from prober.types import FindingKind, Severity

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


async def run_audit(config: ProberConfig, secrets: dict[str, Secret | None], *, dry_run: bool = False,
                    embedder: Embedder | None = None, on_event: Listener = ignore) -> AuditResult:
    ledger = open_ledger(config.ledger)
    try:
        auditor = Auditor(config, Minter(ledger, resolve_key(ledger), embedder), secrets, on_event=on_event,
                          dry_run=dry_run, scrubber=scrubber_for(secrets, ledger=config.ledger))
        return await auditor.run()
    finally:
        ledger.close()


def exit_code(result: AuditResult, fail_on: Severity) -> int:
    """Errors outrank findings: an audit that did not finish, or whose answers never showed their own canary
    (blind: it could not have seen a leak), never exits 0 or 1 — unless it saw a leak all the same."""
    leaked = any(f.kind is FindingKind.CROSS_TENANT_ECHO for f in result.findings)
    if not result.complete or (result.blind and not leaked and not result.dry_run):
        return EXIT_ERROR
    return EXIT_FINDINGS if any(f.severity >= fail_on for f in result.findings) else EXIT_CLEAN
