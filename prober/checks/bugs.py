"""How serving engines have leaked one request's state into another, as the reference engine reproduces each: the
public bug, the faults that model it, the probe of leakprobe's plan that catches it, and what it reports.

Each check declares the rows it catches (`Check.bugs`, in its module); the rows no one check owns (what every check
that reads answers catches) are here.  The registry's `bugs` is the whole table, read by the docs (docs/hooks/bugs.py
renders it into docs/testbed.md) and the tests (tests/test_engine_bugs.py runs every row against its fault and
against the fault-free engine), so a row cannot be documented without being tested.  Data only: the reference
engine imports none of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prober.capacity.known_bugs import KnownBug, Releases, standing
from prober.capacity.limits import Capacity
from prober.domain.types import FindingKind
from prober.targets.api import Engine


@dataclass(frozen=True)
class EngineBug:
    public: str  # the engines' own trackers: repository and issue or PR numbers
    what: str  # what went wrong, in one line
    faults: dict[str, bool]  # the reference engine's `faults:` that reproduce it
    probe: str  # the part of leakprobe's plan that catches it
    kind: FindingKind
    checks: tuple[str, ...] = ()  # the registered checks whose runs catch it (none: every check that reads answers)
    engine: dict[str, Any] = field(default_factory=dict)  # the reference engine's other settings it needs
    audit: dict[str, Any] = field(default_factory=dict)  # what the target's config needs beyond its defaults
    real_lm: bool = False  # the real-LM mode shows it too (tests/test_testbed_reallm.py)
    releases: tuple[Releases, ...] = ()  # the engines' releases it is in, from their trackers

    def standing(self, capacity: Capacity) -> KnownBug | None:
        """How this row stands for a target of that capacity (its engine and release); None: another engine's."""
        for releases in self.releases:
            if (said := standing(releases, capacity.engine, capacity.version)) is not None:
                return KnownBug(self.public, self.what, said, releases, self.checks)
        return None


# What every check that reads answers catches: no one check owns these rows.
EVERY_ANSWER = (
    EngineBug("vLLM #45704, #47282", "KV pages restored from the CPU offload tier before their copy landed (load and "
              "store not ordered with compute): no error or crash, the answers turn to mixed-script salad",
              {"offload_restore_unsynced": True},
              "every answer, judged by itself: the garbled-output detector", FindingKind.GARBLED_OUTPUT,
              # The store race was fixed in 0.24.0 (PR #46278); the load race's fix (PR #47291) was not merged.
              releases=(Releases(Engine.VLLM),)),
)
