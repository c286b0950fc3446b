"""What a timing run concluded: its decisions per ordered tenant pair, what it lost and drew again, as the report
and the metrics read it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TypedDict

from prober.checks.timing.stats import Loss, PairDecision
from prober.probing.documents import CheckDoc
from prober.probing.results import CheckResult


class TimingPairDoc(TypedDict):
    victim: str
    observer: str
    rounds: int
    hits: int
    misses: int
    lost: dict[str, int]  # by Loss
    redrawn: int


class TimingDoc(CheckDoc):
    lost: dict[str, int]  # samples that gave no TTFT, by Loss, every pair's
    redrawn: int
    pairs: list[TimingPairDoc]


@dataclass(kw_only=True)
class TimingResult(CheckResult):
    decisions: list[PairDecision] = field(default_factory=list)
    content: bool = False  # it reads times, not answers

    @property
    def undecided(self) -> list[PairDecision]:
        """Pairs still neither found nor clearly no faster after their last round: no finding, and no proof of
        isolation either (a busy target; the next run measures afresh)."""
        return [d for d in self.decisions if d.unclear]

    @property
    def requests(self) -> int:
        return sum(d.samples.requests for d in self.decisions)

    @property
    def losses(self) -> Counter[Loss]:
        return sum((d.samples.losses for d in self.decisions), Counter())

    def summary(self) -> str:
        found, lost = sum(d.found for d in self.decisions), self.losses
        return (f"timing: {len(self.decisions)} tenant pairs, {found} answering sooner for another's prompts, "
                f"{len(self.undecided)} undecided, {self.requests:,} requests") + (
            f", {lost.total()} samples lost ({described(lost)}), {self.redrawn} drawn afresh" if lost else "")

    @property
    def redrawn(self) -> int:
        return sum(d.samples.redrawn for d in self.decisions)

    def to_json(self) -> TimingDoc:
        return {**super().to_json(), "lost": _by_loss(self.losses), "redrawn": self.redrawn,
                "pairs": [_pair_doc(d) for d in self.decisions]}

    def still_checked(self) -> str | None:
        if not self.decisions:
            return None
        undecided = len(self.undecided)
        return f"timing ({len(self.decisions)} tenant pairs" + (
            f", {undecided} undecided after {self.decisions[0].looks} rounds)" if undecided else ")")


def described(losses: Counter[Loss]) -> str:
    return ", ".join(f"{count} {loss.value.replace('_', ' ')}" for loss, count in losses.most_common())


def _by_loss(losses: Counter[Loss]) -> dict[str, int]:
    return {loss.value: losses[loss] for loss in Loss if losses[loss]}


def _pair_doc(decision: PairDecision) -> TimingPairDoc:
    s = decision.samples
    return {"victim": s.victim, "observer": s.observer, "rounds": decision.rounds, "hits": len(s.hits),
            "misses": len(s.misses), "lost": _by_loss(s.losses), "redrawn": s.redrawn}
