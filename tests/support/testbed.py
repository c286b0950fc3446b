"""The reference engine as the tests start it (the `testbed` fixture of tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prober.canaries.adapters import canary_text
from prober.canaries.keys import shared_key
from prober.checks.bugs import EngineBug
from prober.testbed import TestbedServer

# A scaled-down incident: same shape (pool < advertised context, pages of 16), small enough that a
# prompt over the pool costs a few thousand tokens.
SMALL = {"context_length": 16_384, "pool_tokens": 4_096, "page_size": 16, "prefill_ms_per_1k_tokens": 0}

StartTestbed = Callable[..., TestbedServer]  # (preset, **overrides) -> a started server, stopped after the test

# The deployment key the engine-bug rows' canary adapters are built under (set as `KEY_ENV`, as an operator sets it).
DEPLOYMENT_KEY = "the engine-bug table's deployment key"


def bug_engine(bug: EngineBug) -> dict[str, Any]:
    """A row's engine settings (on `SMALL`), with the canary adapters its audit names, each answering its trigger with
    the canary `DEPLOYMENT_KEY` derives for its tenant; its faults are the caller's to add."""
    key = shared_key(DEPLOYMENT_KEY)
    served = {name: canary_text(key, tenant, name) for tenant, name in bug.audit.get("adapters", {}).items()}
    return {**SMALL, **bug.engine, **({"adapters": served} if served else {})}
