"""What a target is before the first prompt: reachable with this credential, its capacity (introspection,
config, bisection) and verdict, and how to count its tokens.  `leakprobe preflight` is this alone; the
audit and the daemon's jobs start from it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from prober.capacity import Capacity, Verdict, assess, introspect, origin_of, reachability
from prober.capacity.bisect import bisect_accept_limit
from prober.capacity.known_bugs import BugTable, KnownBug
from prober.config.schema import TargetConfig
from prober.domain.errors import CountError
from prober.domain.types import Severity
from prober.probing.path import PathOverhead, measure
from prober.prompts import PromptBuilder, TokenCounter
from prober.prompts.select import select_counter
from prober.targets.credentials import Secret
from prober.targets.factory import make_target
from prober.targets.transport import Transport
from prober.text.scrub import Scrubber

UNKNOWN_ENGINE = ("engine unknown (its introspection is hidden or unlike any engine leakprobe knows): the checks of "
                  "every engine family run, idle slots at llama.cpp's usual width")


@dataclass
class Survey:
    """What leakprobe learned of a target before planning (the preflight step): its capacity and the verdicts on
    it, the tokenizer, what the path adds."""

    target: str
    url: str
    capacity: Capacity = field(default_factory=Capacity)
    verdicts: list[Verdict] = field(default_factory=list)
    tokenizer: str | None = None
    error: str | None = None
    at: float = field(default_factory=time.time)  # when it was learned
    path: PathOverhead | None = None  # what the path adds to a prompt on the configured route, where measured
    bugs: tuple[KnownBug, ...] = ()  # the bug table's rows for its engine, as its release stands

    @property
    def page(self) -> int | None:
        """The KV page size learned, which canaries in prompts are spaced by."""
        return self.capacity.page_size.value if self.capacity.page_size else None

    @property
    def severity(self) -> Severity:
        return max((v.severity for v in self.verdicts), default=Severity.INFO)

    def to_json(self) -> dict[str, object]:
        return {"target": self.target, "url": self.url, "severity": self.severity.label,
                "capacity": self.capacity.to_json(), "verdicts": [v.to_json() for v in self.verdicts],
                "tokenizer": self.tokenizer, "error": self.error,
                "path": self.path.to_json() if self.path else None,
                "known_bugs": [bug.to_json() for bug in self.bugs]}


async def survey(transport: Transport, config: TargetConfig, secret: Secret | None, *, bisect_budget: int = 0,
                 measure_as: str | None = None, bugs: BugTable | None = None) -> tuple[Survey, TokenCounter | None]:
    """`measure_as`: also measure what the path adds on the configured route, as this tenant (with `secret`): two
    short generation requests of one answer token each (prober/probing/path.py).  `bugs`: the table whose rows for
    the engine's release the survey lists."""
    result = Survey(config.name, config.url)
    problem = await reachability(transport, config.url, secret) if config.api.openai_routes else None
    if problem:
        result.error = problem
        return result, None
    capacity = await introspect(transport, config.url, secret, introspection_url=config.introspection_url,
                                configured=config.capacity.capacity())
    target = make_target(config.api, config.name, config.url, transport, model=config.model)
    counter: TokenCounter | None = None
    try:
        counter = await select_counter(transport, target, origin_of(config.introspection_url or config.url),
                                       api=config.api, mode=config.tokenizer, secret=secret, engine=capacity.engine)
        result.tokenizer = counter.source
        if capacity.advertised is None and bisect_budget > 0:
            found = await bisect_accept_limit(target, PromptBuilder(counter), secret, budget=bisect_budget)
            known = found.known()
            notes = (f"bisection stopped: {found.stopped}",) if found.stopped else ()
            capacity = capacity.merged(Capacity(accept_limit=known, notes=notes))
        if measure_as is not None:
            result.path = await measure(config.api, counter, [measure_as],
                                        lambda _, prompt: target.complete(prompt, secret))
    except CountError as exc:
        result.error = str(exc)
    if capacity.engine is None:
        capacity = replace(capacity, notes=(*capacity.notes, UNKNOWN_ENGINE))
    result.capacity = capacity
    result.verdicts = assess(capacity)
    result.bugs = bugs.known_bugs(capacity) if bugs else ()
    return result, counter


async def preflight(config: TargetConfig, secret: Secret | None, *, bisect_budget: int = 0,
                    scrubber: Scrubber | None = None, tenant: str | None = None,
                    bugs: BugTable | None = None) -> Survey:
    """`tenant`: whose `secret` it is; given, the path's overhead is measured as that tenant."""
    async with Transport(config.policy(), scrubber) as transport:
        result, _ = await survey(transport, config, secret, bisect_budget=bisect_budget, measure_as=tenant, bugs=bugs)
    return result
