"""Where the shipped data lives (inside the wheel, or at the top of a source checkout), and where data derived
on this machine is cached."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path


@cache
def canaries_dir() -> Path:
    """`canaries/` (packs and filler corpora).

    A wheel carries it as prober/_data/canaries; an editable install or a checkout reads the
    repository's own `canaries/` so that edits take effect without reinstalling.
    """
    package = Path(__file__).resolve().parents[1]  # prober/
    for candidate in (package / "_data" / "canaries", package.parent / "canaries"):
        if (candidate / "packs").is_dir():
            return candidate
    raise FileNotFoundError("canary packs not found: reinstall leakprobe (the wheel ships prober/_data/canaries)")


def cache_root() -> Path:
    """Models and tables built once per machine: `LEAKPROBE_CACHE`, else ~/.cache/leakprobe."""
    return Path(os.environ.get("LEAKPROBE_CACHE", Path.home() / ".cache" / "leakprobe"))
