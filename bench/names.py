"""Name-only findings on names nobody leaked (issue #43): real names, and names drawn from the packs' own syllables.

    python bench/names.py                      # 1,000 answers per language, ledgers of 50 and 500 facts per language
    python bench/names.py --answers 2000 --facts 100 1000

1. Real names.  How often a minted name is a real one: the given (and family) names of 20,000 minted facts per
   language looked up in Faker's lists of real names (`pip install faker`: 7,203 English first names and its
   English and US family names; 121 common Korean given names and 44 family names), for the packs as they were
   at BEFORE and as they are now.
2. Same-pool answers.  A ledger of N facts per language, minted for four tenants; then answers that reuse a
   fact's sentence shape with every value drawn at random from the same pools (`FactPack.mint`: a template and
   fresh names, places and numbers), in English, in Korean, and Korean facts retold in English (romanized
   names), received by a fifth tenant.  Every answer is scanned (no embedder: exact, fuzzy, fragment); a
   cross-tenant finding is a false one.  `collided` counts answers holding a name equal to one of the ledger's,
   whatever the detector made of it.  The same is run with the packs and the name rule of BEFORE (a name of
   a fact alone always attributed), for the figure this fixes.
3. The rule is live: answers that carry one of the ledger's names alone (a true name-only leak) and how many
   are still attributed, and how many of the ledger's names may attribute alone at this size.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from prober.canaries.packs import FactPack, load_pack
from prober.detect import CanarySet, Scanner, fragment
from prober.detect.values import is_name, is_word_name
from prober.domain.evidence import Fragment, find
from prober.domain.types import Canary, CanaryKind, Record
from tests.support.evalset import KO_TO_EN, korean_in_english  # the evaluation set's retelling

BEFORE = "fb1e52b"  # the packs and the name rule before issue #43
BEFORE_LENGTHS = {"en": {"given": [2, 2, 3], "family": [2], "place": [2]}, "ko": {"given": [2, 2, 3], "place": [2]}}
ROOT = Path(__file__).resolve().parent.parent
KEY = b"bench-names-key-bench-names-key!"
TENANTS = ("tenant-a", "tenant-b", "tenant-c", "tenant-d")
OBSERVER = "tenant-x"


def pack_before(language: str) -> FactPack:
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:canaries/packs/{language}.yaml"],
                            capture_output=True, text=True, check=True).stdout
    data: dict[str, Any] = yaml.safe_load(source)
    return FactPack(language, {**data, "lengths": BEFORE_LENGTHS[language]})


def real_names() -> dict[str, tuple[set[str], set[str]]]:
    """language -> (real given names, real family names), lower case."""
    try:
        from faker.providers.person.en import Provider as English
        from faker.providers.person.en_US import Provider as American
        from faker.providers.person.ko_KR import Provider as Korean
    except ImportError:
        sys.exit("bench/names.py needs Faker's lists of real names: pip install faker")
    return {"en": ({n.lower() for n in English.first_names},
                   {n.lower() for n in (*English.last_names, *American.last_names)}),
            "ko": (set(Korean.first_names), set(Korean.last_names))}


def split_name(pack: FactPack, name: str) -> tuple[str, str]:
    """(given, family) of a minted person's name."""
    if pack.language == "ko":
        family = next(f for f in sorted(pack.syllables["family"], key=len, reverse=True) if name.startswith(f))
        return name[len(family) :], family
    given, family = name.lower().split()
    return given, family


def real_collisions(pack: FactPack, reals: tuple[set[str], set[str]], facts: int = 20_000) -> str:
    rng = random.Random(11)
    given_real = family_real = both = names = 0
    for _ in range(facts):
        fact = pack.mint(rng)
        for slot, value in fact.slots.items():
            if pack.slots[slot].get("generator") != "name":
                continue
            given, family = split_name(pack, value)
            names += 1
            given_real += given in reals[0]
            family_real += family in reals[1]
            both += given in reals[0] and family in reals[1]
    return (f"{names:,} names: given name real {given_real / names:.4%}, family name real "
            f"{family_real / names:.4%}, both {both / names:.4%}")


def ledger(pack: FactPack, count: int, seed: int) -> list[Canary]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        fact = pack.mint(rng)
        out.append(Canary(id=f"cn_{pack.language}_{i}", tenant=TENANTS[i % len(TENANTS)], kind=CanaryKind.FACT,
                          text=fact.text, pack=pack.language, values=fact.distinctive, aliases=fact.aliases,
                          expires_at=2**40))
    return out


