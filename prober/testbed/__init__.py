"""The reference multi-tenant paged-KV engine with injectable isolation faults."""

from prober.testbed.config import (
    DEFAULT_TENANTS,
    PRESETS,
    EngineConfig,
    Faults,
    QuoteStyle,
    build_config,
    load_config_file,
)
from prober.testbed.engine import Engine, EngineError
from prober.testbed.server import TestbedServer

__all__ = [
    "DEFAULT_TENANTS",
    "PRESETS",
    "Engine",
    "EngineConfig",
    "EngineError",
    "Faults",
    "QuoteStyle",
    "TestbedServer",
    "build_config",
    "load_config_file",
]
