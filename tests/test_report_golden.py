"""Every report format rendered from one stored document, pinned in golden files: the table an on-call reads, the
HTML page, SARIF for code scanning and JUnit for CI are what users parse and diff, so a change to any of them is
made on purpose and reviewed: `LEAKPROBE_UPDATE_GOLDEN=1 pytest tests/test_report_golden.py`.

The document (`tests/golden/report/document.json`) is the JSON report of a real audit of the reference engine's
`incident` preset at the tests' sizes; a test checks that it still has every field today's `Document` declares, so
the goldens are rendered from what the code produces, not from a shape it left behind.  Made again with

    leakprobe testbed serve --config tests/golden/report/engine.yaml --port 18777 &
    LP_A=testbed-key-a LP_B=testbed-key-b leakprobe audit --target http://127.0.0.1:18777/v1 \
        --tenant tenant-a=LP_A --tenant tenant-b=LP_B --no-semantic --skip timing --skip crosstalk \
        --skip request-ids --skip abort-retry \
        --ledger /tmp/golden.sqlite -f json -o tests/golden/report/document.json
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict

import pytest

from prober.domain.types import Severity
from prober.report.document import Document
from prober.report.html import html_report
from prober.report.junit import junit
from prober.report.sarif import sarif
from prober.report.table import table_report

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden" / "report"
DOCUMENT: Document = json.loads((GOLDEN / "document.json").read_text())
RENDERINGS = {
    "table.txt": lambda: table_report(DOCUMENT),
    "report.html": lambda: html_report(DOCUMENT),
    "sarif.json": lambda: json.dumps(sarif(DOCUMENT, "leakprobe.yaml"), ensure_ascii=False, indent=2) + "\n",
    "junit.xml": lambda: junit(DOCUMENT, Severity.WARNING) + "\n",
}


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_each_format_renders_the_golden_one(name: str) -> None:
    text = RENDERINGS[name]()
    if os.environ.get("LEAKPROBE_UPDATE_GOLDEN"):
        (GOLDEN / name).write_text(text)
    assert (GOLDEN / name).read_text() == text, (
        f"the {name} rendering changed; if on purpose: LEAKPROBE_UPDATE_GOLDEN=1 pytest {__file__}")


def _missing(value: Any, hint: Any, where: str) -> list[str]:
    """Fields a TypedDict requires that `value` lacks, recursively through lists, mappings and optionals of them."""
    if is_typeddict(hint):
        assert isinstance(value, dict), where
        fields = get_type_hints(hint)
        inside = [gap for key, inner in fields.items() if key in value
                  for gap in _missing(value[key], inner, f"{where}.{key}")]
        return [f"{where}.{key}" for key in sorted(hint.__required_keys__) if key not in value] + inside
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType) and value is not None:
        return [gap for arm in args if is_typeddict(arm) for gap in _missing(value, arm, where)]
    if origin is list:
        return [gap for i, item in enumerate(value) for gap in _missing(item, args[0], f"{where}[{i}]")] \
            if isinstance(value, list) else [f"{where} (not a list)"]
    if origin is dict:
        return [gap for key, item in value.items() for gap in _missing(item, args[1], f"{where}.{key}")] \
            if isinstance(value, dict) else [f"{where} (not an object)"]
    return []


def test_the_stored_document_has_every_field_of_todays() -> None:
    assert _missing(DOCUMENT, Document, "document") == []
    assert DOCUMENT["incidents"] and DOCUMENT["findings"] and DOCUMENT["targets"][0]["steps"]
