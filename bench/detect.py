"""Detector throughput and calibration, each beside a naive baseline measured in the same run.

    python bench/detect.py            # throughput (exact, fuzzy, fragment at 100k canaries; verbatim at 1,000
                                      # recorded prompts; semantic on CPU/GPU)
    python bench/detect.py --quick    # 10k canaries, for a fast look

Semantic detection runs with the default embedder (USE multilingual) on English and Korean answers, and
with MiniLM on English ones, for comparison.

Prints medians of 3 repeats, ratios against the baselines, peak RSS, and the score distributions
that the fuzzy and semantic thresholds were chosen from.
"""

from __future__ import annotations

import argparse
import random
import re
import resource
import statistics
import string
import time
from collections.abc import Callable

import numpy as np
from previous import load as load_previous  # bench/previous.py: the detectors before the automata
from rapidfuzz import fuzz, process

from prober.canaries import tokens
from prober.canaries.compact import compact
from prober.canaries.filler import load_filler
from prober.canaries.packs import load_pack
from prober.detect import CanarySet, Detector, ExactDetector, FragmentDetector, FuzzyDetector, Scanner, SemanticDetector
from prober.detect.base import BATCH
from prober.detect.patterns import PatternIndex
from prober.detect.verbatim import VerbatimDetector
from prober.domain.types import Canary, CanaryKind, Record
from prober.embeddings import DEFAULT_MODEL, MINILM, make_embedder
from prober.text.shingles import Shingler

KEY = b"bench-key-000000000000000000000000"


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def answers(rng: random.Random, count: int, chars: int = 2000, language: str = "en") -> list[str]:
    """Canary-free answers: filler sentences and, in English, invoice lines with codes of their own."""
    filler = load_filler(language).sentences(rng.randrange(10**6))
    out = []
    for _ in range(count):
        parts: list[str] = []
        while sum(map(len, parts)) < chars:
            if language != "en" or rng.random() < 0.7:
                parts.append(next(filler))
            else:
                code = "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(10))
                parts.append(f"Invoice {rng.randrange(10**5)} ref {code} was paid on {rng.randrange(1, 29)} May.")
        out.append(" ".join(parts)[:chars])
    return out


def rate(fn: Callable[[], int], repeats: int = 3) -> float:
    """Median answers per second over repeats; fn returns how many answers it handled."""
    speeds = []
    for _ in range(repeats):
        started = time.perf_counter()
        handled = fn()
        speeds.append(handled / (time.perf_counter() - started))
    return statistics.median(speeds)


def edited(rng: random.Random, body: str, edits: int) -> str:
    chars = list(body)
    for i in rng.sample(range(len(chars)), edits):
        chars[i] = rng.choice(tokens.ALPHABET.replace(chars[i], ""))
    return "".join(chars)


