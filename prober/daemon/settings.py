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

from prober.canaries.keys import KEY_ENV, resolve_key
from prober.checks import REGISTRY, Registry
from prober.config.schema import ProberConfig, assemble_config
from prober.daemon.schedule import Timetable
from prober.domain.errors import CredentialError, LeakprobeError
from prober.probing.plan import pairs
from prober.probing.secrets import load_secrets, scrubber_for
from prober.targets.credentials import CredentialSource, Secret
from prober.text.scrub import Scrubber

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
    token: Secret | None  # what /status and /-/reload require (daemon.token_file)
    path: Path | None  # where they were read from, and are read again on reload
    flags: Mapping[str, Any]  # command-line values that override the file (None = not given)
    timetable: Timetable
    checks: Registry
    loaded_at: float

    def reloaded(self) -> Settings | str:
        """The config and credentials read again, or why they cannot replace these: they fail to load, or they
        change what only a restart may change."""
        try:
            fresh = load_settings(self.path, self.flags, self.checks)
        except LeakprobeError as exc:
            return str(exc)
        for name, get in RESTART_ONLY:
            old, new = get(self.config), get(fresh.config)
            if old != new:
                return f"{name} cannot change on reload ({old!r} -> {new!r}); restart the daemon"
        return fresh


def load_settings(path: Path | None, flags: Mapping[str, Any], checks: Registry = REGISTRY) -> Settings:
    """Config file < LEAKPROBE_* environment < flags, then every credential it names (raises LeakprobeError)."""
    config = assemble_config(path, environ=dict(os.environ), sections=checks.sections, **flags)
    pairs([t.name for t in config.tenants])  # a victim and an observer at least
    timetable = Timetable(config.daemon, checks)
    secrets = load_secrets(config)
    if KEY_ENV in os.environ:
        resolve_key(None)  # a malformed deployment key fails the start here, not at the first canary
    token = load_token(config.daemon.token_file)
    scrubber = scrubber_for({**secrets, TOKEN_LABEL: token}, ledger=config.ledger)
    return Settings(config, secrets, scrubber, token, path, dict(flags), timetable, checks, time.time())


TOKEN_LABEL = "the daemon's token"
TOKEN_MIN = 16


def load_token(path: Path | None) -> Secret | None:
    """The bearer token of the protected endpoints, read now so a missing or short one fails the start."""
    if path is None:
        return None
    token = CredentialSource(file=path).load()
    if token is not None and len(token.reveal()) < TOKEN_MIN:
        raise CredentialError(f"daemon.token_file {path} holds fewer than {TOKEN_MIN} characters: too easy to guess")
    return token
