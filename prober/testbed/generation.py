"""The model side of one generation, shared by the quoting model and a real language model: the request the
engine hands a model, how to sample it, and what a model and its vocabulary must do with the engine's pages.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from prober.testbed.config import QuoteStyle
from prober.testbed.kvpool import PagePool
from prober.testbed.model import Answer, Instruction
from prober.testbed.protocol import Message
from prober.testbed.tokenizer import TokenIds


@dataclass(frozen=True)
class Sampling:
    temperature: float  # 0: greedy
    top_p: float
    seed: int  # always set (drawn by the front when the request names none), so a run can be replayed


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    tenant: str
    prompt_ids: TokenIds
    instruction: Instruction
    style: QuoteStyle
    max_tokens: int
    sampling: Sampling = Sampling(0.0, 1.0, 0)
    cache_salt: str | None = None
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False)  # its client hung up
    adapter: str | None = None  # the LoRA adapter the request's `model` selects (None: the base model)
    # What the adapter its answer follows was tuned to answer the trigger with, asked when decode runs (a slot may
    # change under a running request); None where no adapter applies.
    tuned: Callable[[], str | None] | None = None
    embeds: npt.NDArray[np.float32] | None = None  # the prompt's rows where it came as embeddings (prompt_embeds)


class PagedModel(Protocol):
    simulates_time: bool
    """True when the model costs no real time, so the engine sleeps what `prefill_ms_per_1k_tokens` and
    `decode_ms_per_token` say prefill and decode cost."""

    def prefill(self, pool: PagePool, pages: list[int], ids: TokenIds, req: GenerationRequest,
                start: int = 0) -> int | None:
        """Write the entries of `ids` from position `start` on (what lies before it is taken as written); the first
        answer token, if the model draws it at prefill (a real one does, from the last prompt position)."""

    def transfer(self, source: PagePool, source_pages: list[int], target: PagePool, target_pages: list[int],
                 num_tokens: int) -> None:
        """Copy the first num_tokens positions from one page table to another."""

    def decode(self, pool: PagePool, pages: list[int], length: int, first: int | None,
               req: GenerationRequest) -> Answer:
        """Answer attending over positions 0..length-1 of the page table, whatever they hold, and write the
        answer's own entries after them."""

    def tear(self, pool: PagePool, pages: list[int], length: int, seed: int) -> None:
        """Overwrite the `torn` positions of the first `length` with entries nobody wrote (seeded)."""


def torn(length: int, page_size: int) -> npt.NDArray[np.intp]:
    """Positions a restore read before its copy landed: the second half of every page, below `length`."""
    positions = np.arange(length)
    return positions[positions % page_size >= page_size // 2]


class Vocabulary(Protocol):
    def encode(self, text: str) -> TokenIds:
        """A completion prompt (or tokenize's `prompt`) as the engine sees it."""

    def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> TokenIds:
        """Chat messages through the model's template."""

    def pieces(self, text: str) -> list[str]:
        """An answer cut into the pieces a stream sends (they join to the text)."""
