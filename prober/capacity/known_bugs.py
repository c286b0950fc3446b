"""The bug table read against a target: which public isolation bugs its engine's release is in.

A row of the table (prober/checks/bugs.py) names the releases of each engine its bug is in (`Releases`); a target
whose engine says its release (prober/capacity/version.py) gets each row of its engine as applying, fixed, or
unknown where the release is not known.  Nothing here decides what runs: a fixed row's check still runs, later.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypedDict

from packaging.version import Version

from prober.capacity.limits import Capacity
from prober.capacity.version import EngineVersion
from prober.targets.api import Engine


@dataclass(frozen=True)
class Releases:
    """The releases of one engine a bug is in, from its public tracker: from `since` (None: not established, so
    every release before the fix) up to `fixed_in` (None: no release with a fix is known, as of the record)."""

    engine: Engine
    since: str | None = None
    fixed_in: str | None = None

    def holds(self, release: Version) -> bool:
        return ((self.since is None or release >= Version(self.since))
                and (self.fixed_in is None or release < Version(self.fixed_in)))

    def describe(self) -> str:
        since = f"from {self.since}" if self.since else "every release known"
        return f"{self.engine} {since}, " + (f"fixed in {self.fixed_in}" if self.fixed_in else "no fix known")


class Standing(StrEnum):
    """What a target's engine and release say of one bug in the table."""

    APPLIES = "applies"  # its release is one the bug is in
    FIXED = "fixed"  # its release is past the fix (or before the bug)
    UNKNOWN = "unknown"  # the engine is one the bug hits, but its release is not known: its check runs all the same


class KnownBugDoc(TypedDict):
    public: str
    what: str
    standing: str
    releases: str
    checks: list[str]


@dataclass(frozen=True)
class KnownBug:
    """One row of the bug table as it stands for one target (rows of other engines are left out)."""

    public: str
    what: str
    standing: Standing
    releases: Releases
    checks: tuple[str, ...]  # the checks that probe it (none: every check that reads answers)

    def to_json(self) -> KnownBugDoc:
        return {"public": self.public, "what": self.what, "standing": str(self.standing),
                "releases": self.releases.describe(), "checks": list(self.checks)}


def standing(releases: Releases, engine: Engine | None, version: EngineVersion | None) -> Standing | None:
    """How one engine's releases of a bug stand for a target (None: the target runs another engine)."""
    if engine is not releases.engine:
        return None
    release = version.release(engine) if version else None
    if release is None:
        return Standing.UNKNOWN
    return Standing.APPLIES if releases.holds(release) else Standing.FIXED


class BugTable(Protocol):
    """The bug table, read for one target (the checks' registry is one)."""

    def known_bugs(self, capacity: Capacity) -> tuple[KnownBug, ...]: ...
