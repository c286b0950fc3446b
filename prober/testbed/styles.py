"""How the test model re-renders what it quotes: verbatim, disguised, or paraphrased.

Real models rarely echo a secret byte for byte: they change case, add spaces, break lines, fix
"typos", swap look-alike characters, or reword the sentence around names and numbers.  These
transforms make the reference engine do the same, deterministically (seeded by the text), so the
fuzzy and semantic detectors are exercised by a real HTTP answer.
"""

from __future__ import annotations

import hashlib
import random
import re

from prober.testbed.config import QuoteStyle

# Latin -> Cyrillic/Greek look-alikes.
_CONFUSABLES = {"A": "А", "E": "Е", "O": "О", "P": "Р", "C": "С", "K": "К", "X": "Х", "B": "В", "M": "М",
                "H": "Н", "T": "Т", "a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "x": "х"}

_CODE_LIKE = re.compile(r"\b(?=[A-Za-z0-9-]*\d)(?=[A-Za-z0-9-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9-]{5,}\b")

# Rewordings a model might choose.  Keys are lower-case whole words or phrases.
_SYNONYMS = {
    "lives in": "resides in", "lives": "resides", "works at": "is employed at", "works": "is employed",
    "keeps": "stores", "kept": "stored", "stores": "keeps", "located": "situated", "owns": "possesses",
    "favourite": "preferred", "favorite": "preferred", "code": "passcode", "number": "figure",
    "meeting": "appointment", "secret": "confidential", "account": "profile", "city": "town",
    "village": "hamlet", "house": "home", "birthday": "date of birth", "arrives": "lands",
    "booked": "reserved", "bought": "purchased", "paid": "settled", "ordered": "requested",
    "hidden": "concealed", "near": "close to", "every": "each", "begins": "starts", "starts": "begins",
    "called": "named", "named": "called", "uses": "relies on", "sent": "dispatched", "shipment": "delivery",
    "deliver": "hand over", "grows": "cultivates", "planted": "sowed", "collects": "gathers",
    "built": "constructed", "travels": "journeys", "visits": "calls on", "room": "chamber",
}
_SYNONYM_RE = re.compile(r"\b(" + "|".join(sorted(map(re.escape, _SYNONYMS), key=len, reverse=True)) + r")\b",
                         re.IGNORECASE)
_OPENERS = ("According to the records, ", "As noted, ", "It is recorded that ", "Reportedly, ")


def _rng(text: str, salt: str) -> random.Random:
    return random.Random(hashlib.blake2b(f"{salt}\x00{text}".encode(), digest_size=8).digest())


def _disguise_code(code: str, rng: random.Random) -> str:
    choice = rng.randrange(6)
    if choice == 0:
        return code.lower()
    if choice == 1:
        bare = code.replace("-", "")
        return " ".join(bare[i : i + 4] for i in range(0, len(bare), 4))
    if choice == 2:
        return code.replace("-", "")
    if choice == 3:
        cut = len(code) // 2
        return code[:cut] + "\n" + code[cut:]
    if choice == 4:
        chars = list(code)
        spots = [i for i, ch in enumerate(chars) if ch in _CONFUSABLES]
        for i in rng.sample(spots, min(2, len(spots))):
            chars[i] = _CONFUSABLES[chars[i]]
        return "".join(chars)
    chars = list(code)
    i = rng.randrange(len(chars))
    chars[i] = rng.choice("ABCDEFGHJKMNPQRSTVWXYZ0123456789".replace(chars[i].upper(), ""))
    return "".join(chars)


def disguise(sentence: str) -> str:
    """Reformat code-like strings and the case of the sentence, keeping it recognisable to a person."""
    rng = _rng(sentence, "disguise")
    out = _CODE_LIKE.sub(lambda m: _disguise_code(m.group(0), rng), sentence)
    if rng.random() < 0.3:
        out = out.lower()
    elif rng.random() < 0.2:
        out = out.upper()
    return out


def paraphrase(sentence: str) -> str:
    """Reword around the names and numbers: synonyms, a different opening, no trailing period."""
    rng = _rng(sentence, "paraphrase")

    def swap(match: re.Match[str]) -> str:
        word = match.group(0)
        new = _SYNONYMS[word.lower()]
        return new.capitalize() if word[0].isupper() else new

    body = _SYNONYM_RE.sub(swap, sentence.strip())
    if body and body[0].isupper() and not body.split(" ", 1)[0].isupper():
        body = body[0].lower() + body[1:] if body.split(" ", 1)[0] in {"The", "A", "An", "This"} else body
    return rng.choice(_OPENERS) + body


def render(sentence: str, style: QuoteStyle) -> str:
    if style is QuoteStyle.DISGUISE:
        return disguise(sentence)
    if style is QuoteStyle.PARAPHRASE:
        return paraphrase(sentence)
    return sentence
