"""The static distillation of USE (prober/embeddings/static.py) beside USE itself, in one run.

    make static-embedder                   # once: builds the table (about 30 s)
    python bench/static.py                 # throughput (bench/detect.py's semantic benchmark) and evaluation set
    python bench/static.py --thresholds 0.45 0.5 0.55

Throughput: bench/detect.py's `bench_semantic` (answers/s of the semantic detector, 2,000 facts, 200 answers of
which a fifth hold a reworded fact, BATCH answers a call), English and Korean, each model on the same answers.
Quality: the labelled evaluation set (tests/support/evalset.py, as tests/test_detect_eval.py scans it) -- recall of
each paraphrase kind (English, Korean, a memo, and across the two languages), false positives on the negatives,
wrong attributions -- for USE at its threshold and the static model at each threshold asked, and the three answers
of test_detect_eval.py whose values stand out of place (which the embedding must reject).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import detect  # bench/detect.py
import numpy as np
from detect import bench_semantic

from prober.canaries import hangul
from prober.canaries.compact import compact
from prober.canaries.packs import _SLOT, load_pack
from prober.detect import CanarySet, Scanner, SemanticDetector
from prober.detect.base import BATCH
from prober.domain.types import Canary, CanaryKind, Record
from prober.embeddings import STATIC_MODEL, USE_MODEL, Embedder, Vectors, make_embedder
from prober.ledger import open_ledger
from tests.support import evalset
from tests.test_detect_eval import KAIKEN, MORMAR, OWN_FACTS, WENDRU

KEY = bytes(range(32))
OUT_OF_PLACE = [  # test_detect_eval.py: the victim's values in the answer, not its fact
    (KAIKEN, OWN_FACTS, OWN_FACTS), (WENDRU, MORMAR, MORMAR),
    (KAIKEN, f"Kaiken Thornridge opened the shop. {'The farmer carries the gate past the mill. ' * 12}"
             "A letter reached Banellthorpe asking for the ledger.", ""),
]


def out_of_place(embedder: Embedder) -> int:
    """How many of the three answers yield a semantic finding (0 is right)."""
    wrong = 0
    for (text, values), answer, own in OUT_OF_PLACE:
        victim = Canary(id="cn_victim", tenant="tenant-b", kind=CanaryKind.FACT, text=text, pack="en",
                        values=values, created_at=0, expires_at=2**40)
        observer = [Canary(id="cn_own", tenant="tenant-a", kind=CanaryKind.FACT, text=own, pack="en",
                           values=tuple(v for v in values if v in own), created_at=0, expires_at=2**40)] if own else []
        scanner = Scanner(CanarySet([victim, *observer]), embedder=embedder, foreign=False)
        wrong += any(f.detector == "semantic" for f in scanner.scan(Record("r", "tenant-a", answer)).findings)
    return wrong


def semantic_line(embedder: Embedder, result: evalset.Evaluation, canaries: CanarySet, threshold: float) -> str:
    """Recall per paraphrase kind, false positives per negative kind, wrong attributions: the semantic detector
    alone at `threshold`."""
    embedder.threshold = threshold
    alone = evalset.semantic_alone(embedder, result, canaries)
    recall = "  ".join(f"{label} {alone.recall(label):.3f}" for label in evalset.PARAPHRASED)
    fp = "  ".join(f"{label} {alone.flagged[label] / alone.total[label]:.3f}" for label in evalset.NEGATIVE)
    return f"recall {recall}\n      false positives {fp}   wrong attributions {alone.wrong}"


def evaluate(embedder: Embedder, thresholds: list[float]) -> None:
    """The whole scanner once at the model's threshold, as test_detect_eval.py, then the semantic detector alone at
    each threshold."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        ledger = open_ledger(Path(folder) / "ledger.sqlite")
        result = evalset.evaluate(embedder, ledger, KEY)
        canaries = CanarySet(ledger.active_canaries(), key=KEY)
    recall = "  ".join(f"{label} {result.recall(label)[0]:.3f}" for label in evalset.PARAPHRASED)
    fp = "  ".join(f"{label} {result.false_positives(label)[0]:.3f}" for label in evalset.NEGATIVE)
    print(f"  {embedder.name}, whole scanner @ {embedder.threshold:.2f}: recall {recall}\n"
          f"      false positives {fp}   wrong attributions {result.wrong_attributions()}   "
          f"values out of place found {out_of_place(embedder)}/3   ({time.perf_counter() - started:.0f} s)",
          flush=True)
    for threshold in sorted({embedder.threshold, *thresholds}):
        started = time.perf_counter()
        line = semantic_line(embedder, result, canaries, threshold)
        print(f"  {embedder.name}, semantic alone @ {threshold:.2f} ({time.perf_counter() - started:.1f} s): {line}"
              f"   values out of place found {out_of_place(embedder)}/3", flush=True)


