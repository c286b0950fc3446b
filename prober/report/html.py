"""One self-contained HTML file that answers, in this order: did tenant data cross (the verdict), between
whom (a victim x observer matrix per target), at which prompt length (outcome against prompt length, with
the capacity boundaries), and what exactly (incidents, each with what to do and expanding to its findings
and masked evidence).  Preflight's verdicts stand beside each target.  No script and no network are needed to
read it; it prints.

The plots are hand-drawn SVG: two small charts of a few dozen points, a few lines of code each, no
dependency and nothing to load; a plotting library would add tens of megabytes for the same pictures.
"""

from __future__ import annotations

import datetime
import html
import json

from prober.domain.evidence import EngineCounters, find, of_json
from prober.domain.types import FindingDoc, FindingKind
from prober.domain.verdicts import Status
from prober.report.advice import WHAT_TO_DO
from prober.report.document import Document, TargetDoc, advertised_and_pool, bug_lines, engine_named, said_caches

COLOURS = {"served": "#2b8a3e", "refused": "#1c7ed6", "finding": "#e03131", "error": "#f08c00"}
SEVERITY_COLOURS = {"critical": "#c92a2a", "high": "#e8590c", "warning": "#e67700", "info": "#868e96"}
VERDICT_COLOURS = {Status.LEAK: "#c92a2a", Status.ENGINE_FAULT: "#e8590c", Status.INCOMPLETE: "#e67700",
                   Status.BLIND: "#e67700", Status.NO_LEAK: "#2b8a3e", Status.DRY_RUN: "#495057"}
