"""The API routes a target's requests may take, each with its adapter, a prompt builder that counts tokens
the way that route does (a chat template costs tokens the completions route does not), and what the path to the
engine adds on that route (prober/probing/path.py, measured when the route is first used): the configured route
from the survey, any other (completions beside chat) set up the first time a probe shape asks for it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from prober.capacity import origin_of
from prober.config.schema import TargetConfig
from prober.domain.errors import PlanError
from prober.probing.path import PathOverhead
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
    path: PathOverhead  # what the path adds to each tenant's prompts on this route

    @property
    def counter(self) -> TokenCounter:
        return self.builder.counter


Measure = Callable[[Route], Awaitable[PathOverhead]]


class Routes:
    def __init__(self, config: TargetConfig, transport: Transport, measure: Measure | None = None) -> None:
        """`measure`: how a route's path overhead is measured when it is first used (none: assumed 0)."""
        self.config = config
        self.transport = transport
        self.measure = measure
        self._routes: dict[Api, Route] = {}
        self._measured: set[Api] = set()
        self._setting_up = asyncio.Lock()  # jobs that share the target wait for a route being set up and measured
        self._engine: Engine | None = None
        self._secret: Secret | None = None

    def _target(self, api: Api) -> HTTPTarget:
        cfg = self.config
        return make_target(api, cfg.name, cfg.url, self.transport, model=cfg.model)

    def surveyed(self, counter: TokenCounter, engine: Engine | None, secret: Secret | None) -> Route:
        """What a survey learned replaces every route: the configured one counts with `counter`."""
        self._engine, self._secret = engine, secret
        route = Route(self.config.api, self._target(self.config.api), PromptBuilder(counter),
                      PathOverhead(self.config.api))
        self._routes, self._measured = {route.api: route}, set()
        return route

    async def get(self, api: Api) -> Route:
        """Raises PlanError before a survey, CountError where the route has no way to count tokens."""
        if not self._routes:
            raise PlanError("survey the target before sending it anything")
        if api in self._measured or (api in self._routes and self.measure is None):
            return self._routes[api]
        async with self._setting_up:
            return await self._set_up(api)

    async def _set_up(self, api: Api) -> Route:
        if api not in self._routes:
            cfg = self.config
            target = self._target(api)
            counter = await select_counter(self.transport, target, origin_of(cfg.introspection_url or cfg.url),
                                           api=api, mode=cfg.tokenizer, secret=self._secret, engine=self._engine)
            self._routes[api] = Route(api, target, PromptBuilder(counter), PathOverhead(api))
        if self.measure is not None and api not in self._measured:
            route = self._routes[api]
            path = await self.measure(route)
            current = self._routes.get(api)
            if current is None or current.counter.source != route.counter.source:
                return replace(route, path=path)  # a survey meanwhile changed how this route counts: for this caller
            # Kept, also where a survey replaced the route meanwhile: the measurement is newer.  Else, with surveys
            # that come faster than a measurement (a busy machine), every job that waits here would measure again.
            self._routes[api] = replace(current, path=path)
            self._measured.add(api)
        return self._routes[api]

    @property
    def paths(self) -> list[PathOverhead]:
        """What each route used so far measured."""
        return [self._routes[api].path for api in sorted(self._measured) if api in self._routes]
