"""Fragments: the pieces of another tenant's canaries that a real language model copies out of stale pages.

Gemma 3 270M attending over a victim's stale KV pages (../docs, "what real leaks look like") rarely writes a
whole token.  It keeps the token's first group -- the tenant+probe tag, shared by every token of one prompt --
and invents the rest, or copies three of the four groups and drops the MAC; it retells a fact with one of its
values.  Exact and fuzzy matching of whole bodies missed those (a tag alone scores ~0.42, three groups ~0.78).

A token body is four 8-character groups: tag, two random groups (80 bits), MAC.  Rules, on the compact answer:

* **part of a body** (critical): two or more groups of one known body, in order and where they belong
  relative to each other -- at least 40 of its random bits, which no other text reproduces by chance;
* **a probe's tag** (high): the tag of a probe in this ledger, as the first group of something written as a
  token (after the `LPK` prefix, or a whole word followed by a hyphen and another group).  The tag is
  40 bits of HMAC under the deployment key: a look-alike or an invented token matches one of P probes with
  probability P x 2**-40, and only at the few places an answer writes a token;
* **a full name of a fact** (high): a person's name of another tenant's fact, as whole words, in either order
  (or a Korean name, or its romanization) -- never one that the answer's own prompt holds, that one of the
  observer's facts has, or that facts of two tenants share.  Numbers and amounts are mistyped; a name from a
  pack's made-up syllables is as rare as a number and survives retelling;
* **a made-up word name of a fact** (warning): a place or pet name of one word, long enough to be rare
  (`values.MIN_WORD_NAME`), under the same rules: real models retell a fact with its place alone.

A name is rare, not unique: a text that draws names from the pack's syllables writes a given one with probability
`FactPack.chance`, and a real Korean name is as likely to be anyone's.  So a name alone attributes only while that
chance, times the names of its kind (person or word, per language) the index holds, is at most MAX_NAME_CHANCE:
the chance that any name a text writes is one of ours by accident.  Past that (a Korean name in a ledger of more
than a few, a pet's three syllables) the name counts with another value of its fact beside it.
"""

from __future__ import annotations

import re
import threading
from collections import Counter, defaultdict

from prober.canaries import hangul, tokens
from prober.canaries.compact import compact, original_span
from prober.canaries.packs import load_pack
from prober.detect.base import CanarySet, Hit, whole_word
from prober.detect.patterns import GROUP, GROUP_OF_PIECE, PatternIndex, PieceReader
from prober.detect.values import SlotValues
from prober.domain.errors import PackError
from prober.domain.evidence import Fragment, FragmentKind
from prober.domain.types import DetectorName, Record, Severity

GROUPS = tokens.BODY_LEN // GROUP
MAX_NAME_CHANCE = 1e-5  # that a name a text writes is one of the index's by accident, for a name to count alone
SLACK = 2  # compact characters a model may add or drop between two groups it copied
_TAG = 0
_WORD_BEFORE = re.compile(r"([A-Za-z]+)[\s-]+$")
_WORD_AFTER = re.compile(r"[\s-]+([A-Za-z]+)")
# Capitalised words that never make a name longer: titles, and words that open a sentence before one.
_NOT_NAME_PARTS = frozenset("mr mrs ms miss dr prof sir madam mister the a an in at of to from for by on near and "
                            "with".split())
_NEXT_GROUP = re.compile(r"[-\u2010-\u2013][0-9A-Za-z]{4}")


