"""Capacity introspection, bisection, token-exact prompts and `leakprobe preflight`, over real HTTP where the
behaviour is the server's (the reference engine, a route that never answers); what introspection makes of each
engine's answers is parsing, answered in this process (httpx's MockTransport)."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest
from typer.testing import CliRunner

from prober.canaries.mint import Minter
from prober.capacity import Capacity, Known, assess, introspect
from prober.capacity.bisect import bisect_accept_limit
from prober.capacity.limits import EngineCache
from prober.cli import app
from prober.config.schema import CapacityHints, assemble_config
from prober.domain.errors import ConfigError
from prober.domain.types import Severity
from prober.ledger import open_ledger
from prober.prompts import EndpointCounter, LocalCounter, PromptBuilder, UsageCounter, detect_counter
from prober.prompts.costs import SegmentCosts
from prober.targets import OpenAICompatible, Prompt, Secret, Transport, TransportPolicy
from prober.targets.api import Api
from prober.testbed import tokenizer
from tests.support.aio import run
from tests.support.mockhttp import Route, Routes, send
from tests.support.policies import FAST
from tests.support.shaped import Reply, Seen, ShapedServer, chat_answer
from tests.support.testbed import SMALL, StartTestbed

KEY_A = Secret("testbed-key-a")


def _introspect(url: str, secret: Secret | None = KEY_A, configured: Capacity | None = None,
                policy: TransportPolicy = FAST, http: Routes | None = None) -> Capacity:
    """What introspection finds at `url`: a real server's, or in this process `http`'s answers."""
    async def go() -> Capacity:
        async with Transport(policy, http=http and http.transport()) as transport:
            return await introspect(transport, url, secret, configured=configured)
    return run(go())


def _answered(routes: dict[str, Route], secret: Secret | None = KEY_A) -> Capacity:
    """Introspection of an engine whose introspection routes answer as `routes` say (in this process)."""
    return _introspect("http://engine.test/v1", secret, http=Routes(routes))


@pytest.mark.parametrize(("preset", "severity", "code"), [
    ("incident", Severity.CRITICAL, "capacity_inversion"),
    ("fixed", Severity.CRITICAL, "capacity_inversion"),
    ("healthy", Severity.INFO, "ok"),
])
def test_reference_engine_presets(testbed: StartTestbed, preset: str, severity: Severity, code: str) -> None:
    server = testbed(preset, prefill_ms_per_1k_tokens=0)
    cfg = server.engine.config
    capacity = _introspect(server.url + "/v1")
    assert capacity.engine == "sglang"
    assert capacity.context_length == Known(cfg.context_length, "sglang /server_info context_length")
    assert capacity.pool_tokens == Known(cfg.pool_tokens, "sglang /server_info max_total_num_tokens")
    assert capacity.max_req_input_len is not None and capacity.max_req_input_len.value == cfg.max_req_input_len
    assert capacity.page_size is not None and capacity.page_size.value == cfg.page_size
    assert [(c.layer, c.on) for c in capacity.caches] == [("prefix", True), ("prefix-tier2", False)]
    verdicts = assess(capacity)
    assert max(v.severity for v in verdicts) is severity and verdicts[0].code == code


@pytest.mark.unit
def test_vllm_shape() -> None:
    metrics = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
               'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
               'engine="0",num_cpu_blocks="None",num_gpu_blocks="2048"} 1.0\n')
    capacity = _answered({
        "GET /v1/models": lambda _: send(200, {"object": "list", "data": [
            {"id": "m", "object": "model", "max_model_len": 131072}]}),
        "GET /metrics": lambda _: send(200, metrics, content_type="text/plain")})
    assert capacity.engine == "vllm"
    assert capacity.context_length == Known(131072, "/v1/models max_model_len")
    assert capacity.pool_tokens is not None and capacity.pool_tokens.value == 2048 * 16
    assert "num_gpu_blocks x block_size" in capacity.pool_tokens.source
    assert assess(capacity)[0].code == "capacity_inversion"
    assert capacity.caches == (EngineCache("prefix", True, "vllm /metrics cache_config_info enable_prefix_caching"),)


@pytest.mark.unit
@pytest.mark.parametrize(("labels", "said"), [
    ('enable_prefix_caching="False",kv_offloading_size="None",kv_offloading_backend="native"',
     ((False, None), (False, None))),
    ('enable_prefix_caching="True",kv_offloading_size="4.0",kv_offloading_backend="lmcache"',
     ((True, None), (True, "CPU offload, lmcache, 4.0 GiB"))),
])
def test_vllm_says_which_caches_it_runs(labels: str, said: tuple[tuple[bool, str | None], ...]) -> None:
    """vLLM's cache config (every attribute a label of `vllm:cache_config_info`) says whether its prefix cache is on
    and whether a CPU offload tier sits below it: what the prefix-cache check then tests, known before it sends."""
    metrics = f'vllm:cache_config_info{{block_size="16",{labels},num_gpu_blocks="2048"}} 1.0\n'
    capacity = _answered({"GET /metrics": lambda _: send(200, metrics, content_type="text/plain")})
    assert [(c.layer, c.on, c.kind) for c in capacity.caches] == [("prefix", *said[0]), ("prefix-tier2", *said[1])]


@pytest.mark.unit
def test_sglang_says_which_caches_it_runs() -> None:
    info = {"max_total_num_tokens": 20480, "page_size": 1, "disable_radix_cache": False,
            "enable_hierarchical_cache": True, "hicache_storage_backend": "mooncake"}
    capacity = _answered({"GET /server_info": lambda _: send(200, info)}, secret=None)
    assert capacity.caches == (
        EngineCache("prefix", True, "sglang /server_info disable_radix_cache"),
        EngineCache("prefix-tier2", True, "sglang /server_info enable_hierarchical_cache",
                    "host memory, storage backend mooncake"))


@pytest.mark.unit
def test_llamacpp_shape() -> None:
    props = {"default_generation_settings": {"n_ctx": 8192, "params": {}}, "total_slots": 4,
             "model_path": "m.gguf", "build_info": "b1"}
    capacity = _answered({"GET /props": lambda _: send(200, props)}, secret=None)
    assert capacity.engine == "llama.cpp"
    assert capacity.context_length is not None and capacity.context_length.value == 8192
    assert capacity.slots is not None and capacity.slots.value == 4 and "total_slots" in capacity.slots.source
    assert assess(capacity)[0].code == "capacity_unknown"


@pytest.mark.unit
def test_tgi_shape_and_old_sglang_alias() -> None:
    info = {"model_id": "m", "max_input_tokens": 4095, "max_total_tokens": 4096, "max_concurrent_requests": 128}
    old = {"max_total_num_tokens": 20480, "max_req_input_len": 20474, "page_size": 1, "context_length": None,
           "disaggregation_mode": "null"}
    capacity = _answered({"GET /info": lambda _: send(200, info), "GET /get_server_info": lambda _: send(200, old)},
                         secret=None)
    assert capacity.pool_tokens == Known(20480, "sglang /get_server_info max_total_num_tokens")
    assert capacity.context_length == Known(4096, "tgi /info max_total_tokens")
    assert capacity.disaggregation_mode is None  # "null" is SGLang's way of saying none


def test_configured_values_win(testbed: StartTestbed) -> None:
    server = testbed("incident", **SMALL)
    hints = CapacityHints(pool_tokens=999_999)
    capacity = _introspect(server.url + "/v1", configured=hints.capacity())
    assert capacity.pool_tokens == Known(999_999, "config")
    assert capacity.context_length is not None and capacity.context_length.value == SMALL["context_length"]


@pytest.mark.unit
def test_garbage_introspection_is_ignored() -> None:
    capacity = _answered({"GET /server_info": lambda _: send(200, b"\xff<html>"),
                          "GET /v1/models": lambda _: send(200, {"data": "nope"}),
                          "GET /props": lambda _: send(200, [1, 2]),
                          "GET /metrics": lambda _: send(404, b"")}, secret=None)
    assert capacity == Capacity() and assess(capacity)[0].severity is Severity.INFO


def test_an_endpoint_that_fails_to_answer_is_noted() -> None:
    """A timeout or a 5xx leaves a value unknown for a reason the user can act on; a 4xx or llama.cpp's 501 for
    /metrics without --metrics is the engine saying "not here", and says nothing."""
    # /info holds its answer until the server closes, so it times out however slow the machine; the others must
    # answer within the timeout, and a loopback reply on a busy 2-core machine took over 0.5 s (an extra note).
    routes: dict[str, Any] = {"GET /info": lambda r, _: r.hold(),
                              "GET /metrics": lambda r, _: r.send(500, b"boom"),
                              "GET /props": lambda r, _: r.send(501, {"error": "metrics not enabled"})}
    with ShapedServer(routes) as srv:
        capacity = _introspect(srv.url + "/v1", secret=None, policy=TransportPolicy(timeout_s=5, retries=0))
    assert capacity.context_length is None and capacity.pool_tokens is None
    metrics, info = capacity.notes  # in the readers' order
    assert metrics == "GET /metrics failed with HTTP 500; what it would say is unknown"
    assert re.fullmatch(r"GET /info did not answer \(timeout: .*\); what it would say is unknown", info), info
    with ShapedServer({"GET /metrics": routes["GET /metrics"]}) as srv:
        result = _preflight("--target", srv.url + "/v1")
    assert result.exit_code == 0 and "note: GET /metrics failed with HTTP 500" in result.output, result.output


def _counter(url: str, api: str, calibrate: bool) -> Any:
    async def go() -> tuple[list[tuple[int, int, int | None, bool]], str]:
        async with Transport(FAST) as transport:
            target = OpenAICompatible("t", url + "/v1", transport, api=Api(api))
            found = await detect_counter(transport, url, Api(api), KEY_A)
            counter = UsageCounter(target, KEY_A) if calibrate else found
            assert counter is not None
            builder = PromptBuilder(counter)
            rows = []
            for length in (40, 1_000, 4_089, 4_096, 4_097, 9_000):
                built = await builder.build(length, instruction="Quote the document.")
                answer = await target.complete(Prompt(built.text, max_tokens=1), KEY_A)
                assert answer.usage is not None, answer.error
                rows.append((length, built.tokens, answer.usage.prompt_tokens, built.counted))
            return rows, counter.source
    return run(go())


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("calibrate", [False, True], ids=["tokenizer-endpoint", "calibration-only"])
def test_built_prompts_are_token_exact(testbed: StartTestbed, api: str, calibrate: bool) -> None:
    server = testbed("healthy", **{**SMALL, "pool_tokens": 32_768})
    rows, source = _counter(server.url, api, calibrate)
    for length, predicted, served, counted in rows:
        assert served == length == predicted, rows
        assert counted is not calibrate
    assert ("usage" in source) is calibrate and ("chat form" in source) is (api == "chat" and not calibrate)


@pytest.mark.unit
def test_a_filler_is_the_most_whole_words_that_fit_then_pads() -> None:
    """The filler a model reads is natural text up to its last word; only what no word fits into is padded.
    (Found by guesses from the tokens per word measured so far: the same text as halving, in fewer counts.)"""
    counter = LocalCounter(tokenizer.count)
    costs = SegmentCosts(counter)
    header = "Summarize the document.\n"

    def cost(text: str) -> int:
        return tokenizer.count(header + text) - tokenizer.count(header)

    for tokens in (*range(1, 60), 97, 256, 1_000):
        for seed in range(5):
            filler = run(costs.filler_of(header, tokens, seed))
            words = costs.filler.text(tokens * 8, seed).split(" ")
            kept = 0  # the most whole words that fit, counted one by one
            while kept < len(words) and cost(" ".join(words[: kept + 1]) + "\n") <= tokens:
                kept += 1
            line = " ".join(words[:kept])
            assert filler == line + (run(costs.pad(header))) * (tokens - cost(line + "\n")) + "\n"
            assert cost(filler) == tokens
    assert counter.requests <= 250  # measured: 227; halving alone asked 354


def test_canary_in_every_window(testbed: StartTestbed, tmp_path: Any) -> None:
    server = testbed("healthy", **SMALL)
    ledger = open_ledger(tmp_path / "l.sqlite")
    minter = Minter(ledger, b"k" * 32)

    async def mint(n: int) -> Any:
        return minter.tokens("tenant-a", n, probe_id="p")

    async def go() -> Any:
        async with Transport(FAST) as transport:
            counter = await detect_counter(transport, server.url, Api.COMPLETIONS, KEY_A)
            assert isinstance(counter, EndpointCounter)
            return await PromptBuilder(counter).build(3_000, instruction="Quote the document.", page_size=64,
                                                      mint=mint)
    built = run(go())
    assert built.exact and built.canary_period is not None
    stored = {c.text for c in ledger.active_canaries()}
    assert all(c.text in stored for c in built.canaries)  # persisted before anyone could send them
    pieces = tokenizer.pieces(built.text)
    header = tokenizer.count("Quote the document.\n")
    period = built.canary_period
    text_ends = [built.text.rindex(c.text) + len(c.text) for c in built.canaries[-1:]]
    body_end = tokenizer.count(built.text[: text_ends[0]])  # after the last canary only the tail pad remains
    assert len(pieces) - body_end < period
    for start in range(header, body_end - period, period // 2):
        window = "".join(pieces[start : start + period])
        assert any(c.text in window for c in built.canaries), (start, window)


def test_bisection_finds_the_refusal_boundary(testbed: StartTestbed) -> None:
    server = testbed("fixed", **SMALL, mode="monolithic")
    cfg = server.engine.config

    async def go() -> Any:
        async with Transport(FAST) as transport:
            target = OpenAICompatible("t", server.url + "/v1", transport, api=Api.COMPLETIONS)
            counter = await detect_counter(transport, server.url, Api.COMPLETIONS, KEY_A)
            assert counter is not None
            return await bisect_accept_limit(target, PromptBuilder(counter), KEY_A, budget=200_000, start=512)
    found = run(go())
    assert found.served == cfg.max_req_input_len - 1 and found.refused == cfg.max_req_input_len, found
    assert found.known() is not None and "bisection" in found.known().source  # type: ignore[union-attr]
    poor = run(_bisect_poor(server.url))
    assert poor.stopped.startswith("token budget") and poor.tokens_spent <= 3_000


async def _bisect_poor(url: str) -> Any:
    async with Transport(FAST) as transport:
        target = OpenAICompatible("t", url + "/v1", transport, api=Api.COMPLETIONS)
        counter = await detect_counter(transport, url, Api.COMPLETIONS, KEY_A)
        assert counter is not None
        return await bisect_accept_limit(target, PromptBuilder(counter), KEY_A, budget=3_000, start=512)


runner = CliRunner()


def _preflight(*args: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, ["preflight", *args], env={"LP_KEY_A": "testbed-key-a", **(env or {})})


@pytest.mark.parametrize(("preset", "code"), [("incident", 1), ("fixed", 1), ("healthy", 0)])
def test_preflight_cli_exit_codes(testbed: StartTestbed, preset: str, code: int) -> None:
    server = testbed(preset, prefill_ms_per_1k_tokens=0)
    result = _preflight("--target", server.url + "/v1", "--tenant", "a=LP_KEY_A", "--format", "json")
    assert result.exit_code == code, result.output
    report = json.loads(result.stdout)["targets"][0]
    assert report["capacity"]["pool_tokens"]["value"] == server.engine.config.pool_tokens
    assert report["tokenizer"] == "sglang /v1/tokenize (chat form)"
    assert "testbed-key-a" not in result.output


def test_preflight_fail_on_and_errors(testbed: StartTestbed, tmp_path: Any) -> None:
    server = testbed("incident", prefill_ms_per_1k_tokens=0)
    url = server.url + "/v1"
    assert _preflight("--target", url, "--tenant", "a=LP_KEY_A", "--fail-on", "critical").exit_code == 1
    table = _preflight("--target", url, "--tenant", "a=LP_KEY_A")
    assert "capacity_inversion" in table.stdout and "681,280" in table.stdout
    denied = _preflight("--target", url)
    assert denied.exit_code == 2 and "refused the credential" in denied.output
    missing = _preflight("--target", url, "--tenant", "a=LP_NOT_SET")
    assert missing.exit_code == 2 and "LP_NOT_SET is not set" in missing.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets:\n  - name: x\n    url: ftp://nope\n")
    broken = _preflight("--config", str(bad))
    assert broken.exit_code == 2 and re.search(r"targets\[0\]\.url: .*http", broken.output), broken.output
    with ShapedServer({}) as gone:
        dead = gone.url
    unreachable = _preflight("--target", dead + "/v1")
    assert unreachable.exit_code == 2 and "cannot reach" in unreachable.output


@pytest.mark.unit
def test_config_layers() -> None:
    cfg = assemble_config(None, target="http://h:1/v1", tenants=["a=A_KEY", "b=B_KEY"],
                          environ={"LEAKPROBE_FAIL_ON": "critical", "LEAKPROBE_TOKEN_BUDGET": "1000"},
                          token_budget=5000)
    assert cfg.audit.fail_on is Severity.CRITICAL and cfg.audit.token_budget == 5000
    assert [t.credential.env for t in cfg.tenants] == ["A_KEY", "B_KEY"]
    for kwargs, message in (({"tenants": ["novalue"]}, "NAME=ENVVAR"), ({}, "targets"),
                            ({"target": "http://h/v1", "environ": {"LEAKPROBE_FAIL_ON": "loud"}}, "fail_on")):
        with pytest.raises(ConfigError, match=message):
            assemble_config(None, **kwargs)  # type: ignore[arg-type]


def test_chat_answer_shape_round_trips() -> None:
    """The fault servers' happy-path shape is one the adapter reads (so their fault tests test faults)."""
    def route(r: Reply, s: Seen) -> None:
        r.send(200, chat_answer(s.json()["messages"][0]["content"]))

    with ShapedServer({"POST /v1/chat/completions": route}) as srv:
        async def go() -> Any:
            async with Transport(FAST) as transport:
                return await OpenAICompatible("t", srv.url + "/v1", transport).complete(Prompt("echo"), None)
        assert run(go()).text == "echo"


def test_no_api_key_in_any_output_or_log(testbed: StartTestbed, caplog: pytest.LogCaptureFixture) -> None:
    """Preflight, counting, plain and streamed requests with every logger at DEBUG: the key never shows."""
    caplog.set_level(logging.DEBUG)
    server = testbed("incident", **SMALL)
    outputs = [_preflight("--target", server.url + "/v1", "--tenant", "a=LP_KEY_A", *fmt).output
               for fmt in ((), ("--format", "json"))]

    async def go() -> list[str]:
        async with Transport(FAST) as transport:
            target = OpenAICompatible("t", server.url + "/v1", transport)
            counter = await detect_counter(transport, server.url, Api.CHAT, KEY_A)
            assert counter is not None
            built = await PromptBuilder(counter).build(500, instruction="Quote.")
            answers = [await target.complete(Prompt(built.text, stream=s), KEY_A) for s in (False, True)]
            return [repr(a) for a in answers] + [repr(counter.__dict__), repr(target.__dict__)]
    outputs += run(go())
    assert all("testbed-key-a" not in text for text in [*outputs, caplog.text])
    assert "httpx" in caplog.text or "httpcore" in caplog.text  # the logs were really captured
