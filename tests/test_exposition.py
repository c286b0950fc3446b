"""The daemon's metrics as a scrape shows them, pinned in a golden file: every name, type, help text and label set
that dashboards, alert rules and users' own queries are written against.  A change to the exposition is a change
to this file, made on purpose and reviewed: `LEAKPROBE_UPDATE_GOLDEN=1 pytest tests/test_exposition.py`."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from prober.checks import REGISTRY
from prober.daemon.metrics import Metrics
from prober.daemon.schedule import daemon_jobs

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden" / "metrics.txt"
# What differs between machines and runs: when a series was created, and the versions running.
CREATED = re.compile(r"^(# (HELP|TYPE) )?\w+_created[ {].*\n", re.MULTILINE)
VERSIONS = re.compile(r'(python|version)="[^"]*"')


def exposition() -> str:
    """A fresh daemon's scrape once one target's jobs are scheduled (the series it exports before any run)."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    for job in daemon_jobs(REGISTRY):
        metrics.schedule("target-1", job, 60.0, 1_000_000, ["tenant-a", "tenant-b"])
    text = CREATED.sub("", generate_latest(registry).decode())
    return VERSIONS.sub(r'\1="…"', text)


def test_the_exposition_is_the_golden_one() -> None:
    text = exposition()
    if os.environ.get("LEAKPROBE_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"no golden file: LEAKPROBE_UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == GOLDEN.read_text(), ("the metrics exposition changed; if on purpose: "
                                        f"LEAKPROBE_UPDATE_GOLDEN=1 pytest {__file__}")
