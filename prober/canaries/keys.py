"""The deployment key that signs canary tokens.

Replicas that must verify each other's tokens share it through LEAKPROBE_CANARY_KEY (any string of
at least 16 characters; keep it in a secret store).  Without it, a random key is created once and kept
in the ledger, which suits a single prober: the ledger already holds the canaries it protects.
"""

from __future__ import annotations

import hashlib
import os
import secrets

from prober.domain.errors import CanaryKeyError
from prober.ledger import Ledger

KEY_ENV = "LEAKPROBE_CANARY_KEY"


def shared_key(configured: str) -> bytes:
    """The key a configured secret (LEAKPROBE_CANARY_KEY's value) stands for."""
    if len(configured) < 16:
        raise CanaryKeyError(f"{KEY_ENV} must be at least 16 characters")
    return hashlib.sha256(b"leakprobe-canary-key\x00" + configured.encode()).digest()


def resolve_key(ledger: Ledger | None) -> bytes:
    configured = os.environ.get(KEY_ENV)
    if configured is not None:
        return shared_key(configured)
    if ledger is None:
        raise CanaryKeyError(f"no canary key: set {KEY_ENV} or give a ledger")
    return bytes.fromhex(ledger.set_meta_if_absent("canary_key", secrets.token_hex(32)))
