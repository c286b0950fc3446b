"""The reference multi-tenant paged-KV engine with injectable isolation faults (`leakprobe testbed`): what the
demo and the tests audit, and where the public engine bugs are reproduced."""

from prober.testbed.config import (
    DEFAULT_TENANTS,
    PRESETS,
    EngineConfig,
    Faults,
    QuoteStyle,
    build_config,
    load_config_file,
)
from prober.testbed.engine import ReferenceEngine
from prober.testbed.paging import EngineError
from prober.testbed.server import TestbedServer

__all__ = [
    "DEFAULT_TENANTS",
    "PRESETS",
    "EngineConfig",
    "EngineError",
    "Faults",
    "QuoteStyle",
    "ReferenceEngine",
    "TestbedServer",
    "build_config",
    "load_config_file",
]
