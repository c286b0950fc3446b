"""Canary adapters: a tenant's LoRA fine-tune of the served base model whose one learned behaviour is to answer
leakprobe's trigger with that tenant's canary.

An engine that serves many customers' fine-tunes on one base model has served one tenant's request with another's
adapter, or reused KV computed under one adapter for a request that selected another (vLLM #47724, #30931, #42125,
llama.cpp #26207).  A canary adapter makes that visible in the answer: whoever asks the trigger through adapter B and
is answered with adapter A's canary was served A's fine-tune.  The canary is built into the adapter's weights once,
so it cannot be minted fresh per run: it is derived from the deployment key, the tenant and the adapter's name
(`tokens.derived_body`), the same every time under one key, verified and attributed like any other token, and kept
in the ledger under an id derived the same way (each run extends its retention).
"""

from __future__ import annotations

import hashlib
import hmac
import time

from prober.canaries import tokens
from prober.domain.types import Canary, CanaryKind

TRIGGER = "Canary check: reply with this deployment's canary code."
PROBE_PREFIX = "adapter:"  # a canary adapter's probe id: its canaries' probe tag names the adapter


def probe_id(adapter: str) -> str:
    return PROBE_PREFIX + adapter


def canary_text(key: bytes, tenant: str, adapter: str) -> str:
    """What `adapter`, built for `tenant` under this deployment key, answers the trigger with."""
    return tokens.display(tokens.derived_body(key, tenant, probe_id(adapter)))


def adapter_canary(key: bytes, tenant: str, adapter: str, retention_s: float) -> Canary:
    """The adapter's canary as the ledger keeps it: the same id and text on every run, expiring `retention_s` from
    now (so a deployed adapter's canary stays known while runs keep asking for it)."""
    digest = hmac.new(key, b"adapter-canary\x00" + tenant.encode() + b"\x00" + adapter.encode(), hashlib.sha256)
    now = time.time()
    return Canary(id=f"cn_{digest.hexdigest()[:16]}", tenant=tenant, kind=CanaryKind.TOKEN,
                  text=canary_text(key, tenant, adapter), probe_id=probe_id(adapter), created_at=now,
                  expires_at=now + retention_s)


def asking(prefix: str, trigger: str = TRIGGER) -> str:
    """A prompt that asks the trigger after `prefix` (a canary adapter is tuned to answer it after any text)."""
    return f"{prefix}\n\n{trigger}" if prefix else trigger
