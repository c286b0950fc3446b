"""The reference engine as the tests start it (the `testbed` fixture of tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

from prober.testbed import TestbedServer

# A scaled-down incident: same shape (pool < advertised context, pages of 16), small enough that a
# prompt over the pool costs a few thousand tokens.
SMALL = {"context_length": 16_384, "pool_tokens": 4_096, "page_size": 16, "prefill_ms_per_1k_tokens": 0}

StartTestbed = Callable[..., TestbedServer]  # (preset, **overrides) -> a started server, stopped after the test
