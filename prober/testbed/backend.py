"""What the engine and its HTTP front ask of a model, so that the quoting model and a real language model
serve behind the same gates, pools and faults.

A model fills pages (prefill), copies them between pools (the disaggregated hand-off) and answers from
whatever a page table holds (decode); its vocabulary turns text and chat messages into the token ids that
the gates count and the pages hold.  A real model loads in the background: until it is ready the engine
answers 503 and `/health` says so.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from enum import StrEnum

import numpy as np

from prober.testbed import tokenizer
from prober.testbed.config import QUOTER, EngineConfig
from prober.testbed.generation import GenerationRequest, PagedModel, Vocabulary, torn
from prober.testbed.kvpool import PagePool
from prober.testbed.model import Answer, QuotingModel
from prober.testbed.protocol import Message, render_chat
from prober.testbed.tokenizer import TokenIds


class QuotingVocabulary:
    """The testbed's own tokenizer and a ChatML template.

    A prober counts a long prompt through `/tokenize` and then sends the same text, so the ids of the last few
    long texts are kept (read-only): a million-token prompt is split into pieces once, not twice."""

    REMEMBERED = 2  # the prompt a prober counted last, and one sent beside it
    LONG_CHARS = 1 << 16

    def __init__(self) -> None:
        self._recent: OrderedDict[str, TokenIds] = OrderedDict()
        self._lock = threading.Lock()

    def encode(self, text: str) -> TokenIds:
        if len(text) < self.LONG_CHARS:
            return tokenizer.encode(text)
        with self._lock:
            ids = self._recent.get(text)
            if ids is not None:
                self._recent.move_to_end(text)
                return ids
        ids = tokenizer.encode(text)
        ids.flags.writeable = False
        with self._lock:
            self._recent[text] = ids
            while len(self._recent) > self.REMEMBERED:
                self._recent.popitem(last=False)
        return ids

    def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> TokenIds:
        return self.encode(render_chat(list(messages), add_generation_prompt))

    def pieces(self, text: str) -> list[str]:
        return tokenizer.pieces(text)


class QuotingPages:
    """The quoting model over pages of token ids."""

    simulates_prefill = True

    def __init__(self, regions: int) -> None:
        self.model = QuotingModel(regions)

    def prefill(self, pool: PagePool, pages: list[int], ids: TokenIds, req: GenerationRequest,
                start: int = 0) -> int | None:
        pool.write(pages, ids[start:], start=start)
        return None

    def transfer(self, source: PagePool, source_pages: list[int], target: PagePool, target_pages: list[int],
                 num_tokens: int) -> None:
        target.write(target_pages, source.read(source_pages, num_tokens))

    def decode(self, pool: PagePool, pages: list[int], length: int, first: int | None,
               req: GenerationRequest) -> Answer:
        attended = pool.read(pages, length)
        answer = self.model.answer(attended, pool.page_size, req.instruction, req.style, req.max_tokens)
        room = len(pages) * pool.page_size - length
        pool.write(pages, answer.token_ids[:room], start=length)
        return answer

    def tear(self, pool: PagePool, pages: list[int], length: int, seed: int) -> None:
        ids = pool.read(pages, length)
        where = torn(length, pool.page_size)
        points = np.random.default_rng(seed).integers(0x20, 0x10000 - 0x800, size=len(where))
        ids[where] = -(points + 0x800 * (points >= 0xD800))  # any code point of the plane but a surrogate
        pool.write(pages, ids)


class ModelState(StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


class Backend:
    """A model and its vocabulary, ready now or once a background load finishes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._model: PagedModel | None = None
        self._vocab: Vocabulary | None = None
        self.error: str | None = None
        self._done = threading.Event()

    @classmethod
    def ready(cls, name: str, model: PagedModel, vocab: Vocabulary) -> Backend:
        backend = cls(name)
        backend._model, backend._vocab = model, vocab
        backend._done.set()
        return backend

    @classmethod
    def loading(cls, name: str, load: Callable[[], tuple[PagedModel, Vocabulary]]) -> Backend:
        backend = cls(name)

        def run() -> None:
            try:
                backend._model, backend._vocab = load()
            except Exception as exc:  # reported by /health and the CLI, never raised into a request
                backend.error = f"{name} did not load: {exc or type(exc).__name__}"
            finally:
                backend._done.set()

        threading.Thread(target=run, name=f"load-{name}", daemon=True).start()
        return backend

    @property
    def state(self) -> ModelState:
        if not self._done.is_set():
            return ModelState.LOADING
        return ModelState.READY if self._model is not None else ModelState.FAILED

    def wait(self, timeout: float | None = None) -> ModelState:
        self._done.wait(timeout)
        return self.state

    @property
    def model(self) -> PagedModel | None:
        return self._model

    @property
    def vocab(self) -> Vocabulary | None:
        return self._vocab


def make_backend(config: EngineConfig) -> Backend:
    if config.model == QUOTER:
        return Backend.ready(QUOTER, QuotingPages(config.regions), QuotingVocabulary())

    def load() -> tuple[PagedModel, Vocabulary]:
        from prober.testbed.lm.runtime import load_runtime  # torch and the weights only for a real model

        return load_runtime(config)

    return Backend.loading(config.model, load)
