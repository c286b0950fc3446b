"""The detectors as they were before the automata (commit PREVIOUS), loaded from git history, so that a bench
times the previous implementation beside the current one in the same run: each speed-up is a ratio measured
on one machine at one moment, whatever else ran on it."""

from __future__ import annotations

import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from prober.detect import Detector, Scanner
from prober.detect.base import CanarySet
from prober.detect.values import SlotValues

PREVIOUS = "7fe03a2"  # the last commit with gram-hash exact, fuzzy and fragment detectors
ROOT = Path(__file__).resolve().parent.parent


def _module(path: str, **names: types.ModuleType) -> types.ModuleType:
    """`path` at PREVIOUS, run as a module of its own.  It imports today's other modules; `names` replaces some
    of them after the import with their PREVIOUS versions, where today's lost a name it used."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{PREVIOUS}:{path}"],
                            capture_output=True, text=True, check=True).stdout
    module = types.ModuleType(f"previous_{Path(path).stem}")
    module.__file__ = f"{PREVIOUS}:{path}"
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # our own history
    module.__dict__.update(names)
    return module


@dataclass(frozen=True)
class Previous:
    exact: type[Detector]
    fuzzy: type[Detector]
    fragment: type[Detector]

    def scanner(self, scanner: Scanner) -> Scanner:
        """`scanner` with the previous exact, fuzzy and fragment detectors in place of today's."""
        canaries: CanarySet = scanner.canary_set
        values = SlotValues(canaries)
        old: list[Detector] = [self.exact(canaries), self.fuzzy(canaries), self.fragment(canaries, values)]
        scanner.detectors = old + [d for d in scanner.detectors if d.name not in {"exact", "fuzzy", "fragment"}]
        scanner._by_name = {d.name: d for d in scanner.detectors}
        return scanner


def load() -> Previous | None:
    """The previous detectors, or None (with a line saying why) outside a git checkout that has PREVIOUS."""
    try:
        tokens = _module("prober/canaries/tokens.py")
        return Previous(_module("prober/detect/exact.py", tokens=tokens).ExactDetector,
                        _module("prober/detect/fuzzy.py", tokens=tokens).FuzzyDetector,
                        _module("prober/detect/fragment.py", tokens=tokens).FragmentDetector)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"(no previous implementation to time: git show {PREVIOUS} failed: {exc})")
        return None
