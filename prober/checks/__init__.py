"""The checks: each one way a target can be caught leaking, behind one contract (`Check`: a name, what a run costs,
the run) and one registry that the audit and the daemon loop over."""

from prober.checks.base import DEADLINE_BASE_S, SURVEY_ALLOWANCE_S, Check, Run, perform, planning
from prober.checks.registry import REGISTRY, Registry
from prober.probing.plan import Planned

__all__ = ["DEADLINE_BASE_S", "REGISTRY", "SURVEY_ALLOWANCE_S", "Check", "Planned", "Registry", "Run",
           "perform", "planning"]