W, H, PAD = 720, 220, 48
LABEL_FONT, LABEL_CHAR, LABEL_ROW = 9, 5.4, 10  # boundary labels: px per character at that size, px per row
PAIR_LEGEND = ("<b>victim → observer</b>: a canary planted in the victim's prompts came back in an answer to the "
               "observer, or the victim's prompt filled a cache that the observer's was served from; one name alone: "
               "what that tenant's answer showed, with no victim known.")

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#212529}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}
td,th{border:1px solid #dee2e6;padding:3px 6px;text-align:left;vertical-align:top}
code{font-size:12px;word-break:break-all}small,.muted{color:#868e96;font-weight:normal}
.verdict{color:#fff;padding:1em 1.5em;border-radius:6px}.verdict h1{margin:0 0 .2em}
.verdict dl{display:flex;flex-wrap:wrap;gap:.3em 2em;margin:.6em 0 0}.verdict dt{font-weight:600}
.verdict dd{margin:0}
.target{border-top:2px solid #dee2e6;margin-top:2em;padding-top:1em}
.head{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:1.5em}
.preflight{background:#f8f9fa;border-left:4px solid #adb5bd;padding:.4em 1em}
.preflight li{margin:.3em 0}
.matrix td.cell{text-align:center;font-weight:600;min-width:5em}
.matrix td.leak{background:#ffe3e3;color:#c92a2a}.matrix td.clean{background:#ebfbee;color:#2b8a3e}
.matrix td.self{background:#f1f3f5;color:#adb5bd}
.legend{font-size:12px;color:#495057;margin:.2em 0 .6em}.legend i{font-style:normal;font-weight:700}
.todo{display:block;margin:.2em 0 0 1.2em;font-size:13px;color:#495057}
details.incident{border:1px solid #dee2e6;border-radius:4px;margin:.4em 0;padding:.3em .6em}
details.incident summary{cursor:pointer}.sev{font-weight:700;text-transform:uppercase;font-size:12px}
@media print{body{margin:0;max-width:none}details.incident::details-content{content-visibility:visible;
display:block}details.incident summary{list-style:none}.target{break-before:page}
.verdict{-webkit-print-color-adjust:exact;print-color-adjust:exact}}
"""


def _esc(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _when(at: float | None) -> str:
    if not at:
        return "-"
    return datetime.datetime.fromtimestamp(at, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _clusters(lengths: list[int]) -> list[list[int]]:
    """Boundaries close together (within 2% of each other) share one zoomed panel."""
    groups: list[list[int]] = []
    for length in sorted(set(lengths)):
        if groups and length - groups[-1][-1] <= max(16, groups[-1][-1] * 0.02):
            groups[-1].append(length)
        else:
            groups.append([length])
    return groups


def label_rows(spans: list[tuple[float, float]], gap: float = 4.0) -> list[int]:
    """For labels centred at x with width w, the row each goes on (0 at the top) so that none overlaps
    another: left to right, each takes the first row whose last label ends before it starts."""
    rows: list[int] = [0] * len(spans)
    ends: list[float] = []  # per row, where its last label ends
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        x, width = spans[i]
        start = x - width / 2
        row = next((r for r, end in enumerate(ends) if end + gap <= start), len(ends))
        if row == len(ends):
            ends.append(0.0)
        ends[row] = x + width / 2
        rows[i] = row
    return rows


def outcome_plot(target: TargetDoc) -> str:
    """One panel per group of nearby boundaries: x = prompt tokens, zoomed to the group; y = outcome; a dot
    per probe (red when it produced a finding); dashed lines mark the boundaries, their labels in as many rows
    as it takes for none to overlap another."""
    steps = [s for s in target["steps"] if s["role"] == "probe"]
    if not steps:
        return '<p class="muted">No probes were sent.</p>'
    marks: dict[int, str] = {}  # boundaries at one length share a line and a label
    for b in (target["plan"]["boundaries"] if target["plan"] else []):
        marks[b["length"]] = f'{marks[b["length"]]} · {b["label"]}' if b["length"] in marks else b["label"]
    groups = _clusters(list(marks) or [s["prompt_tokens"] for s in steps])
    panel = (W - PAD) / len(groups)
    labels: list[tuple[float, str]] = []  # (x, text) of every boundary line
    lines, dots, axes = [], [], []
    for g, group in enumerate(groups):
        left = PAD + g * panel + 12
        width = panel - 24
        spread = max(group[-1] - group[0], 8)
        lo, hi = group[0] - spread * 0.15, group[-1] + spread * 0.15

        def x(n: float, left: float = left, width: float = width, lo: float = lo, hi: float = hi) -> float:
            return left + (n - lo) / (hi - lo) * width

        axes.append((left + width / 2, f'{group[0]:,}{"–" + format(group[-1], ",") if len(group) > 1 else ""} tokens'))
        for length in group:
            lines.append(x(length))
            labels.append((x(length), marks.get(length, "")))
        for k, s in enumerate(st for st in steps if lo <= st["prompt_tokens"] <= hi):
            dots.append((x(s["prompt_tokens"]), k, s))
    label_row = label_rows([(lx, len(text) * LABEL_CHAR) for lx, text in labels])
    top = (max(label_row, default=0) + 1) * LABEL_ROW + 6  # the plot starts below the last row of labels
    rows = {"served": top + 40, "refused": top + 90, "error": top + 140}
    height = top + H - 20
    parts = [f'<svg class="outcome-plot" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
             f'role="img" aria-label="outcome against prompt length"><rect width="{W}" height="{height}" fill="#fff"/>']
    for label, y in rows.items():
        parts.append(f'<text x="2" y="{y + 4}" font-size="11">{label}</text>'
                     f'<line x1="{PAD}" y1="{y}" x2="{W}" y2="{y}" stroke="#eee"/>')
    for lx in lines:
        parts.append(f'<line x1="{lx:.1f}" y1="{top}" x2="{lx:.1f}" y2="{rows["error"] + 20}" stroke="#adb5bd" '
                     'stroke-dasharray="3,3"/>')
    for (lx, text), lane in zip(labels, label_row, strict=True):
        parts.append(f'<text class="boundary" x="{lx:.1f}" y="{LABEL_ROW * (lane + 1)}" font-size="{LABEL_FONT}" '
                     f'fill="#495057" text-anchor="middle">{_esc(text)}</text>')
    for ax, text in axes:
        parts.append(f'<text x="{ax:.1f}" y="{height - 8}" font-size="10" text-anchor="middle">{_esc(text)}</text>')
    for cx, k, s in dots:
        row = "served" if s["outcome"] == "served" else "refused" if s["outcome"] == "refused" else "error"
        colour = COLOURS["finding"] if s["findings"] else COLOURS[row]
        title = (f"{s['id']} {s['tenant']} {s['prompt_tokens']:,} tokens ({s['boundary']}): {s['outcome']}, "
                 f"expected {s['expect']}, {s['findings']} findings")
        parts.append(f'<circle cx="{cx:.1f}" cy="{rows[row] + (k % 3 - 1) * 7}" r="5" fill="{colour}" '
                     f'fill-opacity="0.8"><title>{_esc(title)}</title></circle>')
    parts.append("</svg>")
    key = " · ".join(f'<span style="color:{COLOURS[name]}">●</span> {what}' for name, what in (
        ("served", "served"), ("refused", "refused"), ("error", "no answer"), ("finding", "produced a finding")))
    return "".join(parts) + f'<p class="legend">{key}; dashed lines: the boundaries of the plan.</p>'


def score_plot(findings: list[FindingDoc]) -> str:
    """Histogram of matched similarity scores per detector (exact matches sit at 1.0)."""
    scored = [(f["detector"], f["score"]) for f in findings if f["kind"] == "cross_tenant_echo"]
    if not scored:
        return '<p class="muted">No canary matches, so no similarity scores to plot.</p>'
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


def verdict_block(doc: Document) -> str:
    v = doc["verdict"]
    facts = [("worst severity", v["worst"] or "none"), ("incidents", doc["summary"]["incidents"]),
             ("findings", doc["summary"]["findings"]), ("tokens sent", f"{v['tokens_sent']:,}"),
             ("duration", f"{v['duration_s']:,} s"), ("targets", ", ".join(t["name"] for t in doc["targets"])),
             ("started", _when(doc["started"]))]
    items = "".join(f"<div><dt>{_esc(k)}</dt><dd>{_esc(val)}</dd></div>" for k, val in facts)
    why = "".join(f'<p class="why">{_esc(reason)}</p>' for reason in v["reasons"])
    return (f'<header id="verdict" class="verdict" data-status="{v["status"]}" '
            f'style="background:{VERDICT_COLOURS[v["status"]]}"><h1>{_esc(v["headline"].split(":")[0])}</h1>'
            f'<p>{_esc(v["headline"].split(": ", 1)[-1])}.</p>{why}<dl>{items}</dl></header>')


def matrix_table(target: TargetDoc) -> str:
    m = target["matrix"]
    if len(m["tenants"]) < 2:
        return '<p class="muted">Fewer than two tenants were probed.</p>'
    head = "".join(f'<th scope="col">{_esc(o)}</th>' for o in m["tenants"])
    rows = []
    for victim in m["tenants"]:
        cells = []
        for observer in m["tenants"]:
            if observer == victim:
                cells.append('<td class="cell self">—</td>')
                continue
            n = m["cells"][victim][observer]
            cells.append(f'<td class="cell {"leak" if n else "clean"}" data-victim="{_esc(victim)}" '
                         f'data-observer="{_esc(observer)}" data-count="{n}">{n}</td>')
        rows.append(f'<tr><th scope="row">{_esc(victim)}</th>{"".join(cells)}</tr>')
    return (f'<table class="matrix" data-target="{_esc(target["name"])}"><caption class="muted">Crossings '
            f'(canaries in answers, shared-cache hits): whose data (rows, the victim) reached whom (columns, the '
            f'observer)</caption><tr><th>'
            f'victim → observer</th>{head}</tr>{"".join(rows)}</table>')


def engine_moved(finding: FindingDoc) -> str:
    """The engine series that moved while the finding's request ran, read back from its evidence."""
    counters = find((of_json(item) for item in finding["details"]), EngineCounters)
    return ", ".join(f"{name} {delta:+g}" for name, delta in counters.moved().items()) if counters else ""


def finding_rows(findings: list[FindingDoc]) -> str:
    rows = []
    for f in findings:
        moved = engine_moved(f)
        rows.append(
            f"<tr><td>{_esc(f['record_id'])}</td><td>{_esc(f['prompt_tokens'])}</td><td>{_esc(f['boundary'])}</td>"
            f"<td>{_esc(f['detector'])} {f['score']:.2f}</td><td>{_esc(f['canary_id'] or '-')}</td>"
            f"<td><code>{_esc(f['evidence']['excerpt'])}</code></td><td>{_esc(moved or '-')}</td></tr>")
    return ("<table><tr><th>probe</th><th>prompt tokens</th><th>boundary</th><th>detector</th><th>canary</th>"
            f"<th>evidence (masked)</th><th>engine counters that moved</th></tr>{''.join(rows)}</table>")


def incident_list(doc: Document, target: str) -> str:
    items = []
    for incident in (i for i in doc["incidents"] if i["target"] == target):
        pair = f"{incident['victim']} → {incident['observer']}" if incident["victim"] else incident["observer"]
        colour = SEVERITY_COLOURS[incident["severity"]]
        findings = [doc["findings"][i] for i in incident["findings"]]
        items.append(
            f'<details class="incident" data-kind="{_esc(incident["kind"])}" data-victim="{_esc(incident["victim"])}" '
            f'data-observer="{_esc(incident["observer"])}"><summary><span class="sev" style="color:{colour}">'
            f'{_esc(incident["severity"])}</span> <b>{_esc(incident["kind"])}</b> {_esc(pair)} · at '
            f'{_esc(", ".join(incident["boundaries"]) or "-")} · {incident["count"]} finding'
            f'{"s" if incident["count"] != 1 else ""} · first {_esc(_when(incident["first_seen"]))}, last '
            f'{_esc(_when(incident["last_seen"]))}<span class="todo">What to do: '
            f'{_esc(WHAT_TO_DO[FindingKind(incident["kind"])])}</span></summary>{finding_rows(findings)}</details>')
    if not items:
        return '<p class="muted">No incidents.</p>'
    return f'<p class="legend">{PAIR_LEGEND}</p>' + "".join(items)


def target_section(doc: Document, t: TargetDoc) -> str:
    cap = t["capacity"]
    ctx, pool = advertised_and_pool(cap)
    facts = (f"engine {_esc(engine_named(cap))}; advertised context {f'{ctx:,}' if ctx else '?'} tokens; "
             f"KV pool {f'{pool:,}' if pool else '?'} tokens; tokens counted by {_esc(t['tokenizer'])}; "
             f"{t['tokens_sent']:,} tokens sent; {'complete' if t['complete'] else '<b>incomplete</b>'}."
             + "".join(f" Check {_esc(c['check'])}: {_esc(c['summary'])}." for c in t["checks"])
             + "".join(f" Path to the engine: {_esc(path['summary'])}." for path in t["paths"])
             + "".join(f" Cache map: {_esc(c['layer'])} cache on {_esc(c['route'])}: "
                       f"<b>{_esc(c['state'].replace('_', ' '))}</b> ({_esc(c['control'])})." for c in t["cache_map"])
             + "".join(f" Skipped {_esc(exchange)}: {_esc(why)}." for exchange, why in t["skipped"].items())
             + "".join(f" Note: {_esc(note)}." for note in t["notes"]))
    verdicts = "".join(f'<li><span class="sev" style="color:{SEVERITY_COLOURS.get(v["severity"], "#495057")}">'
                       f'{_esc(v["severity"])}</span> <b>{_esc(v["code"])}</b>: {_esc(v["message"])}</li>'
                       for v in t["verdicts"]) or "<li>no verdict</li>"
    verdicts += "".join(f"<li>{_esc(line)}</li>" for line in bug_lines(t["known_bugs"]) + said_caches(cap))
    notes = "".join(f'<li class="muted">{_esc(note)}</li>' for note in cap["notes"])
    errors = "".join(f"<li>{_esc(e)}</li>" for e in t["errors"])
    own = [f for f in doc["findings"] if f["target"] == t["name"]]
    return (f'<section class="target" data-target="{_esc(t["name"])}"><div class="head"><div><h2>{_esc(t["name"])} '
            f'<small>{_esc(t["url"])}</small></h2><p>{facts}</p></div><aside class="preflight"><h3>Preflight</h3>'
            f'<ul>{verdicts}{notes}</ul></aside></div>'
            f"<h3>Who reached whom</h3>{matrix_table(t)}"
            f"<h3>Outcome against prompt length</h3>{outcome_plot(t)}"
            f'<h3>Incidents</h3><div class="incidents">{incident_list(doc, t["name"])}</div>'
            f"{'<h3>Errors</h3><ul>' + errors + '</ul>' if errors else ''}"
            f"<h3>Similarity of matched canaries</h3>{score_plot(own)}</section>")


def html_report(doc: Document) -> str:
    data = json.dumps(doc, ensure_ascii=False).replace("</", "<\\/")
    sections = "".join(target_section(doc, t) for t in doc["targets"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>leakprobe: {_esc(doc["verdict"]["headline"])}</title><style>{STYLE}</style></head><body>
{verdict_block(doc)}
{sections}
<script type="application/json" id="leakprobe-data">{data}</script>
</body></html>
"""
