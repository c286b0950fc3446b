"""What a (re)load of the daemon's config produces, and which changes only a restart may make.

A reload re-reads the file, the environment and every credential; it is refused (the old settings keep
running) when it fails to validate or changes something the running process cannot change under itself."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prober.campaign.plan import pairs
from prober.config import ProberConfig, assemble_config
from prober.scrub import Scrubber
from prober.secrets import load_secrets, scrubber_for
from prober.targets.credentials import Secret

# What a running daemon holds open or has loaded: a reload that changes any of these is refused.
RESTART_ONLY: tuple[tuple[str, Callable[[ProberConfig], object]], ...] = (
    ("ledger", lambda c: c.ledger),
    ("daemon.listen", lambda c: c.daemon.listen),
    ("daemon.replica", lambda c: c.daemon.replica),
    ("detection.semantic", lambda c: c.detection.semantic),
    ("detection.model", lambda c: c.detection.model),
    ("detection.device", lambda c: c.detection.device),
    ("detection.threshold", lambda c: c.detection.threshold),
)


@dataclass(frozen=True)
class Settings:
    config: ProberConfig
    secrets: Mapping[str, Secret | None]
    scrubber: Scrubber
    path: Path | None  # where they were read from, and are read again on reload
    flags: Mapping[str, Any]  # command-line values that override the file (None = not given)
    loaded_at: float

    def reload(self) -> Settings:
        return load_settings(self.path, self.flags)

    def restart_needed(self, fresh: Settings) -> str | None:
        """Why `fresh` cannot replace these without a restart, or None."""
        for name, get in RESTART_ONLY:
            old, new = get(self.config), get(fresh.config)
            if old != new:
                return f"{name} cannot change on reload ({old!r} -> {new!r}); restart the daemon"
        return None


def load_settings(path: Path | None, flags: Mapping[str, Any]) -> Settings:
    """Config file < LEAKPROBE_* environment < flags, then every credential it names (raises LeakprobeError)."""
    config = assemble_config(path, environ=dict(os.environ), **flags)
    pairs([t.name for t in config.tenants])  # a victim and an observer at least
    secrets = load_secrets(config)
    return Settings(config, secrets, scrubber_for(secrets, ledger=config.ledger), path, dict(flags), time.time())
