"""The incident and its fix, over HTTP: what tenant B's answer says about tenant A's prompt."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from prober.testbed import TestbedServer, tokenizer
from tests.support.keys import BEARER_A, BEARER_B
from tests.support.testbed import SMALL, StartTestbed

SECRET = "Tenant A keeps the vault code ZEBRA-7Q4X at Brackenfold Depot."
FILLER = "The river runs past the old mill and the fields turn green in spring. "


def prompt_of(tokens: int, body: str = FILLER, instruction: str = "Quote the document.") -> str:
    per_copy = tokenizer.count(body * 2) - tokenizer.count(body)  # the cost of one more copy
    return instruction + "\n" + body * max(1, tokens // per_copy)


def a_prompt(tokens: int) -> str:
    return prompt_of(tokens, FILLER * 20 + SECRET + " ")


def complete(server: TestbedServer, headers: dict[str, str], prompt: str, **extra: Any) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", headers=headers, timeout=120,
                      json={"prompt": prompt, "max_tokens": 128, **extra})


def stream_chat(server: TestbedServer, headers: dict[str, str], prompt: str, **extra: Any) -> dict[str, Any]:
    """Collect a streamed chat answer: status, text, finish reason, usage, in-stream error."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 128, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    out: dict[str, Any] = {"text": "", "finish_reason": None, "usage": None, "error": None}
    with httpx.stream("POST", server.url + "/v1/chat/completions", headers=headers, json=body,
                      timeout=120) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                out["error"] = event["error"]
                continue
            if event.get("usage"):
                out["usage"] = event["usage"]
            for choice in event["choices"]:
                out["text"] += choice["delta"].get("content") or ""
                out["finish_reason"] = choice["finish_reason"] or out["finish_reason"]
    return out


def test_incident_leaks_tenant_a_prompt_into_tenant_b_http_200(testbed: StartTestbed) -> None:
    server = testbed("incident")
    a = complete(server, BEARER_A, a_prompt(200_000))
    assert a.status_code == 200 and 600_000 > a.json()["usage"]["prompt_tokens"] > 190_000
    b_prompt = prompt_of(800_000)  # between the pool (681,280) and the context (1,048,576)
    assert "ZEBRA" not in b_prompt
    b = complete(server, BEARER_B, b_prompt)
    assert b.status_code == 200
    assert "ZEBRA-7Q4X" in b.json()["choices"][0]["text"]
    # Nothing but the text tells: usage and finish_reason look normal, no extra fields or headers.
    assert b.json()["usage"]["prompt_tokens"] == tokenizer.count(b_prompt)
    assert b.json()["choices"][0]["finish_reason"] == "stop"
    assert set(b.json()) == set(a.json())
    assert set(b.headers) == set(a.headers)


def test_fixed_refuses_the_over_pool_prompt_with_sglang_message(testbed: StartTestbed) -> None:
    server = testbed("fixed")
    assert complete(server, BEARER_A, a_prompt(200_000)).status_code == 200
    b = complete(server, BEARER_B, prompt_of(800_000))
    assert b.status_code == 400
    assert "exceeds the maximum allowed length (681274 tokens)" in b.json()["message"]
    assert "ZEBRA" not in b.text


def test_healthy_serves_the_long_prompt_from_its_own_pages_only(testbed: StartTestbed) -> None:
    server = testbed("healthy")
    assert complete(server, BEARER_A, a_prompt(200_000)).status_code == 200
    b = complete(server, BEARER_B, prompt_of(800_000))
    assert b.status_code == 200
    text = b.json()["choices"][0]["text"]
    assert "ZEBRA" not in text and "river runs past the old mill" in text


def test_a_request_just_under_the_advertised_context_completes(testbed: StartTestbed) -> None:
    server = testbed("healthy")
    prompt = prompt_of(1_048_000)
    assert 1_040_000 < tokenizer.count(prompt) < 1_048_576
    started = time.perf_counter()
    r = complete(server, BEARER_A, prompt, max_tokens=64)
    assert r.status_code == 200
    assert time.perf_counter() - started < 60  # a generous hang guard; the figure lives in bench/


