"""A labelled evaluation set for the detectors, generated from seeds (no external data).

Positives put tenant A's canaries into answers that tenant B received -- verbatim, disguised the ways
models reformat text, or paraphrased by hand-written rewordings -- inside long, realistic text.
Negatives are clean answers (with numbers, names and codes of their own), look-alike tokens that no
deployment key signed, and facts from the same templates minted for the observer itself.
"""

from __future__ import annotations

import random
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from prober.canaries import hangul, tokens
from prober.canaries.compact import compact
from prober.canaries.filler import load_filler
from prober.canaries.mint import Minter
from prober.canaries.packs import load_pack
from prober.detect import CanarySet, Scanner, ScanResult, SemanticDetector
from prober.detect.base import BATCH
from prober.domain.types import Canary, CanaryKind, Record
from prober.embeddings import Embedder
from prober.ledger import Ledger

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


# Hand-written Korean rewordings of the Korean templates (particle pairs agree with the values).
KO_PARAPHRASES = {
    "{person}의 금고 비밀번호는 {number}이며/며 금고는 {place}에 있습니다.":
        "{place}에 있는 {person}의 금고는 {number}으로/로 열립니다.",
    "{person} 씨는 {place}에 살고 있으며 {color} {animal} {pet}을/를 키웁니다.":
        "{place}에 사는 {person} 씨가 기르는 {color} {animal}의 이름은 {pet}입니다.",
    "{person} 씨의 소포 {number}번은 {place} 우체국에 보관되어 있습니다.":
        "{place} 우체국이 {person} 씨 앞으로 온 {number}번 소포를 맡아 두고 있습니다.",
    "{person} 씨는 {place} 시장에서 {object}을/를 {amount}원에 샀습니다.":
        "{amount}원을 내고 {person} 씨가 {place} 시장에서 산 물건은 {object}입니다.",
    "{person} 씨와의 회의는 {place} 기록관 {number}호실에서 열립니다.":
        "{place} 기록관의 {number}호실에서 {person} 씨를 만나기로 했습니다.",
    "{person} 씨는 {place} 천문대에서 일하며 계좌 번호 {number}을/를 씁니다.":
        "{place} 천문대 직원인 {person} 씨의 계좌는 {number}번입니다.",
    "{person}과/와 {pet}은/는 다음 달에 {place}으로/로 이사합니다.":
        "다음 달 {place}으로/로 옮겨 가는 이들은 {person}과/와 {pet}입니다.",
    "{place}의 창고 {number}번 선반에 {person} 씨의 {object}이/가 있습니다.":
        "{person} 씨의 {object}은/는 {place} 창고의 {number}번 선반에 놓여 있습니다.",
}
# A Korean fact noted down as a memo: a label, the values, the name in brackets (no sentence, few particles).
KO_MEMOS = {
    "{person}의 금고 비밀번호는 {number}이며/며 금고는 {place}에 있습니다.":
        "금고 비밀번호 {number} ({person} 씨) — 위치: {place}",
    "{person} 씨는 {place}에 살고 있으며 {color} {animal} {pet}을/를 키웁니다.":
        "반려동물: {color} {animal} {pet} ({person} 씨) — 거주지: {place}",
    "{person} 씨의 소포 {number}번은 {place} 우체국에 보관되어 있습니다.":
        "소포 번호 {number} ({person} 씨) — 보관 장소: {place} 우체국",
    "{person} 씨는 {place} 시장에서 {object}을/를 {amount}원에 샀습니다.":
        "구매: {object}, {amount}원 ({person} 씨) — 장소: {place} 시장",
    "{person} 씨와의 회의는 {place} 기록관 {number}호실에서 열립니다.":
        "회의 ({person} 씨) — 장소: {place} 기록관 {number}호실",
    "{person} 씨는 {place} 천문대에서 일하며 계좌 번호 {number}을/를 씁니다.":
        "계좌 번호 {number} ({person} 씨) — 근무지: {place} 천문대",
    "{person}과/와 {pet}은/는 다음 달에 {place}으로/로 이사합니다.":
        "이사 예정: {person}, {pet} — 새 주소: {place} (다음 달)",
    "{place}의 창고 {number}번 선반에 {person} 씨의 {object}이/가 있습니다.":
        "보관 물품: {object} ({person} 씨) — 위치: {place} 창고 {number}번 선반",
}
# How people write the pack's syllables in Latin letters besides the Revised Romanization (which comes first):
# popular spellings (oo, ee, u for eo, yu for yeo), McCune-Reischauer without its marks (k, t, p, ch), an h.
SPELLINGS = {
    "윤": ("yun", "yoon"), "슬": ("seul", "sul"), "담": ("dam", "tam"), "휘": ("hwi", "hwee"),
    "로": ("ro", "roh", "lo"),
    "결": ("gyeol", "kyul", "gyul", "kyol"), "채": ("chae", "chai"), "온": ("on", "ohn"), "솔": ("sol",),
    "빈": ("bin", "been", "pin"), "하": ("ha", "hah"), "률": ("ryul", "yul", "ryool"), "겸": ("gyeom", "kyum", "kyom"),
    "설": ("seol", "sul", "sol"), "도": ("do", "doh", "to"), "새": ("sae", "sai"), "린": ("rin", "lin"),
    "준": ("jun", "joon", "chun"), "별": ("byeol", "byul", "pyol"), "아": ("a", "ah"),
    "단": ("dan", "tan"), "연": ("yeon", "yun", "yon"), "호": ("ho", "hoh"), "늘": ("neul", "nul"),
    "봄": ("bom", "pom"), "샘": ("saem", "sam"), "찬": ("chan",), "해": ("hae", "hai"), "누": ("nu", "noo"),
    "람": ("ram", "lam"), "남궁": ("namgung", "namkung"), "황보": ("hwangbo", "hwangpo"),
    "사공": ("sagong", "sakong"), "서문": ("seomun", "somun", "sumun"),
    "탁": ("tak", "tahk"), "어": ("eo", "uh", "o"), "편": ("pyeon", "pyun", "pyon"), "두": ("du", "doo", "tu"),
    "빙": ("bing", "ping"), "옹": ("ong", "ohng"), "국": ("guk", "kook", "kuk"), "선우": ("seonu", "sunwoo", "sonu"),
    "제갈": ("jegal", "chegal"), "독고": ("dokgo", "dokko", "tokko"),
    "무": ("mu", "moo"), "진": ("jin", "chin"), "개": ("gae", "kae"), "여": ("yeo", "yo", "yu"), "울": ("ul", "wool"),
    "달": ("dal", "tal"), "갈": ("gal", "kal"), "미": ("mi", "mee"), "리": ("ri", "li", "lee"),
    "벌": ("beol", "bul", "pol"), "모": ("mo",), "초": ("cho",), "가": ("ga", "ka"), "은": ("eun", "un"),
    "골": ("gol", "kol"), "포구": ("pogu", "pogoo"), "마을": ("maeul", "maul"), "나루": ("naru", "naroo"),
    "고개": ("gogae", "kogae"),
}
# A Korean fact as an English answer tells it: names romanized, words translated, numbers kept.
KO_TO_EN = {
    "{person}의 금고 비밀번호는 {number}이며/며 금고는 {place}에 있습니다.":
        "{person}'s safe in {place} opens with the code {number}.",
    "{person} 씨는 {place}에 살고 있으며 {color} {animal} {pet}을/를 키웁니다.":
        "{person} lives in {place} and has a {color} {animal} named {pet}.",
    "{person} 씨의 소포 {number}번은 {place} 우체국에 보관되어 있습니다.":
        "Parcel number {number} for {person} is being held at the {place} post office.",
    "{person} 씨는 {place} 시장에서 {object}을/를 {amount}원에 샀습니다.":
        "At the market in {place}, {person} bought a {object} for {amount} won.",
    "{person} 씨와의 회의는 {place} 기록관 {number}호실에서 열립니다.":
        "The meeting with {person} will be held in room {number} of the {place} archives.",
    "{person} 씨는 {place} 천문대에서 일하며 계좌 번호 {number}을/를 씁니다.":
        "{person} works at the {place} observatory and uses account number {number}.",
    "{person}과/와 {pet}은/는 다음 달에 {place}으로/로 이사합니다.":
        "Next month {person} and {pet} are moving to {place}.",
    "{place}의 창고 {number}번 선반에 {person} 씨의 {object}이/가 있습니다.":
        "{person}'s {object} is on shelf {number} of the warehouse in {place}.",
}
# An English fact as a Korean answer tells it: names kept in Latin letters, words translated.
EN_TO_KO = {
    "The vault code of {person} is {number}, and the vault is located in {place}.":
        "{person}의 금고는 {place}에 있고 비밀번호는 {number}입니다.",
    "{person} keeps the spare key to the {object} in locker {number} at {place} station.":
        "{person} 씨는 {object} 예비 열쇠를 {place} 역의 {number}번 사물함에 보관합니다.",
    "{person} was born in {place} and keeps a {color} {animal} called {pet}.":
        "{place}에서 태어난 {person} 씨는 {pet}이라는 이름의 {color} {animal}를 키웁니다.",
    "The shipment for {person} is booked on barge {vessel} to {place}.":
        "{person} 씨의 화물은 {vessel} 바지선에 실려 {place}로 갑니다.",
    "{person} paid {amount} crowns for the {color} {object} at the market in {place}.":
        "{person} 씨는 {place} 시장에서 {color} {object}에 {amount} 크라운을 냈습니다.",
    "The meeting with {person} is set for room {number} of the {place} archive.":
        "{person} 씨와의 회의는 {place} 기록관 {number}호실로 잡혀 있습니다.",
    "{person} works at the {place} observatory and uses account number {number}.":
        "{person} 씨는 {place} 천문대에서 일하며 계좌 번호 {number}을 사용합니다.",
    "{person} hid the {object} under the old bridge of {place} beside marker {number}.":
        "{person} 씨는 {place}의 옛 다리 아래 {number}번 표지 옆에 {object}을 숨겼습니다.",
    "The secret recipe of {person} needs {amount} grains of salt from {place}.":
        "{person} 씨의 비밀 요리법에는 {place}산 소금 {amount}알이 들어갑니다.",
    "{person} sent a letter to {place} asking for parcel {number} and the {object}.":
        "{person} 씨는 {place}에 편지를 보내 {number}번 소포와 {object}을 요청했습니다.",
}
KO_WORDS_IN_EN = {"호박색": "amber", "진홍색": "crimson", "청록색": "teal", "황토색": "ochre", "보라색": "violet",
                  "은색": "silver", "왜가리": "heron", "족제비": "weasel", "거북이": "turtle", "스라소니": "lynx",
                  "수달": "otter", "까마귀": "crow", "등불": "lantern", "나침반": "compass", "장부": "ledger",
                  "바이올린": "violin", "주전자": "kettle", "망원경": "telescope"}
