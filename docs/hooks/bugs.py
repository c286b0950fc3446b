"""mkdocs hook: the engine-bug table, rendered at build time from the checks' registry (each check's `bugs`, and
prober/checks/bugs.py).

A page asks for it with `<!-- bugs -->` on a line of its own and gets one row per public bug: what went wrong,
the engines' releases it is in and the fix, the reference engine's faults that reproduce it, the probe that
catches it and the finding it reports.  The
same rows drive tests/test_engine_bugs.py, so a documented row is a tested one.
"""

from __future__ import annotations

import re
from typing import Any

from prober.checks import REGISTRY

MARKER = re.compile(r"^<!-- bugs -->$", re.M)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return MARKER.sub(lambda _: table(), markdown)


def table() -> str:
    rows = ["| public bug | what went wrong | releases | reference-engine fault | the probe that catches it "
            "| finding |", "| --- | --- | --- | --- | --- | --- |"]
    for bug in REGISTRY.bugs:
        faults = ", ".join([f"`{name}`" for name, on in bug.faults.items() if on]
                           + [f"`{key}: {value}`" for key, value in bug.engine.items()])
        needs = "".join(f" (with `{key}: {value}`)" for key, value in bug.audit.items())
        lm = "; also with a real model" if bug.real_lm else ""
        releases = "; ".join(r.describe() for r in bug.releases) or "not the engine's own (no release to read)"
        rows.append(f"| {bug.public} | {bug.what} | {releases} | {faults} | {bug.probe}{needs} | "
                    f"`{bug.kind.value}`{lm} |")
    return "\n".join(rows)
