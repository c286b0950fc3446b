"""Prompts sent as embeddings (vLLM's `--enable-prompt-embeds`: the completions request's `prompt_embeds`, a base64
string of a `torch.save`d tensor of shape [tokens, hidden]): the wire codec, and the input-embedding tables that
turn a prompt's text into the rows a model would have looked its tokens up in."""

from prober.input_embeds.codec import decode, encode
from prober.input_embeds.model import ModelTable
from prober.input_embeds.tables import HIDDEN, InputTable, ReferenceTable, ids_of, rows_of

__all__ = ["HIDDEN", "InputTable", "ModelTable", "ReferenceTable", "decode", "encode", "ids_of", "rows_of"]
