"""Checks that run a plan of exchanges (prober/probing/plan.py): the boundary campaign, the prefix-cache check and
the sentinel each make their plan in their own module, and run it alike here."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence

from prober.capacity.limits import Capacity
from prober.checks.base import Check, Run
from prober.checks.shapes import shaped
from prober.probing.exchanges import run_plan
from prober.probing.plan import Aim, Ask, Boundary, Plan, Planned, prime_length
from prober.probing.results import CheckResult

LONG_PROMPTS = "long-prompts"  # the campaign's and the prefix cache's probes: planted and laid out alike
# Quotes surface tokens verbatim; summaries and translations reword, so facts come out paraphrased (or in
# another language) and the semantic detector has something to find.
ASKS: tuple[Ask, ...] = ("quote", "summarize", "quote", "translate")


class PlanCheck(Check):
    @abstractmethod
    def plan(self, run: Run) -> Plan:
        """Its exchanges for what the survey learned (raises PlanError)."""

    def planned(self, run: Run) -> Planned:
        return Planned.of_plan(self.plan(run))

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        result = CheckResult(check=self.name, sees_with=self.sees_with)
        await shaped(run, result)
        await run_plan(run.target, planned.plan or self.plan(run), result, run.on_event)
        return result


Adder = Callable[..., str]  # adds one exchange to a plan and returns its id (`adder`)


def adder(plan: Plan, capacity: Capacity, max_tokens: int) -> Adder:
    """How a plan adds an exchange: primes at the longest prompt a correct engine serves unless told otherwise,
    asks in turn unless told (`ask`), and no more completion than the context leaves."""
    prime = prime_length(capacity)
    ctx = capacity.advertised.value if capacity.advertised else None

    def room(length: int) -> int:
        """Engines refuse prompt + max_tokens over the context; a probe tests the prompt, so it asks for
        no more completion than fits (at least one token)."""
        return max(1, min(max_tokens, ctx - length)) if ctx else max_tokens

    def add(victim: str, observer: str, boundary: Boundary, stream: bool, together: bool,
            same_text: bool = False, first: int = prime, prime_label: str = "prime", repeat: bool = False,
            prime_aim: Aim | None = None, ask: Ask | None = None, then: Sequence[Boundary] = (),
            unless_decided: str | None = None) -> str:
        ask = ask or ("quote" if same_text or repeat else ASKS[len(plan.exchanges) % len(ASKS)])
        return plan.add(victim, observer, boundary, stream=stream, concurrent=together, same_text=same_text,
                        prime_length=boundary.length if same_text else first, room=room, ask=ask,
                        prime_label=prime_label, repeat=repeat, prime_aim=prime_aim, then=then,
                        unless_decided=unless_decided)

    return add
