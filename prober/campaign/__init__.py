"""Boundary campaigns and sentinels: plan, run, check.  The runner wires targets, prompts, canaries and
detection; results come back as values, and observers hear typed events."""

from prober.campaign.events import Event, FindingRecorded, Listener, PlanReady, StepDone, SurveyDone, TargetFailed
from prober.campaign.plan import Plan, make_plan, sentinel_plan
from prober.campaign.results import AuditResult, StepResult, TargetReport
from prober.campaign.runner import Auditor, TargetRunner
from prober.campaign.survey import PreflightResult, preflight, survey

__all__ = ["AuditResult", "Auditor", "Event", "FindingRecorded", "Listener", "Plan", "PlanReady",
           "PreflightResult", "StepDone", "StepResult", "SurveyDone", "TargetFailed", "TargetReport",
           "TargetRunner", "make_plan", "preflight", "sentinel_plan", "survey"]
