"""The API routes a target's requests may take, each with its adapter and a prompt builder that counts tokens
the way that route does (a chat template costs tokens the completions route does not): the configured route
from the survey, any other (completions beside chat) set up the first time a probe shape asks for it."""

from __future__ import annotations

from dataclasses import dataclass

from prober.capacity import origin_of
from prober.config import TargetConfig
from prober.errors import PlanError
from prober.prompts import PromptBuilder, TokenCounter
from prober.prompts.select import select_counter
from prober.targets.api import Api, Engine
from prober.targets.base import HTTPTarget
from prober.targets.credentials import Secret
from prober.targets.factory import make_target
from prober.targets.transport import Transport


@dataclass(frozen=True)
class Route:
    api: Api
    target: HTTPTarget
    builder: PromptBuilder


class Routes:
    def __init__(self, config: TargetConfig, transport: Transport) -> None:
        self.config = config
        self.transport = transport
        self._routes: dict[Api, Route] = {}
        self._engine: Engine | None = None
        self._secret: Secret | None = None

    def _target(self, api: Api) -> HTTPTarget:
        cfg = self.config
        return make_target(api, cfg.name, cfg.url, self.transport, model=cfg.model)

    def surveyed(self, counter: TokenCounter, engine: Engine | None, secret: Secret | None) -> Route:
        """What a survey learned replaces every route: the configured one counts with `counter`."""
        self._engine, self._secret = engine, secret
        route = Route(self.config.api, self._target(self.config.api), PromptBuilder(counter))
        self._routes = {route.api: route}
        return route

    async def get(self, api: Api) -> Route:
        """Raises PlanError before a survey, CountError where the route has no way to count tokens."""
        if not self._routes:
            raise PlanError("survey the target before sending it anything")
        if api not in self._routes:
            cfg = self.config
            target = self._target(api)
            counter = await select_counter(self.transport, target, origin_of(cfg.introspection_url or cfg.url),
                                           api=api, mode=cfg.tokenizer, secret=self._secret, engine=self._engine)
            self._routes[api] = Route(api, target, PromptBuilder(counter))
        return self._routes[api]
