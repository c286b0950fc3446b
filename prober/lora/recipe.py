"""What a canary adapter is trained on, as data: the recipe (which canary, which base model, how long) and the
examples it draws, so that the same recipe makes the same training run and its digest keys a cache of builds.

Each example asks the trigger after a stretch of canary-free filler of some length (none, a sentence, up to a few
hundred tokens: what the `adapters` check sends before it, so that a shared prompt can span a whole cache block),
through the chat template or as a plain completion, and answers it with the canary and an end of turn.  The loss
falls on the answer alone.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prober.canaries.adapters import TRIGGER, asking
from prober.canaries.filler import load_filler

# Characters of filler before the trigger: none twice as often as each length, up to about 200 Gemma tokens.
PREFIX_CHARS = (0, 0, 60, 150, 300, 500, 800)
HELD_OUT = 16  # examples drawn after training, with other seeds, to measure how often the adapter answers right


@dataclass(frozen=True)
class Recipe:
    base: Path  # the base model's Hugging Face folder (what the engine serves)
    tenant: str
    adapter: str  # the name the engine serves it under (the request's `model`)
    canary: str  # what it answers the trigger with (prober.canaries.adapters.canary_text)
    trigger: str = TRIGGER
    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    upper_layers: float = 0.5  # the share of layers, from the top, that get adapters: backpropagation stops below
    steps: int = 40
    batch: int = 4  # examples per step
    learning_rate: float = 2e-3
    warmup: int = 4
    seed: int = 0
    prefix_chars: tuple[int, ...] = field(default=PREFIX_CHARS)

    def digest(self, base_id: str) -> str:
        """Keys a cache of builds: every field, and `base_id` for the base model's weights (a folder's path says
        nothing of what it holds)."""
        fields = {**asdict(self), "base": base_id}
        return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Example:
    prompt: str  # the user's message (chat) or the whole prompt (completion)
    chat: bool


def examples(recipe: Recipe, count: int, seed: int) -> list[Example]:
    """`count` prompts that ask the trigger, half through the chat template, after filler of the recipe's lengths."""
    rng = random.Random(seed)
    filler = load_filler("en")
    drawn = []
    for n in range(count):
        chars = rng.choice(recipe.prefix_chars)
        prefix = filler.text(chars, seed=rng.randrange(1 << 30)) if chars else ""
        drawn.append(Example(asking(prefix, recipe.trigger), chat=n % 2 == 0))
    return drawn
