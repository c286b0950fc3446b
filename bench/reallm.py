"""What a real model says over another tenant's stale KV pages: a corpus for detection (issue #21).

    python bench/reallm.py generate                 # 6 victims x 54 answers, ~30-60 min on 2 busy cores
    python bench/reallm.py generate --victims 1     # a first batch (54 answers)
    python bench/reallm.py summary                  # the per-condition tables over the whole corpus

Gemma 3 270M (the reference engine's real-LM mode, its paged forward) decodes as the incident's fault makes
it decode: an observer's over-pool request is replaced by a one-token placeholder and decode attends over
the placeholder plus a victim's freed pages.  The victim's prompt is built by the project's PromptBuilder
(as an audit's prime: a token canary in every unit, a fact in every fourth) and its canaries are minted into
a ledger before the prompt exists.  Conditions, for each victim:

    pages attended     8 / 32 / 128 (16-token pages)
    positions          own (page i at position i) / other (the pages reversed, as an allocator that frees
                       from the tail hands them out)
    decoding           greedy / temperature 0.7 (two seeds)
    instruction        none (decode starts from the placeholder) / the observer's quote request as a turn
    controls           zeroed pages (never written) / the observer's own pages (its own prompt, prefilled)

Answers of one condition group decode together (`Gemma.forward_batch`: one read of the weights per step).

Corpus, under --out (default $LEAKPROBE_CACHE/reallm-corpus, i.e. ~/.cache/leakprobe/reallm-corpus):

    ledger.sqlite   every canary (victims' and observers'), and the canary key
    answers.jsonl   {id, tenant, text, prompt}: `leakprobe scan answers.jsonl --ledger ledger.sqlite` reads it
                    (tenant: the observer; prompt: what the observer sent)
    truth.jsonl     per id, for an oracle that knows nothing of the detectors: condition, victim, observer,
                    `stale` (the victim canaries in the attended stale pages: id, kind, text, values, complete),
                    `stale_text` (the victim text those pages hold), `own` (the observer's canaries in its
                    prompt), tokens, finish reason, seconds (the answer's share of its group's wall time)

It prints seconds per answer and, per condition, the share of answers that carry victim material by the
oracle here (`material`): an 8-character group of a stale victim token, a distinctive value of a stale victim
fact, or a run of 6+ words of the stale text that the observer's own prompt does not have.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from prober.canaries.keys import resolve_key
from prober.canaries.mint import Minter
from prober.domain.types import Canary, CanaryKind
from prober.embeddings import make_embedder
from prober.ledger import open_ledger
from prober.probing.planting import ASKED, PRIME_INSTRUCTION, fact_samples
from prober.prompts import PromptBuilder
from prober.prompts.builder import BuiltPrompt, Facts
from prober.prompts.counter import LocalCounter
from prober.system.resources import cache_root
from prober.testbed.generation import Sampling
from prober.testbed.lm import weights
from prober.testbed.lm.gemma import PagedKV, RequestKV
from prober.testbed.lm.runtime import Decoding, GemmaVocabulary, load_weights, sample
from prober.testbed.protocol import Message
from prober.testbed.tokenizer import PLACEHOLDER_TOKEN

PAGE = 16
SIZES = (8, 32, 128)  # pages attended
VICTIM_TOKENS = (max(SIZES) + 1) * PAGE  # the prompt fills every attended page, and one more
OBSERVER_TOKENS = 2_600  # what the observer sent: over a 2,048-token pool, so it was replaced by the placeholder
DECODINGS = ((0.0, 0), (0.7, 1), (0.7, 2))  # (temperature, seed index)
CONTROL_DECODINGS = ((0.0, 0), (0.7, 1))
FACT_SHARE = 0.25
RUN_WORDS = 6


@dataclass(frozen=True)
class Condition:
    pages: int
    positions: str  # own | other (leak conditions); "" for controls
    control: str  # "" | zeroed | own_pages
    instruction: bool
    temperature: float
    seed: int

    @property
    def label(self) -> str:
        kind = self.kind
        decoding = "greedy" if self.temperature == 0 else f"t{self.temperature}"
        return f"{kind}/{self.pages}p/{decoding}/{'instr' if self.instruction else 'bare'}"

    @property
    def kind(self) -> str:
        return self.control or f"stale-{self.positions}"

    def group(self, *axes: str) -> str:
        """The condition seen along some axes only (the summary pools the others)."""
        parts = {"kind": self.kind, "pages": f"{self.pages}p",
                 "decoding": "greedy" if self.temperature == 0 else "sampled",
                 "instruction": "instr" if self.instruction else "bare"}
        return "/".join(parts[axis] for axis in axes)


@dataclass
class Trial:
    id: str
    condition: Condition
    decoding: Decoding
    prompt: str  # what the observer sent
    truth: dict[str, Any] = field(default_factory=dict)


class Corpus:
    """The model, the ledger, the builder; one victim round at a time."""

    def __init__(self, out: Path, max_tokens: int) -> None:
        self.out = out
        self.max_tokens = max_tokens
        out.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        self.model, tokenizer = load_weights(weights.model_dir(log=print))
        self.vocab = GemmaVocabulary(tokenizer)
        print(f"model loaded in {time.monotonic() - started:.1f} s")
        self.ledger = open_ledger(out / "ledger.sqlite")
        self.minter = Minter(self.ledger, resolve_key(self.ledger), make_embedder())
        counter = LocalCounter(lambda text: len(self.chat_ids(text)), "gemma3-270m chat template")
        self.builder = PromptBuilder(counter)
        self.instruction_ids = self.vocab.encode_chat([Message(role="user", content=ASKED["quote"])])[1:].tolist()
        answer_pages = -(-(max_tokens + len(self.instruction_ids) + 1) // PAGE)
        # Physical layout of one store: victim pages, the observer's own pages, never-written pages, scratch.
        self.victim_pages = list(range(max(SIZES) + 1))
        start = len(self.victim_pages)
        self.own_pages: dict[int, list[int]] = {}
        for size in SIZES:
            self.own_pages[size] = list(range(start, start + size + 1))
            start += size + 1
        self.zero_pages = list(range(start, start + max(SIZES)))
        self.scratch = list(range(start + max(SIZES), start + max(SIZES) + answer_pages))
        self.store = PagedKV(self.model.config, self.scratch[-1] + 1, PAGE)
        self.prefill_seconds: list[float] = []
        self.prefill_tokens: list[int] = []

    def chat_ids(self, text: str) -> list[int]:
        return [int(i) for i in self.vocab.encode_chat([Message(role="user", content=text)])]

    # -- prompts ----------------------------------------------------------------------------------
    def _minting(self, make: Callable[[int], list[Canary]]) -> Callable[[int], Any]:
        async def mint(count: int) -> list[Canary]:
            return make(count)  # persisted in the ledger by the minter before it returns
        return mint

    def build(self, tenant: str, probe_id: str, tokens: int, instruction: str, seed: int) -> BuiltPrompt:
        mint_tokens = self._minting(partial(self.minter.tokens, tenant, probe_id=probe_id))
        mint_facts = self._minting(partial(self.minter.facts, tenant, probe_id=probe_id, language="en"))
        facts = Facts(fact_samples("en"), mint_facts, FACT_SHARE)
        return asyncio.run(self.builder.build(tokens, instruction=instruction, mint=mint_tokens, facts=facts,
                                              page_size=PAGE, seed=seed))

    def prefill(self, ids: Sequence[int], pages: list[int]) -> torch.Tensor:
        """A request writing its own pages (through to the store), chunk by chunk; the last logits."""
        started = time.monotonic()
        kv = RequestKV(self.store, pages, 0)
        logits = torch.empty(0)
        for begin in range(0, len(ids), 256):
            logits = self.model.forward(torch.as_tensor(ids[begin : begin + 256]), kv)
        self.prefill_seconds.append(time.monotonic() - started)
        self.prefill_tokens.append(len(ids))
        return logits

    # -- one victim -------------------------------------------------------------------------------
    def round(self, index: int, victim: str, observer: str) -> Iterator[Trial]:
        victim_prompt = self.build(victim, f"reallm-{index}-prime", VICTIM_TOKENS, PRIME_INSTRUCTION, index)
        victim_ids = self.chat_ids(victim_prompt.text)
        self.prefill(victim_ids, self.victim_pages)
        spans = canary_tokens(self.vocab, victim_prompt)
        sent = self.build(observer, f"reallm-{index}-probe", OBSERVER_TOKENS, ASKED["quote"], 1000 + index)
        for size in SIZES:
            trials = list(self._leaks(index, size, victim, observer, victim_ids, spans, sent))
            trials += list(self._controls(index, size, victim, observer, sent))
            yield from self._decode_group(trials)

    def _stale_truth(self, victim: str, observer: str, victim_ids: list[int], spans: dict[str, tuple[Canary, set[int]]],
                     pages: list[int], overwritten: int) -> dict[str, Any]:
        """The victim tokens the attended pages hold (slot 0 of the table now holds the placeholder)."""
        held = {page * PAGE + offset for page in pages for offset in range(PAGE)} - {overwritten}
        held &= set(range(len(victim_ids)))
        stale = [{"id": c.id, "kind": c.kind.value, "text": c.text, "values": list(c.values),
                  "complete": where <= held}
                 for c, where in spans.values() if where & held]
        text = self.vocab.decode([victim_ids[i] for i in sorted(held)])
        return {"victim": victim, "observer": observer, "stale": stale, "stale_text": text}

    def _leaks(self, index: int, size: int, victim: str, observer: str, victim_ids: list[int],
               spans: dict[str, tuple[Canary, set[int]]], sent: BuiltPrompt) -> Iterator[Trial]:
        attended = self.victim_pages[:size]
        for positions, table in (("own", attended), ("other", attended[::-1])):
            truth = self._stale_truth(victim, observer, victim_ids, spans, table, table[0] * PAGE)
            for instruction in (False, True):
                for temperature, seed in DECODINGS:
                    condition = Condition(size, positions, "", instruction, temperature, seed)
                    decoding = self._start(table, size, instruction, condition, index)
                    yield Trial(f"r{index}-{condition.label}-s{seed}", condition, decoding, sent.text,
                                {**truth, "own": canary_list(sent.canaries)})

    def _controls(self, index: int, size: int, victim: str, observer: str, sent: BuiltPrompt) -> Iterator[Trial]:
        empty = {"victim": victim, "observer": observer, "stale": [], "stale_text": ""}
        for instruction in (False, True):
            for temperature, seed in CONTROL_DECODINGS:
                condition = Condition(size, "", "zeroed", instruction, temperature, seed)
                decoding = self._start(self.zero_pages[:size], size, instruction, condition, index)
                yield Trial(f"r{index}-{condition.label}-s{seed}", condition, decoding, sent.text,
                            {**empty, "own": canary_list(sent.canaries)})
        own = self.build(observer, f"reallm-{index}-own-{size}", size * PAGE, ASKED["quote"], 2000 + index)
        ids = self.chat_ids(own.text)
        pages = self.own_pages[size]
        logits = self.prefill(ids, pages)
        for temperature, seed in CONTROL_DECODINGS:
            condition = Condition(size, "", "own_pages", True, temperature, seed)
            sampling = self._sampling(condition, index)
            kv = RequestKV(self.store, pages + self.scratch, len(ids), write_through=False)
            decoding = Decoding(kv, sample(logits, sampling, 0), sampling, self.max_tokens)
            yield Trial(f"r{index}-{condition.label}-s{seed}", condition, decoding, own.text,
                        {**empty, "own": canary_list(own.canaries)})

    def _sampling(self, condition: Condition, index: int) -> Sampling:
        return Sampling(condition.temperature, 1.0, 7919 * index + condition.seed)

    def _start(self, table: list[int], size: int, instruction: bool, condition: Condition, index: int) -> Decoding:
        """The incident's decode: the placeholder at position 0, the stale positions up to `size` pages as
        they are, then (optionally) the observer's request as a turn; the first token from the last logits.
        Writes stay in this answer's private copy, so every condition sees the same stale pages."""
        kv = RequestKV(self.store, table + self.scratch, 0, write_through=False)
        logits = self.model.forward(torch.tensor([PLACEHOLDER_TOKEN]), kv)
        kv.length = size * PAGE
        if instruction:
            logits = self.model.forward(torch.tensor(self.instruction_ids), kv)
        sampling = self._sampling(condition, index)
        return Decoding(kv, sample(logits, sampling, 0), sampling, self.max_tokens)

    def _decode_group(self, trials: list[Trial]) -> Iterator[Trial]:
        started = time.monotonic()
        active = [t for t in trials if not t.decoding.done]
        while active:
            logits = self.model.forward_batch([(torch.tensor([t.decoding.next]), t.decoding.kv) for t in active])
            for trial, row in zip(active, logits, strict=True):
                trial.decoding.take(row)
            active = [t for t in active if not t.decoding.done]
        share = (time.monotonic() - started) / len(trials)
        for trial in trials:
            trial.truth["seconds"] = round(share, 2)
            yield trial


