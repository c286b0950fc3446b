"""mkdocs hook: the table of registered checks, rendered from prober/checks/registry.py at build time.

A page asks for it with `<!-- checks -->` on a line of its own and gets one row per check, in the order an audit
runs them: its name (the daemon's job, the metrics' `job` label, the report's `check`), what it catches, how often
the daemon runs it by default, and whether `leakprobe audit` runs it at the default settings.
"""

from __future__ import annotations

import re
from typing import Any

from prober.checks import REGISTRY
from prober.config.schema import ProberConfig
from prober.daemon.schedule import PREFLIGHT_EVERY

MARKER = re.compile(r"^<!-- checks -->$", re.M)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return MARKER.sub(lambda _: table(), markdown)


def table() -> str:
    defaults = ProberConfig.model_validate({"targets": [{"name": "t", "url": "http://t/v1"}]})
    rows = ["| check (job) | what it catches | daemon, every | `audit` |", "| --- | --- | --- | --- |",
            f"| `preflight` | reachability with every tenant's key, capacity and verdicts (no generation request; "
            f"not a check) | {spelled(PREFLIGHT_EVERY)} | yes |"]
    rows += [f"| [`{c.name}`]({c.docs}#{c.name}) | {c.about} | {spelled(c.every)} | "
             f"{'yes' if c.in_audit(defaults) else 'no'} |" for c in REGISTRY]
    return "\n".join(rows)


def spelled(seconds: float | None) -> str:
    """As the config spells durations: 1m, 5m, 6h (`off`: the daemon runs it only where its schedule says)."""
    if seconds is None:
        return "off"
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
