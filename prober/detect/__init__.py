"""Detection: is another tenant's canary (or foreign material) in this answer?  No HTTP here."""

from prober.detect.base import CanarySet, Detector, Hit
from prober.detect.embedder import DEFAULT_MODEL, Embedder, EmbedderError, SentenceTransformerEmbedder
from prober.detect.exact import ExactDetector
from prober.detect.foreign import ForeignContentDetector
from prober.detect.fuzzy import FuzzyDetector
from prober.detect.scanner import Scanner, ScanResult
from prober.detect.semantic import SemanticDetector

__all__ = [
    "DEFAULT_MODEL",
    "CanarySet",
    "Detector",
    "Embedder",
    "EmbedderError",
    "ExactDetector",
    "ForeignContentDetector",
    "FuzzyDetector",
    "Hit",
    "ScanResult",
    "Scanner",
    "SemanticDetector",
    "SentenceTransformerEmbedder",
]