def test_streaming_and_plain_agree(testbed: StartTestbed) -> None:
    server = testbed("incident", **SMALL)
    complete(server, BEARER_A, a_prompt(2_000))
    plain = complete(server, BEARER_B, prompt_of(8_000)).json()
    complete(server, BEARER_A, a_prompt(2_000))
    streamed = stream_chat(server, BEARER_B, prompt_of(8_000))
    assert streamed["status"] == 200 and streamed["error"] is None
    assert "ZEBRA-7Q4X" in plain["choices"][0]["text"] and "ZEBRA-7Q4X" in streamed["text"]
    assert streamed["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert streamed["usage"]["completion_tokens"] == tokenizer.count(streamed["text"])


def test_scheduler_abort_arrives_inside_a_200_stream(testbed: StartTestbed) -> None:
    server = testbed("fixed", **SMALL)
    out = stream_chat(server, BEARER_B, prompt_of(8_000))
    assert out["status"] == 200 and out["text"] == ""
    assert out["error"]["code"] == 400 and "exceeds the maximum allowed length" in out["error"]["message"]


# -- each fault alone ---------------------------------------------------------------------------

def test_abort_flag_unsynced_alone_forwards_and_decode_refuses_with_500(testbed: StartTestbed) -> None:
    server = testbed("fixed", **SMALL, faults={"abort_flag_unsynced": True})
    complete(server, BEARER_A, a_prompt(2_000))
    b = complete(server, BEARER_B, prompt_of(8_000))
    assert b.status_code == 500 and "KV transfer incomplete" in b.json()["message"]
    assert "ZEBRA" not in b.text


def test_decode_skips_page_check_alone_is_latent(testbed: StartTestbed) -> None:
    server = testbed("fixed", **SMALL, faults={"decode_skips_page_check": True})
    complete(server, BEARER_A, a_prompt(2_000))
    assert complete(server, BEARER_B, prompt_of(8_000)).status_code == 400
    ok = complete(server, BEARER_B, prompt_of(3_000))
    assert ok.status_code == 200 and "ZEBRA" not in ok.text


def test_usage_reports_placeholder_alone_turns_the_abort_into_an_empty_200(testbed: StartTestbed) -> None:
    server = testbed("fixed", **SMALL, faults={"usage_reports_placeholder": True})
    b = complete(server, BEARER_B, prompt_of(8_000))
    assert b.status_code == 200
    assert b.json()["usage"]["prompt_tokens"] == 1
    assert b.json()["choices"][0] == {"index": 0, "text": "", "finish_reason": "length"}


def test_all_three_together_leak_with_placeholder_usage(testbed: StartTestbed) -> None:
    faults = {"abort_flag_unsynced": True, "decode_skips_page_check": True, "usage_reports_placeholder": True}
    server = testbed("incident", **SMALL, faults=faults)
    complete(server, BEARER_A, a_prompt(2_000))
    b = complete(server, BEARER_B, prompt_of(8_000)).json()
    assert "ZEBRA-7Q4X" in b["choices"][0]["text"]
    assert b["usage"]["prompt_tokens"] == 1 and b["choices"][0]["finish_reason"] == "length"


def test_monolithic_mode_catches_the_same_abort(testbed: StartTestbed) -> None:
    server = testbed("incident", **SMALL, mode="monolithic")
    complete(server, BEARER_A, a_prompt(2_000))
    b = complete(server, BEARER_B, prompt_of(8_000))
    assert b.status_code == 400 and "ZEBRA" not in b.text


@pytest.mark.parametrize("shared", [False, True])
def test_prefix_cache_is_per_tenant_unless_shared(testbed: StartTestbed, shared: bool) -> None:
    server = testbed("healthy", **{**SMALL, "prefill_ms_per_1k_tokens": 400},
                     faults={"shared_prefix_cache": shared})
    prompt = a_prompt(3_000)
    started = time.perf_counter()
    first = complete(server, BEARER_A, prompt).json()
    miss = time.perf_counter() - started
    again = complete(server, BEARER_A, prompt).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 2_900
    started = time.perf_counter()
    other = complete(server, BEARER_B, prompt).json()
    elapsed = time.perf_counter() - started
    cached = other["usage"]["prompt_tokens_details"]["cached_tokens"]
    if shared:
        # A miss sleeps 1.2 s of simulated prefill; the rest of a request costs the same either way, however busy.
        assert cached > 2_900 and elapsed < miss - 0.6, (elapsed, miss)
    else:
        assert cached == 0 and elapsed > 1.0


@pytest.mark.parametrize("style", ["disguise", "paraphrase"])
def test_quote_style_per_request_reshapes_the_leak(testbed: StartTestbed, style: str) -> None:
    server = testbed("incident", **SMALL)
    complete(server, BEARER_A, a_prompt(2_000))
    text = complete(server, BEARER_B, prompt_of(8_000), quote_style=style).json()["choices"][0]["text"]
    if style == "paraphrase":
        assert "Brackenfold" in text and "ZEBRA-7Q4X" in text and "stores" in text
    else:
        assert "ZEBRA-7Q4X" not in text
        assert "brackenfold" in text.lower()