def canary_tokens(vocab: GemmaVocabulary, built: BuiltPrompt) -> dict[str, tuple[Canary, set[int]]]:
    """For each canary of a prompt, the token positions (slots) that carry it in the chat-rendered prompt."""
    rendered = vocab.render_chat([Message(role="user", content=built.text)])
    offsets = vocab.tokenizer.encode(rendered, add_special_tokens=False).offsets
    out: dict[str, tuple[Canary, set[int]]] = {}
    for canary in built.canaries:
        at = rendered.find(canary.text)
        if at < 0:
            continue
        end = at + len(canary.text)
        out[canary.id] = (canary, {i for i, (a, b) in enumerate(offsets) if a < end and b > at})
    return out


def canary_list(canaries: Sequence[Canary]) -> list[dict[str, Any]]:
    return [{"id": c.id, "kind": c.kind.value, "text": c.text, "values": list(c.values)} for c in canaries]


_WORD = re.compile(r"[\w'-]+")


def _runs(text: str, length: int) -> set[tuple[str, ...]]:
    words = [w.lower() for w in _WORD.findall(text)]
    return {tuple(words[i : i + length]) for i in range(len(words) - length + 1)}


def material(answer: str, truth: dict[str, Any], prompt: str) -> dict[str, bool]:
    """Victim material in an answer, by string facts alone (knows nothing of the detectors)."""
    upper = answer.upper()
    tokens = [c for c in truth["stale"] if c["kind"] == CanaryKind.TOKEN.value]
    facts = [c for c in truth["stale"] if c["kind"] == CanaryKind.FACT.value]
    group = any(g in upper for c in tokens for g in c["text"].split("-")[1:] if len(g) == 8)
    lower = answer.lower()
    value = any(re.search(rf"\b{re.escape(v.lower())}\b", lower) for c in facts for v in c["values"] if len(v) >= 4)
    runs = _runs(answer, RUN_WORDS) & _runs(truth["stale_text"], RUN_WORDS)
    verbatim = bool(runs - _runs(prompt, RUN_WORDS))
    # A fact retold with its made-up one-word name alone (a place, a pet) and nothing else of the victim's.
    words = {v.lower() for c in facts for v in c["values"] if v.isalpha() and len(v) >= 8}
    named = any(re.search(rf"\b{re.escape(w)}\b", lower) for w in words)
    others = any(re.search(rf"\b{re.escape(v.lower())}\b", lower) for c in facts for v in c["values"]
                 if len(v) >= 4 and v.lower() not in words)
    return {"token_group": group, "fact_value": value, "verbatim_run": verbatim,
            "name_only": named and not group and not others}


