"""The engine's failure counters as evidence about leakprobe's own requests, apart from other users' noise.

An abort counted while every answer in the window came back HTTP 200 is the incident's signature: the engine gave
up on a request its client was told succeeded.  On a shared endpoint other users' disconnects and over-long prompts
are aborts too, in every window.  So a run tests, per failure counter, whether the counter rose faster in its own
windows than it does with none of its requests out:

- own: K events (each window's rise beyond the requests in it that were refused or failed, whose aborts the engine
  counts rightly) in D seconds of windows;
- background: B events in T seconds of stretches with none of this process's requests to the target out (read by
  the same telemetry between windows, and in a quiet stretch the run takes when it has too little).

Under "same rate" (no abort of ours), given the K + B events in all, the number that fell in our windows is
Binomial(K + B, D / (D + T)): the conditional test for two Poisson rates, exact whatever the rate and however little
background was seen (a short background only weakens the test, it never makes a false alarm likelier).  The
p-value is that binomial's upper tail at K; a counter is a finding where p is at most the false-alarm rate divided
by the number of failure counters the engine exposed in the run's windows (Bonferroni over every counter that could
have risen, not only those that did: a family picked after seeing which rose would make a false alarm likelier).
With no background at all (T = 0: every read of the counters came while a request of ours was out, or failed) there
is nothing to test against: the rise is undecided, and the check says so as something it could not do.  Windows that
cannot be evidence are left out, and said: another replica answered a read, a counter went down, another of our
requests ran beside, or an answer took a retry (the engine may have aborted the first attempt when the connection
dropped).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from prober.config.sections import CounterSettings
from prober.domain.evidence import CounterDecision, CounterTest, RisenWindow
from prober.domain.types import DetectorName, Finding, FindingKind, ProbeContext, Severity
from prober.targets.telemetry import FAILURES, Background, EngineTelemetry, Window

TEST = ("conditional binomial test of two Poisson rates: the counter's rise in leakprobe's own windows against its "
        "rise in stretches with none of its requests out; one-sided, Bonferroni over the failure counters the engine "
        "exposed")
MIN_BACKGROUND_S = 5.0  # with less background than this a run takes a quiet stretch before it decides


@dataclass(frozen=True)
class CountedWindow:
    """One of our windows that is evidence, and what its failure counters did beyond its own refusals."""

    request: str  # the request a finding is named on: the observer's answer, else the victim's
    tenant: str
    context: ProbeContext
    seconds: float
    excess: dict[str, float]


@dataclass
class CounterEvidence:
    """The windows of one run: added as they close, decided once at its end."""

    windows: list[CountedWindow] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)  # why windows were not evidence
    exposed: set[str] = field(default_factory=set)  # failure counters the engine showed in the evidence windows
    undecided: list[str] = field(default_factory=list)  # why a rise could not be tested: the check's errors

    def add(self, window: Window, *, request: str, tenant: str, context: ProbeContext, unserved: int,
            retried: bool) -> bool:
        """Whether the window is evidence: what only the counters show is checked for its requests."""
        if window.problem is not None:
            self.set_aside.append(f"{request}: {window.problem}")
        elif retried:
            self.set_aside.append(f"{request}: an answer took a retry (the engine may have counted the dropped "
                                  "attempt as an abort)")
        elif window.changed is not None:
            self.exposed |= FAILURES & window.changed.keys()
            excess = {name: rise - unserved for name, rise in window.failures().items() if rise > unserved}
            self.windows.append(CountedWindow(request, tenant, context, window.seconds, excess))
            return True
        return False

    def notes(self) -> list[str]:
        """What the report says of windows that were not evidence, by why."""
        why = Counter(reason.split(": ", 1)[1] for reason in self.set_aside)
        return [f"engine counters: {n} window{'s' if n > 1 else ''} set aside: {reason}" for reason, n in
                why.most_common()]

    @property
    def rose(self) -> bool:
        return any(w.excess for w in self.windows)

    async def decided(self, telemetry: EngineTelemetry | None, settings: CounterSettings, *,
                      quiet: bool = True) -> list[Finding]:
        """Where a counter rose in our windows: a quiet stretch first if too little background was seen (as long as
        our windows took, between `settings.quiet` and three times it), then the test."""
        if telemetry is None or not self.rose:
            return []
        own = sum(w.seconds for w in self.windows)
        waited = min(3 * settings.quiet, max(settings.quiet, own))
        if quiet and telemetry.background.seconds < MIN_BACKGROUND_S:
            await telemetry.quiet(waited)
        if telemetry.background.seconds <= 0:
            rose = Counter[str]()
            for w in self.windows:
                rose.update(w.excess)
            tried = f"a quiet stretch of {waited:g} s was read" if quiet else "the run was stopping: no quiet stretch"
            self.undecided.append(
                f"engine counters: {', '.join(f'{n} +{k:g}' for n, k in sorted(rose.items()))} in {own:.1f} s of "
                f"leakprobe's windows, and no stretch with none of its requests out to test that against ({tried}, "
                "none came back from one engine process with nothing of ours out): undecided")
            return []
        return self.findings(self.decide(telemetry.background, settings.false_alarm))

    def decide(self, background: Background, false_alarm: float) -> list[CounterDecision]:
        """Every failure counter that rose in our windows, tested against the background."""
        risen = sorted({name for w in self.windows for name in w.excess})
        if not risen:
            return []
        own_seconds = sum(w.seconds for w in self.windows)
        alpha = false_alarm / len(self.exposed)  # every counter that rose was exposed: at least one
        return [CounterDecision(name, k, round(own_seconds, 3), b, round(background.seconds, 3),
                                rate_test(k, own_seconds, b, background.seconds), alpha)
                for name in risen
                for k, b in [(sum(w.excess.get(name, 0.0) for w in self.windows), background.events(name))]]

    def findings(self, decisions: Iterable[CounterDecision]) -> list[Finding]:
        """One finding for the counters that rose significantly, named on the window that rose most."""
        found = [d for d in decisions if d.found]
        if not found:
            return []
        names = {d.counter for d in found}
        worst = max(self.windows, key=lambda w: sum(v for n, v in w.excess.items() if n in names))
        rising = [w for w in self.windows if names & w.excess.keys()]
        said = "; ".join(f"{d.counter} +{d.own_events:g} in {d.own_seconds:.1f} s of leakprobe's windows against "
                         f"+{d.background_events:g} in {d.background_seconds:.0f} s with none of its requests out "
                         f"(p = {d.p_value:.2g})" for d in found)
        return [Finding(
            record_id=worst.request, kind=FindingKind.COUNTED_FAILURE, detector=DetectorName.ENGINE_COUNTERS,
            severity=Severity.HIGH, score=1.0 - min(d.p_value for d in found), observer_tenant=worst.tenant,
            probe_id=worst.request, context=worst.context,
            excerpt=f"{said}: more than other users' traffic explains, while the answers came back HTTP 200 — the "
                    "engine gave up on requests it answered",
            evidence=(CounterTest(TEST, tuple(found), tuple(RisenWindow(w.request, round(w.seconds, 3), w.excess)
                                                            for w in rising)),))]


def rate_test(own: float, own_seconds: float, background: float, background_seconds: float) -> float:
    """One-sided p-value that the own windows' rate is no higher than the background's (1.0 where it cannot say)."""
    k, b = round(own), round(background)
    if k <= 0 or own_seconds <= 0:
        return 1.0
    if background_seconds <= 0:
        return 1.0
    from scipy.stats import binom  # here, not at the top: importing scipy.stats costs each command ~1.5 s

    share = own_seconds / (own_seconds + background_seconds)
    return float(binom.sf(k - 1, k + b, share))
