"""`leakprobe demo`: the incident, reproduced on the reference engine in this process, and caught.

Tenant A sends a long prompt (below the KV pool) with a canary token minted for it in every stretch
of text; tenant B then sends a canary-free prompt between the pool and the advertised context.  On
the `incident` preset B's HTTP 200 answer quotes A's canaries, and the scanner attributes them to A;
on `fixed` B gets a 400 and nothing of A's.  (The boundary audit replaces this scripted exchange.)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx
from rich.console import Console

from prober.canaries.filler import load_filler
from prober.canaries.mint import Minter
from prober.detect import Scanner
from prober.ledger import open_ledger
from prober.testbed import DEFAULT_TENANTS, TestbedServer, build_config, tokenizer
from prober.types import Record

INSTRUCTION = "Quote the document."
KEY = b"leakprobe-demo-key-not-a-secret!"


def _prompt(blocks: list[str], tokens: int) -> str:
    """INSTRUCTION plus blocks repeated until the engine's tokenizer counts about `tokens`."""
    body = " ".join(blocks) + " "
    per_copy = tokenizer.count(body * 2) - tokenizer.count(body)
    return INSTRUCTION + "\n" + body * max(1, tokens // per_copy)


def _exchange(console: Console, preset: str, ledger_path: Path) -> bool:
    config = build_config(preset)
    ledger = open_ledger(ledger_path)
    canaries = Minter(ledger, KEY).tokens("tenant-a", 8, probe_id=f"demo-{preset}")
    filler = load_filler("en").text(3_000)
    a_blocks = [f"{filler} The access code is {c.text}." for c in canaries]
    keys = {name: {"Authorization": f"Bearer {key}"} for name, key in DEFAULT_TENANTS.items()}
    with TestbedServer(config) as server, httpx.Client(base_url=server.url + "/v1", timeout=120) as http:
        console.rule(f"preset [bold]{preset}[/]: advertised context {config.context_length:,} tokens, "
                     f"KV pool {config.pool_tokens:,} tokens")
        a = http.post("/completions", headers=keys["tenant-a"],
                      json={"prompt": _prompt(a_blocks, 200_000), "max_tokens": 64})
        console.print(f"tenant-a sends {a.json()['usage']['prompt_tokens']:,} tokens with "
                      f"{len(canaries)} canaries -> HTTP {a.status_code}")
        b_prompt = _prompt([filler], (config.pool_tokens + config.context_length) // 2)
        b = http.post("/completions", headers=keys["tenant-b"], json={"prompt": b_prompt, "max_tokens": 256})
        console.print(f"tenant-b sends {tokenizer.count(b_prompt):,} tokens -> HTTP {b.status_code}")
        if b.status_code != 200:
            console.print(f"  refused: {b.json().get('message')}")
            return False
    text = b.json()["choices"][0]["text"]
    result = Scanner(ledger.active_canaries(), key=KEY).scan(Record("demo-b", "tenant-b", text, b_prompt))
    ledger.add_findings(result.findings, target=f"testbed-{preset}")
    console.print(f"  answer: {text[:400]}")
    for finding in result.findings:
        console.print(f"  [bold red]{finding.kind.value}[/] ({finding.severity.label}, {finding.detector}): "
                      f"canary {finding.canary_id} of [bold]{finding.victim_tenant}[/] in the answer to "
                      f"[bold]{finding.observer_tenant}[/]")
    return any(f.victim_tenant == "tenant-a" for f in result.findings)


def run_demo() -> int:
    console = Console(highlight=False)
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Path(tmp) / "demo-ledger.sqlite"
        leaked = _exchange(console, "incident", ledger)
        clean = not _exchange(console, "fixed", ledger)
        console.rule()
        console.print(f"incident preset leaked: {leaked}; fixed preset clean: {clean}; "
                      f"findings recorded in the ledger: {len(open_ledger(ledger).findings())}")
    return 0 if leaked and clean else 1