EN_WORDS_IN_KO = {"amber": "호박색", "crimson": "진홍색", "teal": "청록색", "ochre": "황토색", "violet": "보라색",
                  "silver": "은색", "olive": "올리브색", "scarlet": "주홍색", "heron": "왜가리", "ferret": "족제비",
                  "tortoise": "거북이", "lynx": "스라소니", "otter": "수달", "raven": "까마귀", "gecko": "도마뱀",
                  "badger": "오소리", "lantern": "등불", "compass": "나침반", "ledger": "장부", "violin": "바이올린",
                  "kettle": "주전자", "telescope": "망원경", "satchel": "가방", "clock": "시계"}


def korean_in_english(canary: Canary, slots: dict[str, str], template: str, rng: random.Random) -> str:
    """A Korean fact retold in English: the pack's romanized spellings (a person's two names in either
    order), translated words, the same numbers."""
    spelled = dict(slots)
    distinctive = [n for n, v in slots.items() if v in canary.values]
    for index, alias in canary.aliases:
        name = distinctive[index]
        if " " in alias and rng.random() < 0.5:
            family, given = alias.split(" ", 1)
            alias = f"{given} {family}"
        spelled[name] = alias
    spelled = {n: KO_WORDS_IN_EN.get(v, v) for n, v in spelled.items()}
    return KO_TO_EN[template].format(**spelled)


