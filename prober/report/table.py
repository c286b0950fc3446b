"""The terminal report: boundary outcomes per target, then the findings, then where to read more."""

from __future__ import annotations

import io
import time
from typing import Any

from rich.console import Console
from rich.table import Table


def table_report(doc: dict[str, Any], width: int = 140) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, highlight=False, color_system=None)
    for t in doc["targets"]:
        cap = t["capacity"]
        ctx = (cap.get("context_length") or cap.get("accept_limit") or {}).get("value")
        pool = (cap.get("pool_tokens") or {}).get("value")
        console.print(f"[bold]{t['name']}[/] {t['url']}  engine {cap['engine'] or '?'}, advertised "
                      f"{ctx if ctx is None else f'{ctx:,}'}, KV pool {pool if pool is None else f'{pool:,}'}, "
                      f"tokens counted by {t['tokenizer']}")
        for v in t["verdicts"]:
            console.print(f"  preflight {v['severity']}: {v['code']}: {v['message']}")
        probes = Table("probe", "tenant", "boundary", "tokens", "expect", "outcome", "status", "stream", "findings",
                       title=f"{t['name']}: probes", title_justify="left")
        for s in t["steps"]:
            if s["role"] == "probe":
                mark = "" if (s["outcome"] == s["expect"]) else " (!)"
                probes.add_row(s["id"], s["tenant"], s["boundary"], f"{s['prompt_tokens']:,}", s["expect"],
                               s["outcome"] + mark, str(s["status"]), "yes" if s["stream"] else "no",
                               str(s["findings"]))
        if t["steps"]:
            console.print(probes)
        if doc["dry_run"] and t["plan"]:
            plan = Table("exchange", "victim", "observer", "boundary", "prime tokens", "probe tokens", "expect",
                         "stream", "concurrent", title=f"{t['name']}: plan ({t['plan']['tokens']:,} tokens)",
                         title_justify="left")
            for e in t["plan"]["exchanges"]:
                plan.add_row(e["id"], e["victim"], e["observer"], e["boundary"], f"{e['prime_tokens']:,}",
                             f"{e['probe_tokens']:,}", e["expect"], "yes" if e["stream"] else "no",
                             "yes" if e["concurrent"] else "no")
            console.print(plan)
        for e in t["errors"]:
            console.print(f"  error: {e}")
    if doc["incidents"]:
        incidents = Table("severity", "kind", "target", "victim", "observer", "findings", "first seen", "last seen",
                          title="incidents", title_justify="left")
        for i in doc["incidents"]:
            incidents.add_row(i["severity"], i["kind"], i["target"] or "-", i["victim"] or "-", i["observer"],
                              str(i["count"]), _clock(i["first_seen"]), _clock(i["last_seen"]))
        console.print(incidents)
    if doc["findings"]:
        findings = Table("severity", "kind", "target", "victim", "observer", "probe", "tokens", "detector",
                         "evidence", title="findings", title_justify="left")
        for f in doc["findings"]:
            findings.add_row(f["severity"], f["kind"], f["target"] or "-", f["victim_tenant"] or "-",
                             f["observer_tenant"], f["probe"], f"{f['prompt_tokens'] or 0:,}", f["detector"],
                             (f["evidence"]["excerpt"] or "")[:60])
        console.print(findings)
    s = doc["summary"]
    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(s["by_kind"].items())) or "none"
    console.print(f"{s['findings']} findings ({by_kind}); worst {s['worst'] or 'none'}; "
                  f"{s['tokens_sent']:,} tokens sent; audit {'complete' if doc['complete'] else 'INCOMPLETE'}"
                  f"{' (dry run: nothing sent)' if doc['dry_run'] else ''}")
    return out.getvalue()


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"
