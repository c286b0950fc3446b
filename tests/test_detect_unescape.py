"""`leakprobe scan` over logs that stored answers escaped: HTML character references, URL encoding, JSON `\\u`
escapes, and escapes of escapes.  Each canary is found, attributed, and located in the line as it was written."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from tests.support.cli import mint, run, write_jsonl


def _html(text: str) -> str:
    return "".join(f"&#{ord(ch)};" for ch in text)


def _json_u(text: str) -> str:
    units = text.encode("utf-16-be")
    return "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))


ESCAPES: dict[str, Callable[[str], str]] = {
    "html": _html,
    "html_hex": lambda t: "".join(f"&#x{ord(ch):x};" for ch in t),
    "url": lambda t: "".join(f"%{b:02X}" for b in t.encode()),
    "json_u": _json_u,
    "html_escaped_again": lambda t: _html(t).replace("&", "&amp;"),
    "url_of_html": lambda t: urllib.parse.quote(_html(t), safe=""),
}


def test_scan_finds_canaries_written_in_any_common_escape(tmp_path: Path) -> None:
    ledger = tmp_path / "l.sqlite"
    token = str(mint(ledger, "tenant-a", count=1)[0]["text"])
    fact = mint(ledger, "tenant-a", kind="fact", count=1)[0]
    minted = run("canaries", "mint", "--ledger", str(ledger), "--tenant", "tenant-a", "--kind", "fact",
                 "--language", "ko", "--format", "json")
    assert minted.returncode == 0, minted.stderr
    korean = json.loads(minted.stdout)[0]
    lines: list[object] = []
    for name, escape in ESCAPES.items():
        lines.append({"id": f"tok-{name}", "tenant": "tenant-b", "text": f"<p>Code: {escape(token)}</p>"})
    lines.append({"id": "fact-html", "tenant": "tenant-b", "text": _html(str(fact["text"]))})
    lines.append({"id": "ko-url", "tenant": "tenant-b", "text": urllib.parse.quote(str(korean["text"]))})
    clean = "Save 50% at AT&T &amp; R&amp;D; path C:\\new\\u00zz %zz &#xZZ; &unknown; &lt;b&gt;"
    lines.append({"id": "clean", "tenant": "tenant-b", "text": clean})
    out = run("scan", "--ledger", str(ledger), "--no-semantic", "--format", "json",
              str(write_jsonl(tmp_path / "escaped.jsonl", lines)))
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["scanned"] == len(lines)
    found = {f["record_id"]: f for f in report["findings"]}
    assert set(found) == {*(f"tok-{n}" for n in ESCAPES), "fact-html", "ko-url"}
    texts = {str(line["id"]): str(line["text"]) for line in lines if isinstance(line, dict)}
    for record_id, finding in found.items():
        assert (finding["kind"], finding["victim_tenant"]) == ("cross_tenant_echo", "tenant-a"), finding
        assert next(d["kinds"] for d in finding["details"] if d["type"] == "escaped"), finding
        start, end = finding["evidence"]["offsets"]
        assert texts[record_id][start] in "&%\\" and texts[record_id][end - 1] in ";0123456789ABCDEFabcdef"
    assert found["tok-html"]["evidence"]["offsets"][0] == len("<p>Code: ") + len(_html("LPK-"))
    assert found["fact-html"]["canary_id"] == fact["id"] and found["ko-url"]["canary_id"] == korean["id"]
