"""Reports over an audit result: table, json, sarif, junit, html — each rendered from one document."""

from __future__ import annotations

import json
from enum import StrEnum

from prober.domain.types import Severity
from prober.probing.results import AuditResult
from prober.report.document import document
from prober.report.html import html_report
from prober.report.junit import junit
from prober.report.sarif import sarif
from prober.report.table import table_report
from prober.report.terminal import Terminal


class ReportFormat(StrEnum):
    table = "table"
    json = "json"
    sarif = "sarif"
    junit = "junit"
    html = "html"


def render(result: AuditResult, fmt: ReportFormat, *, config_uri: str = "leakprobe.yaml",
           fail_on: Severity = Severity.WARNING, terminal: Terminal | None = None) -> str:
    """`terminal`: where a table goes (colour and wrapping on a terminal; plain lines elsewhere)."""
    doc = document(result)
    if fmt is ReportFormat.json:
        return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"
    if fmt is ReportFormat.sarif:
        return json.dumps(sarif(doc, config_uri), ensure_ascii=False, indent=2) + "\n"
    if fmt is ReportFormat.junit:
        return junit(doc, fail_on) + "\n"
    if fmt is ReportFormat.html:
        return html_report(doc)
    return table_report(doc, terminal)


__all__ = ["ReportFormat", "Terminal", "document", "render"]
