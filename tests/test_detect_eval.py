"""Detector quality on a labelled evaluation set (tests/evalset.py), measured and asserted, with the default
(multilingual) embedder: verbatim, disguised, reworded in English and in Korean, and retold across the two."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from prober.embeddings import Embedder
from prober.ledger import open_ledger
from prober.types import FindingKind
from tests import evalset

KEY = bytes(range(32))


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> evalset.Evaluation:
    return evalset.evaluate(embedder, open_ledger(Path(tmp_path_factory.mktemp("eval")) / "ledger.sqlite"), KEY)


@pytest.mark.parametrize(("label", "floor"), [
    ("verbatim", 1.0), ("disguised", 0.99), ("paraphrased", 0.90), ("paraphrased_ko", 0.90),
    ("korean_in_english", 0.90), ("english_in_korean", 0.90)])
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
