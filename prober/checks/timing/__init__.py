"""The timing check of prefix-cache isolation: the check and its requests (`check`), the decision over its samples
(`stats`), what a run concluded (`result`) and the series its results carry (`metrics`)."""

from prober.checks.timing.check import Send, TimingCheck, check_decidable, check_timing, findings_of, random_text
from prober.checks.timing.result import TimingResult

__all__ = ["Send", "TimingCheck", "TimingResult", "check_decidable", "check_timing", "findings_of", "random_text"]
