"""A real model's input-embedding table, read from its Hugging Face folder: the rows a prompt's tokens look up in
`embed_tokens`, scaled as the serving engine scales them before the first layer.

vLLM applies a model's embedding scale inside its own token lookup only (Gemma 3's `embed_input_ids`:
`embed_tokens(ids) * hidden_size ** 0.5`, the normalizer), and takes `prompt_embeds` as the first layer's input
as given, so a client sends the scaled rows.  Measured on the project's vLLM 0.32.0 (CPU) with Gemma 3 270M: a
prompt sent so is answered as the same prompt sent as text (docs/checks.md#prompt-embeds)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from prober.input_embeds.tables import Rows

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

FILES = ("config.json", "tokenizer.json", "model.safetensors")
EMBEDDINGS = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "embed_tokens.weight")
SCALED = ("gemma", "gemma2", "gemma3", "gemma3_text")  # model types whose lookup multiplies by sqrt(hidden)


@dataclass(frozen=True)
class _Loaded:
    table: torch.Tensor  # [vocabulary, hidden], in the file's dtype
    scale: float
    tokenizer: Tokenizer


class ModelTable:
    """The table of the model in `folder` (its config.json, tokenizer.json and model.safetensors), loaded on first
    use; its tokenizer adds what it adds to a prompt (Gemma's `<bos>`), as the engine's does to the same text."""

    def __init__(self, folder: Path) -> None:
        missing = [name for name in FILES if not (folder / name).is_file()]
        if missing:
            raise ValueError(f"{folder} is no model folder: it lacks {', '.join(missing)}")
        self.folder = folder

    @cached_property
    def _loaded(self) -> _Loaded:
        from safetensors import safe_open  # the model's files only where a real model's table is used
        from tokenizers import Tokenizer

        config = json.loads((self.folder / "config.json").read_text(encoding="utf-8"))
        text = config.get("text_config", config)
        with safe_open(str(self.folder / "model.safetensors"), "pt") as weights:
            held = set(weights.keys())
            name = next((n for n in EMBEDDINGS if n in held), None)
            if name is None:
                raise ValueError(f"{self.folder / 'model.safetensors'} holds none of {', '.join(EMBEDDINGS)}")
            table = weights.get_tensor(name)
        scaled = text.get("model_type", config.get("model_type")) in SCALED
        return _Loaded(table, float(text["hidden_size"]) ** 0.5 if scaled else 1.0,
                       Tokenizer.from_file(str(self.folder / "tokenizer.json")))

    def rows(self, text: str) -> Rows:
        import torch

        loaded = self._loaded
        ids = torch.tensor(loaded.tokenizer.encode(text).ids, dtype=torch.long)
        rows: Rows = (loaded.table[ids].float() * loaded.scale).numpy().astype(np.float32)
        return rows
