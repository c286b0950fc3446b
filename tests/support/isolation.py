"""The runner's isolation checks (timing, cross-talk, idle slots) as the tests call them: against any engine, with a
ledger of their own (what the audit gives each target)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from prober.campaign.crosstalk import CrosstalkResult
from prober.campaign.runner import TargetRunner
from prober.campaign.scanning import RunScanner
from prober.campaign.timing import TimingResult
from prober.campaign.wiring import Wiring
from prober.canaries.mint import Minter
from prober.config import CrosstalkSettings, TargetConfig, TimingSettings
from prober.ledger import open_ledger
from prober.targets import Secret
from prober.targets.transport import Transport
from prober.types import FindingKind
from tests.support.keys import KEYS

KEY = b"isolation-test-key-isolation-key"
TENANTS = ("tenant-a", "tenant-b")
TESTBED_KEYS = {"tenant-a": Secret(KEYS["LP_A"]), "tenant-b": Secret(KEYS["LP_B"])}
NO_KEYS: dict[str, Secret | None] = dict.fromkeys(TENANTS)  # llama-server runs without --api-key here
@asynccontextmanager
async def surveyed(url: str, secrets: Mapping[str, Secret | None], ledger_path: Path) -> AsyncIterator[TargetRunner]:
    """A surveyed runner for the engine at `url`, with a ledger of its own: what the audit gives each target."""
    ledger = open_ledger(ledger_path)
    try:
        wiring = Wiring(ledger, Minter(ledger, KEY), RunScanner([], key=KEY, tenants=TENANTS), secrets, TENANTS)
        config = TargetConfig(name="engine", url=url + "/v1", api="completions", timeout_s=300, retries=0)
        async with Transport(config.policy()) as transport:
            runner = TargetRunner(config, transport, wiring)
            await runner.survey()
            yield runner
    finally:
        ledger.close()


def timing(url: str, secrets: Mapping[str, Secret | None], ledger: Path, settings: TimingSettings) -> TimingResult:
    async def go() -> TimingResult:
        async with surveyed(url, secrets, ledger) as runner:
            return await runner.isolation.timing(settings)
    result = asyncio.run(go())
    for decision in result.decisions:
        print(decision.samples.victim, "->", decision.samples.observer, decision.evidence())
    assert not result.errors, result.errors
    assert {f.kind for f in result.findings} <= {FindingKind.CROSS_TENANT_CACHE_TIMING}
    return result


def burst(url: str, secrets: Mapping[str, Secret | None], ledger: Path) -> CrosstalkResult:
    async def go() -> CrosstalkResult:
        async with surveyed(url, secrets, ledger) as runner:
            return await runner.isolation.crosstalk(CrosstalkSettings(per_tenant=4))
    return asyncio.run(go())