def spelled_otherwise(value: str, rng: random.Random) -> str:
    """A Korean name or place as someone writes it who does not follow the Revised Romanization: each syllable
    (or two-syllable family name, place suffix) in another common spelling, the given name hyphenated or in
    separate syllables now and then."""
    pieces: list[str] = []
    rest = value
    while rest:
        unit = next((rest[:n] for n in (2, 1) if rest[:n] in SPELLINGS), rest[:1])
        options = SPELLINGS.get(unit, (hangul.romanize(unit),))
        pieces.append(rng.choice(options[1:] or options))
        rest = rest[len(unit):]
    joiner = rng.choice(("", "", "-", " ")) if len(pieces) > 1 else ""
    return joiner.join(pieces).capitalize() if joiner != " " else " ".join(p.capitalize() for p in pieces)


def korean_spelled_otherwise(canary: Canary, slots: dict[str, str], template: str, rng: random.Random) -> str:
    """A Korean fact retold in English with its names spelled another common way ("Tahk Yoon-sul", "Joon Doo")."""
    spelled = dict(slots)
    distinctive = [n for n, v in slots.items() if v in canary.values]
    for index, alias in canary.aliases:
        name, value = distinctive[index], slots[distinctive[index]]
        if " " in alias:  # a person: family name first in the value, apart in the alias
            family_length = next(n for n in (2, 1) if hangul.romanize(value[:n]).capitalize() == alias.split()[0])
            family, given = (spelled_otherwise(part, rng) for part in (value[:family_length], value[family_length:]))
            spelled[name] = f"{given} {family}" if rng.random() < 0.5 else f"{family} {given}"
        else:
            spelled[name] = spelled_otherwise(value, rng)
    spelled = {n: KO_WORDS_IN_EN.get(v, v) for n, v in spelled.items()}
    return KO_TO_EN[template].format(**spelled)


