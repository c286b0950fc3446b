"""Canary-free padding text for long prompts.

Generated from word lists in `canaries/filler/<lang>.yaml` (lower-case common words, no digits), so no
filler sentence can match a token body or a distinctive slot value.  Deterministic for a seed, so a
prompt of a given length is reproducible and its token cost can be measured once per target.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import cache

import yaml

from prober.domain.errors import PackError
from prober.system.resources import canaries_dir


class Filler:
    def __init__(self, language: str, parts: dict[str, list[str]], order: list[str]) -> None:
        self.language = language
        self.parts = parts
        self.order = order

    def sentences(self, seed: int = 0) -> Iterator[str]:
        rng = random.Random(seed)
        while True:
            words = [rng.choice(self.parts[part]) for part in self.order
                     if part != "openers" or rng.random() < 0.4]
            sentence = " ".join(words)
            yield (sentence[0].upper() + sentence[1:] + ".") if sentence.isascii() else sentence + "."

    def text(self, chars: int, seed: int = 0) -> str:
        """At least `chars` characters of whole sentences."""
        out: list[str] = []
        size = 0
        for sentence in self.sentences(seed):
            if size >= chars:
                break
            out.append(sentence)
            size += len(sentence) + 1
        return " ".join(out)


@cache
def load_filler(language: str = "en") -> Filler:
    path = canaries_dir() / "filler" / f"{language}.yaml"
    if not path.is_file():
        raise PackError(f"no filler corpus for language {language!r} (looked for {path})")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        order = list(data["order"])
        return Filler(language, {part: list(data[part]) for part in order}, order)
    except (KeyError, TypeError) as exc:
        raise PackError(f"{path}: missing or malformed key {exc}") from None
