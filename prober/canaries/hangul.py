"""What Korean facts need: particles that agree with the word before them, and the Latin spelling a model
uses when it writes a Korean name in English.

Particles: 을/를, 이/가, 은/는, 과/와, 이며/며 take their first form after a final consonant (batchim) and the
second after a vowel; 으로/로 takes 로 after a vowel or a final ㄹ.  A word ending in a digit is read as a
Korean numeral (…구, …일, …십): 0, 1, 3, 6, 7, 8 end in a consonant, 1, 7 and 8 in ㄹ.

Romanization follows the Revised Romanization of Korean syllable by syllable (the spelling models and
passports use most); sound changes across syllables are not applied, so a transliteration keeps the letters
of each syllable, which is also how a made-up name is usually romanized.
"""

from __future__ import annotations

import re

_FIRST, _LAST = 0xAC00, 0xD7A3
_INITIALS = ["g", "kk", "n", "d", "tt", "r", "m", "b", "pp", "s", "ss", "", "j", "jj", "ch", "k", "t", "p", "h"]
_VOWELS = ["a", "ae", "ya", "yae", "eo", "e", "yeo", "ye", "o", "wa", "wae", "oe", "yo", "u", "wo", "we", "wi",
           "yu", "eu", "ui", "i"]
_FINALS = ["", "k", "k", "k", "n", "n", "n", "t", "l", "k", "m", "l", "l", "l", "p", "l", "m", "p", "p", "t", "t",
           "ng", "t", "t", "k", "t", "p", "t"]
_RIEUL = 8  # the index of ㄹ among finals
_DIGIT_FINAL = {"0": 1, "1": _RIEUL, "3": 16, "6": 1, "7": _RIEUL, "8": _RIEUL}  # read as Korean numerals
PARTICLES = ("을/를", "이/가", "은/는", "과/와", "으로/로", "이며/며")
_PARTICLE = re.compile(r"\{(\w+)\}(" + "|".join(PARTICLES) + ")")


def final_consonant(ch: str) -> int:
    """The index of the syllable's final consonant (0: none); digits as Korean numerals."""
    if _FIRST <= ord(ch) <= _LAST:
        return (ord(ch) - _FIRST) % 28
    return _DIGIT_FINAL.get(ch, 0)


def particle(word: str, pair: str) -> str:
    """The form of `pair` (e.g. "을/를") that follows `word`."""
    after_consonant, after_vowel = pair.split("/")
    final = final_consonant(word[-1]) if word else 0
    if pair == "으로/로":
        return after_vowel if final in (0, _RIEUL) else after_consonant
    return after_consonant if final else after_vowel


def resolve_particles(template: str, values: dict[str, str]) -> str:
    """`{slot}을/를` -> `{slot}` followed by the particle that agrees with the slot's value."""
    return _PARTICLE.sub(lambda m: "{" + m.group(1) + "}" + particle(values[m.group(1)], m.group(2)), template)


def romanize(text: str) -> str:
    """Hangul syllables in Revised Romanization; anything else kept as it is."""
    out = []
    for ch in text:
        code = ord(ch) - _FIRST
        if 0 <= code <= _LAST - _FIRST:
            initial, vowel, final = code // 588, (code % 588) // 28, code % 28
            out.append(_INITIALS[initial] + _VOWELS[vowel] + _FINALS[final])
        else:
            out.append(ch)
    return "".join(out)


def is_hangul(text: str) -> bool:
    return any(_FIRST <= ord(ch) <= _LAST for ch in text)
