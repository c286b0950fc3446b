"""A real language model behind the engine's pools: Gemma's tokenizer and turn template, prefill and decode
over the pools' K/V pages, greedy or sampled decoding.

Each pool gets K/V tensors beside its token ids (the same page indices), so every fault of the engine acts on
real keys and values: a page table that points at an earlier tenant's freed pages makes the model attend to
that tenant's prompt.  One forward pass runs at a time (a lock), prefill in chunks, so concurrent requests
interleave step by step as on a single accelerator.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from prober.testbed.config import EngineConfig
from prober.testbed.generation import GenerationRequest, Sampling, torn
from prober.testbed.kvpool import PagePool
from prober.testbed.lm import weights
from prober.testbed.lm.gemma import Gemma, PagedKV, RequestKV
from prober.testbed.model import Answer
from prober.testbed.protocol import Message
from prober.testbed.tokenizer import TokenIds

log = logging.getLogger("prober.testbed")

PREFILL_CHUNK = 256  # tokens per forward pass: bounds the attention matrix and lets other requests in
STOP_IDS = frozenset({weights.EOS_ID, weights.END_OF_TURN_ID})

_loaded: dict[Path, tuple[Gemma, Tokenizer]] = {}
_loading = threading.Lock()


def load_weights(folder: Path) -> tuple[Gemma, Tokenizer]:
    """Once per process: every engine (each preset of a demo, each test) shares the same weights."""
    with _loading:
        if folder not in _loaded:
            _loaded[folder] = (Gemma.load(folder), Tokenizer.from_file(str(folder / "tokenizer.json")))
        return _loaded[folder]


def load_runtime(config: EngineConfig) -> tuple[GemmaPages, GemmaVocabulary]:
    started = time.monotonic()
    torch.set_num_threads(config.threads)
    folder = weights.model_dir(log=log.info)
    model, tokenizer = load_weights(folder)
    log.info("%s loaded from %s in %.1f s", config.model, folder, time.monotonic() - started)
    vocab = GemmaVocabulary(tokenizer)
    return GemmaPages(model, vocab), vocab


class GemmaVocabulary:
    """Gemma's SentencePiece tokenizer: `<bos>` before a completion prompt, the turn template for chats."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders
        self.template = env.from_string(weights.CHAT_TEMPLATE)

    def encode(self, text: str) -> TokenIds:
        return np.asarray(self.tokenizer.encode(text).ids, dtype=np.int32)

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        turns: list[dict[str, Any]] = [m.model_dump() for m in messages]
        return str(self.template.render(messages=turns, bos_token="<bos>",
                                        add_generation_prompt=add_generation_prompt))

    def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> TokenIds:
        rendered = self.render_chat(messages, add_generation_prompt)
        return np.asarray(self.tokenizer.encode(rendered, add_special_tokens=False).ids, dtype=np.int32)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def pieces(self, text: str) -> list[str]:
        """Token by token, except where a character spans several byte tokens (it waits for the last)."""
        out: list[str] = []
        pending: list[int] = []
        for token in self.tokenizer.encode(text, add_special_tokens=False).ids:
            pending.append(token)
            piece = self.decode(pending)
            if not piece.endswith("\ufffd"):
                out.append(piece)
                pending = []
        if pending:
            out.append(self.decode(pending))
        return out if "".join(out) == text else [text]


class GemmaPages:
    """The engine's PagedModel for Gemma: K/V tensors per pool, created on first use."""

    simulates_prefill = False

    def __init__(self, model: Gemma, vocab: GemmaVocabulary) -> None:
        self.model = model
        self.vocab = vocab
        self._stores: dict[int, PagedKV] = {}
        self._lock = threading.Lock()  # one forward pass at a time

    def store(self, pool: PagePool) -> PagedKV:
        with self._lock:
            key = id(pool)
            if key not in self._stores:
                self._stores[key] = PagedKV(self.model.config, pool.num_pages, pool.page_size)
            return self._stores[key]

    def _step(self, ids: Sequence[int], kv: RequestKV) -> torch.Tensor:
        with self._lock:
            return self.model.forward(torch.as_tensor(list(ids), dtype=torch.long), kv)

    def prefill(self, pool: PagePool, pages: list[int], ids: TokenIds, req: GenerationRequest,
                start: int = 0) -> int | None:
        pool.write(pages, ids[start:], start=start)
        kv = RequestKV(self.store(pool), pages, start)
        logits = None
        for chunk in range(start, len(ids), PREFILL_CHUNK):
            logits = self._step(ids[chunk : chunk + PREFILL_CHUNK].tolist(), kv)
        assert logits is not None, "the engine never prefills an empty prompt"
        return sample(logits, req.sampling, 0)

    def transfer(self, source: PagePool, source_pages: list[int], target: PagePool, target_pages: list[int],
                 num_tokens: int) -> None:
        target.write(target_pages, source.read(source_pages, num_tokens))
        self.store(target).copy(self.store(source), source_pages, target_pages, num_tokens)

    def decode(self, pool: PagePool, pages: list[int], length: int, first: int | None,
               req: GenerationRequest) -> Answer:
        if first is None:
            raise ValueError("a real model draws its first token at prefill")
        kv = RequestKV(self.store(pool), pages, length)
        answer = Decoding(kv, first, req.sampling, req.max_tokens)
        while not answer.done:
            pool.write(pages, np.asarray([answer.next], dtype=np.int32), start=kv.length)
            answer.take(self._step([answer.next], kv))
        return Answer(text=self.vocab.decode(answer.tokens), token_ids=np.asarray(answer.tokens, dtype=np.int32),
                      truncated=answer.truncated)

    def tear(self, pool: PagePool, pages: list[int], length: int, seed: int) -> None:
        store = self.store(pool)
        slots = store.slots(pages)[:length]
        where = slots[torch.as_tensor(torn(length, pool.page_size))]
        generator = torch.Generator().manual_seed(seed)
        with self._lock:
            for tensor in (store.k, store.v):
                for layer in range(tensor.shape[0]):
                    scale = tensor[layer, slots].std()
                    tensor[layer, where] = torch.randn((len(where), tensor.shape[2]), generator=generator) * scale


class Decoding:
    """One answer being decoded over a page table: the tokens so far and the next one to feed (several of
    them can step together through `Gemma.forward_batch`)."""

    def __init__(self, kv: RequestKV, first: int, sampling: Sampling, max_tokens: int) -> None:
        self.kv = kv
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.tokens: list[int] = []
        self.next = first
        self._accept()

    def _accept(self) -> None:
        if self.next not in STOP_IDS:
            self.tokens.append(self.next)

    @property
    def truncated(self) -> bool:
        return self.next not in STOP_IDS

    @property
    def done(self) -> bool:
        return not self.truncated or len(self.tokens) >= self.max_tokens

    def take(self, logits: torch.Tensor) -> None:
        """The logits of feeding `next`: draw the token after it."""
        self.next = sample(logits, self.sampling, len(self.tokens))
        self._accept()


def sample(logits: torch.Tensor, sampling: Sampling, index: int) -> int:
    """Greedy at temperature 0; otherwise nucleus sampling, seeded per (request seed, token index)."""
    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1:
        ordered, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(ordered, 0) - ordered < sampling.top_p  # always keeps the most likely token
        probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
    generator = torch.Generator().manual_seed((sampling.seed * 1_000_003 + index) & 0x7FFF_FFFF_FFFF_FFFF)
    return int(torch.multinomial(probs, 1, generator=generator))
