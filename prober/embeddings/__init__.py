"""Sentence embeddings behind one interface: what fact canaries are stored with and paraphrases matched by.

The default is USE multilingual v3 (English, Korean and 14 more languages in one space; CPU); its static
distillation (`use-multilingual-v3-static`, built once per machine) embeds several times faster; any
sentence-transformers model can be named instead (path or name), and runs on a GPU when one is present."""

from prober.embeddings.base import Embedder, Vectors, pick_device
from prober.embeddings.sentence_transformers import MINILM, SentenceTransformerEmbedder
from prober.embeddings.static import STATIC_MODEL, StaticEmbedder
from prober.embeddings.use import USE_MODEL, UniversalSentenceEncoder

DEFAULT_MODEL = USE_MODEL


def make_embedder(model: str = DEFAULT_MODEL, device: str = "auto", threshold: float | None = None) -> Embedder:
    """USE or its static distillation by name; anything else is a sentence-transformers model (name or path) on
    `device`.  `threshold` replaces the model's measured paraphrase cosine (needed for a model nobody here
    measured)."""
    embedder: Embedder
    if model == USE_MODEL:
        embedder = UniversalSentenceEncoder()
    elif model == STATIC_MODEL:
        embedder = StaticEmbedder()
    else:
        embedder = SentenceTransformerEmbedder(model, device=device)
    if threshold is not None:
        embedder.threshold = threshold
    return embedder


__all__ = ["DEFAULT_MODEL", "MINILM", "STATIC_MODEL", "USE_MODEL", "Embedder", "SentenceTransformerEmbedder",
           "StaticEmbedder", "UniversalSentenceEncoder", "Vectors", "make_embedder", "pick_device"]
