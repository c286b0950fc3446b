"""One self-contained HTML file: summary, findings, and two inline-SVG plots per target — outcome against
prompt length around each boundary, and the similarity scores of what the detectors matched."""

from __future__ import annotations

import html
import json
from typing import Any

COLOURS = {"served": "#2b8a3e", "refused": "#1c7ed6", "finding": "#e03131", "error": "#f08c00"}
SEVERITY_COLOURS = {"critical": "#c92a2a", "high": "#e8590c", "warning": "#f59f00", "info": "#868e96"}
W, H, PAD = 720, 220, 48


def _esc(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _clusters(lengths: list[int]) -> list[list[int]]:
    """Boundaries close together (within 2% of each other) share one zoomed panel."""
    groups: list[list[int]] = []
    for length in sorted(set(lengths)):
        if groups and length - groups[-1][-1] <= max(16, groups[-1][-1] * 0.02):
            groups[-1].append(length)
        else:
            groups.append([length])
    return groups


def outcome_plot(target: dict[str, Any]) -> str:
    """One panel per group of nearby boundaries: x = prompt tokens, zoomed to the group; y = outcome; a dot
    per probe (red when it produced a finding); dashed lines mark the boundaries."""
    steps = [s for s in target["steps"] if s["role"] == "probe"]
    if not steps:
        return "<p>No probes were sent.</p>"
    marks = {b["length"]: b["label"] for b in (target["plan"] or {}).get("boundaries", [])}
    groups = _clusters(list(marks) or [s["prompt_tokens"] for s in steps])
    rows = {"served": 80, "refused": 130, "error": 180}
    panel = (W - PAD) / len(groups)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H + 30}" role="img" '
             f'aria-label="outcome against prompt length"><rect width="{W}" height="{H + 30}" fill="#fff"/>']
    for label, y in rows.items():
        parts.append(f'<text x="2" y="{y + 4}" font-size="11">{label}</text>'
                     f'<line x1="{PAD}" y1="{y}" x2="{W}" y2="{y}" stroke="#eee"/>')
    for g, group in enumerate(groups):
        left = PAD + g * panel + 12
        width = panel - 24
        spread = max(group[-1] - group[0], 8)
        lo, hi = group[0] - spread * 0.15, group[-1] + spread * 0.15

        def x(n: float, left: float = left, width: float = width, lo: float = lo, hi: float = hi) -> float:
            return left + (n - lo) / (hi - lo) * width

        parts.append(f'<text x="{left + width / 2:.1f}" y="{H + 20}" font-size="10" text-anchor="middle">'
                     f'{group[0]:,}{"–" + format(group[-1], ",") if len(group) > 1 else ""} tokens</text>')
        for i, length in enumerate(group):
            parts.append(f'<line x1="{x(length):.1f}" y1="{50}" x2="{x(length):.1f}" y2="{H - 20}" '
                         f'stroke="#adb5bd" stroke-dasharray="3,3"/><text x="{x(length):.1f}" y="{11 + 10 * (i % 4)}" '
                         f'font-size="9" fill="#495057" text-anchor="middle">{_esc(marks.get(length, ""))}</text>')
        for k, s in enumerate(st for st in steps if lo <= st["prompt_tokens"] <= hi):
            row = "served" if s["outcome"] == "served" else "refused" if s["outcome"] == "refused" else "error"
            colour = COLOURS["finding"] if s["findings"] else COLOURS[row]
            title = (f"{s['id']} {s['tenant']} {s['prompt_tokens']:,} tokens ({s['boundary']}): {s['outcome']}, "
                     f"expected {s['expect']}, {s['findings']} findings")
            parts.append(f'<circle cx="{x(s["prompt_tokens"]):.1f}" cy="{rows[row] + (k % 3 - 1) * 7}" r="5" '
                         f'fill="{colour}" fill-opacity="0.8"><title>{_esc(title)}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def score_plot(findings: list[dict[str, Any]]) -> str:
    """Histogram of matched similarity scores per detector (exact matches sit at 1.0)."""
    scored = [(f["detector"], f["score"]) for f in findings if f["kind"] == "cross_tenant_echo"]
    if not scored:
        return "<p>No canary matches, so no similarity scores to plot.</p>"
    detectors = sorted({d for d, _ in scored})
    palette = ["#c92a2a", "#1971c2", "#2f9e44", "#f08c00"]
    bins = 20
    counts = {d: [0] * bins for d in detectors}
    for detector, score in scored:
        counts[detector][min(bins - 1, int(max(0.0, score) * bins))] += 1
    top = max(max(c) for c in counts.values())
    bar = (W - 2 * PAD) / bins / len(detectors)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H + 30}" role="img" '
             f'aria-label="similarity score distribution"><rect width="{W}" height="{H + 30}" fill="#fff"/>']
    for k, detector in enumerate(detectors):
        for b, n in enumerate(counts[detector]):
            if n:
                height = n / top * (H - 40)
                left = PAD + (b * len(detectors) + k) * bar
                parts.append(f'<rect x="{left:.1f}" y="{H - height:.1f}" width="{bar:.1f}" height="{height:.1f}" '
                             f'fill="{palette[k % 4]}"><title>{_esc(detector)} {b / bins:.2f}-{(b + 1) / bins:.2f}: '
                             f'{n}</title></rect>')
        parts.append(f'<text x="{W - PAD}" y="{20 + 12 * k}" font-size="11" text-anchor="end" '
                     f'fill="{palette[k % 4]}">{_esc(detector)}</text>')
    parts.append(f'<text x="{PAD}" y="{H + 20}" font-size="10">0.0</text><text x="{W - PAD}" y="{H + 20}" '
                 f'font-size="10" text-anchor="end">1.0 (score)</text></svg>')
    return "".join(parts)


