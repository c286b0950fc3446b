"""Sentence embeddings behind one interface: what fact canaries are stored with and paraphrases matched by."""

from prober.embeddings.base import Embedder, EmbedderError, Vectors, pick_device
from prober.embeddings.sentence_transformers import DEFAULT_MODEL, SentenceTransformerEmbedder

__all__ = ["DEFAULT_MODEL", "Embedder", "EmbedderError", "SentenceTransformerEmbedder", "Vectors", "pick_device"]
