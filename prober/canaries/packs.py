"""Fact packs: natural-language canary templates whose slot values attribute a paraphrase.

A model asked to summarise may reword "The vault code of Morwenna Quill is 4471-209" into "Quill's
vault code, 4471-209, ...": the template words change, the made-up name and the odd number survive.
Those *distinctive* slot values are what the detectors attribute on.
"""

from __future__ import annotations

import random
import re
import secrets
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from prober.canaries import hangul
from prober.errors import PackError
from prober.resources import canaries_dir

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
        except (KeyError, TypeError) as exc:
            raise PackError(f"pack {language}: missing or malformed key {exc}") from None
        for template in self.templates:
            for name in _SLOT.findall(template):
                if name not in self.slots:
                    raise PackError(f"pack {language}: template uses undefined slot {{{name}}}")

    # -- slot generators: made-up syllable combinations, odd number shapes ----------------------
    def _given(self, rng: random.Random) -> str:
        parts = self.syllables["given"]
        word = "".join(rng.choice(parts) for _ in range(rng.choice((2, 2, 3))))
        return word.capitalize() if word.isascii() else word

    def _value(self, generator: str, rng: random.Random) -> str:
        s = self.syllables
        if generator == "given_name":
            return self._given(rng)
        if generator == "name":
            given = self._given(rng)
            if given.isascii():
                return f"{given} {''.join(rng.choice(s['family']) for _ in range(2)).capitalize()}"
            return rng.choice(s["family"]) + given  # Korean order: family name first, no space
        if generator == "place":
            stem = "".join(rng.choice(s["place"]) for _ in range(2)) + rng.choice(s["place_suffix"])
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
