"""Prompts sent as embeddings: the wire codec, the reference table, and the reference engine that takes them (its
refusal without `enable_prompt_embeds`, its prefix cache keyed by the rows, and the fault that keys them by
placeholder ids alone, vLLM #56655)."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
import torch

from prober.prompt_embeds import HIDDEN, ReferenceTable, decode, encode, ids_of, rows_of
from prober.testbed import tokenizer
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
