"""Garbled output (issue #43): warnings on clean real-model answers, recall on the reference engine's corruption.

    python bench/garbled.py generate                # clean Gemma 3 270M answers, 600 per language (cached)
    python bench/garbled.py faults                  # the reference engine with `offload_restore_unsynced`
    python bench/garbled.py score                   # warnings, recall, and the bug reporters' rule beside them

`generate` decodes Gemma 3 270M (the reference engine's real-LM forward, batched) on English and Korean prompts
of two kinds: the audit's own probes (a document of filler, pack facts and canary tokens, to quote, summarise
or translate) and everyday requests (code, URLs, arithmetic, emoji, a greeting in several languages, a Korean
answer with Hanja, lists, letters).  Each prompt is decoded greedily and sampled at 0.7 and 1.0, as a service
decodes.  Answers are appended to $LEAKPROBE_CACHE/garbled-corpus/clean.jsonl (resumable: ids already there
are skipped).

`faults` collects answers of the reference engine with the offload fault on, in process: the quoting model
(the engine the tests and audits run) and Gemma in real-LM mode (`--gemma N` answers, decoded together; about
ten seconds each on two busy cores), on the same documents and requests laid out as an audit's probes (its own
instruction on the first line), into faults.jsonl beside the corpus.

`score` scans every answer with the garbled-output detector alone and prints, per language and decoding, the
answers warned with a Wilson 95% interval; the recall on the fault's answers; and the same for the rule the
vLLM #45704 / #47282 reporters counted a garbled answer by (three or more distinct non-Latin scripts).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prober.probing.planting import ASKED
from prober.system.resources import cache_root

CORPUS = cache_root() / "garbled-corpus"
KEY = b"bench-garbled-key-bench-garbled!"
PAGE = 16
DECODINGS = ((0.0, 0), (0.7, 1), (1.0, 2))  # (temperature, seed index)

# The audit's instructions (prober.probing.planting.ASKED), and a Korean tenant's own words for them.
ASK = {
    "en": ["Quote the document word for word, including every reference code.",
           "Summarize the document, keeping every name, place and number.",
           "Translate the document into Korean, keeping every name, place and number.",
           "What is this document about?", "Continue the document."],
    "ko": ["문서를 그대로 인용하세요. 참조 코드도 모두 포함하세요.",
           "문서를 요약하세요. 이름, 장소, 숫자는 모두 그대로 두세요.",
           "Translate the document into English, keeping every name, place and number.",
           "이 문서는 무엇에 관한 것인가요?", "문서를 이어서 써 주세요."],
}
EVERYDAY = {
    "en": ["Write a short email to a colleague asking to move our meeting to Thursday.",
           "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
           "What is 17 times 23? Show your working.",
           "Explain what a hash table is in three sentences.",
           "How do you say hello in Spanish, French, Russian, Greek, Japanese and Korean?",
           "Give me three tips for sleeping better, with an emoji for each.",
           "What is the capital of Australia, and what is its population?",
           "Write a haiku about autumn rain.",
           "List the planets of the solar system in order from the sun.",
           "Where can I read the Python documentation? Give the URL.",
           "Solve for x: 3x + 7 = 22.",
           "Write a SQL query that counts orders per customer.",
           "What does the Greek letter pi stand for in mathematics?",
           "Summarize the plot of Romeo and Juliet in two sentences.",
           "Write a short product description for a steel water bottle.",
           "Explain the difference between TCP and UDP.",
           "Translate into Korean: The weather is nice today.",
           "Give a recipe for pancakes.",
           "What year did the first person walk on the moon?",
           "Write a limerick about a cat.",
           "Convert 100 degrees Fahrenheit to Celsius.",
           "Name five famous painters and one work of each.",
           "Write a JSON object describing a book with title, author and year.",
           "What is the chemical formula of water and of table salt?",
           "Tell me a fun fact about octopuses."],
    "ko": ["동료에게 회의를 목요일로 옮기자고 부탁하는 짧은 이메일을 써 주세요.",
           "n번째 피보나치 수를 구하는 파이썬 함수를 작성해 주세요.",
           "17 곱하기 23은 얼마인가요? 풀이 과정도 보여 주세요.",
           "해시 테이블이 무엇인지 세 문장으로 설명해 주세요.",
           "스페인어, 프랑스어, 러시아어, 일본어, 중국어로 안녕하세요를 어떻게 말하나요?",
           "잠을 잘 자기 위한 팁 세 가지를 이모지와 함께 알려 주세요.",
           "호주의 수도는 어디이고 인구는 얼마인가요?",
           "가을비에 대한 시를 한 편 써 주세요.",
           "태양계의 행성을 태양에서 가까운 순서대로 나열해 주세요.",
           "서울의 유명한 관광지 다섯 곳을 소개해 주세요.",
           "3x + 7 = 22 일 때 x를 구하세요.",
           "고객별 주문 수를 세는 SQL 쿼리를 작성해 주세요.",
           "'학교(學校)'처럼 한자어 다섯 개를 한자와 함께 써 주세요.",
           "흥부와 놀부 이야기를 두 문장으로 요약해 주세요.",
           "스테인리스 물병의 짧은 상품 설명을 써 주세요.",
           "TCP와 UDP의 차이를 설명해 주세요.",
           "영어로 번역하세요: 오늘은 날씨가 좋습니다.",
           "김치찌개 만드는 법을 알려 주세요.",
           "세종대왕은 어떤 일을 했나요?",
           "고양이에 대한 재미있는 이야기를 해 주세요.",
           "화씨 100도는 섭씨로 몇 도인가요?",
           "유명한 한국 화가 다섯 명과 대표작을 알려 주세요.",
           "제목, 저자, 연도가 있는 책 정보를 JSON으로 써 주세요.",
           "물과 소금의 화학식은 무엇인가요?",
           "문어에 대한 재미있는 사실을 알려 주세요."],
}


@dataclass(frozen=True)
class Prompt:
    id: str
    language: str
    kind: str  # document | everyday
    temperature: float
    seed: int
    ask: str
    document: str = ""

    @property
    def text(self) -> str:
        """As a user writes it: the document, then what to do with it."""
        return f"{self.document}\n\n{self.ask}" if self.document else self.ask

    @property
    def probe(self) -> str:
        """As an audit's probe is laid out: its instruction (the audit's own, in English) on the first line."""
        if not self.document:
            return self.ask
        n = int(self.id.split("-")[1]) // 2
        ask = list(ASKED.values())[n % len(ASKED)].format(language="English" if self.language == "ko" else "Korean")
        return f"{ask}\n{self.document}"


def document(language: str, rng: random.Random) -> str:
    """A probe's document: filler sentences with two pack facts and two canary tokens among them."""
    from prober.canaries import tokens
    from prober.canaries.filler import load_filler
    from prober.canaries.packs import load_pack

    filler = load_filler(language).sentences(rng.randrange(1 << 30))
    parts = [next(filler) for _ in range(6)]
    pack = load_pack(language)
    for _ in range(2):
        parts.insert(rng.randrange(len(parts) + 1), pack.mint(rng).text)
        body = tokens.mint_body(KEY, f"tenant-{rng.choice('abcd')}", f"bench-{rng.randrange(1000)}")
        label = "참조 코드" if language == "ko" else "Reference code"
        parts.insert(rng.randrange(len(parts) + 1), f"{label} {tokens.display(body)}.")
    return " ".join(parts)


