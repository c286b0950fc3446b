"""The numpy search for pieces of token bodies, against the plain one it replaces (every piece, at every place),
and the bound that lets the fuzzy detector skip a candidate: no alignment shares more than the multisets do."""

from __future__ import annotations

import random

import numpy as np
import pytest
from rapidfuzz import fuzz

from prober.canaries import tokens
from prober.detect.bags import TokenBags, least_shared
from prober.detect.pieces import Batch, PieceTable

pytestmark = pytest.mark.unit


def naive(pieces: list[str], texts: list[str]) -> set[tuple[int, int, int, int]]:
    """(answer, piece, start, end) of every piece at every place, in bytes."""
    found = set()
    for n, text in enumerate(texts):
        data = text.encode().decode("latin-1")  # a character per byte
        for p, piece in enumerate(pieces):
            found |= {(n, p, at, at + len(piece)) for at in range(len(data)) if data.startswith(piece, at)}
    return found


def test_every_piece_is_found_where_it_is_and_nowhere_else() -> None:
    rng = random.Random(5)
    bodies = ["".join(rng.choice(tokens.ALPHABET) for _ in range(32)) for _ in range(200)]
    pieces = sorted({body[a:b] for body in bodies for a, b in ((0, 5), (5, 11), (11, 16))})
    texts = [
        "".join(rng.choice(tokens.ALPHABET) for _ in range(rng.randrange(0, 400))) + bodies[n][:11] + "THEN"
        for n in range(30)
    ]
    texts += [bodies[0][:4], bodies[1][:3] + bodies[1][3:5], "", f"KIMÉ{bodies[2][:11]}", bodies[3][:5]]
    texts[5] = bodies[4][:3]  # ends an answer; the next one starts with the rest: no piece spans the two
    texts[6] = bodies[4][3:11] + texts[6]
    found = PieceTable(pieces).find(Batch.of(texts))
    got = set(zip(found.answer.tolist(), found.pattern.tolist(), found.start.tolist(), found.end.tolist(),
                  strict=True))
    assert got == naive(pieces, texts)
    assert (30 + 1, pieces.index(bodies[1][:5]), 0, 5) in got and (33, pieces.index(bodies[2][:5]), 5, 10) in got
    assert not any(n == 5 for n, *_ in got)


def test_no_alignment_shares_more_characters_than_the_multisets_do() -> None:
    assert least_shared(tokens.BODY_LEN, 0.84) == 24  # 2 x 24 / (32 + 24) = 0.857; 23 of 24 or 23 is 0.82-0.84
    rng = random.Random(9)
    bodies = ["".join(rng.choice(tokens.ALPHABET) for _ in range(32)) for _ in range(300)]
    bags = TokenBags(bodies)
    windows, scores = [], []
    for body in bodies:
        edited = list(body)
        for i in rng.sample(range(32), rng.randrange(0, 12)):
            edited[i] = rng.choice(tokens.ALPHABET)
        window = "".join(rng.choice(tokens.ALPHABET) for _ in range(rng.randrange(0, 9))) + "".join(edited)
        windows.append(window)
        scores.append(fuzz.partial_ratio(body, window))
    joined = "\n".join(windows).encode()
    begin = np.cumsum([0, *(len(w) + 1 for w in windows)])[:-1]
    shared = bags.shared(joined, np.arange(len(bodies)), begin, begin + [len(w) for w in windows])
    for score, common in zip(scores, shared.tolist(), strict=True):
        if score >= 84:
            assert common >= 24
    assert sum(s >= 84 for s in scores) > 50 and sum(s < 84 for s in scores) > 50
