"""Boundary campaigns: plan, run, check.  The runner wires targets, prompts, canaries and detection."""

from prober.campaign.plan import Plan, PlanError, make_plan
from prober.campaign.runner import Auditor, AuditResult, StepResult, TargetReport

__all__ = ["AuditResult", "Auditor", "Plan", "PlanError", "StepResult", "TargetReport", "make_plan"]
