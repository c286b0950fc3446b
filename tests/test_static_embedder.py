"""USE distilled into a static embedding (prober/embeddings/static.py): its pieces are USE's, word by word, and on
the evaluation set's paraphrases the semantic detector alone finds with it at least what it finds with USE,
with no false positive and no wrong attribution.  The table is built once per machine (about 30 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prober.detect import CanarySet
from prober.embeddings import STATIC_MODEL, Embedder, StaticEmbedder, make_embedder
from prober.embeddings.static import build
from prober.ledger import open_ledger
from tests.support import evalset

KEY = bytes(range(32))


@pytest.fixture(scope="module")
def static() -> Embedder:
    build()
    model = make_embedder(STATIC_MODEL)
    model.load()
    return model


@pytest.mark.unit
def test_pieces_word_by_word_are_those_of_the_whole_text() -> None:
    embedder = StaticEmbedder()
    texts = ["Mina Park keeps the amber key at Busan Harbour.", "소포 번호 4471 (탁윤설 씨) — 보관 장소: 창고",
             "  odd\twhite\u3000space\n\nand  repeats repeats ", "", "x"]
    for text in texts:
        whole = embedder._tokenizer.encode(text, add_bos=False, add_eos=False)
        assert embedder._pieces(text) == list(whole), text


def test_it_finds_each_paraphrase_kind_as_use_does(tmp_path: Path, embedder: Embedder, static: Embedder) -> None:
    ledger = open_ledger(tmp_path / "ledger.sqlite")
    evaluation = evalset.evaluate(embedder, ledger, KEY, clean=300)
    canaries = CanarySet(ledger.active_canaries(), key=KEY)
    use, distilled = (evalset.semantic_alone(model, evaluation, canaries) for model in (embedder, static))
    for label in evalset.PARAPHRASED:
        print(f"{label}: USE {use.recall(label):.3f}, static {distilled.recall(label):.3f}")
        assert distilled.recall(label) >= use.recall(label) and distilled.total[label] >= 80, label
    assert all(distilled.flagged[label] == 0 for label in evalset.NEGATIVE) and distilled.wrong == 0
