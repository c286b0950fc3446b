"""Fact packs: natural-language canary templates whose slot values attribute a paraphrase.

A model asked to summarise may reword "The vault code of Morwenna Quill is 4471-209" into "Quill's
vault code, 4471-209, ...": the template words change, the made-up name and the odd number survive.
Those *distinctive* slot values are what the detectors attribute on.

A name alone attributes only if nobody writes it by accident, and names are drawn from a pack's syllables: a text
that draws names from the same syllables (a model recombining the names it read, another prober) writes a given
one with probability `FactPack.chance`, which the fragment detector weighs against how many names it holds.
"""

from __future__ import annotations

import random
import re
import secrets
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import yaml

from prober.canaries import hangul
from prober.domain.errors import PackError
from prober.system.resources import canaries_dir

_SLOT = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True)
class Fact:
    text: str
    template: str
    slots: dict[str, str]
    distinctive: tuple[str, ...]  # the values that attribute it
    aliases: tuple[tuple[int, str], ...] = ()  # (index into distinctive, another spelling): romanized Korean


class FactPack:
    def __init__(self, language: str, data: dict[str, Any]) -> None:
        self.language = language
        try:
            self.templates: list[str] = list(data["templates"])
            self.slots: dict[str, dict[str, Any]] = dict(data["slots"])
            self.syllables: dict[str, list[str]] = dict(data["syllables"])
            self.lengths: dict[str, list[int]] = {part: list(counts) for part, counts in data["lengths"].items()}
        except (KeyError, TypeError, AttributeError) as exc:
            raise PackError(f"pack {language}: missing or malformed key {exc}") from None
        for template in self.templates:
            for name in _SLOT.findall(template):
                if name not in self.slots:
                    raise PackError(f"pack {language}: template uses undefined slot {{{name}}}")

    # -- slot generators: made-up syllable combinations, odd number shapes ----------------------
    def _word(self, part: str, rng: random.Random) -> str:
        pool = self.syllables[part]
        return "".join(rng.choice(pool) for _ in range(rng.choice(self.lengths[part])))

    def _given(self, rng: random.Random) -> str:
        word = self._word("given", rng)
        return word.capitalize() if word.isascii() else word

    def _value(self, generator: str, rng: random.Random) -> str:
        s = self.syllables
        if generator == "given_name":
            return self._given(rng)
        if generator == "name":
            given = self._given(rng)
            if given.isascii():
                return f"{given} {self._word('family', rng).capitalize()}"
            return rng.choice(s["family"]) + given  # Korean order: family name first, no space
        if generator == "place":
            stem = self._word("place", rng) + rng.choice(s["place_suffix"])
            return stem.capitalize() if stem.isascii() else stem
        if generator == "number":
            return f"{rng.randrange(1000, 10000)}-{rng.randrange(100, 1000)}"
        if generator == "amount":
            return f"{rng.randrange(1000, 100000):,}"
        if generator == "vessel":
            letters = "BCDFGHJKMNPRSTVWXZ"
            return f"{rng.choice(letters)}{rng.choice(letters)}-{rng.randrange(100, 1000)}"
        raise PackError(f"pack {self.language}: unknown generator {generator!r}")

    def mint(self, rng: random.Random | None = None) -> Fact:
        """A fresh fact; unpredictable unless a seeded rng is given (tests, evaluation sets)."""
        rng = rng or secrets.SystemRandom()
        template = rng.choice(self.templates)
        values: dict[str, str] = {}
        for name in _SLOT.findall(template):
            if name in values:
                continue
            spec = self.slots[name]
            values[name] = rng.choice(spec["choice"]) if "choice" in spec else self._value(spec["generator"], rng)
        names = [n for n in values if self.slots[n].get("distinctive")]
        distinctive = tuple(values[n] for n in names)
        aliases = tuple((i, alias) for i, n in enumerate(names)
                        for alias in [self._romanized(values[n], self.slots[n].get("generator"))] if alias)
        return Fact(text=hangul.resolve_particles(template, values).format(**values), template=template,
                    slots=values, distinctive=distinctive, aliases=aliases)

    # -- how likely a name is by accident --------------------------------------------------------
    def chance(self, value: str) -> float:
        """The probability that this pack's generators write `value` as a name: a person's (either order, or a
        Korean one in Hangul), or a one-word place or pet.  A Korean name whose given name has two syllables or
        fewer has the shape of most real Korean names, which a stranger's text holds by accident: 1."""
        if hangul.is_hangul(value):
            total = 0.0
            for family in self.syllables["family"]:
                if value.startswith(family):
                    if len(value) - len(family) <= 2:
                        return 1.0
                    total += self._part(value[len(family) :], "given") / len(self.syllables["family"])
            return total
        words = value.lower().split()
        if len(words) == 2:
            return sum(self._part(given, "given") * self._part(family, "family")
                       for given, family in (words, words[::-1]))
        word = "".join(words)
        suffixes = self.syllables["place_suffix"]
        place = sum(self._part(word[: -len(s)], "place") for s in suffixes if word.endswith(s)) / len(suffixes)
        return place + self._part(word, "given")

    def _part(self, word: str, part: str) -> float:
        """The probability of writing `word` as syllables of one part (given, family, place), one to as many as
        the pack mints, any count alike: a writer need not keep to the pack's lengths (a canary minted with
        fewer syllables, before the pack grew, is as likely by accident as its length says)."""
        pool = tuple(self.syllables[part])
        longest = max(self.lengths.get(part, [1]))
        return sum(_ways(word, pool, n) / float(len(pool)) ** n for n in range(1, longest + 1)) / longest

    def _romanized(self, value: str, generator: str | None) -> str | None:
        """How a Korean name or place is written in an English answer: Revised Romanization, a person's family
        name first and apart (a model may swap them; the given name alone is distinctive enough to match)."""
        if not hangul.is_hangul(value):
            return None
        if generator == "name":
            family = next((f for f in sorted(self.syllables["family"], key=len, reverse=True)
                           if value.startswith(f)), value[:1])
            given = value[len(family):]
            return f"{hangul.romanize(family).capitalize()} {hangul.romanize(given).capitalize()}"
        return hangul.romanize(value).capitalize()


@lru_cache(maxsize=1 << 16)  # the endings of the names being weighed: an index of 100,000 facts passes once
def _ways(word: str, pool: tuple[str, ...], count: int) -> int:
    """How many ways `word` is `count` syllables of `pool` in a row (draws of the same letters count apart)."""
    if count == 0:
        return int(word == "")
    return sum(_ways(word[len(s) :], pool, count - 1) for s in pool if word.startswith(s))


@cache
def load_pack(language: str) -> FactPack:
    path = canaries_dir() / "packs" / f"{language}.yaml"
    if not path.is_file():
        raise PackError(f"no fact pack for language {language!r} (looked for {path})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PackError(f"{path}: {exc}") from None
    return FactPack(language, data)


def languages() -> list[str]:
    return sorted(p.stem for p in (canaries_dir() / "packs").glob("*.yaml"))
