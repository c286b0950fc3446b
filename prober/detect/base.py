"""What every detector shares: the canary set it searches for, the hit it reports, and what a sentence is."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from prober.canaries import tokens
from prober.canaries.compact import compact
from prober.canaries.hangul import NOUN_ENDINGS, is_hangul
from prober.canaries.tokens import VerifiedToken
from prober.domain.evidence import Evidence
from prober.domain.types import Canary, CanaryKind, DetectorName, FindingKind, Record, Severity

SENTENCE_ENDS = ".!?。\n"
BATCH = 256  # answers a scanner hands each detector at once (`Detector.detect_many`); `Recent` keeps as many.
# 256, not 64: the pieces' numpy search is paid per batch (scans 8% faster); the semantic pass the same or faster
T = TypeVar("T")


def sentence_around(text: str, start: int, end: int) -> tuple[int, int]:
    """The span of the sentence (or run of sentences) holding text[start:end], its terminator included."""
    first = max(text.rfind(t, 0, start) for t in SENTENCE_ENDS) + 1
    ends = [i for i in (text.find(t, end) for t in SENTENCE_ENDS) if i >= 0]
    return first, (min(ends) + 1 if ends else len(text))


def whole_word(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] is not part of a longer word: nothing alphanumeric just before it, and
    after it no letter of the same script (Latin) or digit (numbers) -- a Korean particle may follow a Korean
    word, but no other syllable."""
    if start > 0 and text[start - 1].isalnum():
        return False
    if end >= len(text) or not text[end].isalnum():
        return True
    last, after = text[end - 1], text[end]
    if last.isdigit() or after.isdigit():
        return not (last.isdigit() and after.isdigit())
    if is_hangul(last) and is_hangul(after):
        return after in NOUN_ENDINGS
    return not (last.isascii() and after.isascii())


@dataclass(frozen=True)
class Hit:
    """Something in one answer that a detector recognised, with its span in the original text."""

    detector: DetectorName
    score: float  # 0..1, how sure the detector is
    start: int
    end: int
    canary: Canary | None = None  # a canary of this ledger
    verified: VerifiedToken | None = None  # a MAC-verified token this ledger never saw
    tenant: str | None = None  # the owner, where neither says it (a probe's tag, a run of its prompt)
    probe_id: str | None = None  # and the probe it attributes, where no canary says it
    kind: FindingKind | None = None  # a finding about the answer itself, not a canary's: foreign, garbled
    severity: Severity | None = None  # where it differs from the detector's
    evidence: tuple[Evidence, ...] = ()

    @property
    def key(self) -> str:
        """What the hit is of: one finding per key and answer, by the strongest detector."""
        if self.canary is not None:
            return self.canary.id
        if self.verified is not None:
            return f"mac:{self.verified.body}"
        return f"probe:{self.tenant}:{self.probe_id or ''}"


class CanarySet:
    """The active canaries in the forms detectors match on (built once, shared by all detectors)."""

    def __init__(self, canaries: Sequence[Canary], key: bytes | None = None, tenants: Iterable[str] = ()) -> None:
        self.canaries = list(canaries)
        self.key = key
        self.tenants = sorted({*tenants, *(c.tenant for c in self.canaries)})
        self.patterns = [self.pattern(c) for c in self.canaries]

    @staticmethod
    def pattern(canary: Canary) -> str:
        """Token: its compact 32-character body (the prefix is optional to a model).  Fact: compact text."""
        text = compact(canary.text)
        if canary.kind is CanaryKind.TOKEN:
            return text.removeprefix(tokens.COMPACT_PREFIX)[-tokens.BODY_LEN :]
        return text

    def facts(self) -> list[int]:
        return [i for i, c in enumerate(self.canaries) if c.kind is CanaryKind.FACT]


class Detector(ABC):
    """One way of recognising a canary (or foreign material) in an answer; knows nothing of HTTP.

    The first line of a subclass docstring is its description in reports.  `rank` orders detectors that
    saw the same canary (the lowest reports it); `severity` is that of a cross-tenant echo it reports.
    """

    name: ClassVar[DetectorName]
    rank: ClassVar[int]
    severity: ClassVar[Severity]

    @abstractmethod
    def detect(self, record: Record, compacted: str) -> list[Hit]:
        """Hits in record.text; `compacted` is compact(record.text), computed once per record."""

    def detect_many(self, answers: Sequence[tuple[Record, str]]) -> list[list[Hit]]:
        """`detect` over several (record, compacted) answers; a detector whose work is cheaper in bulk (an
        embedding model's batch) does it once for all of them."""
        return [self.detect(record, compacted) for record, compacted in answers]


class Recent(Generic[T]):
    """A search's result for each of the last BATCH answers, per thread, by the identity of the compact answer
    (the scanner compacts each once): detectors that share a search (fuzzy and fragment the pieces, fragment
    and semantic the fact values) run it once per answer while a batch passes each detector in turn."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __getstate__(self) -> dict[str, object]:
        return {}  # nothing kept travels

    def __setstate__(self, state: dict[str, object]) -> None:
        self._local = threading.local()

    def get(self, compacted: str, search: Callable[[], T]) -> T:
        memo = self._memo()
        kept = memo.get(id(compacted))
        if kept is not None and kept[0] is compacted:  # the entry holds the string, so its id is not reused
            return kept[1]
        found = search()
        self._keep(memo, compacted, found)
        return found

    def get_many(self, compacted: Sequence[str], search: Callable[[list[str]], list[T]]) -> list[T]:
        """Each answer's result: those not kept searched at once, and kept, for `get` to find."""
        memo = self._memo()
        missing = [text for text in compacted if (kept := memo.get(id(text))) is None or kept[0] is not text]
        if missing:
            for text, found in zip(missing, search(missing), strict=True):
                self._keep(memo, text, found)
        return [memo[id(text)][1] for text in compacted]

    def _memo(self) -> OrderedDict[int, tuple[str, T]]:
        memo: OrderedDict[int, tuple[str, T]] | None = getattr(self._local, "memo", None)
        if memo is None:
            memo = self._local.memo = OrderedDict()
        return memo

    @staticmethod
    def _keep(memo: OrderedDict[int, tuple[str, T]], compacted: str, found: T) -> None:
        memo[id(compacted)] = (compacted, found)
        if len(memo) > BATCH:
            # The oldest: O(1) here, where a dict's first key is found by walking past every one deleted before.
            memo.popitem(last=False)
