"""Foreign-content calibration on real model answers: warnings on clean answers, recall of planted data.

    python bench/llamacpp.py       # once: collects 400 Gemma 3 270M answers to canary prompts
    python bench/foreign.py        # warnings and recall, with and without the embedder
    python bench/foreign.py --corpus ~/.cache/leakprobe/reallm-corpus   # the clean controls of bench/reallm.py

With --corpus, the clean answers are the real-LM corpus's controls: Gemma decoding from never-written
(zeroed) pages -- multilingual garbage -- and from the observer's own pages, where it invents sentences.

Clean: the Gemma answers as they came (greedy and sampled at 0.8, five instructions).  Leaked: the same
answers with one sentence of another customer's data spliced in at a sentence boundary -- a fact from the
canary packs that was never minted (a name, a place, an account number) or a line of business text.
A leak counts as caught when a foreign-content hit overlaps the spliced sentence.  The baseline is the
first version of the detector: exact words only, no stems, no paraphrase or translation check.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from prober.canaries.packs import load_pack
from prober.detect.foreign import ForeignContentDetector
from prober.domain.types import Record
from tests.support.llamacpp import cache_dir

ANSWERS = cache_dir() / "gemma-answers.jsonl"
BUSINESS = [
    "Quarterly revenue of Harlow Dynamics fell to 4.2 million after the Denver plant closed.",
    "Payroll account 55120983 moves to Meridian Trust next week.",
    "Patient Ellen Marsh was prescribed 20 mg of atorvastatin on 14 March.",
    "Please wire the deposit for the Lisbon apartment to IBAN PT50 0002 0123 1234 5678 9015 4.",
    "Our board approved the acquisition of Vexley Robotics for 310 million dollars.",
    "The new hire starts Monday; her badge number is 77-4410 and she reports to Mr. Okafor.",
    "Customer complaint 8841: the refrigerator delivered to Aurora Street arrived with a cracked door.",
    "Reset the VPN password for jlindqvist and send it to her personal phone ending 3312.",
    "Draft contract: Brightwater Logistics pays a penalty of 2 percent per day after the June deadline.",
    "Lab results for sample K-2209 show elevated lead levels in the Fairview school water supply.",
]


def _legacy(prompt: str, text: str) -> bool:
    """The first detector: exact content words, 60% unsupported or a new identifier and 30%."""
    common = {"the", "and", "for", "are", "was", "with", "that", "this", "from", "have", "has", "not", "but"}
    prompt_words = set(re.findall(r"\w{3,}", prompt.lower()))
    for sentence in re.findall(r"[^.!?\n]+[.!?]?", text):
        words = [w for w in re.findall(r"\w{3,}", sentence.lower()) if w not in common]
        ids = [i for i in re.findall(r"\b(?=\w*\d)\w{4,}\b", sentence) if i.lower() not in prompt.lower()]
        if len(words) < 5 and not ids:
            continue
        share = sum(w not in prompt_words for w in words) / max(1, len(words))
        if share >= 0.6 or (ids and share >= 0.3):
            return True
    return False


def splice(text: str, sentence: str, rng: random.Random) -> tuple[str, int, int]:
    cuts = [0, *(m.end() for m in re.finditer(r"[.!?\n]\s*", text))]
    at = rng.choice(cuts)
    glued = text[:at] + ("" if at == 0 or text[at - 1].isspace() else " ")
    start = len(glued)
    return glued + sentence + " " + text[at:], start, start + len(sentence)


def corpus_controls(corpus: Path) -> list[dict[str, Any]]:
    """The clean answers of a real-LM corpus (its controls), as rows of the llama.cpp answer file."""
    truths = {t["id"]: t for t in map(json.loads, (corpus / "truth.jsonl").read_text("utf-8").splitlines())}
    rows = []
    for row in map(json.loads, (corpus / "answers.jsonl").read_text("utf-8").splitlines()):
        truth = truths.get(row["id"])  # None: the generator is still writing it
        condition = truth["condition"] if truth else {"control": ""}
        if condition["control"]:
            rows.append({**row, "greedy": condition["temperature"] == 0, "kind": condition["control"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, help="a bench/reallm.py corpus: its controls are the clean answers")
    args = parser.parse_args()
    if args.corpus is not None:
        rows = corpus_controls(args.corpus)
    elif ANSWERS.exists():
        rows = [json.loads(line) for line in ANSWERS.read_text(encoding="utf-8").splitlines()]
    else:
        sys.exit(f"no answers at {ANSWERS}: run `python bench/llamacpp.py` first (or give --corpus)")
    rng = random.Random(11)
    pack = load_pack("en")
    leaks = [*BUSINESS, *(pack.mint(rng).text for _ in range(40))]
    print(f"{len(rows)} Gemma answers, {len(leaks)} foreign sentences to splice")
    for label, detector in (("detector", ForeignContentDetector()),):
        warned: Counter[str] = Counter()
        total: Counter[str] = Counter()
        caught = 0
        legacy_warned = legacy_caught = 0
        started = time.perf_counter()
        for row in rows:
            kind = ("greedy" if row["greedy"] else "sampled") + (f" {row['kind']}" if "kind" in row else "")
            total[kind] += 1
            if detector.detect(Record(row["id"], row["tenant"], row["text"], row["prompt"]), ""):
                warned[kind] += 1
            legacy_warned += _legacy(row["prompt"], row["text"])
            leaked, start, end = splice(row["text"], rng.choice(leaks), rng)
            hits = detector.detect(Record(row["id"], row["tenant"], leaked, row["prompt"]), "")
            caught += any(h.start < end and start < h.end for h in hits)
            legacy_caught += _legacy(row["prompt"], leaked)
        elapsed = time.perf_counter() - started
        clean = ", ".join(f"{k} {warned[k]}/{total[k]} ({warned[k] / total[k]:.1%})" for k in sorted(total))
        print(f"{label:14s}: warnings on clean answers: {clean}; recall {caught}/{len(rows)} "
              f"({caught / len(rows):.1%}); {2 * len(rows) / elapsed:,.0f} answers/s")
    print(f"baseline      : warnings on clean answers {legacy_warned}/{len(rows)} "
          f"({legacy_warned / len(rows):.1%}); answers with a warning after splicing {legacy_caught}/{len(rows)}")


if __name__ == "__main__":
    main()
