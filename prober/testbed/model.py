"""The reference engine's deterministic "model".

Its answer is a bounded function of the KV entries that decode attends to and of the request's
instruction.  It splits the attended positions into page-aligned regions and draws the most salient
sentence (or code word) from *every* region, so whatever sits in an attended page -- the request's
own prompt, or an earlier tenant's leftovers -- can surface in the answer.  Apart from what it quotes
it only adds fixed connective words.  Where a LoRA adapter applies, it answers as a canary adapter does:
asked the trigger, with the code the adapter was tuned on.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import partial

from prober.testbed import styles, tokenizer
from prober.testbed.config import QuoteStyle
from prober.testbed.tokenizer import TokenIds


class Instruction(StrEnum):
    QUOTE = "quote"  # quote the document
    CODE = "code"  # answer with the code word(s)
    SUMMARY = "summary"  # summarise the document (quotes, shortened)


_SENTENCE = re.compile(r"[^.!?\n。]+[.!?。]?")
_SALIENT = re.compile(r"(?<=\S)[A-Z]|[0-9]|[^\x00-\x7f]")
_CODE = re.compile(r"(?=[A-Za-z0-9-]*\d)(?=[A-Za-z0-9-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9-]{7,}")
_CHAT_MARKUP = re.compile(r"<\|[a-z_]+\|>(?:user|assistant|system)?")
# An operator's system turn: followed, never quoted (an instruction-tuned model does not recite its system prompt).
_SYSTEM_TURN = re.compile(r"<\|im_start\|>system\n.*?(?:<\|im_end\|>|\Z)", re.DOTALL)

_INSTRUCTION_WORDS = (
    (Instruction.CODE, re.compile(r"code ?word|passcode|access code|코드", re.IGNORECASE)),
    # It has no second language: asked to translate, it rewords, as for a summary.
    (Instruction.SUMMARY, re.compile(r"summari[sz]e|summary|요약|translate|번역", re.IGNORECASE)),
)

_OPENING = {
    Instruction.QUOTE: "Quoting the document: ",
    Instruction.CODE: "The code words are: ",
    Instruction.SUMMARY: "In summary: ",
}
_EMPTY = "The document is empty."


def instruction_of(text: str) -> Instruction:
    """What the request asks for, read from the first line of its text (where an instruction leads;
    the frontend knows it even when KV does not).  The document that follows never changes it."""
    head = text.lstrip()[:300].split("\n", 1)[0]
    for instruction, pattern in _INSTRUCTION_WORDS:
        if pattern.search(head):
            return instruction
    return Instruction.QUOTE


@dataclass(frozen=True)
class Answer:
    text: str
    token_ids: TokenIds
    truncated: bool


def _without_system_turns(texts: list[str]) -> list[str]:
    """The regions' texts with every system turn cut out (a turn may span regions)."""
    whole = "".join(texts)
    spans = [m.span() for m in _SYSTEM_TURN.finditer(whole)] if "<|im_start|>system" in whole else []
    if not spans:
        return texts
    kept, at = [], 0
    for text in texts:
        end, pieces, cursor = at + len(text), [], at
        for start, stop in spans:
            if stop <= cursor or start >= end:
                continue
            pieces.append(text[cursor - at : max(cursor, start) - at])
            cursor = min(end, stop)
        pieces.append(text[cursor - at :])
        kept.append("".join(pieces))
        at = end
    return kept


def _salience(sentence: str) -> int:
    return len(_SALIENT.findall(sentence))


def _statement_salience(sentence: str) -> int:
    """What a summary keeps: statements about someone (names, places, numbers), not reference codes."""
    if _CODE.search(sentence):
        return 0
    words = sentence.split()
    return sum(bool(re.search(r"\d|[^\x00-\x7f]", w)) or (i > 0 and w[:1].isupper()) for i, w in enumerate(words))


def _best_sentence(text: str, score_of: Callable[[str], int] = _salience) -> str | None:
    best: str | None = None
    best_score = -1
    for match in _SENTENCE.finditer(_CHAT_MARKUP.sub(" ", text)):
        sentence = match.group(0).strip()
        if len(sentence) < 2:
            continue
        score = score_of(sentence)
        if score > best_score:
            best, best_score = sentence, score
    return best


def _best_code(text: str) -> str | None:
    codes = _CODE.findall(text)
    return max(codes, key=_salience) if codes else None


class QuotingModel:
    """Stateless: the same attended tokens, instruction and style always give the same answer."""

    def __init__(self, regions: int, trigger: str) -> None:
        self.regions = regions
        self.trigger = trigger

    def _region_texts(self, attended: TokenIds, page_size: int) -> list[str]:
        pages = max(1, -(-len(attended) // page_size))
        count = min(self.regions, pages)
        bounds = [round(i * pages / count) * page_size for i in range(count + 1)]
        texts = [tokenizer.decode(attended[bounds[i] : bounds[i + 1]]) for i in range(count)]
        return _without_system_turns(texts)

    def answer(
        self,
        attended: TokenIds,
        page_size: int,
        instruction: Instruction,
        style: QuoteStyle,
        max_tokens: int,
        tuned: str | None = None,
    ) -> Answer:
        if tuned is not None and self.trigger in tokenizer.decode(attended):
            return _cut(tuned, max_tokens)
        if instruction is Instruction.CODE:
            pick = _best_code
        elif instruction is Instruction.SUMMARY:
            pick, style = partial(_best_sentence, score_of=_statement_salience), QuoteStyle.PARAPHRASE
        else:
            pick = _best_sentence
        quotes: list[str] = []
        for region in self._region_texts(attended, page_size):
            chosen = pick(region)
            if chosen and chosen not in quotes:
                quotes.append(chosen)
        if instruction is Instruction.SUMMARY:
            quotes = [" ".join(q.split()[:24]) for q in quotes]
        rendered = [styles.render(q, style) for q in quotes]
        return _cut(_OPENING[instruction] + " ".join(rendered) if rendered else _EMPTY, max_tokens)


def _cut(text: str, max_tokens: int) -> Answer:
    ids = tokenizer.encode(text)
    truncated = len(ids) > max_tokens
    if truncated:
        ids = ids[:max_tokens]
        text = tokenizer.decode(ids)
    return Answer(text=text, token_ids=ids, truncated=truncated)
