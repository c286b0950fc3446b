"""`leakprobe demo`: the incident, reproduced on the reference engine in this process.

Tenant A sends a long prompt (below the KV pool) that carries a code word; tenant B then sends a
prompt between the pool and the advertised context.  On the `incident` preset B's HTTP 200 answer
quotes A's code word; on `fixed` B gets a 400 and nothing of A's.
"""

from __future__ import annotations

import httpx
from rich.console import Console

from prober.testbed import DEFAULT_TENANTS, TestbedServer, build_config, tokenizer

SECRET = "Tenant A's vault code is ZEBRA-7Q4X, kept at Brackenfold Depot."
FILLER = "The river runs past the old mill and the fields turn green in spring. "


def _prompt(instruction: str, body: str, tokens: int) -> str:
    """Repeat body until the prompt holds about `tokens` tokens of the engine's tokenizer."""
    unit = tokenizer.count(body * 2) - tokenizer.count(body)
    return instruction + "\n" + body * max(1, tokens // unit)


def _exchange(console: Console, preset: str) -> bool:
    config = build_config(preset)
    keys = {name: {"Authorization": f"Bearer {key}"} for name, key in DEFAULT_TENANTS.items()}
    with TestbedServer(config) as server, httpx.Client(base_url=server.url + "/v1", timeout=120) as http:
        console.rule(f"preset [bold]{preset}[/]: advertised context {config.context_length:,} tokens, "
                     f"KV pool {config.pool_tokens:,} tokens")
        a_prompt = _prompt("Quote the document.", (FILLER * 30) + SECRET + " ", 200_000)
        a = http.post("/completions", headers=keys["tenant-a"], json={"prompt": a_prompt, "max_tokens": 64})
        console.print(f"tenant-a sends {a.json()['usage']['prompt_tokens']:,} tokens -> HTTP {a.status_code}")
        b_tokens = (config.pool_tokens + config.context_length) // 2
        b_prompt = _prompt("Quote the document.", FILLER, b_tokens)
        b = http.post("/completions", headers=keys["tenant-b"], json={"prompt": b_prompt, "max_tokens": 128})
        console.print(f"tenant-b sends {tokenizer.count(b_prompt):,} tokens -> HTTP {b.status_code}")
        if b.status_code != 200:
            console.print(f"  refused: {b.json().get('message')}")
            return False
        text = b.json()["choices"][0]["text"]
        leaked = "ZEBRA-7Q4X" in text
        console.print("  answer: " + text.replace("ZEBRA-7Q4X", "[bold red]ZEBRA-7Q4X[/]"))
        if leaked:
            console.print("  [bold red]tenant-a's code word is in tenant-b's HTTP 200 answer[/]")
        return leaked


def run_demo() -> int:
    console = Console(highlight=False)
    leaked = _exchange(console, "incident")
    clean = not _exchange(console, "fixed")
    console.rule()
    console.print(f"incident preset leaked: {leaked}; fixed preset clean: {clean}")
    return 0 if leaked and clean else 1
