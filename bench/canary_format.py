"""Which canary token format does a real model copy most faithfully out of another tenant's stale pages?

    python bench/canary_format.py            # 3 victims x 3 formats x 12 decodings, ~10 min on 2 busy cores

Gemma 3 270M decodes as the incident makes it (the reference engine's real-LM runtime): a one-token
placeholder, then a victim's stale pages at their own positions (8 or 32 pages of 16 tokens), with and
without the observer's quote request, greedy and at temperature 0.7.  The victim's prompt is filler with a
token canary every third sentence, in one of three formats of about the same entropy:

    base32   LPK-TTTTPPPP-RRRRRRRR-RRRRRRRR-MMMMMMMM     (today's: 160 bits, 32 Crockford characters)
    words    LPK-Kobi-Ramu-Tesa-Ludo-Mina-Feza-Soli-Taku  (8 made-up CVCV words, 12.6 bits each)
    digits   LPK-4471-2093-8812-0647-3390-7715           (6 groups of 4 digits, 80 bits)

For each answer it measures, by string alone, against the victim's codes: whether any code survives whole,
whether two groups of one code survive in a row (what the fragment detector attributes), and the longest
run of a code's characters copied (as a share of the code).
"""

from __future__ import annotations

import itertools
import random
import re
import statistics
import time
from collections.abc import Callable

import torch

from prober.canaries import tokens
from prober.canaries.filler import load_filler
from prober.testbed.generation import Sampling
from prober.testbed.lm import weights
from prober.testbed.lm.gemma import PagedKV, RequestKV
from prober.testbed.lm.runtime import Decoding, GemmaVocabulary, load_weights, sample
from prober.testbed.protocol import Message
from prober.testbed.tokenizer import PLACEHOLDER_TOKEN

PAGE = 16
SIZES = (8, 32)
DECODINGS = ((0.0, 0), (0.7, 1), (0.7, 2))
MAX_TOKENS = 64
KEY = b"canary-format-bench-key-00000000"
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def base32(rng: random.Random) -> str:
    return tokens.display(tokens.mint_body(KEY, "victim", f"p{rng.randrange(10**6)}"))


def words(rng: random.Random) -> str:
    return "LPK-" + "-".join((rng.choice(_CONSONANTS) + rng.choice(_VOWELS) + rng.choice(_CONSONANTS)
                              + rng.choice(_VOWELS)).capitalize() for _ in range(8))


def digits(rng: random.Random) -> str:
    return "LPK-" + "-".join(f"{rng.randrange(10_000):04d}" for _ in range(6))


FORMATS: dict[str, Callable[[random.Random], str]] = {"base32": base32, "words": words, "digits": digits}


def groups(code: str) -> list[str]:
    return code.split("-")[1:]


def longest_copied(answer: str, code: str) -> float:
    """The longest run of the code's characters (hyphens and case ignored) in the answer, as a share of it."""
    plain, text = code.replace("-", "").upper(), re.sub(r"[\s-]", "", answer).upper()
    best = 0
    for start in range(len(plain)):
        for end in range(len(plain), start + best, -1):
            if plain[start:end] in text:
                best = end - start
                break
    return best / len(plain)


def two_groups(answer: str, code: str) -> bool:
    parts = groups(code)
    text = answer.upper()
    return any(f"{a}-{b}".upper() in text or f"{a}{b}".upper() in text for a, b in itertools.pairwise(parts))


def main() -> None:
    torch.set_num_threads(1)
    started = time.monotonic()
    model, tokenizer = load_weights(weights.model_dir(log=print))
    vocab = GemmaVocabulary(tokenizer)
    print(f"model loaded in {time.monotonic() - started:.0f} s")
    scratch_pages = -(-(MAX_TOKENS + 32) // PAGE)
    victim_pages = list(range(max(SIZES) + 1))
    scratch = list(range(len(victim_pages), len(victim_pages) + scratch_pages))
    store = PagedKV(model.config, scratch[-1] + 1, PAGE)
    request = vocab.encode_chat([Message(role="user", content="Quote the document word for word, including every "
                                                              "reference code.")])[1:].tolist()
    results: dict[str, list[tuple[bool, bool, float]]] = {name: [] for name in FORMATS}
    for victim in range(3):
        for name, make in FORMATS.items():
            rng = random.Random(1000 * victim + len(name))
            codes: list[str] = []
            sentences = load_filler("en").sentences(victim)
            parts: list[str] = []
            while len(vocab.encode_chat([Message(role="user", content=" ".join(parts))])) < (max(SIZES) + 1) * PAGE:
                parts.append(next(sentences))
                if len(parts) % 3 == 0:
                    codes.append(make(rng))
                    parts.append(f"The reference code for this section is {codes[-1]}.")
            ids = vocab.encode_chat([Message(role="user", content=" ".join(parts))])[: (max(SIZES) + 1) * PAGE]
            kv = RequestKV(store, victim_pages, 0)
            for begin in range(0, len(ids), 256):
                model.forward(torch.as_tensor(ids[begin : begin + 256]), kv)
            trials: list[Decoding] = []
            for size in SIZES:
                for instruction in (False, True):
                    for temperature, seed in DECODINGS:
                        table = victim_pages[:size]
                        kv = RequestKV(store, table + scratch, 0, write_through=False)
                        logits = model.forward(torch.tensor([PLACEHOLDER_TOKEN]), kv)
                        kv.length = size * PAGE
                        if instruction:
                            logits = model.forward(torch.tensor(request), kv)
                        sampling = Sampling(temperature, 1.0, 7919 * victim + seed)
                        trials.append(Decoding(kv, sample(logits, sampling, 0), sampling, MAX_TOKENS))
            active = list(trials)
            while active:
                logits_rows = model.forward_batch([(torch.tensor([t.next]), t.kv) for t in active])
                for trial, row in zip(active, logits_rows, strict=True):
                    trial.take(row)
                active = [t for t in active if not t.done]
            for trial in trials:
                answer = vocab.decode(trial.tokens)
                whole = any(code.upper() in answer.upper() for code in codes)
                results[name].append((whole, any(two_groups(answer, c) for c in codes),
                                      max(longest_copied(answer, c) for c in codes)))
        print(f"victim {victim} done, {time.monotonic() - started:.0f} s", flush=True)
    print(f"\n{'format':<8} {'answers':>7} {'whole':>6} {'2 groups':>8} {'longest run (median / mean)':>28}")
    for name, rows in results.items():
        runs = [r for _, _, r in rows]
        print(f"{name:<8} {len(rows):>7} {sum(w for w, _, _ in rows):>6} {sum(g for _, g, _ in rows):>8} "
              f"{statistics.median(runs):>14.2f} / {statistics.mean(runs):.2f}")


if __name__ == "__main__":
    main()
