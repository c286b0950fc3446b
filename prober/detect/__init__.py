"""Detection: is another tenant's canary (or foreign material) in this answer?  No HTTP here."""

from prober.detect.base import CanarySet, Detector, Hit
from prober.detect.exact import ExactDetector
from prober.detect.foreign import ForeignContentDetector
from prober.detect.fragment import FragmentDetector
from prober.detect.fuzzy import FuzzyDetector
from prober.detect.garbled import GarbledOutputDetector
from prober.detect.scanner import Scanner, ScanResult
from prober.detect.semantic import SemanticDetector
from prober.detect.verbatim import VerbatimDetector

__all__ = [
    "CanarySet",
    "Detector",
    "ExactDetector",
    "ForeignContentDetector",
    "FragmentDetector",
    "FuzzyDetector",
    "GarbledOutputDetector",
    "Hit",
    "ScanResult",
    "Scanner",
    "SemanticDetector",
    "VerbatimDetector",
]
