"""Registered checks (timing, cross-talk, idle slots) as the tests call them: against any engine, with a ledger of
their own (what the audit gives each target)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from prober.canaries.mint import Minter
from prober.checks import REGISTRY, Run, perform
from prober.checks.crosstalk import CrosstalkResult
from prober.checks.timing import TimingResult
from prober.config.schema import ProberConfig, TargetConfig
from prober.config.sections import CrosstalkSettings, TimingSettings
from prober.domain.types import FindingKind
from prober.ledger import open_ledger
from prober.probing import TargetContext
from prober.probing.results import CheckResult
from prober.probing.scanning import RunScanner
from prober.probing.wiring import Wiring
from prober.targets import Secret
from prober.targets.transport import Transport
from tests.support.keys import KEYS

KEY = b"isolation-test-key-isolation-key"
TENANTS = ("tenant-a", "tenant-b")
TESTBED_KEYS = {"tenant-a": Secret(KEYS["LP_A"]), "tenant-b": Secret(KEYS["LP_B"])}
NO_KEYS: dict[str, Secret | None] = dict.fromkeys(TENANTS)  # llama-server runs without --api-key here


@asynccontextmanager
async def surveyed(url: str, secrets: Mapping[str, Secret | None], ledger_path: Path, *, retries: int = 0,
                   **sections: Any) -> AsyncIterator[Run]:
    """A run on the surveyed engine at `url`, with a ledger of its own: what the audit gives each target.
    `sections`: config sections the checks read, by attribute (`timing=TimingSettings(...)`); `retries`: the
    transport's (an audit's default is 3: llama.cpp closes a kept-alive connection after a stream as the next request
    goes out)."""
    ledger = open_ledger(ledger_path)
    try:
        wiring = Wiring(ledger, Minter(ledger, KEY), RunScanner([], key=KEY, tenants=TENANTS), secrets, TENANTS)
        target = TargetConfig(name="engine", url=url + "/v1", api="completions", timeout_s=300, retries=retries)
        named = {ProberConfig.model_fields[key].alias or key: value for key, value in sections.items()}
        config = ProberConfig.model_validate({"targets": [target], "tenants": [{"name": t} for t in TENANTS], **named})
        async with Transport(target.policy()) as transport:
            context = TargetContext(target, transport, wiring)
            await context.survey()
            yield Run(context, config, "iso-")
    finally:
        ledger.close()


async def run_check(name: str, run: Run) -> CheckResult:
    """One registered check, planned and run as the audit would."""
    check = REGISTRY.get(name)
    return await perform(check, run, check.planned(run))


def timing(url: str, secrets: Mapping[str, Secret | None], ledger: Path, settings: TimingSettings) -> TimingResult:
    async def go() -> CheckResult:
        async with surveyed(url, secrets, ledger, timing=settings) as run:
            return await run_check("timing", run)
    result = asyncio.run(go())
    assert isinstance(result, TimingResult)
    for decision in result.decisions:
        print(decision.samples.victim, "->", decision.samples.observer, decision.evidence())
    assert not result.errors, result.errors
    assert {f.kind for f in result.findings} <= {FindingKind.CROSS_TENANT_CACHE_TIMING}
    return result


def burst(url: str, secrets: Mapping[str, Secret | None], ledger: Path) -> CrosstalkResult:
    async def go() -> CheckResult:
        async with surveyed(url, secrets, ledger, crosstalk=CrosstalkSettings(per_tenant=4)) as run:
            return await run_check("crosstalk", run)
    result = asyncio.run(go())
    assert isinstance(result, CrosstalkResult)
    return result
