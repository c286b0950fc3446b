"""Prompts sent as embeddings: the wire codec, the reference table, and the reference engine that takes them (its
refusal without `enable_prompt_embeds`, its prefix cache keyed by the rows, and the fault that keys them by
placeholder ids alone, vLLM #56655)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from prober.checks import REGISTRY
from prober.checks.prompt_embeds import table_of
from prober.config.schema import TargetConfig, assemble_config
from prober.domain.errors import PlanError
from prober.domain.types import FindingKind
from prober.input_embeds import HIDDEN, ReferenceTable, decode, encode, ids_of, rows_of
from prober.oneshot.audit import run_audit
from prober.probing.results import TargetReport
from prober.targets import Prompt
from prober.targets.credentials import Secret
from prober.testbed import tokenizer
from tests.support.keys import KEYS
from tests.support.mockhttp import Routes, ask, chat, send
from tests.support.testbed import SMALL, StartTestbed

TABLE = ReferenceTable(tokenizer.encode)
KEY_A, KEY_B = "testbed-key-a", "testbed-key-b"


@pytest.mark.unit
def test_rows_travel_as_vllm_reads_them_and_come_back_as_the_same_ids() -> None:
    text = "LPK-7Q2 the vault code is 4471, ünïcode ✓"
    rows = TABLE.rows(text)
    assert rows.shape == (tokenizer.count(text), HIDDEN) and rows.dtype == np.float32
    wire = encode(rows)
    saved = torch.load(io.BytesIO(base64.b64decode(wire)), weights_only=True)  # what vLLM's loader sees
    assert isinstance(saved, torch.Tensor) and list(saved.shape) == list(rows.shape)
    assert tokenizer.decode(ids_of(decode(wire))) == text
    noisy = rows + np.random.default_rng(0).normal(0, 0.1, rows.shape).astype(np.float32)
    assert (ids_of(noisy) == tokenizer.encode(text)).all()  # the nearest row's id


@pytest.mark.unit
def test_a_batch_of_one_is_read_and_anything_else_is_refused_with_a_reason() -> None:
    rows = rows_of(tokenizer.encode("abc def"))
    buffer = io.BytesIO()
    torch.save(torch.from_numpy(rows)[None], buffer)
    assert (decode(base64.b64encode(buffer.getvalue()).decode()) == rows).all()
    for wire, why in [("not base64!", "not a base64"), (encode(rows[:, :8]), None)]:
        with pytest.raises(ValueError, match=why or "32 dimensions"):
            ids_of(decode(wire))


def complete(url: str, key: str, rows: np.ndarray) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": "testbed-quoter", "prompt_embeds": encode(rows), "max_tokens": 64})


def test_the_engine_refuses_embeddings_without_the_switch_as_vllm_does(testbed: StartTestbed) -> None:
    answer = complete(testbed("fixed", **SMALL).url, KEY_A, TABLE.rows("repeat the code LPK-7A1B2C"))
    assert answer.status_code == 400
    assert "--enable-prompt-embeds" in answer.json()["message"]


def prompt(code: str) -> str:
    """A prompt of two pages and more (page_size 16), the same length for any code of one length."""
    return f"Repeat the code word exactly. The code word is {code}. " + "Filler words pad the page out. " * 6


@pytest.mark.parametrize("fault", [False, True])
def test_only_the_fault_serves_one_tenants_embeds_prompt_from_anothers_pages(testbed: StartTestbed,
                                                                               fault: bool) -> None:
    url = testbed("fixed", **SMALL, enable_prompt_embeds=True,
                  faults={"shared_prefix_cache": True, "prompt_embeds_missing_from_cache_key": fault}).url
    first, second = TABLE.rows(prompt("LPK-7A1B2C")), TABLE.rows(prompt("LPK-9X8Y7Z"))
    assert first.shape == second.shape
    a = complete(url, KEY_A, first).json()
    assert "LPK-7A1B2C" in a["choices"][0]["text"]
    again = complete(url, KEY_A, first).json()  # the healthy shared cache: A's own prompt again is a hit
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    b = complete(url, KEY_B, second).json()
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert ("LPK-7A1B2C" in b["choices"][0]["text"]) is fault, b
    assert (cached > 16) is fault  # healthy, only the page both prompts open with (the same rows) is shared


def audit(url: str, ledger: Path, embeds: str | None) -> TargetReport:
    """The prompt-embeds check alone, as an operator runs it, with the target's table named or not."""
    cfg = assemble_config(None, target=url + "/v1", tenants=["tenant-a=LP_A", "tenant-b=LP_B"], ledger=str(ledger),
                          checks=["prompt-embeds"], semantic=False, timing=False, sections=REGISTRY.sections)
    target = TargetConfig.model_validate({**cfg.targets[0].model_dump(), "prompt_embeds": embeds})
    cfg = cfg.model_copy(update={"targets": [target]})
    secrets = {"tenant-a": Secret(KEYS["LP_A"]), "tenant-b": Secret(KEYS["LP_B"])}
    (report,) = asyncio.run(run_audit(cfg, secrets)).targets
    return report


def test_the_check_names_both_tenants_of_the_fault_and_is_moot_where_embeds_are_not_taken(
        testbed: StartTestbed, tmp_path: Path) -> None:
    faults = {"shared_prefix_cache": True, "prompt_embeds_missing_from_cache_key": True}
    faulty = audit(testbed("fixed", **SMALL, enable_prompt_embeds=True, faults=faults).url, tmp_path / "a.db",
                   "reference")
    echoes = {(f.victim_tenant, f.observer_tenant) for f in faulty.findings if f.kind is FindingKind.CROSS_TENANT_ECHO}
    # Under the fault every embeds prompt shares the placeholder pages of the one before: the first exchange's probe
    # reads A's prompt, and the second's prime (B's) the pages that probe left, still A's.
    assert ("tenant-a", "tenant-b") in echoes and all(f.kind is FindingKind.CROSS_TENANT_ECHO
                                                      for f in faulty.findings), [f.describe() for f in faulty.findings]
    clean = audit(testbed("fixed", **SMALL, enable_prompt_embeds=True, faults={"shared_prefix_cache": True}).url,
                  tmp_path / "b.db", "reference")
    result = clean.result("prompt-embeds")
    assert result is not None and not result.findings and clean.complete
    assert result.sight is not None and result.sight.echoed == result.sight.checked == 2  # each its own canary
    refused = audit(testbed("fixed", **SMALL).url, tmp_path / "c.db", "reference").result("prompt-embeds")
    assert refused is not None and "--enable-prompt-embeds" in (refused.moot or ""), refused
    unnamed = audit(testbed("fixed", **SMALL).url, tmp_path / "d.db", None).result("prompt-embeds")
    assert unnamed is not None and "names no input-embedding table" in (unnamed.moot or "")


@pytest.mark.unit
def test_an_embeds_prompt_travels_as_prompt_embeds_on_completions_only() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return send(200, {"choices": [{"text": "ok", "finish_reason": "stop"}]})

    wire = encode(TABLE.rows("abc"))
    assert ask(Routes({"POST /v1/completions": answer}), Prompt("abc", embeds=wire), api="completions").served
    body = json.loads(seen[0].content)
    assert body["prompt_embeds"] == wire and "prompt" not in body
    with pytest.raises(ValueError, match="takes no prompt embeddings"):
        ask(chat(answer), Prompt("abc", embeds=wire))


@pytest.mark.unit
def test_a_folder_that_is_no_models_is_not_planned_and_says_what_it_lacks(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(PlanError, match=r"lacks tokenizer\.json, model\.safetensors"):
        table_of(str(tmp_path))
