"""The day a schedule projects from its jobs' last plans, against the budget, and the pace a large plan sets (pure
arithmetic over a registry)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from prober.checks import REGISTRY
from prober.config.sections import DaemonSettings
from prober.daemon.schedule import Timetable
from prober.daemon.spending import Projection, Spending

pytestmark = pytest.mark.unit


def test_each_plan_times_its_runs_a_day_against_the_budget() -> None:
    intervals = {"sentinel": 60.0, "campaign": 21_600.0}
    assert Projection.of("t", 20_000_000, {"unscheduled": 5}, intervals) is None  # off the schedule: nothing
    fits = Projection.of("t", 20_000_000, {"sentinel": 1_024}, intervals)
    assert fits is not None and fits.fits and fits.tokens == 1_024 * 1_440
    plans = {"sentinel": 1_024, "campaign": 5_000_000, "unscheduled": 5}
    over = Projection.of("t", 20_000_000, plans, intervals)
    assert over is not None and not over.fits and over.by_job == {"sentinel": 1_474_560, "campaign": 20_000_000}
    assert over.describe().startswith("t: the schedule plans 21,474,560 prompt tokens a day (campaign 20,000,000, "
                                      "sentinel 1,474,560), over daemon.tokens_per_day (20,000,000)")
    registry = CollectorRegistry()
    Spending(registry).show(over, plans)
    assert registry.get_sample_value("leakprobe_token_budget_projected_tokens", {"target": "t"}) == 21_474_560
    assert registry.get_sample_value("leakprobe_job_planned_tokens", {"target": "t", "job": "campaign"}) == 5_000_000
    assert registry.get_sample_value("leakprobe_job_planned_tokens", {"target": "t", "job": "unscheduled"}) is None


def test_a_default_scheduled_job_is_paced_to_its_share_and_a_named_one_is_kept() -> None:
    daemon = DaemonSettings(tokens_per_day=50_000_000, job_share=0.3, schedule={"timing": 3_600.0})
    timetable = Timetable(daemon, REGISTRY)
    assert timetable.interval("campaign") == 21_600.0  # no plan yet: its default
    assert timetable.interval("campaign", 350_316) == 21_600.0  # 1.4 M a day: well inside 15 M
    incident = timetable.interval("campaign", 10_955_403)  # the incident's sizes: 43.8 M a day at 6 h
    assert incident == pytest.approx(10_955_403 * 86_400 / 15_000_000) and 17 * 3_600 < incident < 18 * 3_600
    assert timetable.interval("timing", 100_000_000) == 3_600.0  # named: the operator's interval stands
    assert timetable.jitter("campaign", incident) == pytest.approx(incident / 10)


def test_a_paced_interval_past_the_hold_is_said_as_the_start_says_a_named_one() -> None:
    """The start warns of intervals it knows (the defaults, the named ones); pacing warns of the one it sets."""
    timetable = Timetable(DaemonSettings(incident_hold=3_600.0, schedule={"crosstalk": 7_200.0}), REGISTRY)
    warned = {w.split(" ")[0].removeprefix("daemon.schedule.") for w in timetable.recheck_warnings()}
    assert {"crosstalk", "campaign"} <= warned and not {"sentinel", "request-ids", "preflight"} & warned, warned
    assert timetable.recheck_warning("sentinel", 60.0) is None and timetable.recheck_warning("preflight", 1e6) is None
    paced = timetable.recheck_warning("sentinel", 63_103.0)
    assert paced is not None and "69413.3 s with jitter" in paced and "daemon.incident_hold (3600 s)" in paced
