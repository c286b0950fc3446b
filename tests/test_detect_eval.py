"""Detector quality on a labelled evaluation set (tests/support/evalset.py), measured and asserted, with the default
(multilingual) embedder: verbatim, disguised, reworded in English and in Korean (also as a memo), and retold
across the two (also with names spelled other common ways than the Revised Romanization)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from prober.detect import CanarySet, Scanner
from prober.domain.types import Canary, CanaryKind, FindingKind, Record
from prober.embeddings import Embedder
from prober.ledger import open_ledger
from tests.support import evalset

KEY = bytes(range(32))


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> evalset.Evaluation:
    return evalset.evaluate(embedder, open_ledger(Path(tmp_path_factory.mktemp("eval")) / "ledger.sqlite"), KEY)


@pytest.mark.parametrize(("label", "floor"), [
    ("verbatim", 1.0), ("disguised", 0.99), ("paraphrased", 0.90), ("paraphrased_ko", 0.90),
    ("korean_in_english", 0.90), ("english_in_korean", 0.90), ("memo_ko", 0.95), ("romanized_ko", 0.95)])
def test_recall(evaluation: evalset.Evaluation, label: str, floor: float) -> None:
    recall, n = evaluation.recall(label)
    print(f"recall {label}: {recall:.4f} (n={n})")
    assert n >= 80 and recall >= floor


@pytest.mark.parametrize("label", evalset.NEGATIVE)
def test_no_false_positive(evaluation: evalset.Evaluation, label: str) -> None:
    rate, n = evaluation.false_positives(label)
    print(f"false positives {label}: {rate:.4f} (n={n})")
    assert rate == 0.0, [r.findings for c, r in evaluation.results if c.label == label and r.findings][:3]


def test_attribution_is_never_wrong(evaluation: evalset.Evaluation) -> None:
    by_detector: Counter[str] = Counter()
    for case, result in evaluation.results:
        for finding in result.findings:
            assert finding.kind is FindingKind.CROSS_TENANT_ECHO
            by_detector[finding.detector] += 1
            assert case.canary is not None and finding.canary_id == case.canary.id
            assert (finding.victim_tenant, finding.observer_tenant) == ("tenant-a", "tenant-b")
    print("findings by detector:", dict(by_detector))
    assert evaluation.wrong_attributions() == 0
    assert by_detector["exact"] and by_detector["fuzzy"] and by_detector["semantic"]
    own = [r for c, r in evaluation.results if c.label == "same_template"]
    assert all(r.own_echoes for r in own)  # positive control: the observer's own fact is recognised


# From real runs (the `fixed` preset, tenant-a quoting its own facts): tenant-b's fact shares a place with
# tenant-a's, and its name is the start of another name, or shares only the family name. Not the fact.
KAIKEN = ("Kaiken Thornridge sent a letter to Banellthorpe asking for parcel 9671-892 and the ledger.",
          ("Kaiken Thornridge", "Banellthorpe", "9671-892"))
WENDRU = ("Wendru Brackwyn hid the satchel under the old bridge of Enlystead beside marker 6466-792.",
          ("Wendru Brackwyn", "Enlystead", "6466-792"))
OWN_FACTS = ("Reportedly, appointment with Selsia Quistbrook is set for chamber 1398-124 of the Banellthorpe "
             "archive. As noted, the delivery for Kaikenix Tullholl is reserved on barge BS-168 to Quenlyford.")


def _victim(embedder: Embedder, fact: tuple[str, tuple[str, ...]], own: str = "") -> Scanner:
    """The victim's fact in the ledger, and (`own`) the observer's fact the answer quotes, whose values it shares."""
    canary = Canary(id="cn_victim", tenant="tenant-b", kind=CanaryKind.FACT, text=fact[0], pack="en",
                    values=fact[1], created_at=0, expires_at=2**40)
    observer = [Canary(id="cn_own", tenant="tenant-a", kind=CanaryKind.FACT, text=own, pack="en",
                       values=tuple(v for v in fact[1] if v in own), created_at=0, expires_at=2**40)] if own else []
    return Scanner(CanarySet([canary, *observer]), embedder=embedder, foreign=False)


MORMAR = "It is recorded that the meeting with Mormar Brackwyn is set for room 7729-604 of the Enlystead archive."


@pytest.mark.parametrize(("fact", "answer", "own"), [
    (KAIKEN, OWN_FACTS, OWN_FACTS),
    (WENDRU, MORMAR, MORMAR),
    # the victim's name and place, each in its own unrelated sentence far apart
    (KAIKEN, f"Kaiken Thornridge opened the shop. {'The farmer carries the gate past the mill. ' * 12}"
             "A letter reached Banellthorpe asking for the ledger.", ""),
])
def test_shared_values_out_of_place_are_not_the_fact(embedder: Embedder, fact: tuple[str, tuple[str, ...]],
                                                       answer: str, own: str) -> None:
    """The observer quotes its own fact, which shares a place with the victim's (both in the ledger, as in the
    runs these come from): the place attributes nothing."""
    findings = _victim(embedder, fact, own).scan(Record("r", "tenant-a", answer)).findings
    # Not the fact: at most the victim's name in full where it stands alone, reported as that (a fragment).
    assert [(f.detector, answer[f.start : f.end]) for f in findings] == (
        [("fragment", fact[1][0])] if answer.startswith(fact[1][0]) else [])


@pytest.mark.parametrize("reworded", [
    "Kaiken Thornridge's letter to Banellthorpe asks for the ledger and parcel 9671-892.",
    "Thornridge Kaiken wrote to Banellthorpe for the ledger.",  # names swapped, no number
    "A letter went to Banellthorpe: parcel 9671-892 and the ledger, please.",  # no name
])
def test_the_fact_reworded_beside_the_same_text_is_still_found(embedder: Embedder, reworded: str) -> None:
    findings = _victim(embedder, KAIKEN).scan(Record("r", "tenant-a", f"{OWN_FACTS} {reworded}")).findings
    assert [(f.canary_id, f.victim_tenant, f.detector) for f in findings] == [("cn_victim", "tenant-b", "semantic")]