def english_in_korean(slots: dict[str, str], template: str) -> str:
    return EN_TO_KO[template].format(**{n: EN_WORDS_IN_KO.get(v, v) for n, v in slots.items()})


@dataclass(frozen=True)
class Case:
    record: Record
    label: str  # verbatim | disguised | paraphrased | clean | lookalike | same_template
    canary: Canary | None  # the planted canary, for positives


def _compose(rng: random.Random, chars: int, makers: list[tuple[float, Callable[[], str]]]) -> str:
    """Sentences until `chars`, each from the first maker whose bound the roll is under (the last is 1.0)."""
    parts: list[str] = []
    while sum(map(len, parts)) < chars:
        roll = rng.random()
        parts.append(next(make for bound, make in makers if roll < bound)())
    return " ".join(parts)


def clean_text(rng: random.Random, chars: int = 2000) -> str:
    """Realistic answer text with its own names, numbers and codes, none of them canaries."""
    filler = load_filler("en")
    names = ["Alice Johnson", "Mr. Patel", "Dr. Nguyen", "Berlin", "Lisbon", "Order Desk", "Team Atlas"]

    def code() -> str:
        return "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(rng.randrange(6, 14)))

    return _compose(rng, chars, [
        (0.5, lambda: next(filler.sentences(rng.randrange(10**6)))),
        (0.7, lambda: f"Invoice {rng.randrange(1000, 99999)} for {rng.choice(names)} was paid on "
                      f"{rng.randrange(1, 29)} March {rng.randrange(1990, 2030)}."),
        (0.85, lambda: f"Reference {code()} was assigned to ticket #{rng.randrange(100, 9999)}."),
        (1.0, lambda: f"The meeting with {rng.choice(names)} is set for room {rng.randrange(1, 500)}."),
    ])


def clean_text_ko(rng: random.Random, chars: int = 900) -> str:
    """A Korean answer with numbers and names of its own."""
    filler = load_filler("ko")
    names = ["김민준", "이서연", "박지훈", "서울", "부산", "고객지원팀"]
    return _compose(rng, chars, [
        (0.6, lambda: next(filler.sentences(rng.randrange(10**6)))),
        (0.8, lambda: f"{rng.choice(names)} 님의 주문 {rng.randrange(1000, 99999)}번은 {rng.randrange(1, 29)}일에 "
                      "처리되었습니다."),
        (1.0, lambda: f"{rng.choice(names)}의 회의는 {rng.randrange(1, 500)}호실에서 열립니다."),
    ])


def embed_ko(rng: random.Random, payload: str) -> str:
    """Put payload inside a Korean answer."""
    return f"{clean_text_ko(rng, rng.randrange(100, 800))} {payload} {clean_text_ko(rng, 200)}"


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
            template, slots = templates_of[canary.id], slots_of[canary.id]
            add(embed(rng, PARAPHRASES[template].format(**slots)), "paraphrased", canary)
            add(embed_ko(rng, english_in_korean(slots, template)), "english_in_korean", canary)
        if canary.kind is CanaryKind.FACT and canary.pack == "ko":
            template, slots = templates_of[canary.id], slots_of[canary.id]
            reworded = hangul.resolve_particles(KO_PARAPHRASES[template], slots).format(**slots)
            add(embed_ko(rng, reworded), "paraphrased_ko", canary)
            add(embed(rng, korean_in_english(canary, slots, template, rng)), "korean_in_english", canary)
            memo = hangul.resolve_particles(KO_MEMOS[template], slots).format(**slots)
            add(embed_ko(rng, memo), "memo_ko", canary)
            add(embed(rng, korean_spelled_otherwise(canary, slots, template, rng)), "romanized_ko", canary)
    for i in range(clean):
        add(clean_text(rng) if i % 5 else clean_text_ko(rng), "clean", None)
    for _ in range(200):
        fake = "".join(rng.choice(tokens.ALPHABET) for _ in range(32))
        add(embed(rng, tokens.display(fake)), "lookalike", None)
    for canary in observer_facts:  # the observer's own fact, same templates as the victim's
        add(embed(rng, canary.text), "same_template", canary, tenant=canary.tenant)
    return cases