def swapped(embedder: Embedder, thresholds: list[float], count: int = 200) -> None:
    """A harder negative than the evaluation set has: a fact's own values written into *another* template of its
    pack (another fact's sentence), inside an answer.  The values pass the detector's gate, so only the embedding
    can tell; how often the semantic detector still reports the fact says how much the embedding adds to the
    values (with a static model, a sentence is mostly the sum of its rare pieces, which are the values)."""
    for language in ("en", "ko"):
        pack, rng = load_pack(language), random.Random(31)
        facts = [pack.mint(rng) for _ in range(count)]
        vectors = embedder.encode([f.text for f in facts])
        canaries = [Canary(id=f"s{i}", tenant="tenant-a", kind=CanaryKind.FACT, text=f.text, pack=language,
                           values=f.distinctive, aliases=f.aliases, embedding=v.tobytes(),
                           embedding_model=embedder.name, created_at=0, expires_at=2**40)
                    for i, (f, v) in enumerate(zip(facts, vectors, strict=True))]
        answers: list[tuple[Record, str]] = []
        for i, fact in enumerate(facts):
            other = rng.choice([t for t in pack.templates if t != fact.template])
            donor = pack.mint(rng).slots
            filled = {n: fact.slots.get(n, donor.get(n) or pack.mint(rng).slots.get(n, "")) for n in
                      _SLOT.findall(other)}
            while any(not v for v in filled.values()):  # a slot no donor had: draw until one does
                extra = pack.mint(rng).slots
                filled = {n: v or extra.get(n, "") for n, v in filled.items()}
            sentence = hangul.resolve_particles(other, filled).format(**filled)
            text = evalset.embed(rng, sentence) if language == "en" else evalset.embed_ko(rng, sentence)
            answers.append((Record(f"s{i}", "tenant-b", text), compact(text)))
        line = []
        for threshold in thresholds:
            embedder.threshold = threshold
            detector = SemanticDetector(CanarySet(canaries), embedder)
            hits = sum(any(h.canary and h.canary.id == f"s{i}" for h in found)
                       for first in range(0, count, BATCH)
                       for i, found in enumerate(detector.detect_many(answers[first : first + BATCH]), start=first))
            line.append(f"@{threshold:.2f} {hits / count:.3f}")
        print(f"  {embedder.name}, {language}: its values in another template's sentence reported as the fact "
              + "  ".join(line), flush=True)


class Free:
    """An embedder that costs nothing (every text the same unit vector, so every candidate is confirmed at once):
    the semantic detector's speed without embedding, the most any embedder could reach."""

    name = "free"
    threshold = 0.5
    device = "cpu"

    def load(self) -> None:
        pass

    def encode(self, texts: list[str]) -> Vectors:
        vectors = np.zeros((len(texts), 8), dtype=np.float32)
        vectors[:, 0] = 1.0
        return vectors


def throughput(rounds: int) -> None:
    """bench/detect.py's semantic benchmark for each model on the same answers, `rounds` times in turn (the machine
    is shared: compare within a round), with the free embedder as the ceiling."""
    for round_ in range(1, rounds + 1):
        print(f"\nround {round_}")
        for language in ("en", "ko"):
            for model in ("free", USE_MODEL, STATIC_MODEL):  # the same seed: the same facts and answers
                detect.make_embedder = (lambda *_: Free()) if model == "free" else make_embedder
                bench_semantic(random.Random(2026), 2_000, model, "cpu", language)
        detect.make_embedder = make_embedder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--thresholds", type=float, nargs="*", default=[0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7],
                        help="static model thresholds for the semantic detector alone")
    parser.add_argument("--use-thresholds", type=float, nargs="*", default=[0.3, 0.35, 0.45, 0.5],
                        help="USE thresholds for the semantic detector alone")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds")
    parser.add_argument("--no-throughput", action="store_true")
    parser.add_argument("--no-eval", action="store_true")
    args = parser.parse_args()
    if not args.no_throughput:
        throughput(args.rounds)
    if not args.no_eval:
        print("\nevaluation set (tests/support/evalset.py): recall per paraphrase kind, false positives per "
              "negative kind")
        evaluate(make_embedder(USE_MODEL), args.use_thresholds)
        evaluate(make_embedder(STATIC_MODEL), args.thresholds)
        print("\nvalues in another fact's sentence (lower: the embedding adds more to the values)")
        use = make_embedder(USE_MODEL)
        swapped(use, sorted({use.threshold, *args.use_thresholds}))
        static = make_embedder(STATIC_MODEL)
        swapped(static, sorted({static.threshold, *args.thresholds}))


if __name__ == "__main__":
    main()
