"""Input-embedding tables: a prompt's text as the rows of the table a model looks its tokens up in.

The reference engine's model reads token ids, so its table is a code, documented here and known to both sides: a
token id's row is its 32 bits (two's complement, least significant first) as ±1, times a fixed orthogonal matrix
(`HIDDEN` = 32, the Q of a seeded Gaussian matrix).  The nearest row to any received row is then found exactly
(an orthogonal matrix keeps distances, and the nearest ±1 vector to a point is its signs), so exact rows come back
as exact ids and a perturbed row as the id nearest it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Protocol

import numpy as np
import numpy.typing as npt

HIDDEN = 32
SEED = 56_655  # vLLM #56655, the bug the canaries sent as embeddings look for

Ids = npt.NDArray[np.int32]
Rows = npt.NDArray[np.float32]


class InputTable(Protocol):
    """What sending a prompt as embeddings needs of a model: its text as the model's input rows."""

    def rows(self, text: str) -> Rows:
        """[tokens, hidden] float32."""


@cache
def _basis() -> npt.NDArray[np.float64]:
    q, r = np.linalg.qr(np.random.default_rng(SEED).standard_normal((HIDDEN, HIDDEN)))
    return q * np.sign(np.diag(r))  # the unique Q with a positive-diagonal R


def rows_of(ids: Ids) -> Rows:
    """The reference table's rows of token ids."""
    unsigned = np.asarray(ids, dtype="<i4").view("<u4")
    bits = (unsigned[:, None] >> np.arange(HIDDEN, dtype=np.uint32)) & 1
    return ((bits.astype(np.float64) * 2 - 1) @ _basis().T).astype(np.float32)


def ids_of(rows: Rows) -> Ids:
    """The token id whose reference row is nearest each row.  Raises ValueError for another hidden size."""
    if rows.ndim != 2 or rows.shape[1] != HIDDEN:
        raise ValueError(f"the reference engine's embeddings have {HIDDEN} dimensions, not {rows.shape[-1]}")
    bits = (rows.astype(np.float64) @ _basis()) > 0
    packed = (bits.astype(np.uint64) << np.arange(HIDDEN, dtype=np.uint64)).sum(axis=1)
    ids: Ids = packed.astype(np.uint32).view(np.int32)
    return ids


class ReferenceTable:
    """The reference engine's table over its tokenizer (given: the engine's own, prober/testbed/tokenizer.py)."""

    def __init__(self, tokenize: Callable[[str], Ids]) -> None:
        self.tokenize = tokenize

    def rows(self, text: str) -> Rows:
        return rows_of(self.tokenize(text))
