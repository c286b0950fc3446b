"""Detector quality on a labelled evaluation set (tests/evalset.py), measured and asserted."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from prober.canaries.mint import Minter
from prober.canaries.packs import load_pack
from prober.detect import Scanner
from prober.embeddings import SentenceTransformerEmbedder
from prober.ledger import open_ledger
from prober.types import FindingKind
from tests import evalset

KEY = bytes(range(32))


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder) -> dict[str, object]:
    ledger = open_ledger(Path(tmp_path_factory.mktemp("eval")) / "ledger.sqlite")
    minter = Minter(ledger, KEY, embedder)
    victim = minter.tokens("tenant-a", 300, probe_id="p1") + minter.tokens("tenant-a", 100, probe_id="p2")
    slots_of: dict[str, dict[str, str]] = {}
    templates_of: dict[str, str] = {}
    for language, count, seed in (("en", 80, 11), ("ko", 30, 12)):
        facts = minter.facts("tenant-a", count, probe_id="p3", language=language, rng=random.Random(seed))
        # The same seed draws the same facts again, which tells us each one's template and slots.
        replay = random.Random(seed)
        for canary in facts:
            drawn = load_pack(language).mint(replay)
            assert drawn.text == canary.text
            slots_of[canary.id], templates_of[canary.id] = drawn.slots, drawn.template
        victim += facts
    observer = minter.facts("tenant-b", 60, probe_id="p4", rng=random.Random(13))
    cases = evalset.build(victim, observer, slots_of, templates_of)
    scanner = Scanner(ledger.active_canaries(), key=KEY, embedder=embedder, foreign=False)
    results = [(case, scanner.scan(case.record)) for case in cases]
    return {"results": results}


def _rate(results: list, label: str, predicate) -> tuple[float, int]:  # type: ignore[type-arg]
    chosen = [(c, r) for c, r in results if c.label == label]
    return sum(predicate(c, r) for c, r in chosen) / len(chosen), len(chosen)


def _found(case: evalset.Case, result) -> bool:  # type: ignore[no-untyped-def]
    return any(f.canary_id == case.canary.id and f.victim_tenant == "tenant-a" for f in result.findings)


def test_recall_verbatim_disguised_paraphrased(evaluation: dict) -> None:  # type: ignore[type-arg]
    results = evaluation["results"]
    verbatim, n_v = _rate(results, "verbatim", _found)
    disguised, n_d = _rate(results, "disguised", _found)
    paraphrased, n_p = _rate(results, "paraphrased", _found)
    print(f"recall verbatim {verbatim:.4f} (n={n_v}) disguised {disguised:.4f} (n={n_d}) "
          f"paraphrased {paraphrased:.4f} (n={n_p})")
    assert verbatim == 1.0
    assert disguised >= 0.99
    assert paraphrased >= 0.90


def test_false_positives_on_clean_lookalike_and_same_template(evaluation: dict) -> None:  # type: ignore[type-arg]
    results = evaluation["results"]
    for label in ("clean", "lookalike", "same_template"):
        rate, n = _rate(results, label, lambda c, r: bool(r.findings))
        print(f"false positives {label}: {rate:.4f} (n={n})")
        assert rate <= 0.001, [r.findings for c, r in results if c.label == label and r.findings][:3]
    own = [r for c, r in results if c.label == "same_template"]
    assert all(r.own_echoes for r in own)  # positive control: the observer's own fact is recognised


def test_attribution_is_exact_for_exact_and_fuzzy_hits(evaluation: dict) -> None:  # type: ignore[type-arg]
    by_detector: Counter[str] = Counter()
    for case, result in evaluation["results"]:
        for finding in result.findings:
            assert finding.kind is FindingKind.CROSS_TENANT_ECHO
            by_detector[finding.detector] += 1
            if finding.detector in ("exact", "fuzzy"):
                assert case.canary is not None and finding.canary_id == case.canary.id
                assert (finding.victim_tenant, finding.observer_tenant) == ("tenant-a", "tenant-b")
    print("findings by detector:", dict(by_detector))
    assert by_detector["exact"] and by_detector["fuzzy"] and by_detector["semantic"]
