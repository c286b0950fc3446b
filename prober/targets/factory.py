"""From an API name and a URL to a live adapter."""

from __future__ import annotations

from prober.targets.api import Api
from prober.targets.base import HTTPTarget
from prober.targets.openai import OpenAICompatible
from prober.targets.responses import OpenAIResponses
from prober.targets.transport import Transport
from prober.targets.workers_ai import WorkersAI


def make_target(api: Api, name: str, url: str, transport: Transport, *, model: str | None = None) -> HTTPTarget:
    if api is Api.WORKERS_AI:
        return WorkersAI(name, url, transport)
    if api is Api.RESPONSES:
        return OpenAIResponses(name, url, transport, api=api, model=model)
    return OpenAICompatible(name, url, transport, api=api, model=model)
