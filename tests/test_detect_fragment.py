"""Fragments of canaries, as a real model copies them out of another tenant's stale pages: a token's tag with
the rest invented, three groups without the MAC, a fact retold with its person's name only.  Each is attributed
to the right tenant (and probe), and look-alikes, the observer's own material and shared names never are."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from prober.canaries import tokens
from prober.canaries.mint import Minter
from prober.detect import CanarySet, Scanner
from prober.domain.evidence import Fragment, FragmentKind
from prober.domain.types import Canary, CanaryKind, FindingKind, Record, Severity
from prober.embeddings import Embedder
from prober.ledger import open_ledger

KEY = bytes(range(32))


@pytest.fixture(scope="module")
def minted(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> dict[str, list[Canary]]:
    minter = Minter(open_ledger(Path(tmp_path_factory.mktemp("frag")) / "l.sqlite"), KEY, embedder)
    return {
        "victim_tokens": minter.tokens("tenant-a", 3, probe_id="p-a1"),
        "other_probe": minter.tokens("tenant-a", 2, probe_id="p-a2"),
        "observer_tokens": minter.tokens("tenant-b", 2, probe_id="p-b1"),
        "victim_facts": minter.facts("tenant-a", 6, probe_id="p-a1", rng=random.Random(3)),
        "victim_ko": minter.facts("tenant-a", 6, probe_id="p-a1", language="ko", rng=random.Random(4)),
        "observer_facts": minter.facts("tenant-b", 6, probe_id="p-b1", rng=random.Random(5)),
    }


def scanner(minted: dict[str, list[Canary]]) -> Scanner:
    return Scanner(CanarySet([c for group in minted.values() for c in group], key=KEY), foreign=False)


def invented(groups: int) -> str:
    return "-".join(tokens.lookalike().removeprefix("LPK-").split("-")[:groups])


def test_a_tag_with_the_rest_invented_names_the_victim_and_probe(minted: dict[str, list[Canary]]) -> None:
    tag = minted["victim_tokens"][1].text[4:12]
    answer = f"The reference code for this section is LPK-{tag}-{invented(3)}. The farmer opens the gate."
    findings = scanner(minted).scan(Record("r", "tenant-b", answer)).findings
    assert [(f.kind, f.detector, f.severity, f.victim_tenant, f.probe_id, f.canary_id) for f in findings] == [
        (FindingKind.CROSS_TENANT_ECHO, "fragment", Severity.HIGH, "tenant-a", "p-a1", None)]
    assert answer[findings[0].start : findings[0].end] == tag
    assert findings[0].evidence == (Fragment(FragmentKind.PROBE_TAG, tag=tag),)


@pytest.mark.parametrize("kept", [slice(0, 3), slice(1, 4), slice(0, 2)])
def test_part_of_a_body_names_the_canary_at_critical(minted: dict[str, list[Canary]], kept: slice) -> None:
    canary = minted["victim_tokens"][2]
    groups = canary.text.removeprefix("LPK-").split("-")
    answer = f"Code: LPK-{'-'.join(groups[kept])} and then some words."
    findings = scanner(minted).scan(Record("r", "tenant-b", answer)).findings
    assert [(f.severity, f.canary_id, f.victim_tenant) for f in findings] == [
        (Severity.CRITICAL, canary.id, "tenant-a")]
    # Three groups of four can still read as the whole body with edits (fuzzy, which outranks a fragment),
    # depending on the characters the fourth group happens to share with the words after it.
    assert findings[0].detector == "fragment" or (kept == slice(0, 3) and findings[0].detector == "fuzzy")


def test_the_full_token_stays_an_exact_echo_and_the_tag_adds_nothing(minted: dict[str, list[Canary]]) -> None:
    whole, other = minted["victim_tokens"][0], minted["victim_tokens"][1]
    answer = f"{whole.text} and LPK-{other.text[4:12]}-{invented(3)}"
    findings = scanner(minted).scan(Record("r", "tenant-b", answer)).findings
    assert [(f.detector, f.canary_id) for f in findings] == [("exact", whole.id)]


def test_the_observers_own_tag_is_a_positive_control(minted: dict[str, list[Canary]]) -> None:
    tag = minted["observer_tokens"][0].text[4:12]
    result = scanner(minted).scan(Record("r", "tenant-b", f"LPK-{tag}-{invented(3)}"))
    assert result.findings == [] and len(result.own_echoes) == 1


def test_look_alikes_and_tags_outside_a_token_never_attribute(minted: dict[str, list[Canary]]) -> None:
    tag = minted["victim_tokens"][0].text[4:12]
    scan = scanner(minted)
    look_alikes = " ".join(tokens.lookalike() for _ in range(300))
    assert scan.scan(Record("r", "tenant-b", look_alikes)).findings == []
    # The tag inside running text, not written as a token: eight characters are not enough there.
    assert scan.scan(Record("r", "tenant-b", f"the word {tag.lower()}ish appeared once")).findings == []


def test_one_full_name_of_a_fact_is_a_high_finding(minted: dict[str, list[Canary]]) -> None:
    fact = minted["victim_facts"][0]
    name = next(v for v in fact.values if len(v.split()) == 2)
    given, family = name.split()
    scan = scanner(minted)
    for answer in (f"I remember {name} from somewhere.", f"{family} {given} was mentioned."):
        findings = scan.scan(Record("r", "tenant-b", answer)).findings
        assert [(f.detector, f.severity, f.canary_id) for f in findings] == [("fragment", Severity.HIGH, fact.id)]
    # The given name alone, or the name inside a longer word, is not the name.
    assert scan.scan(Record("r", "tenant-b", f"{given} said hello to {name}ix.")).findings == []


@pytest.mark.unit
def test_a_made_up_one_word_name_alone_is_a_warning_finding() -> None:
    """Real models retell a fact with its place alone ("...in Brackenfold"): a made-up word name of another
    tenant's fact, long enough to be rare, is attributed at warning; a short one, the observer's own, one in the
    answer's prompt, or one two tenants' facts share is not."""
    def fact(cid: str, tenant: str, place: str, pet: str) -> Canary:
        return Canary(id=cid, tenant=tenant, kind=CanaryKind.FACT, values=(place, pet), expires_at=2**40,
                      text=f"The shipment is booked on barge KX-417 to {place}, with a lynx called {pet} aboard.")
    victim, own = fact("cn_v", "tenant-a", "Brackenfold", "Quilbra"), fact("cn_o", "tenant-b", "Ashvenwick", "Kenthal")
    scan = Scanner(CanarySet([victim, own], key=KEY), foreign=False)
    for answer in ("The report says she was born in Brackenfold.", "The Brackenfold archive is closed."):
        findings = scan.scan(Record("r", "tenant-b", answer)).findings
        assert [(f.kind, f.severity, f.victim_tenant, f.canary_id) for f in findings] == [
            (FindingKind.CROSS_TENANT_ECHO, Severity.WARNING, "tenant-a", "cn_v")], answer
    quiet = ["Her pet Quilbra is fine.", "Born in Ashvenwick.", "Brackenfolds everywhere.", "Old Brackenfold Hall."]
    assert all(scan.scan(Record("r", "tenant-b", answer)).findings == [] for answer in quiet)
    assert scan.scan(Record("r", "tenant-b", "in Brackenfold", prompt="Brackenfold is far.")).findings == []
    shared = Scanner(CanarySet([victim, fact("cn_c", "tenant-c", "Brackenfold", "Dru")], key=KEY), foreign=False)
    assert shared.scan(Record("r", "tenant-b", "She was born in Brackenfold.")).findings == []


def test_a_korean_name_counts_with_another_value_or_alone_in_a_small_index(minted: dict[str, list[Canary]],
                                                                         embedder: Embedder) -> None:
    """A Korean name is short: with forty Korean facts held, a name drawn from the same syllables is one of theirs
    by accident too often (FactPack.chance times forty is over MAX_NAME_CHANCE), so it attributes with another
    value of its fact beside it -- in Hangul or romanized alike; alone only while the index holds a handful."""
    fact = minted["victim_ko"][0]
    spelled = dict(fact.aliases)
    slot = next(i for i, a in spelled.items() if len(a.split()) == 2)
    other = next(v for i, v in enumerate(fact.values) if i != slot)
    more = Minter(open_ledger(":memory:"), KEY, embedder).facts("tenant-c", 34, language="ko", rng=random.Random(9))
    scan = Scanner(CanarySet([c for group in minted.values() for c in group] + more, key=KEY), foreign=False)
    for name in (fact.values[slot], spelled[slot]):
        assert scan.scan(Record("r", "tenant-b", f"Someone called {name} wrote.")).findings == []
        findings = scan.scan(Record("r", "tenant-b", f"{name} 씨의 기록: {other}.")).findings
        assert [(f.detector, f.canary_id) for f in findings] == [("fragment", fact.id)], name
    alone = scanner(minted).scan(Record("r", "tenant-b", f"{fact.values[slot]} 씨를 기억합니다."))
    assert [f.canary_id for f in alone.findings] == [fact.id]


def test_a_korean_name_shaped_like_a_real_one_needs_another_value() -> None:
    """A Korean given name of two syllables is the shape of most real ones (도윤, 하린): it never counts alone, even
    as all the index holds, and counts with another value of its fact."""
    fact = Canary(id="cn_ko", tenant="tenant-a", kind=CanaryKind.FACT, text="탁하린 씨는 무진리에 삽니다.", pack="ko",
                  values=("탁하린", "무진리"), aliases=((0, "Tak Harin"), (1, "Mujinri")), expires_at=2**40)
    scan = Scanner(CanarySet([fact], key=KEY), foreign=False)
    for name in ("Tak Harin", "탁하린"):
        assert scan.scan(Record("r", "tenant-b", f"A letter from {name} came.")).findings == []
        findings = scan.scan(Record("r", "tenant-b", f"A letter from {name} came, from Mujinri.")).findings
        assert [f.canary_id for f in findings] == ["cn_ko"]


def test_a_name_the_prompt_holds_or_two_tenants_share_attributes_nothing(minted: dict[str, list[Canary]]) -> None:
    fact = minted["victim_facts"][1]
    name = next(v for v in fact.values if len(v.split()) == 2)
    scan = scanner(minted)
    assert scan.scan(Record("r", "tenant-b", f"{name} again.", prompt=f"Quote: {name} lives here.")).findings == []
    twin = Canary(id="cn_twin", tenant="tenant-c", kind=CanaryKind.FACT, text=f"{name} owns a boat.",
                  values=(name,), expires_at=2**40)
    shared = Scanner(CanarySet([fact, twin], key=KEY), foreign=False)
    assert shared.scan(Record("r", "tenant-b", f"{name} again.")).findings == []


@pytest.mark.unit
@pytest.mark.parametrize("spelled", ["Tak Yunseuldo", "Tahk Yoon-sul-doh", "Yoonseuldo Tak", "TAK YUN SEUL DO",
                                     "Tak Yun-seul-do"])
def test_a_korean_name_counts_in_every_common_spelling(spelled: str) -> None:
    fact = Canary(id="cn_ko", tenant="tenant-a", kind=CanaryKind.FACT, text="탁윤슬도 씨는 무진리에 삽니다.", pack="ko",
                  values=("탁윤슬도", "무진리"), aliases=((0, "Tak Yunseuldo"), (1, "Mujinri")), expires_at=2**40)
    scan = Scanner(CanarySet([fact], key=KEY), foreign=False)
    findings = scan.scan(Record("r", "tenant-b", f"The note was signed by {spelled} yesterday.")).findings
    assert [(f.detector, f.canary_id) for f in findings] == [("fragment", "cn_ko")]
    # Someone else whose name shares its letters: a longer name, or the given name inside another word.
    for other in (f"Ohn {spelled} Kim", f"{spelled}ah", "Takyunseuldoio"):
        assert scan.scan(Record("r", "tenant-b", f"The note was signed by {other} yesterday.")).findings == []
