"""Reports over an audit result: table, json, sarif, junit, html — each rendered from one document."""

from __future__ import annotations

import json
from enum import StrEnum

from prober.campaign.results import AuditResult
from prober.report.document import document
from prober.report.html import html_report
from prober.report.junit import junit
from prober.report.sarif import sarif
from prober.report.table import table_report
from prober.types import Severity


class ReportFormat(StrEnum):
    table = "table"
    json = "json"
    sarif = "sarif"
    junit = "junit"
    html = "html"


def render(result: AuditResult, fmt: ReportFormat, *, config_uri: str = "leakprobe.yaml",
           fail_on: Severity = Severity.WARNING) -> str:
    doc = document(result)
    if fmt is ReportFormat.json:
        return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"
    if fmt is ReportFormat.sarif:
        return json.dumps(sarif(doc, config_uri), ensure_ascii=False, indent=2) + "\n"
    if fmt is ReportFormat.junit:
        return junit(doc, fail_on) + "\n"
    if fmt is ReportFormat.html:
        return html_report(doc)
    return table_report(doc)


__all__ = ["ReportFormat", "document", "render"]
