"""The `prompt_embeds` wire format vLLM reads (#42119, PR #42172): a tensor saved with `torch.save`, base64."""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np
import numpy.typing as npt

Rows = npt.NDArray[np.float32]


def encode(rows: Rows) -> str:
    """Rows [tokens, hidden] as vLLM's clients send them."""
    import torch  # only where embeddings are sent or read

    buffer = io.BytesIO()
    torch.save(torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)), buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode(data: str) -> Rows:
    """The rows a `prompt_embeds` string carries, read as vLLM reads them (`weights_only`: a pickle that is not a
    plain tensor is refused, never run); a leading batch dimension of one is dropped.  Raises ValueError."""
    import torch

    try:
        raw = base64.b64decode(data, validate=True)
        tensor = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except (binascii.Error, RuntimeError, EOFError, ValueError, OSError) as exc:
        raise ValueError(f"prompt_embeds is not a base64 torch.save'd tensor: {exc}") from None
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        raise ValueError("prompt_embeds must hold one floating-point tensor")
    if tensor.dim() == 3 and tensor.shape[0] == 1:
        tensor = tensor[0]
    if tensor.dim() != 2 or tensor.shape[0] == 0:
        raise ValueError(f"prompt_embeds must be of shape [tokens, hidden], not {list(tensor.shape)}")
    return np.asarray(tensor.to(torch.float32).numpy(), dtype=np.float32)
