"""How much of a plan was observed: what an audit's "incomplete" rests on, in one line with what to do about it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from prober.probing.documents import CoverageDoc

OUTCOME_WORDS = {"refused": "refused at lengths the capacity says fit",
                 "server_error": "failed (5xx) at lengths the capacity says fit"}
HINTS = {"refused": "check the model name, the gateway in front of the engine and the credentials",
         "unauthorized": "check the tenants' credentials",
         "rate_limited": "lower the request rate or raise the quota",
         "timeout": "the target is too slow, stalls or never finishes its answers: see timeout_s, deadline_s and the "
                    "audit deadline",
         "server_error": "the engine fails: see its logs",
         "connect": "check the URL and the network path",
         "malformed": "the target does not answer as its API promises",
         "truncated": "the target cuts its answers off"}


@dataclass(frozen=True)
class Coverage:
    """Of the requests a target's plan holds: how many were sent, and the unobserved ones by outcome."""

    planned: int
    sent: int
    unobserved: Counter[str]

    @property
    def observed(self) -> int:
        return self.sent - sum(self.unobserved.values())

    def reason(self) -> str | None:
        """Why these requests do not support "no leak", in one line; None when every planned request was sent
        and observed."""
        if self.observed == self.planned:
            return None
        parts = [f"{n} {OUTCOME_WORDS.get(outcome, outcome)}" for outcome, n in self.unobserved.most_common()]
        if self.sent < self.planned:
            parts.append(f"{self.planned - self.sent} not sent")
        hints = [HINTS[o] for o, _ in self.unobserved.most_common() if o in HINTS][:2]
        return (f"{self.observed} of {self.planned} planned requests observed ({', '.join(parts)})"
                + (f": {'; '.join(hints)}" if hints else ""))

    def to_json(self) -> CoverageDoc:
        return {"planned": self.planned, "sent": self.sent, "observed": self.observed,
                "unobserved": dict(self.unobserved)}
