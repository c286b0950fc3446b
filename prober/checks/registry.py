"""Every check leakprobe runs, in the order an audit runs them: the one list the audit, the daemon's jobs and
schedule, the budget and deadlines, reports, progress and metrics read.  A check registered here (or by `register`,
at start-up) is planned, budgeted, run, reported, exported and shown with no other change: its evidence types join
the codec, its metrics the daemon's registry, its name `--check`, `--skip` and the schedule."""

from __future__ import annotations

from collections.abc import Iterator

from prober.capacity.known_bugs import KnownBug, Standing
from prober.capacity.limits import Capacity
from prober.checks.abort_retry import AbortRetryCheck
from prober.checks.adapters import AdaptersCheck
from prober.checks.base import Check
from prober.checks.bugs import EVERY_ANSWER, EngineBug
from prober.checks.campaign import CampaignCheck
from prober.checks.crosstalk import CrosstalkCheck
from prober.checks.gate import GateCheck
from prober.checks.idle_slots import IdleSlotsCheck
from prober.checks.media_cache import MediaCacheCheck
from prober.checks.prefix_cache import PrefixCacheCheck
from prober.checks.prompt_embeds import PromptEmbedsCheck
from prober.checks.request_ids import RequestIdsCheck
from prober.checks.response_cache import ResponseCacheCheck
from prober.checks.semantic_cache import SemanticCacheCheck
from prober.checks.sentinel import SentinelCheck
from prober.checks.shapes import ShapesCheck
from prober.checks.timing import TimingCheck
from prober.config.schema import ProberConfig, Sections
from prober.domain.errors import ConfigError
from prober.domain.evidence import register as register_evidence


class Registry:
    def __init__(self, checks: list[Check]) -> None:
        self._checks: dict[str, Check] = {}
        for check in checks:
            self.register(check)

    def register(self, check: Check) -> None:
        """Last before the checks that come after every other (the sentinel's place does not matter: it runs in
        the daemon alone)."""
        if check.name in self._checks:
            raise ValueError(f"a check named {check.name!r} is registered already")
        for kind in check.evidence:
            register_evidence(kind)
        self._checks[check.name] = check

    def __iter__(self) -> Iterator[Check]:
        return iter(list(self._checks.values()))

    def get(self, name: str) -> Check:
        return self._checks[name]

    @property
    def bugs(self) -> tuple[EngineBug, ...]:
        """The bug table: each check's rows in the registry's order, then those every check that reads answers
        catches."""
        return (*(bug for check in self for bug in check.bugs), *EVERY_ANSWER)

    def known_bugs(self, capacity: Capacity) -> tuple[KnownBug, ...]:
        """The bug table's rows for a target's engine, each as its release stands (those that apply first)."""
        rows = [known for bug in self.bugs if (known := bug.standing(capacity)) is not None]
        return tuple(sorted(rows, key=lambda known: known.standing is not Standing.APPLIES))

    def probing(self, known: tuple[KnownBug, ...]) -> list[Check]:
        """The checks that probe a bug the target's release has, in the registry's order."""
        names = {name for bug in known if bug.standing is Standing.APPLIES for name in bug.checks}
        return [check for check in self if check.name in names]

    def ordered(self, checks: list[Check], known: tuple[KnownBug, ...]) -> list[Check]:
        """`checks` with those that probe a bug the target's release has first (else in the registry's order)."""
        first = self.probing(known)
        return sorted(checks, key=lambda check: check not in first)

    @property
    def sections(self) -> Sections:
        """The config sections the checks bring (`Check.settings`), by check name: what `parse_config` validates."""
        return {check.name: check.settings for check in self if check.settings is not None}

    def selected(self, config: ProberConfig) -> list[Check]:
        """What `leakprobe audit` runs: the checks `audit.checks` names (else each that its section runs in audits),
        but those `audit.skip` names (ConfigError for a name no check has)."""
        chosen, skip = config.audit.checks, config.audit.skip
        unknown = sorted((set(chosen) | set(skip)) - set(self._checks))
        if unknown:
            raise ConfigError(f"audit: no check named {unknown[0]!r}; the checks: {', '.join(self._checks)}")
        return [check for check in self if (check.name in chosen if chosen else check.in_audit(config))
                and check.name not in skip]


REGISTRY = Registry([ShapesCheck(), PrefixCacheCheck(), CampaignCheck(), SentinelCheck(), TimingCheck(),
                     IdleSlotsCheck(), CrosstalkCheck(), RequestIdsCheck(), AbortRetryCheck(), AdaptersCheck(),
                     MediaCacheCheck(), PromptEmbedsCheck(), ResponseCacheCheck(), SemanticCacheCheck(), GateCheck()])
