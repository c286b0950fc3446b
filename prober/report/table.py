"""The text report, in the HTML report's order: the verdict, then per target its preflight verdicts, who
reached whom, the outcome at each boundary and the incidents with their findings under them."""

from __future__ import annotations

import time

from prober.domain.verdicts import Status
from prober.report.document import (
    Document,
    TargetDoc,
    advertised_and_pool,
    bug_lines,
    engine_named,
    said_caches,
    trace_of,
)
from prober.report.terminal import Terminal

STATUS_STYLE = {Status.LEAK: "bold red", Status.ENGINE_FAULT: "bold red", Status.INCOMPLETE: "bold yellow",
                Status.BLIND: "bold yellow", Status.NO_LEAK: "bold green", Status.DRY_RUN: "bold"}


def table_report(doc: Document, terminal: Terminal | None = None) -> str:
    term = terminal or Terminal()
    v = doc["verdict"]
    parts = [term.style(v["headline"], STATUS_STYLE[v["status"]]) + "\n",
             f"worst {v['worst'] or 'none'}; {doc['summary']['incidents']} incidents, {doc['summary']['findings']} "
             f"findings; {v['tokens_sent']:,} tokens sent in {v['duration_s']:,} s\n"]
    parts += [f"why: {reason}\n" for reason in v["reasons"]]
    for t in doc["targets"]:
        parts.append("\n" + _target(doc, t, term))
    return "".join(parts)


def _target(doc: Document, t: TargetDoc, term: Terminal) -> str:
    cap = t["capacity"]
    ctx, pool = advertised_and_pool(cap)
    parts = [term.style(t["name"], "bold") + f" {t['url']}\n",
             f"  engine {engine_named(cap)}, advertised {'?' if ctx is None else f'{ctx:,}'}, KV pool "
             f"{'?' if pool is None else f'{pool:,}'}, tokens counted by {t['tokenizer']}, {t['tokens_sent']:,} "
             f"tokens sent, {'complete' if t['complete'] else 'INCOMPLETE'}\n"]
    parts += [f"  preflight {v['severity']}: {v['code']}: {v['message']}\n" for v in t["verdicts"]]
    parts += [f"  {line}\n" for line in bug_lines(t["known_bugs"]) + said_caches(cap)]
    parts += [f"  check {c['check']}: {c['summary']}\n" for c in t["checks"]]
    parts += [f"  path to the engine: {path['summary']}\n" for path in t["paths"]]
    parts += [f"  cache map: {c['layer']} cache on {c['route']}: {c['state'].replace('_', ' ')} ({c['control']})\n"
              for c in t["cache_map"]]
    parts += [f"  skipped {exchange}: {why}\n" for exchange, why in t["skipped"].items()]
    parts += [f"  note: {note}\n" for note in t["notes"]]
    parts += [f"  capacity note: {note}\n" for note in cap["notes"]]
    m = t["matrix"]
    if len(m["tenants"]) > 1:
        rows = [[victim] + ["-" if o == victim else str(m["cells"][victim][o]) for o in m["tenants"]]
                for victim in m["tenants"]]
        parts.append(term.table(["victim \\ observer", *m["tenants"]], rows, f"{t['name']}: who reached whom"))
    probes = [[s["id"], s["tenant"], s["boundary"], f"{s['prompt_tokens']:,}", s["expect"],
               s["outcome"] + ("" if s["outcome"] == s["expect"] else " (!)"), str(s["status"]),
               "yes" if s["stream"] else "no", str(s["findings"])] for s in t["steps"] if s["role"] == "probe"]
    if probes:
        parts.append(term.table(["probe", "tenant", "boundary", "tokens", "expect", "outcome", "status", "stream",
                                 "findings"], probes, f"{t['name']}: outcome at each boundary"))
    if doc["dry_run"] and t["planned"]:
        parts.append(_costs(t, term))
    if doc["dry_run"] and t["plan"]:
        plan = [[e["id"], e["victim"], e["observer"], e["boundary"], f"{e['prime_tokens']:,}", f"{e['probe_tokens']:,}",
                 e["ask"], e["expect"], "yes" if e["stream"] else "no", "yes" if e["concurrent"] else "no"]
                for e in t["plan"]["exchanges"]]
        parts.append(term.table(["exchange", "victim", "observer", "boundary", "prime tokens", "probe tokens", "ask",
                                 "expect", "stream", "concurrent"], plan,
                                f"{t['name']}: plan ({t['plan']['tokens']:,} tokens)"))
        share = t["plan"]["fact_share"]
        parts.append("  canaries: a token in every KV page of every prompt; "
                     + (f"1 in {round(1 / share)} canary units also carries a fact (in each tenant's language), "
                        "within the same token count\n" if share else "no fact canaries (semantic detection off)\n"))
    for incident in (i for i in doc["incidents"] if i["target"] == t["name"]):
        pair = f"{incident['victim']} -> {incident['observer']}" if incident["victim"] else incident["observer"]
        parts.append(f"  incident {term.style(incident['severity'], 'bold')} {incident['kind']} {pair} at "
                     f"{', '.join(incident['boundaries']) or '-'}: {incident['count']} findings, first "
                     f"{_clock(incident['first_seen'])}, last {_clock(incident['last_seen'])}\n")
        for f in (doc["findings"][i] for i in incident["findings"]):
            trace = trace_of(f)
            fields = [f["record_id"], f"{f['prompt_tokens'] or 0:,} tokens", f["detector"], f["canary_id"],
                      trace and f"trace {trace}", f["evidence"]["excerpt"]]
            parts.append("    " + " ".join(str(x) for x in fields if x) + "\n")
    parts += [f"  error: {e}\n" for e in t["errors"]]
    return "".join(parts)


def _costs(t: TargetDoc, term: Terminal) -> str:
    """What each check plans to send the target, and what of it a correct engine serves (and, at the target's
    price, what that costs)."""
    price = t["price_per_mtok"]
    planned = t["planned"]
    rows = [[name, f"{p['tokens']:,}", f"{p['served']:,}", f"{p['requests']:,}", f"{p['seconds']:,}",
             *([f"{p['price'] or 0:,.2f}"] if price is not None else []), "not run (moot)" if p["moot"] else ""]
            for name, p in planned.items()]
    total = {k: sum(p[k] for p in planned.values()) for k in ("tokens", "served", "requests")}
    rows.append(["all", f"{total['tokens']:,}", f"{total['served']:,}", f"{total['requests']:,}",
                 f"{sum(p['seconds'] for p in planned.values()):,.1f}",
                 *([f"{sum(p['price'] or 0 for p in planned.values()):,.2f}"] if price is not None else []), ""])
    header = ["check", "tokens sent", "served", "requests", "seconds", *(["price"] if price is not None else []), ""]
    at = f" at {price:g} per million served prompt tokens" if price is not None else ""
    return term.table(header, rows, f"{t['name']}: cost per check{at}")


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"