def bench_exact_fuzzy(n: int, rng: random.Random) -> None:
    """Exact, fuzzy, fragment and the scanner at `n` tokens, each beside a naive baseline and the previous
    implementation (bench/previous.py) in the same run, with a check that both find the same canaries."""
    started = time.perf_counter()
    canaries = [Canary(id=f"c{i}", tenant=f"t{i % 50}", kind=CanaryKind.TOKEN,
                       text=tokens.display(tokens.mint_body(KEY, f"t{i % 50}", f"p{i % 997}"))) for i in range(n)]
    canary_set = CanarySet(canaries, key=KEY)
    patterns = PatternIndex(canary_set)
    exact, fuzzy = ExactDetector(canary_set, patterns), FuzzyDetector(canary_set, patterns)
    fragment = FragmentDetector(canary_set, patterns=patterns)
    plain = [c.text for c in canaries]
    built = time.perf_counter() - started
    print(f"\n{n:,} active tokens: indexes built in {built:.1f} s, peak RSS {rss_mib():.0f} MiB")
    texts = answers(rng, 1000)
    for i in range(0, len(texts), 100):  # 1% carry a canary, 1% one with 1-5 characters changed, 1% two groups
        body = canary_set.patterns[rng.randrange(n)]
        planted = (canaries[rng.randrange(n)].text, edited(rng, body, 1 + i // 100 % 5), f"{body[:8]}-{body[8:16]}")
        for j, piece in enumerate(planted):
            texts[i + j] = texts[i + j][:900] + " " + piece + " " + texts[i + j][900:]
    records = [Record(f"r{i}", "observer", t) for i, t in enumerate(texts)]
    compacted = [compact(t) for t in texts]
    previous = load_previous()

    def run(detector: Detector, found: set[tuple[int, str]] | None = None) -> int:
        """The detector over answers compacted beforehand, as the scanner compacts once for all detectors."""
        for i, (r, c) in enumerate(zip(records, compacted, strict=True)):
            hits = detector.detect(r, c)
            if found is not None:
                found.update((i, h.key) for h in hits)
        return len(records)

    def compare(name: str, ours: Detector, theirs: Detector | None, baseline: float, what: str) -> None:
        now, was = set(), set()
        run(ours, now)
        ours_rate = rate(lambda: run(ours))
        line = f"{name:8}: {ours_rate:10,.0f} answers/s   {what}: {baseline:8,.1f}/s ({ours_rate / baseline:,.0f}x)"
        if theirs is not None:
            run(theirs, was)
            theirs_rate = rate(lambda: run(theirs))
            line += (f"   previous: {theirs_rate:8,.0f}/s ({ours_rate / theirs_rate:.1f}x)   "
                     f"same hits: {'yes' if now == was else f'NO ({len(now - was)} new, {len(was - now)} lost)'}")
        print(line + f"   hits {len(now)}")

    def naive_substring(sample: list[str]) -> int:
        for t in sample:
            any(p in t for p in plain)
        return len(sample)

    sample = texts[:20]
    baseline = rate(lambda: naive_substring(sample))
    compact_rate = rate(lambda: len([compact(t) for t in texts]))
    print(f"compact : {compact_rate:10,.0f} answers/s (once per answer, before every detector)")
    compare("exact", exact, previous and previous.exact(canary_set), baseline, "any(t in text)")
    few = compacted[:3]
    cdist = rate(lambda: len(process.cdist(few, canary_set.patterns, scorer=fuzz.partial_ratio, workers=-1)),
                 repeats=1)
    compare("fuzzy", fuzzy, previous and previous.fuzzy(canary_set), cdist, "cdist over all")
    groups = [g for p in canary_set.patterns for g in (p[i : i + 8] for i in range(0, 32, 8))]
    naive_groups = rate(lambda: sum(1 for t in compacted[:20] if any(g in t for g in groups) or True))
    compare("fragment", fragment, previous and previous.fragment(canary_set), naive_groups, "any(group in text)")
    for i in range(5, len(records), 10):  # a tenth of the answers hold escapes (an HTML log), which are decoded
        records[i] = Record(records[i].id, "observer", records[i].text.replace(" ", "&#32;", 20) + " 50% &amp; co")

    def scan(scanner: Scanner, found: set[tuple[int, str | None]] | None = None) -> int:
        for i, r in enumerate(records):
            result = scanner.scan(r)
            if found is not None:
                found.update((i, f.canary_id or f.probe_id) for f in result.findings)
        return len(records)

    scanner = Scanner(CanarySet(canaries, key=KEY), foreign=False)
    scanner_rate = rate(lambda: scan(scanner))
    line = (f"scanner (exact + fuzzy + fragment, escapes decoded): {scanner_rate:8,.0f} answers/s"
            f"   ratio to any(t in text) {scanner_rate / baseline:,.0f}x")
    if previous is not None:
        before = previous.scanner(Scanner(CanarySet(canaries, key=KEY), foreign=False))
        now, was = set(), set()
        scan(scanner, now)
        scan(before, was)
        before_rate = rate(lambda: scan(before))
        line += (f"   previous: {before_rate:8,.0f}/s ({scanner_rate / before_rate:.1f}x)"
                 f"   same findings: {'yes' if now == was else f'NO ({len(now - was)} new, {len(was - now)} lost)'}")
    print(line)
    print(f"peak RSS {rss_mib():.0f} MiB")


def bench_verbatim(prompts_n: int, rng: random.Random) -> None:
    """Verbatim runs of sent prompts: answers against `prompts_n` recorded prompts shaped as the builder makes
    them (a unit of filler repeated to 8,000 characters), beside looking every 12-word window of the answer up
    in every prompt's text."""
    filler = load_filler("en")
    texts = [" ".join([filler.text(300, seed=rng.randrange(10**6))] * 26) for _ in range(prompts_n)]
    shingler = Shingler(KEY)
    started = time.perf_counter()
    records = [shingler.record(t, f"t{i % 50}", f"p{i}", 0.0, 2e9) for i, t in enumerate(texts)]
    detector = VerbatimDetector(records, KEY)
    print(f"\nverbatim, {prompts_n:,} recorded prompts ({sum(len(r.hashes) for r in records) / 2**20:.1f} MiB of"
          f" hashes): index built in {time.perf_counter() - started:.1f} s, peak RSS {rss_mib():.0f} MiB")
    found: set[int] = set()
    wrong: set[int] = set()
    answers_ = answers(rng, 200)
    for i in range(0, 200, 10):  # 10% copy 20 words of a prompt
        words = texts[i].split()
        answers_[i] = answers_[i][:900] + " " + " ".join(words[30:50]) + " " + answers_[i][900:]
    batch = [Record(f"r{i}", "observer", t) for i, t in enumerate(answers_)]

    def ours() -> int:
        for i, r in enumerate(batch):
            if detector.detect(r, ""):
                (found if i % 10 == 0 else wrong).add(i)
        return len(batch)

    def naive(sample: list[str]) -> int:
        for text in sample:
            words = text.split()
            any(" ".join(words[j : j + 12]) in t for j in range(len(words) - 11) for t in texts)
        return len(sample)

    ours_rate = rate(ours)
    naive_rate = rate(lambda: naive(answers_[:2]), repeats=1)
    print(f"verbatim: {ours_rate:8,.0f} answers/s, found {len(found)}/20, on clean filler answers {len(wrong)}/180"
          f"   baseline windows in every prompt: "
          f"{naive_rate:6,.2f} answers/s   ratio {ours_rate / naive_rate:,.0f}x")


def calibrate_fuzzy(rng: random.Random) -> None:
    print("\nfuzzy calibration (partial_ratio / 100 of a token body inside a 2,000-char answer):")
    bodies = [tokens.mint_body(KEY, "t", "p") for _ in range(300)]
    texts = [compact(t) for t in answers(rng, 300)]
    for edits in (1, 2, 3, 4, 5):
        scores = []
        for body, text in zip(bodies, texts, strict=True):
            chars = list(body)
            for i in rng.sample(range(32), edits):
                chars[i] = rng.choice(tokens.ALPHABET.replace(chars[i], ""))
            pos = rng.randrange(len(text))
            scores.append(fuzz.partial_ratio(body, text[:pos] + "".join(chars) + text[pos:]) / 100)
        print(f"  {edits} substituted: min {min(scores):.3f} median {statistics.median(scores):.3f}")
    null = [fuzz.partial_ratio(body, text) / 100 for body, text in zip(bodies, texts, strict=True)]
    print(f"  no canary  : max {max(null):.3f} median {statistics.median(null):.3f}   (threshold 0.84)")


NAIVE = 200  # answers the naive baseline embeds sentence by sentence


def bench_semantic(rng: random.Random, facts_n: int, model: str, device: str, language: str,
                   count: int = 2_000) -> None:
    """Answers/s and recall for facts reworded into `count` answers (English: the test model's paraphrase; Korean:
    the minted sentence), against embedding every sentence of every answer and comparing all facts (over the first
    NAIVE answers: it is that slow).  Timings of 200 answers (a few tens of milliseconds) varied by a third."""
    embedder = make_embedder(model, device)
    started = time.perf_counter()
    embedder.load()
    print(f"\nsemantic, {embedder.name} ({embedder.device}), {language}: "
          f"model loaded in {time.perf_counter() - started:.1f} s")
    pack = load_pack(language)
    drawn = [pack.mint(rng) for _ in range(facts_n)]
    started = time.perf_counter()
    vectors = embedder.encode([f.text for f in drawn])
    print(f"  encoded {facts_n:,} facts at {facts_n / (time.perf_counter() - started):,.0f} sentences/s")
    canaries = [Canary(id=f"f{i}", tenant="victim", kind=CanaryKind.FACT, text=f.text, values=f.distinctive,
                       aliases=f.aliases, embedding=v.tobytes(), embedding_model=embedder.name)
                for i, (f, v) in enumerate(zip(drawn, vectors, strict=True))]
    detector = SemanticDetector(CanarySet(canaries), embedder)
    from prober.testbed.styles import paraphrase

    texts = answers(rng, count) if language == "en" else answers(rng, count, 900, language)
    cut = len(texts[0]) // 3
    planted: dict[int, str] = {}
    for i in range(0, count, 5):  # 20% carry a reworded fact
        index = rng.randrange(facts_n)
        planted[i] = canaries[index].id
        fact = paraphrase(drawn[index].text) if language == "en" else drawn[index].text
        texts[i] = texts[i][:cut] + " " + fact + " " + texts[i][cut:]
    records = [Record(f"r{i}", "observer", t) for i, t in enumerate(texts)]

    found: set[int] = set()

    def ours() -> int:
        """BATCH answers at a time, as the scanner hands them to its detectors."""
        for first in range(0, len(records), BATCH):
            batch = [(r, compact(r.text)) for r in records[first : first + BATCH]]
            for i, hits in enumerate(detector.detect_many(batch), start=first):
                if any(h.canary and h.canary.id == planted.get(i) for h in hits):
                    found.add(i)
        return len(records)

    fact_matrix = np.stack([np.frombuffer(c.embedding or b"", dtype=np.float32) for c in canaries])
    naive_found: set[int] = set()

    def naive() -> int:
        for i, text in enumerate(texts[:NAIVE]):
            sentences = [s for s in re.split(r"(?<=[.!?。])\s+", text) if s.strip()]
            best = (fact_matrix @ embedder.encode(sentences).T).max(axis=1)  # every fact x every sentence
            if i in planted and best[int(planted[i][1:])] >= detector.threshold:
                naive_found.add(i)
        return len(texts[:NAIVE])

    def one_at_a_time() -> set[tuple[int, str, float]]:
        return {(i, h.key, round(h.score, 3))
                for i, r in enumerate(records) for h in detector.detect(r, compact(r.text))}

    def batched() -> set[tuple[int, str, float]]:
        return {(first + i, h.key, round(h.score, 3)) for first in range(0, len(records), BATCH)
                for i, hits in enumerate(detector.detect_many([(r, compact(r.text))
                                                               for r in records[first : first + BATCH]]))
                for h in hits}

    ours_rate = rate(ours)
    single_rate = rate(lambda: len(records) if one_at_a_time() is not None else 0)
    same = one_at_a_time() == batched()
    naive_rate = rate(naive, repeats=1)
    print(f"  {facts_n:,} facts: {ours_rate:8,.1f} answers/s, recall {len(found) / len(planted):.3f}   "
          f"one answer a call: {single_rate:8,.1f}/s ({ours_rate / single_rate:.2f}x), "
          f"same hits and scores: {'yes' if same else 'NO'}   "
          f"naive sentence chunking: {naive_rate:6,.1f} answers/s, recall "
          f"{len(naive_found) / sum(i < NAIVE for i in planted):.3f}"
          f"   ratio {ours_rate / naive_rate:,.1f}x   peak RSS {rss_mib():.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="10k canaries instead of 100k")
    parser.add_argument("--device", default="auto", help="embedding device: auto, cpu, cuda")
    args = parser.parse_args()
    rng = random.Random(2026)
    bench_exact_fuzzy(10_000 if args.quick else 100_000, rng)
    calibrate_fuzzy(rng)
    bench_verbatim(100 if args.quick else 1_000, random.Random(7))
    for model, language in ((DEFAULT_MODEL, "en"), (DEFAULT_MODEL, "ko"), (MINILM, "en")):
        bench_semantic(rng, 2_000, model, args.device, language)


if __name__ == "__main__":
    main()