def summarize(rows: list[tuple[Condition, dict[str, bool], float]], *axes: str) -> None:
    """Share of answers with victim material per condition, pooled over the axes not named."""
    by: dict[str, list[tuple[dict[str, bool], float]]] = defaultdict(list)
    for condition, found, seconds in rows:
        by[condition.group(*axes)].append((found, seconds))
    head = " / ".join(axes)
    print(f"\n{head:<32} {'answers':>7} {'material':>8} {'token':>6} {'fact':>5} {'run':>5} {'s/answer':>8}")
    for group in sorted(by):
        items = by[group]
        shares = {key: sum(f[key] for f, _ in items) / len(items) for key in ("token_group", "fact_value",
                                                                              "verbatim_run")}
        anything = sum(any(f.values()) for f, _ in items) / len(items)
        print(f"{group:<32} {len(items):>7} {anything:>8.2f} {shares['token_group']:>6.2f} "
              f"{shares['fact_value']:>5.2f} {shares['verbatim_run']:>5.2f} "
              f"{statistics.median(s for _, s in items):>8.2f}")


def report(rows: list[tuple[Condition, dict[str, bool], float]]) -> None:
    for axes in (("kind", "pages"), ("kind", "decoding"), ("kind", "instruction")):
        summarize(rows, *axes)


