"""The machinery every check runs on: a target's context (survey, routes, the path, the probe shape), plans of
exchanges and the running of them, planting canaries, judging answers (envelope, cached tokens, the engine's
counters), results and typed events.  The checks themselves are prober/checks'."""

from prober.probing.context import TargetContext
from prober.probing.events import (
    CheckDone,
    Event,
    FindingRecorded,
    Listener,
    Observed,
    PlanReady,
    StepDone,
    SurveyDone,
    TargetFailed,
)
from prober.probing.plan import Plan
from prober.probing.results import AuditResult, CheckResult, StepResult, TargetReport
from prober.probing.survey import Survey, preflight, survey

__all__ = [
    "AuditResult",
    "CheckDone",
    "CheckResult",
    "Event",
    "FindingRecorded",
    "Listener",
    "Observed",
    "Plan",
    "PlanReady",
    "StepDone",
    "StepResult",
    "Survey",
    "SurveyDone",
    "TargetContext",
    "TargetFailed",
    "TargetReport",
    "preflight",
    "survey",
]
