"""Canary tokens, the compact normal form, fact packs and filler."""

from __future__ import annotations

import random
import re

import pytest

from prober.canaries import tokens
from prober.canaries.compact import compact, original_span
from prober.canaries.filler import load_filler
from prober.canaries.packs import languages, load_pack
from prober.detect import CanarySet, ExactDetector, FuzzyDetector
from prober.domain.types import Canary, CanaryKind, Record

pytestmark = pytest.mark.unit

KEY = b"k" * 32


def test_token_shape_entropy_and_round_trip() -> None:
    body = tokens.mint_body(KEY, "tenant-a", "probe-1")
    text = tokens.display(body)
    assert len(text) <= 40 and re.fullmatch(r"LPK(-[0-9A-HJKMNP-TV-Z]{8}){4}", text)
    verified = tokens.verify(KEY, compact(text)[3:], tenants=["tenant-b", "tenant-a"])
    assert verified is not None and verified.tenant == "tenant-a"
    assert verified.probe_tag == tokens.probe_tag(KEY, "probe-1")
    # 16 random characters of 5 bits each = 80 random bits: two mints never collide in practice.
    assert len({tokens.mint_body(KEY, "t", "p")[8:24] for _ in range(2000)}) == 2000


def test_mac_rejects_lookalikes_other_keys_and_edits() -> None:
    body = tokens.mint_body(KEY, "tenant-a", "p")
    assert tokens.verify(b"x" * 32, body) is None
    flipped = body[:10] + ("0" if body[10] != "0" else "1") + body[11:]
    assert tokens.verify(KEY, flipped) is None
    rng = random.Random(3)
    fakes = ("".join(rng.choice(tokens.ALPHABET) for _ in range(32)) for _ in range(5000))
    assert not any(tokens.verify(KEY, fake) for fake in fakes)


def test_unknown_tenant_tag_still_verifies() -> None:
    verified = tokens.verify(KEY, tokens.mint_body(KEY, "someone-else", "p"), tenants=["tenant-a"])
    assert verified is not None and verified.tenant is None


def test_exact_detection_verifies_tokens_it_never_minted_by_their_mac() -> None:
    """A replica's token (not in this set) is attributed by its MAC; a known one is reported once, by the set."""
    known = Canary(id="c1", tenant="tenant-a", kind=CanaryKind.TOKEN,
                   text=tokens.display(tokens.mint_body(KEY, "tenant-a", "p1")))
    replicas = tokens.display(tokens.mint_body(KEY, "tenant-b", "p2"))
    forged = "LPK-" + "-".join(["ABCDEFGH"] * 4)
    detector = ExactDetector(CanarySet([known], key=KEY, tenants=["tenant-a", "tenant-b"]))
    text = f"one {known.text.lower()} two {replicas} three {forged} four lpk"
    hits = detector.detect(Record("r", "observer", text), compact(text))
    assert [(h.canary.id if h.canary else None, h.verified.tenant if h.verified else None) for h in hits] == [
        ("c1", None), (None, "tenant-b")]
    assert text[hits[1].start : hits[1].end] == replicas


@pytest.mark.parametrize("variant", [
    "lpk-{a}-{b}-{c}-{d}", "LPK {a} {b}\n{c} {d}", "LPK{a}{b}{c}{d}", "{a}.{b}.{c}.{d}",
])
def test_compact_form_survives_reformatting(variant: str) -> None:
    text = tokens.display(tokens.mint_body(KEY, "t", "p"))
    _, a, b, c, d = text.split("-")
    assert compact(variant.format(a=a, b=b, c=c, d=d)).endswith(compact(text)[3:])


def test_compact_maps_confusables_and_spans_back() -> None:
    assert compact("ОРС") == compact("0PC") == "0PC"  # Cyrillic
    assert compact("Ｆｕｌｌ width") == "F\u0056\u0031\u0031W1DTH"
    text = "say: lpk-ab cd"
    start, end = original_span(text, 3, 8)  # "1PKAB" in "SAY1PKABCD"
    assert text[start:end] == "lpk-ab"


def test_packs_ship_en_and_ko_with_distinctive_slots() -> None:
    assert {"en", "ko"} <= set(languages())
    for language in ("en", "ko"):
        fact = load_pack(language).mint(random.Random(1))
        assert fact.distinctive and all(value in fact.text for value in fact.distinctive)


def test_filler_never_matches_a_canary() -> None:
    canaries = [Canary(id=f"t{i}", tenant="a", kind=CanaryKind.TOKEN,
                       text=tokens.display(tokens.mint_body(KEY, "a", "p"))) for i in range(200)]
    rng = random.Random(5)
    for language in ("en", "ko"):
        pack = load_pack(language)
        canaries += [Canary(id=f"f{language}{i}", tenant="a", kind=CanaryKind.FACT, text=f.text,
                            values=f.distinctive) for i, f in enumerate(pack.mint(rng) for _ in range(100))]
    detectors = [ExactDetector(CanarySet(canaries)), FuzzyDetector(CanarySet(canaries))]
    for language in ("en", "ko"):
        text = load_filler(language).text(200_000)
        assert not re.search(r"\d", text)
        for start in range(0, len(text), 2000):
            record = Record("r", "b", text[start : start + 2000])
            assert not any(d.detect(record, compact(record.text)) for d in detectors)


def test_korean_particles_agree_with_the_word_before_them() -> None:
    from prober.canaries.hangul import PARTICLES, particle, romanize

    assert [particle(w, "을/를") for w in ("주전자", "등불", "망원경", "바이올린")] == ["를", "을", "을", "을"]
    assert [particle(w, "이/가") for w in ("장부", "나침반")] == ["가", "이"]
    assert [particle(w, "은/는") for w in ("수달", "까마귀")] == ["은", "는"]
    assert [particle(w, "과/와") for w in ("윤슬", "하아")] == ["과", "와"]
    assert [particle(w, "으로/로") for w in ("달골", "무진포구", "초진마을", "무진")] == ["로", "로", "로", "으로"]
    # A number is read as a Korean numeral: ...9 is 구 (a vowel), ...6 is 육, ...0 is 십/백/천/영.
    assert [particle(n, "을/를") for n in ("4471-209", "4471-206", "3310", "1001")] == ["를", "을", "을", "을"]
    assert particle("3307", "으로/로") == "로"  # 칠 ends in ㄹ
    assert romanize("탁윤슬") == "takyunseul" and romanize("선우하린") == "seonuharin"
    pack = load_pack("ko")
    rng = random.Random(5)
    pairs = {p.split("/")[0]: p for p in PARTICLES} | {p.split("/")[1]: p for p in PARTICLES}
    checked = 0
    for _ in range(500):
        fact = pack.mint(rng)
        assert "/" not in fact.text and "{" not in fact.text, fact.text
        for value in fact.slots.values():
            at = fact.text.find(value)
            rest = fact.text[at + len(value):]
            form = next((f for f in sorted(pairs, key=len, reverse=True) if rest.startswith(f)), None)
            if at >= 0 and form and rest[len(form):len(form) + 1] in (" ", ".", ""):
                assert form == particle(value, pairs[form]), (fact.text, value, form)
                checked += 1
    assert checked > 300
    assert all(alias.isascii() for f in (pack.mint(rng) for _ in range(50)) for _, alias in f.aliases)
