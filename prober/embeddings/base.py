"""The embedder interface that canaries (minting facts) and detection (matching paraphrases) share.

It lives apart from both so that neither imports the other: an embedder turns sentences into unit
vectors; it knows nothing of canaries.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]


class Embedder(Protocol):
    name: str
    threshold: float  # cosine at or above which a chunk says what a fact says (measured per model)

    def load(self) -> None:
        """Load the model now (raises EmbedderError), so a missing model fails at start, not mid-scan."""

    @property
    def device(self) -> str:
        """Where it encodes ("cuda" or "cpu")."""

    def encode(self, texts: list[str]) -> Vectors:
        """L2-normalised float32 rows, one per text."""


def pick_device(requested: str = "auto") -> str:
    if requested != "auto":
        return requested
    import torch  # imported here: nothing pays torch's start-up unless it embeds

    return "cuda" if torch.cuda.is_available() else "cpu"