POSITIVE = ("verbatim", "disguised", "paraphrased", "paraphrased_ko", "korean_in_english", "english_in_korean",
            "memo_ko", "romanized_ko")
NEGATIVE = ("clean", "lookalike", "same_template")
PARAPHRASED = ("paraphrased", "paraphrased_ko", "memo_ko", "english_in_korean", "korean_in_english", "romanized_ko")


@dataclass
class Evaluation:
    results: list[tuple[Case, ScanResult]]

    def found(self, case: Case, result: ScanResult) -> bool:
        assert case.canary is not None
        return any(f.canary_id == case.canary.id and f.victim_tenant == case.canary.tenant for f in result.findings)

    def recall(self, label: str) -> tuple[float, int]:
        chosen = [(c, r) for c, r in self.results if c.label == label]
        return sum(self.found(c, r) for c, r in chosen) / max(1, len(chosen)), len(chosen)

    def false_positives(self, label: str) -> tuple[float, int]:
        chosen = [r for c, r in self.results if c.label == label]
        return sum(bool(r.findings) for r in chosen) / max(1, len(chosen)), len(chosen)

    def wrong_attributions(self) -> int:
        """Findings that name another canary than the one planted, or any canary in a negative case."""
        wrong = 0
        for case, result in self.results:
            for finding in result.findings:
                if case.canary is None or finding.canary_id not in (case.canary.id, None):
                    wrong += 1
        return wrong


@dataclass
class SemanticAlone:
    """The semantic detector alone over an evaluation's answers: the scanner lets the fragment detector report most
    retellings the semantic one misses, which would hide an embedding's recall."""

    found: Counter[str]  # by label: answers where the planted canary was found
    flagged: Counter[str]  # by label: negative answers with a finding on another tenant's canary
    total: Counter[str]
    wrong: int  # findings naming another canary than the one planted

    def recall(self, label: str) -> float:
        return self.found[label] / max(1, self.total[label])


def semantic_alone(embedder: Embedder, evaluation: Evaluation, canaries: CanarySet) -> SemanticAlone:
    detector = SemanticDetector(canaries, embedder)
    found: Counter[str] = Counter()
    flagged: Counter[str] = Counter()
    wrong = 0
    cases = [case for case, _ in evaluation.results]
    for first in range(0, len(cases), BATCH):
        batch = cases[first : first + BATCH]
        for case, hits in zip(batch, detector.detect_many([(c.record, compact(c.record.text)) for c in batch]),
                              strict=True):
            foreign = [h for h in hits if h.canary and h.canary.tenant != case.record.tenant]
            right = [h for h in foreign if case.canary and h.canary and h.canary.id == case.canary.id]
            found[case.label] += bool(right)
            flagged[case.label] += bool(foreign) and case.canary is None
            wrong += len(foreign) - len(right) if case.label in PARAPHRASED or case.canary is None else 0
    return SemanticAlone(found, flagged, Counter(c.label for c in cases), wrong)


def evaluate(embedder: Embedder, ledger: Ledger, key: bytes, clean: int = 1000) -> Evaluation:
    """Mint the evaluation's canaries with `embedder`, build the cases, scan every one."""
    minter = Minter(ledger, key, embedder)
    victim = minter.tokens("tenant-a", 300, probe_id="p1") + minter.tokens("tenant-a", 100, probe_id="p2")
    slots_of: dict[str, dict[str, str]] = {}
    templates_of: dict[str, str] = {}
    for language, count, seed in (("en", 80, 11), ("ko", 80, 12)):
        facts = minter.facts("tenant-a", count, probe_id="p3", language=language, rng=random.Random(seed))
        replay = random.Random(seed)  # the same seed draws the same facts: their templates and slots
        for canary in facts:
            drawn = load_pack(language).mint(replay)
            assert drawn.text == canary.text
            slots_of[canary.id], templates_of[canary.id] = drawn.slots, drawn.template
        victim += facts
    observer = (minter.facts("tenant-b", 60, probe_id="p4", rng=random.Random(13))
                + minter.facts("tenant-b", 30, probe_id="p4", language="ko", rng=random.Random(14)))
    cases = build(victim, observer, slots_of, templates_of, clean=clean)
    scanner = Scanner(CanarySet(ledger.active_canaries(), key=key), embedder=embedder, foreign=False)
    return Evaluation([(case, scanner.scan(case.record)) for case in cases])