def summary(args: argparse.Namespace) -> None:
    """The same tables over a whole corpus (every run that added to it)."""
    answers = {}
    with (args.out / "answers.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            item = json.loads(line)
            answers[item["id"]] = item
    rows = []
    with (args.out / "truth.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            truth = json.loads(line)
            answer = answers[truth["id"]]
            rows.append((Condition(**truth["condition"]), material(answer["text"], truth, answer["prompt"]),
                         float(truth["seconds"])))
    print(f"{len(rows)} answers in {args.out}")
    report(rows)


def generate(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    corpus = Corpus(args.out, args.max_tokens)
    answers_path, truth_path = args.out / "answers.jsonl", args.out / "truth.jsonl"
    rows: list[tuple[Condition, dict[str, bool], float]] = []
    started = time.monotonic()
    mode = "a" if args.first else "w"  # --first adds victims to an existing corpus
    with answers_path.open(mode, encoding="utf-8") as answers, truth_path.open(mode, encoding="utf-8") as truths:
        for index in range(args.first, args.first + args.victims):
            victim, observer = ("tenant-a", "tenant-b") if index % 2 == 0 else ("tenant-b", "tenant-a")
            for trial in corpus.round(index, victim, observer):
                text = corpus.vocab.decode(trial.decoding.tokens)
                answers.write(json.dumps({"id": trial.id, "tenant": observer, "text": text,
                                          "prompt": trial.prompt}, ensure_ascii=False) + "\n")
                finish = "length" if trial.decoding.truncated else "stop"
                truths.write(json.dumps({"id": trial.id, "condition": asdict(trial.condition),
                                         "label": trial.condition.label, **trial.truth,
                                         "tokens": len(trial.decoding.tokens), "finish": finish},
                                        ensure_ascii=False) + "\n")
                rows.append((trial.condition, material(text, trial.truth, trial.prompt), trial.truth["seconds"]))
            answers.flush()
            truths.flush()
            print(f"victim {index} done: {len(rows)} answers, {time.monotonic() - started:.0f} s", flush=True)
    rate = sum(corpus.prefill_tokens) / sum(corpus.prefill_seconds)
    print(f"\nprefill {rate:.0f} tokens/s over {len(corpus.prefill_tokens)} prompts; "
          f"{len(rows)} answers in {time.monotonic() - started:.0f} s "
          f"({(time.monotonic() - started) / max(1, len(rows)):.1f} s per answer, prefills included)")
    report(rows)
    print(f"\ncorpus: {answers_path} (scan it with --ledger {args.out / 'ledger.sqlite'}), truth: {truth_path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    default_out = cache_root() / "reallm-corpus"
    tables = commands.add_parser("summary", help="victim material per condition over a whole corpus")
    tables.add_argument("--out", type=Path, default=default_out)
    tables.set_defaults(run=summary)
    gen = commands.add_parser("generate", help="decode answers over stale pages into a corpus")
    gen.add_argument("--out", type=Path, default=default_out)
    gen.add_argument("--victims", type=int, default=6, help="victim prompts (54 answers each)")
    gen.add_argument("--first", type=int, default=0, help="index of the first victim (to add to a corpus)")
    gen.add_argument("--max-tokens", type=int, default=80)
    gen.add_argument("--threads", type=int, default=1)
    gen.set_defaults(run=generate)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