def html_report(doc: dict[str, Any]) -> str:
    summary = doc["summary"]
    worst = summary["worst"] or "none"
    rows = "".join(
        f'<tr><td style="color:{SEVERITY_COLOURS[f["severity"]]}">{_esc(f["severity"])}</td><td>{_esc(f["kind"])}</td>'
        f'<td>{_esc(f["target"])}</td><td>{_esc(f["victim_tenant"] or "-")}</td><td>{_esc(f["observer_tenant"])}</td>'
        f'<td>{_esc(f["probe"])}</td><td>{_esc(f["prompt_tokens"])}</td><td>{_esc(f["boundary"])}</td>'
        f'<td>{_esc(f["detector"])}</td><td><code>{_esc(f["evidence"]["excerpt"])}</code></td></tr>'
        for f in doc["findings"])
    sections = []
    for t in doc["targets"]:
        verdicts = "".join(f"<li><b>{_esc(v['severity'])}</b> {_esc(v['code'])}: {_esc(v['message'])}</li>"
                           for v in t["verdicts"])
        errors = "".join(f"<li>{_esc(e)}</li>" for e in t["errors"])
        own = [f for f in doc["findings"] if f["target"] == t["name"]]
        sections.append(
            f"<section><h2>{_esc(t['name'])} <small>{_esc(t['url'])}</small></h2>"
            f"<p>Tokens counted by {_esc(t['tokenizer'])}; {t['tokens_sent']:,} tokens sent; "
            f"{'complete' if t['complete'] else '<b>incomplete</b>'}.</p><ul>{verdicts}</ul>"
            f"{'<h3>Errors</h3><ul>' + errors + '</ul>' if errors else ''}"
            f"<h3>Outcome against prompt length</h3>{outcome_plot(t)}"
            f"<h3>Similarity of matched canaries</h3>{score_plot(own)}</section>")
    data = json.dumps(doc, ensure_ascii=False).replace("</", "<\\/")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>leakprobe audit</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;
font-size:13px}}td,th{{border:1px solid #dee2e6;padding:3px 6px;text-align:left;vertical-align:top}}
code{{font-size:12px;word-break:break-all}}small{{color:#868e96;font-weight:normal}}</style></head><body>
<h1>leakprobe audit</h1>
<p>{summary['findings']} findings, worst: <b>{_esc(worst)}</b>; {summary['tokens_sent']:,} tokens sent;
audit {'complete' if doc['complete'] else '<b>incomplete</b>'}{' (dry run)' if doc['dry_run'] else ''}.</p>
<table><tr><th>severity</th><th>kind</th><th>target</th><th>victim</th><th>observer</th><th>probe</th>
<th>prompt tokens</th><th>boundary</th><th>detector</th><th>evidence</th></tr>{rows}</table>
{''.join(sections)}
<script type="application/json" id="leakprobe-data">{data}</script>
</body></html>
"""