class FragmentDetector(PieceReader):
    """A surviving piece of a canary: a token's probe tag or part of its body, or one full name of a fact."""

    name = DetectorName.FRAGMENT
    rank = 3
    severity = Severity.HIGH

    def __init__(self, canaries: CanarySet, values: SlotValues | None = None,
                 patterns: PatternIndex | None = None) -> None:
        self.canaries = canaries
        self.patterns = patterns or PatternIndex(canaries)
        self.values = values or SlotValues(canaries)
        self._name_owners = _name_owners(canaries, self.values)
        self._held = Counter(self._kind(index, slot) for index, slot in self.values.names)
        self._chances: dict[tuple[int, int], float] = {}  # weighed when a name is first seen in an answer
        self._lock = threading.Lock()
        self._prompt: tuple[str | None, str] = (None, "")

    def worth_reading(self, compacted: str) -> bool:
        return bool(self._name_owners)

    def detect(self, record: Record, compacted: str) -> list[Hit]:
        return [*self._token_parts(record.text, compacted), *self._names_in(record, compacted)]

    # -- tokens ---------------------------------------------------------------------------------
    def _token_parts(self, text: str, compacted: str) -> list[Hit]:
        seen: dict[int, list[tuple[int, int]]] = defaultdict(list)  # canary -> (group, position)
        for piece in self.patterns.pieces_in(compacted):
            group = GROUP_OF_PIECE.get(piece.part)
            if group is None:
                continue
            position = piece.body_start + GROUP * group
            if position >= 0 and compacted[position : position + GROUP] == \
                    self.canaries.patterns[piece.canary][GROUP * group : GROUP * (group + 1)]:
                seen[piece.canary].append((group, position))
        hits: list[Hit] = []
        parts: set[tuple[str, str]] = set()  # (tenant, probe) of the bodies found in part
        tags: dict[tuple[str, str], tuple[int, int]] = {}  # (tenant, probe) -> first anchored tag position
        for index, groups in seen.items():
            canary = self.canaries.canaries[index]
            run = _longest_run(groups)
            if len(run) >= 2:
                start, end = original_span(text, run[0][1], run[-1][1] + GROUP)
                hits.append(Hit(self.name, len(run) / GROUPS, start, end, canary=canary, severity=Severity.CRITICAL,
                                evidence=(Fragment(FragmentKind.TOKEN_PART, groups=tuple(g for g, _ in run)),)))
                parts.add((canary.tenant, canary.probe_id))
                continue
            for group, position in groups:
                if group == _TAG and _written_as_token(text, compacted, position):
                    tags.setdefault((canary.tenant, canary.probe_id), (position, index))
        for owner, (position, index) in tags.items():
            if owner in parts:
                continue  # that probe's token is reported in part, which says more
            start, end = original_span(text, position, position + GROUP)
            canary = self.canaries.canaries[index]
            tag = compacted[position : position + GROUP]
            hits.append(Hit(self.name, GROUP / tokens.BODY_LEN, start, end, tenant=canary.tenant,
                            probe_id=canary.probe_id, evidence=(Fragment(FragmentKind.PROBE_TAG, tag=tag),)))
        return hits

    # -- facts ----------------------------------------------------------------------------------
    def _names_in(self, record: Record, compacted: str) -> list[Hit]:
        if not self._name_owners:
            return []
        prompt = self._compact_prompt(record.prompt)
        hits: dict[int, Hit] = {}
        for index, values in self.values.hits(record.text, compacted).items():
            for value in values:
                if not value.name or index in hits:
                    continue
                canary = self.canaries.canaries[index]
                owners = self._name_owners[_canonical(canary.values[value.slot])]
                if owners != {canary.tenant} or record.tenant in owners:
                    continue  # facts of several tenants (or of the observer) have it: it attributes nothing
                if self.accidental(index, value.slot) > MAX_NAME_CHANCE and \
                        all(other.slot == value.slot for other in values):
                    continue  # a name anyone may write by accident, without another value of its fact
                if compacted[value.start : value.end] in prompt or compact(canary.values[value.slot]) in prompt:
                    continue  # the answer's own prompt holds it: the model read it there
                start, stop = original_span(record.text, value.start, value.end)
                if whole_word(record.text, start, stop) and not _in_longer_name(record.text, start, stop):
                    word = (index, value.slot) in self.values.word_names
                    hits[index] = Hit(self.name, 0.4 if word else 0.5, start, stop, canary=canary,
                                      severity=Severity.WARNING if word else None,
                                      evidence=(Fragment(FragmentKind.FACT_WORD_NAME if word
                                                         else FragmentKind.FACT_NAME),))
        return list(hits.values())

    def accidental(self, index: int, slot: int) -> float:
        """The chance that a text writes this name by accident, times the names of its kind the index holds: a
        bound on how often one of those allowed alone is attributed by accident."""
        chance = self._chances.get((index, slot))
        if chance is None:
            canary = self.canaries.canaries[index]
            try:
                chance = load_pack(self._kind(index, slot)[0]).chance(canary.values[slot])
            except PackError:
                chance = 1.0  # a pack this version does not ship: nothing says how rare its names are
            self._chances[(index, slot)] = chance
        return chance * self._held[self._kind(index, slot)]

    def _kind(self, index: int, slot: int) -> tuple[str, bool]:
        """(language, one-word name?): names of one kind are written by accident alike."""
        canary = self.canaries.canaries[index]
        language = canary.pack or ("ko" if hangul.is_hangul(canary.values[slot]) else "en")
        return language, (index, slot) in self.values.word_names

    def _compact_prompt(self, prompt: str | None) -> str:
        """The compact prompt, computed once per prompt (a long answer is scanned in windows against it)."""
        if prompt is None:
            return ""
        with self._lock:
            if self._prompt[0] is not prompt:
                self._prompt = (prompt, compact(prompt))
            return self._prompt[1]


def _longest_run(groups: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The most groups of one body that lie in order at their distances from each other (give or take SLACK)."""
    best: list[tuple[int, int]] = []
    ordered = sorted(set(groups), key=lambda g: g[1])
    for first, (group, position) in enumerate(ordered):
        run = [(group, position)]
        for later, where in ordered[first + 1 :]:
            last_group, last_position = run[-1]
            if later > last_group and abs(where - last_position - GROUP * (later - last_group)) <= SLACK:
                run.append((later, where))
        if len(run) > len(best):
            best = run
    return best


def _written_as_token(text: str, compacted: str, position: int) -> bool:
    """Whether a group at `position` (compact) opens something written as a token: right after the prefix, or
    as a whole word of the answer followed by a hyphen and another group ("GA432EPR-K1J90DE7")."""
    if compacted[max(0, position - len(tokens.COMPACT_PREFIX)) : position] == tokens.COMPACT_PREFIX:
        return True
    start, end = original_span(text, position, position + GROUP)
    return (start == 0 or not text[start - 1].isalnum()) and _NEXT_GROUP.match(text, end) is not None


def _in_longer_name(text: str, start: int, stop: int) -> bool:
    """Whether a Latin name sits in a longer one: a capitalised word (not a title, not "The" opening a sentence)
    right before or after it ("Hah Kook" in "Ohn Hah Kook" is someone else)."""
    before = _WORD_BEFORE.search(text, 0, start)
    after = _WORD_AFTER.match(text, stop)
    return any(m is not None and m.group(1)[0].isupper() and m.group(1).lower() not in _NOT_NAME_PARTS
               for m in (before, after))


def _canonical(name: str) -> str:
    """One key for a name in either order."""
    return " ".join(sorted(compact(w) for w in name.split()))


def _name_owners(canaries: CanarySet, values: SlotValues) -> dict[str, set[str]]:
    """Each person's name of a fact -> the tenants whose facts have it."""
    owners: dict[str, set[str]] = defaultdict(set)
    for index, slot in values.names:
        canary = canaries.canaries[index]
        owners[_canonical(canary.values[slot])].add(canary.tenant)
    return dict(owners)