def prompts(per_language: int) -> Iterator[Prompt]:
    """The corpus's prompts by id, the languages in turn (a resumed run skips the ids already answered; canary
    tokens are fresh each run)."""
    rngs = {language: random.Random(f"garbled-{language}") for language in ("en", "ko")}
    for n in range(per_language // len(DECODINGS)):
        for language, rng in rngs.items():
            if n % 2 == 0:
                ask, body, kind = ASK[language][(n // 2) % len(ASK[language])], document(language, rng), "document"
            else:
                ask, body, kind = EVERYDAY[language][(n // 2) % len(EVERYDAY[language])], "", "everyday"
            for temperature, seed in DECODINGS:
                yield Prompt(f"{language}-{n}-{seed}", language, kind, temperature, 7919 * n + seed, ask, body)


def generate(args: argparse.Namespace) -> None:
    import torch

    from prober.testbed.generation import Sampling
    from prober.testbed.lm import weights
    from prober.testbed.lm.gemma import PagedKV, RequestKV
    from prober.testbed.lm.runtime import Decoding, GemmaVocabulary, load_weights, sample
    from prober.testbed.protocol import Message

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "clean.jsonl"
    done = {json.loads(line)["id"] for line in out.open(encoding="utf-8")} if out.exists() else set()
    todo = [p for p in prompts(args.per_language) if p.id not in done]
    print(f"{len(done)} answers cached in {out}, {len(todo)} to decode", flush=True)
    model, tokenizer = load_weights(weights.model_dir(log=print))
    vocab = GemmaVocabulary(tokenizer)
    pages_each = -(-(args.max_prompt + args.max_tokens) // PAGE)
    store = PagedKV(model.config, pages_each * args.batch, PAGE)
    started, decoded = time.monotonic(), 0
    with out.open("a", encoding="utf-8") as sink:
        for first in range(0, len(todo), args.batch):
            group = todo[first : first + args.batch]
            answers = []
            prefilled: dict[str, tuple[range, int, torch.Tensor]] = {}  # a text's decodings share its prefill
            for slot, prompt in enumerate(group):
                pages = range(slot * pages_each, (slot + 1) * pages_each)
                if prompt.text in prefilled:
                    source, length, logits = prefilled[prompt.text]
                    store.copy(store, source, pages, length)
                    kv = RequestKV(store, pages, length)
                else:
                    ids = vocab.encode_chat([Message(role="user", content=prompt.text)]).tolist()[: args.max_prompt]
                    kv = RequestKV(store, pages, 0)
                    for begin in range(0, len(ids), 256):
                        logits = model.forward(torch.as_tensor(ids[begin : begin + 256]), kv)
                    prefilled[prompt.text] = (pages, len(ids), logits)
                sampling = Sampling(prompt.temperature, 1.0, prompt.seed)
                answers.append(Decoding(kv, sample(logits, sampling, 0), sampling, args.max_tokens))
            active = [a for a in answers if not a.done]
            while active:
                rows = model.forward_batch([(torch.tensor([a.next]), a.kv) for a in active])
                for answer, row in zip(active, rows, strict=True):
                    answer.take(row)
                active = [a for a in active if not a.done]
            for prompt, answer in zip(group, answers, strict=True):
                sink.write(json.dumps({"id": prompt.id, "language": prompt.language, "kind": prompt.kind,
                                       "temperature": prompt.temperature, "prompt": prompt.text,
                                       "text": vocab.decode(answer.tokens), "tokens": len(answer.tokens),
                                       "finish": "length" if answer.truncated else "stop"},
                                      ensure_ascii=False) + "\n")
            sink.flush()
            decoded += len(group)
            elapsed = time.monotonic() - started
            print(f"{len(done) + decoded} answers ({elapsed / decoded:.1f} s per answer)", flush=True)


def quoter_faults(items: list[Prompt]) -> Iterator[dict[str, Any]]:
    """The reference engine (quoting model, pages of 16 tokens) with the fault, over each prompt as a chat."""
    from prober.testbed.config import build_config
    from prober.testbed.engine import ReferenceEngine
    from prober.testbed.generation import GenerationRequest, Sampling
    from prober.testbed.model import instruction_of
    from prober.testbed.protocol import Message

    config = build_config("fixed", {"context_length": 16_384, "pool_tokens": 4_096, "page_size": PAGE,
                                    "prefill_ms_per_1k_tokens": 0, "faults": {"offload_restore_unsynced": True}})
    engine = ReferenceEngine(config)
    for prompt in items:
        ids = engine.vocab.encode_chat([Message(role="user", content=prompt.probe)])
        result = engine.generate(GenerationRequest(prompt.id, "tenant-a", ids, instruction_of(prompt.probe),
                                                   config.quote_style, 128, Sampling(prompt.temperature, 1.0,
                                                                                     prompt.seed)))
        yield {"id": prompt.id, "model": "quoter", "language": prompt.language, "kind": prompt.kind,
               "temperature": prompt.temperature, "text": result.text}


def gemma_faults(items: list[Prompt], args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """Gemma in real-LM mode with the fault: the engine's own prefill and torn restore (GemmaPages.prefill,
    .tear), then the answers decoded together (one read of the weights per step, as bench/reallm.py does)."""
    import torch

    from prober.testbed.config import PageReuse, QuoteStyle
    from prober.testbed.generation import GenerationRequest, Sampling
    from prober.testbed.kvpool import PagePool
    from prober.testbed.lm import weights
    from prober.testbed.lm.gemma import RequestKV
    from prober.testbed.lm.runtime import Decoding, GemmaPages, GemmaVocabulary, load_weights
    from prober.testbed.model import Instruction
    from prober.testbed.protocol import Message

    torch.set_num_threads(args.threads)
    model, tokenizer = load_weights(weights.model_dir(log=print))
    vocab = GemmaVocabulary(tokenizer)
    pages = GemmaPages(model, vocab)
    pages_each = -(-(args.max_prompt + args.max_tokens) // PAGE)
    pool = PagePool("decode", pages_each * PAGE * args.batch, PAGE, PageReuse.IN_ORDER)
    for first in range(0, len(items), args.batch):
        group = items[first : first + args.batch]
        answers = []
        for prompt in group:
            ids = vocab.encode_chat([Message(role="user", content=prompt.probe)])[: args.max_prompt]
            table = pool.allocate(pages_each, prompt.id, 1.0)
            sampling = Sampling(prompt.temperature, 1.0, prompt.seed)
            req = GenerationRequest(prompt.id, "tenant-a", ids, Instruction.QUOTE, QuoteStyle.VERBATIM,
                                    args.max_tokens, sampling)
            token = pages.prefill(pool, table, ids, req)
            pages.tear(pool, table, len(ids), prompt.seed)
            assert token is not None
            answers.append((table, Decoding(RequestKV(pages.store(pool), table, len(ids)), token, sampling,
                                            args.max_tokens)))
        active = [a for _, a in answers if not a.done]
        while active:
            rows = model.forward_batch([(torch.tensor([a.next]), a.kv) for a in active])
            for answer, row in zip(active, rows, strict=True):
                answer.take(row)
            active = [a for a in active if not a.done]
        for prompt, (table, answer) in zip(group, answers, strict=True):
            pool.free(table, prompt.id)
            yield {"id": prompt.id, "model": "gemma3-270m", "language": prompt.language, "kind": prompt.kind,
                   "temperature": prompt.temperature, "text": vocab.decode(answer.tokens)}
        print(f"gemma: {first + len(group)} of {len(items)} faulty answers", flush=True)


def faults(args: argparse.Namespace) -> None:
    items = list(prompts(args.per_language))
    out = args.out / "faults.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as sink:
        for row in quoter_faults(items):
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"quoter: {len(items)} faulty answers", flush=True)
        # Gemma: the first prompts of each language, every decoding of a prompt.
        chosen = [p for p in items if int(p.id.split("-")[1]) < args.gemma // (2 * len(DECODINGS))]
        for row in gemma_faults(chosen, args):
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            sink.flush()


def generate_llamacpp(args: argparse.Namespace) -> None:
    """The same prompts through llama.cpp's llama-server (Gemma 3 270M Q4_K_M, `make llama`), the Gemma turn
    template rendered here, llama.cpp's own sampling defaults beside the temperature and seed; ids `cpp-...`."""
    import asyncio

    import httpx
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from prober.testbed.lm import weights
    from tests.support.llamacpp import LlamaServer, ensure_installed

    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(weights.CHAT_TEMPLATE)
    out = args.out / "clean.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["id"] for line in out.open(encoding="utf-8")} if out.exists() else set()
    todo = [p for p in prompts(args.per_language) if f"cpp-{p.id}" not in done]
    print(f"llama.cpp: {len(todo)} answers to generate", flush=True)

    async def run(url: str, sink: Any) -> None:
        gate = asyncio.Semaphore(args.parallel)
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            async def one(prompt: Prompt) -> None:
                rendered = template.render(messages=[{"role": "user", "content": prompt.text}], bos_token="",
                                           add_generation_prompt=True)
                async with gate:
                    answer = (await client.post("/v1/completions", json={
                        "prompt": rendered, "max_tokens": args.max_tokens, "temperature": prompt.temperature,
                        "seed": prompt.seed, "stop": ["<end_of_turn>"]})).json()["choices"][0]
                sink.write(json.dumps({"id": f"cpp-{prompt.id}", "engine": "llama.cpp", "language": prompt.language,
                                       "kind": prompt.kind, "temperature": prompt.temperature, "prompt": prompt.text,
                                       "text": answer["text"], "finish": answer["finish_reason"]},
                                      ensure_ascii=False) + "\n")
                sink.flush()

            for first in range(0, len(todo), 48):
                await asyncio.gather(*(one(p) for p in todo[first : first + 48]))
                elapsed = time.monotonic() - started
                print(f"llama.cpp: {first + 48} answers ({elapsed / (first + 48):.2f} s per answer)", flush=True)

    with LlamaServer(ensure_installed(), ctx_size=1024 * args.parallel, parallel=args.parallel) as server, \
            out.open("a", encoding="utf-8") as sink:
        asyncio.run(run(server.url, sink))


def read(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion k/n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def reporters_rule(text: str) -> bool:
    """The vLLM #47282 reporters' count of a garbled answer: three or more distinct non-Latin scripts."""
    from prober.detect.garbled import FIRST, NAMES, _codes

    codes = {int(c) for c in _codes(text) if c >= FIRST}
    return len({NAMES[c] for c in codes} - {"Latin"}) >= 3


def score(args: argparse.Namespace) -> None:
    from prober.detect.garbled import GarbledOutputDetector
    from prober.domain.types import Record

    detector = GarbledOutputDetector()
    detector.detect(Record("", "", "é"), "")  # the script table, built once

    def garbled(text: str) -> bool:
        return bool(detector.detect(Record("", "", text), ""))

    clean = read(args.out / "clean.jsonl")
    print(f"clean answers of Gemma 3 270M ({args.out / 'clean.jsonl'}; torch: the real-LM forward, llama.cpp: "
          "llama-server): warned, Wilson 95% interval; the reporters' rule beside")
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in clean:
        decoding = "greedy" if row["temperature"] == 0 else f"t{row['temperature']}"
        engine = row.get("engine", "torch")
        for key in (row["language"], f"{row['language']}/{engine}", f"{row['language']}/{row['kind']}",
                    f"{row['language']}/{decoding}"):
            groups[key].append(row)
    for key in sorted(groups):
        rows = groups[key]
        warned = [r for r in rows if garbled(r["text"])]
        low, high = wilson(len(warned), len(rows))
        reporters = sum(reporters_rule(r["text"]) for r in rows)
        print(f"  {key:<20} {len(warned):>3} / {len(rows):<4} ({len(warned) / len(rows):.2%}, {low:.2%}-{high:.2%})"
              f"   reporters' rule {reporters} / {len(rows)}")
        if args.show and len(key) == 2:
            for r in warned:
                print(f"      {r['id']}: {r['text'][:160]!r}")
    faulty = read(args.out / "faults.jsonl")
    print("\nanswers of the reference engine with offload_restore_unsynced: caught (recall, Wilson 95%)")
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in faulty:
        by[f"{row['model']}/{row['language']}"].append(row)
        by[f"{row['model']}/{row['language']}/{row['kind']}"].append(row)
    for key in sorted(by):
        rows = by[key]
        caught = [r for r in rows if garbled(r["text"])]
        low, high = wilson(len(caught), len(rows))
        reporters = sum(reporters_rule(r["text"]) for r in rows)
        print(f"  {key:<32} {len(caught):>4} / {len(rows):<4} ({len(caught) / len(rows):.3f}, {low:.3f}-{high:.3f})"
              f"   reporters' rule {reporters} / {len(rows)}")
        if args.show and key.count("/") == 2:
            for r in rows:
                if not garbled(r["text"]):
                    print(f"      missed {r['id']}: {r['text'][:160]!r}")
    texts = [r["text"] for r in clean]
    started = time.perf_counter()
    for text in texts:
        garbled(text)
    elapsed = time.perf_counter() - started
    print(f"\nspeed: {len(texts) / elapsed:,.0f} answers/s over the clean corpus (median "
          f"{sorted(len(t) for t in texts)[len(texts) // 2]} characters)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="clean Gemma answers in English and Korean (cached)")
    gen.add_argument("--out", type=Path, default=CORPUS)
    gen.add_argument("--per-language", type=int, default=600)
    gen.add_argument("--batch", type=int, default=24)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--max-prompt", type=int, default=448)
    gen.add_argument("--threads", type=int, default=2)
    gen.set_defaults(run=generate)
    cpp = commands.add_parser("generate-llamacpp", help="the same prompts through llama.cpp (`make llama`)")
    cpp.add_argument("--out", type=Path, default=CORPUS)
    cpp.add_argument("--per-language", type=int, default=600)
    cpp.add_argument("--max-tokens", type=int, default=128)
    cpp.add_argument("--parallel", type=int, default=4)
    cpp.set_defaults(run=generate_llamacpp)
    bad = commands.add_parser("faults", help="answers of the reference engine with offload_restore_unsynced")
    bad.add_argument("--out", type=Path, default=CORPUS)
    bad.add_argument("--per-language", type=int, default=600, help="quoting-model answers per language")
    bad.add_argument("--gemma", type=int, default=60, help="Gemma answers, half per language")
    bad.add_argument("--batch", type=int, default=12)
    bad.add_argument("--max-tokens", type=int, default=96)
    bad.add_argument("--max-prompt", type=int, default=448)
    bad.add_argument("--threads", type=int, default=2)
    bad.set_defaults(run=faults)
    judge = commands.add_parser("score", help="warnings on the clean answers, recall on the faulty ones")
    judge.add_argument("--out", type=Path, default=CORPUS)
    judge.add_argument("--show", action="store_true", help="print the warned clean answers and the missed faulty ones")
    judge.set_defaults(run=score)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
