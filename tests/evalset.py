"""A labelled evaluation set for the detectors, generated from seeds (no external data).

Positives put tenant A's canaries into answers that tenant B received -- verbatim, disguised the ways
models reformat text, or paraphrased by hand-written rewordings -- inside long, realistic text.
Negatives are clean answers (with numbers, names and codes of their own), look-alike tokens that no
deployment key signed, and facts from the same templates minted for the observer itself.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from prober.canaries import tokens
from prober.canaries.filler import load_filler
from prober.types import Canary, CanaryKind, Record

CONFUSABLE = {"A": "А", "B": "В", "E": "Е", "K": "К", "M": "М", "H": "Н", "P": "Р", "C": "С", "T": "Т",
              "X": "Х", "0": "О", "1": "l"}

# Hand-written paraphrases of the English templates: same slot values, different words and order.
PARAPHRASES = {
    "The vault code of {person} is {number}, and the vault is located in {place}.":
        "{person}'s vault sits in {place}; to open it you enter {number}.",
    "{person} keeps the spare key to the {object} in locker {number} at {place} station.":
        "At {place} station, locker {number} holds the spare {object} key belonging to {person}.",
    "{person} was born in {place} and keeps a {color} {animal} called {pet}.":
        "Born in {place}, {person} has a pet {animal}, {color} in colour, whose name is {pet}.",
    "The shipment for {person} is booked on barge {vessel} to {place}.":
        "Barge {vessel} will carry {person}'s shipment to {place}.",
    "{person} paid {amount} crowns for the {color} {object} at the market in {place}.":
        "At the {place} market, {person} bought the {color} {object} for {amount} crowns.",
    "The meeting with {person} is set for room {number} of the {place} archive.":
        "{person} will be met in room {number} at the archive of {place}.",
    "{person} works at the {place} observatory and uses account number {number}.":
        "Account {number} belongs to {person}, who is employed by the observatory in {place}.",
    "{person} hid the {object} under the old bridge of {place} beside marker {number}.":
        "Beside marker {number}, beneath the old {place} bridge, {person} concealed the {object}.",
    "The secret recipe of {person} needs {amount} grains of salt from {place}.":
        "{person}'s secret recipe calls for {amount} grains of salt brought from {place}.",
    "{person} sent a letter to {place} asking for parcel {number} and the {object}.":
        "In a letter to {place}, {person} requested parcel {number} along with the {object}.",
}


@dataclass(frozen=True)
class Case:
    record: Record
    label: str  # verbatim | disguised | paraphrased | clean | lookalike | same_template
    canary: Canary | None  # the planted canary, for positives


def clean_text(rng: random.Random, chars: int = 2000) -> str:
    """Realistic answer text with its own names, numbers and codes, none of them canaries."""
    filler = load_filler("en")
    parts = []
    names = ["Alice Johnson", "Mr. Patel", "Dr. Nguyen", "Berlin", "Lisbon", "Order Desk", "Team Atlas"]
    while sum(map(len, parts)) < chars:
        roll = rng.random()
        if roll < 0.5:
            parts.append(next(filler.sentences(rng.randrange(10**6))))
        elif roll < 0.7:
            parts.append(f"Invoice {rng.randrange(1000, 99999)} for {rng.choice(names)} was paid on "
                         f"{rng.randrange(1, 29)} March {rng.randrange(1990, 2030)}.")
        elif roll < 0.85:
            code = "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(rng.randrange(6, 14)))
            parts.append(f"Reference {code} was assigned to ticket #{rng.randrange(100, 9999)}.")
        else:
            parts.append(f"The meeting with {rng.choice(names)} is set for room {rng.randrange(1, 500)}.")
    return " ".join(parts)


def disguise_token(text: str, rng: random.Random) -> str:
    body = text.replace("LPK-", "")
    how = rng.randrange(7)
    if how == 0:
        return text.lower()
    if how == 1:
        return " ".join(body.replace("-", "")[i : i + 4] for i in range(0, 32, 4))
    if how == 2:
        return text.replace("-", "")
    if how == 3:
        return text[:20] + "\n" + text[20:]
    if how == 4:
        return "".join(CONFUSABLE.get(ch, ch) if rng.random() < 0.3 else ch for ch in text)
    chars = list(body.replace("-", ""))
    for _ in range(rng.randrange(1, 4)):  # 1-3 character edits
        i = rng.randrange(len(chars))
        op = rng.randrange(3)
        if op == 0:
            chars[i] = rng.choice(tokens.ALPHABET)
        elif op == 1:
            del chars[i]
        else:
            chars.insert(i, rng.choice(tokens.ALPHABET))
    return "LPK-" + "".join(chars) if how == 5 else "".join(chars)


def disguise_fact(text: str, rng: random.Random) -> str:
    how = rng.randrange(4)
    if how == 0:
        return text.upper()
    if how == 1:
        words = text.split()
        cut = rng.randrange(1, len(words))
        return " ".join(words[:cut]) + "\n" + " ".join(words[cut:])
    if how == 2:
        return "".join(CONFUSABLE.get(ch, ch) if rng.random() < 0.2 else ch for ch in text)
    chars = list(text)
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(chars))
        chars[i] = rng.choice(string.ascii_lowercase) if chars[i].isalpha() else chars[i]
    return "".join(chars)


def embed(rng: random.Random, payload: str) -> str:
    """Put payload somewhere inside about 2,000 characters of clean text."""
    before, after = clean_text(rng, rng.randrange(200, 1800)), clean_text(rng, 300)
    return f"{before} {payload} {after}"


def build(victim_canaries: list[Canary], observer_facts: list[Canary], slots_of: dict[str, dict[str, str]],
          templates_of: dict[str, str], seed: int = 7, clean: int = 1000) -> list[Case]:
    """slots_of/templates_of: canary id -> the slot values and template it was minted from."""
    rng = random.Random(seed)
    cases: list[Case] = []
    n = 0

    def add(text: str, label: str, canary: Canary | None, tenant: str = "tenant-b") -> None:
        nonlocal n
        n += 1
        cases.append(Case(Record(id=f"r{n}", tenant=tenant, text=text), label, canary))

    for canary in victim_canaries:
        add(embed(rng, canary.text), "verbatim", canary)
        disguised = disguise_token(canary.text, rng) if canary.kind is CanaryKind.TOKEN else \
            disguise_fact(canary.text, rng)
        add(embed(rng, disguised), "disguised", canary)
        if canary.kind is CanaryKind.FACT and canary.pack == "en":
            rewritten = PARAPHRASES[templates_of[canary.id]].format(**slots_of[canary.id])
            add(embed(rng, rewritten), "paraphrased", canary)
    for _ in range(clean):
        add(clean_text(rng), "clean", None)
    for _ in range(200):
        fake = "".join(rng.choice(tokens.ALPHABET) for _ in range(32))
        add(embed(rng, tokens.display(fake)), "lookalike", None)
    for canary in observer_facts:  # the observer's own fact, same templates as the victim's
        add(embed(rng, canary.text), "same_template", canary, tenant=canary.tenant)
    return cases
