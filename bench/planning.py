"""What the checks plan for a target of a given capacity, with no engine: a context whose survey is set by hand and
whose transport sends nothing.  Shared by the benchmarks that read plans (bench/shared.py, bench/cost.py)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prober.canaries.keys import resolve_key
from prober.canaries.mint import Minter
from prober.capacity.limits import Capacity, Known
from prober.checks import Run
from prober.config.schema import ProberConfig
from prober.ledger import open_ledger
from prober.probing import Survey, TargetContext
from prober.probing.scanning import RunScanner
from prober.probing.wiring import Wiring
from prober.targets.transport import Transport
from prober.text.scrub import Scrubber

TENANTS = ["tenant-a", "tenant-b"]
CAPACITIES = {
    "tests' small engine (16k context, 4k pool)": Capacity(context_length=Known(16_384, "x"),
                                                          pool_tokens=Known(4_096, "x"),
                                                          max_req_input_len=Known(4_090, "x"),
                                                          page_size=Known(16, "x")),
    "vLLM, 32k context": Capacity(context_length=Known(32_768, "x"), pool_tokens=Known(55_356, "x"),
                                  page_size=Known(16, "x")),
    "the incident (1M context, 681k pool)": Capacity(context_length=Known(1_048_576, "x"),
                                                     pool_tokens=Known(681_280, "x"),
                                                     max_req_input_len=Known(681_274, "x"),
                                                     page_size=Known(64, "x")),
}


def default_config() -> ProberConfig:
    return ProberConfig.model_validate({"targets": [{"name": "t", "url": "http://t/v1"}],
                                        "tenants": [{"name": t} for t in TENANTS]})


@contextmanager
def planning(config: ProberConfig) -> Iterator[TargetContext]:
    """A target context that plans and sends nothing; set `surveyed` to the capacity to plan for."""
    with tempfile.TemporaryDirectory(prefix="bench-planning-") as scratch:
        ledger = open_ledger(str(Path(scratch) / "l.sqlite"))
        try:
            key = resolve_key(ledger)
            wiring = Wiring.of(config, Minter(ledger, key), RunScanner([], key=key, tenants=TENANTS),
                               dict.fromkeys(TENANTS), Scrubber())
            yield TargetContext(config.targets[0], Transport(config.targets[0].policy()), wiring)
        finally:
            ledger.close()


def run_for(context: TargetContext, config: ProberConfig, capacity: Capacity) -> Run:
    context.surveyed = Survey("t", "http://t/v1", capacity)
    return Run(context, config)
