"""Choosing how to count tokens for a target: its tokenizer endpoint if it has one, else calibration."""

from __future__ import annotations

from typing import Literal

from prober.domain.errors import CountError
from prober.prompts.counter import TokenCounter, UsageCounter, detect_counter
from prober.targets.api import Api, Engine
from prober.targets.base import Target
from prober.targets.credentials import Secret
from prober.targets.transport import Transport


async def select_counter(transport: Transport, target: Target, origin: str, *, api: Api,
                         mode: Literal["auto", "endpoint", "usage"], secret: Secret | None,
                         engine: Engine | None = None) -> TokenCounter:
    if mode != "usage" and api.openai_routes:
        found = await detect_counter(transport, origin, api, secret, engine)
        if found is not None:
            return found
        if mode == "endpoint":
            raise CountError(f"{origin}: no tokenizer endpoint answered (tried SGLang, vLLM, llama.cpp, TGI)")
    return UsageCounter(target, secret)