def answers(pack: FactPack, kind: str, count: int, seed: int) -> Iterator[tuple[str, set[str]]]:
    """Same-pool answers: (text, the names it holds, lower case)."""
    rng = random.Random(seed)
    made = 0
    while made < count:
        fact = pack.mint(rng)
        aliases = dict(fact.aliases)
        names = {v.lower() for i, v in enumerate(fact.distinctive) if is_name(v, aliases.get(i, "")) or is_word_name(v)}
        if kind == "ko-en":
            if fact.template not in KO_TO_EN:
                continue
            canary = Canary(id="x", tenant=OBSERVER, kind=CanaryKind.FACT, text=fact.text, values=fact.distinctive,
                            aliases=fact.aliases)
            text = korean_in_english(canary, fact.slots, fact.template, rng)
            names |= {alias.lower() for _, alias in fact.aliases}
        else:
            text = fact.text
        made += 1
        yield text, names


@contextmanager
def rule_before() -> Iterator[None]:
    """The name rule of BEFORE: a name alone always attributes."""
    kept = fragment.MAX_NAME_CHANCE
    fragment.MAX_NAME_CHANCE = float("inf")
    try:
        yield
    finally:
        fragment.MAX_NAME_CHANCE = kept


def same_pool(packs: dict[str, FactPack], facts: int, count: int) -> None:
    canaries = [c for n, language in enumerate(("en", "ko")) for c in ledger(packs[language], facts, 100 + n)]
    held = {value.lower() for c in canaries for value in c.values} | \
           {a.lower() for c in canaries for _, a in c.aliases}
    scanner = Scanner(CanarySet(canaries, key=KEY), foreign=False)
    for kind, language in (("en", "en"), ("ko", "ko"), ("ko-en", "ko")):
        findings: Counter[str] = Counter()
        collided = flagged = 0
        for n, (text, names) in enumerate(answers(packs[language], kind, count, 7 + len(kind))):
            collided += bool(names & held)
            found = [f for f in scanner.scan(Record(f"a{n}", OBSERVER, text)).findings]
            flagged += bool(found)
            findings.update(str(fragment.kind if (fragment := find(f.evidence, Fragment)) else f.detector)
                            for f in found)
        print(f"  {kind:<6} {count:,} answers: collided with a held name {collided}, answers with a finding "
              f"{flagged} {dict(findings) or ''}")


def live(facts: int) -> None:
    """True name-only leaks at this ledger size, and how many of the ledger's names may attribute alone."""
    canaries = [c for n, language in enumerate(("en", "ko")) for c in ledger(load_pack(language), facts, 100 + n)]
    scanner = Scanner(CanarySet(canaries, key=KEY), foreign=False)
    detector = next(d for d in scanner.detectors if isinstance(d, fragment.FragmentDetector))
    for language in ("en", "ko"):
        mine = [(i, s) for (i, s) in detector.values.names if canaries[i].pack == language]
        alone = [key for key in mine if detector.accidental(*key) <= fragment.MAX_NAME_CHANCE]
        caught = 0
        for i, s in mine:
            record = Record("leak", OBSERVER, f"I remember {canaries[i].values[s]} from somewhere.")
            caught += any(f.canary_id == canaries[i].id for f in scanner.scan(record).findings)
        print(f"  {language}: {len(alone)} of {len(mine)} names may attribute alone; a name alone in an answer "
              f"attributed {caught} of {len(mine)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=int, default=1000, help="same-pool answers per language")
    parser.add_argument("--facts", type=int, nargs="+", default=[50, 500], help="ledger sizes, facts per language")
    args = parser.parse_args()
    reals = real_names()
    before = {language: pack_before(language) for language in ("en", "ko")}
    now = {language: load_pack(language) for language in ("en", "ko")}
    print("1. minted names that are real names (Faker's lists)")
    for language in ("en", "ko"):
        print(f"  {language} before ({BEFORE}): {real_collisions(before[language], reals[language])}")
        print(f"  {language} now: {real_collisions(now[language], reals[language])}")
    for facts in args.facts:
        print(f"\n2. same-pool answers, a ledger of {facts} facts per language")
        print(f" before ({BEFORE}: its pools, a name alone always attributed)")
        with rule_before():
            same_pool(before, facts, args.answers)
        print(" now")
        same_pool(now, facts, args.answers)
        print(f"\n3. the rule at {facts} facts per language")
        live(facts)


if __name__ == "__main__":
    main()
