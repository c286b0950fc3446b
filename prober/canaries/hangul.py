"""What Korean facts need: particles that agree with the word before them, and the Latin spelling a model
uses when it writes a Korean name in English.

Particles: 을/를, 이/가, 은/는, 과/와, 이며/며 take their first form after a final consonant (batchim) and the
second after a vowel; 으로/로 takes 로 after a vowel or a final ㄹ.  A word ending in a digit is read as a
Korean numeral (…구, …일, …십): 0, 1, 3, 6, 7, 8 end in a consonant, 1, 7 and 8 in ㄹ.

Romanization follows the Revised Romanization of Korean syllable by syllable (the spelling models and
passports use most); sound changes across syllables are not applied, so a transliteration keeps the letters
of each syllable, which is also how a made-up name is usually romanized.  `romanization_key` maps the other common
ways of writing the same letters (McCune-Reischauer without marks, popular spellings such as "Yoon") to one key.
"""

from __future__ import annotations

import re

_FIRST, _LAST = 0xAC00, 0xD7A3
_SYLLABLE = re.compile(f"[{chr(_FIRST)}-{chr(_LAST)}]")
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


# One key for the ways the same Korean letters are spelled in Latin (computed on compact text, where O, I, L and U
# are already 0, 1, 1 and V): the consonants that romanizations voice differently merged (g/k, d/t, b/p, r/l,
# j/ch), the vowels reduced to what every spelling keeps (ee -> i; e dropped, so eo, eu -> o, u; o, u, oo one
# class; ai -> ae), an h after a vowel dropped ("Ahn", "Doh"), w before o or u ("Sunwoo") and r before y ("Yul")
# dropped, doubled letters single.
# Lossy on purpose: a key only says which romanized values may be there; what attributes is still a whole word,
# a name in full, the fact's other values.
_KEY_STEPS = [(re.compile("EE"), "1"), (re.compile("CH"), "J"), (re.compile("(?<=[AE0V1Y])H(?![AE0V1YW])"), ""),
              (re.compile("W(?=[0V])"), ""), (re.compile("R(?=Y)"), ""), (re.compile("(?<=A)1(?![AE0V1Y])"), "")]
_KEY_TABLE = str.maketrans({"G": "K", "D": "T", "B": "P", "R": "1", "V": "0", "E": None})
_DOUBLED = re.compile(r"(.)\1+")


def romanization_key(compacted: str) -> str:
    """The key of a compact text (see above): equal for "Tak Yunseul", "Tahk Yoon-sul" and "YOONSEUL TAK"'s
    parts."""
    for pattern, replacement in _KEY_STEPS:
        compacted = pattern.sub(replacement, compacted)
    return _DOUBLED.sub(r"\1", compacted.translate(_KEY_TABLE))


def romanization_key_positions(compacted: str) -> tuple[str, list[int]]:
    """The key and, for each of its characters, the position in `compacted` it came from (slower: for the
    few answers where a key matched)."""
    text, positions = compacted, list(range(len(compacted)))

    def rewrite(pattern: re.Pattern[str], replacement: str | None) -> None:
        nonlocal text, positions
        parts: list[str] = []
        kept: list[int] = []
        copied = 0
        for match in pattern.finditer(text):
            parts.append(text[copied : match.start()])
            kept += positions[copied : match.start()]
            written = match.group(1) if replacement is None else replacement
            parts.append(written)
            kept += positions[match.start() : match.start() + len(written)]
            copied = match.end()
        parts.append(text[copied:])
        kept += positions[copied:]
        text, positions = "".join(parts), kept

    for pattern, replacement in _KEY_STEPS:
        rewrite(pattern, replacement)
    translated = [(ch.translate(_KEY_TABLE), at) for ch, at in zip(text, positions, strict=True)]
    text = "".join(ch for ch, _ in translated)
    positions = [at for ch, at in translated if ch]
    rewrite(_DOUBLED, None)
    return text, positions


# Syllables that open what follows a Korean noun written together with it: particles (의, 에게, 으로, 와의 ...),
# the copula (입니다, 이며, 였다), honorifics and address (씨, 님, 군, 양), plurals.  A Korean name followed by
# any other syllable is the start of a longer name ("빙윤로" is not in "빙윤로준").
NOUN_ENDINGS = frozenset("의에은는이가을를과와으로도만께한하랑라야아여였씨님군양입처보까부마조네들뿐요")


def is_hangul(text: str) -> bool:
    return _SYLLABLE.search(text) is not None  # a regex: detectors ask it of every word of every answer
