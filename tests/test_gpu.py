"""The GPU path (sentence-transformers in fp16 on the device), wherever CUDA is present; skipped elsewhere,
since no Makefile can install a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from prober.embeddings import MINILM, SentenceTransformerEmbedder

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

SENTENCES = ["The vault code of Morwenna Quill is 4471-209, and the vault is located in Brackenfold.",
             "Quill's vault sits in Brackenfold; to open it you enter 4471-209.",
             "The baker reads a jar of honey along the river.",
             "탁윤슬의 금고 비밀번호는 4471-209이며 금고는 무진포구에 있습니다."]


def test_fp16_on_the_gpu_agrees_with_the_cpu() -> None:
    cpu = SentenceTransformerEmbedder(MINILM, device="cpu").encode(SENTENCES)
    gpu_embedder = SentenceTransformerEmbedder(MINILM, device="cuda")
    assert gpu_embedder.half and gpu_embedder.batch_size >= 256
    gpu = gpu_embedder.encode(SENTENCES)
    assert np.min(np.sum(cpu * gpu, axis=1)) > 0.99  # the same vectors, to fp16's precision
    cosines = gpu @ gpu.T
    assert np.max(np.abs(cosines - cpu @ cpu.T)) < 2e-3
    assert cosines[0, 1] > cosines[0, 2]  # the paraphrase stays nearer than the unrelated sentence
