"""From a target's configuration to a live adapter."""

from __future__ import annotations

from prober.config import TargetConfig
from prober.targets.base import HTTPTarget
from prober.targets.openai import OpenAICompatible
from prober.targets.transport import Transport
from prober.targets.workers_ai import WorkersAI


def make_target(config: TargetConfig, transport: Transport) -> HTTPTarget:
    if config.api == "workers-ai":
        return WorkersAI(config.name, config.url, transport)
    return OpenAICompatible(config.name, config.url, transport, api=config.api, model=config.model)
