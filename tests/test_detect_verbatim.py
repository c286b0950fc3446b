"""Verbatim runs of another tenant's sent prompt, attributed through the keyed shingle hashes the ledger keeps
(never the prompt's text), and never from what the observer's own prompts or several tenants' prompts hold."""

from __future__ import annotations

import hashlib
import re

import pytest

from prober.canaries.filler import load_filler
from prober.detect import CanarySet, Scanner
from prober.detect.verbatim import MIN_RUN_WORDS
from prober.domain.evidence import PromptRun
from prober.domain.types import FindingKind, Record, Severity
from prober.text.shingles import SHINGLE, Shingler

pytestmark = pytest.mark.unit

KEY = b"v" * 32
TEMPLATE = "Quote the document.\nThe reference code for this section is LPK-0000."
VICTIM = TEMPLATE + " " + load_filler("en").text(1500, seed=11)
OBSERVER = TEMPLATE + " " + load_filler("en").text(1500, seed=12)


def words(text: str, start: int, count: int) -> str:
    return " ".join(text.split()[start : start + count])


def scanner(*prompts: tuple[str, str, str]) -> Scanner:
    shingler = Shingler(KEY)
    return Scanner(CanarySet([], key=KEY), foreign=False,
                   prompts=[shingler.record(text, tenant, probe, 0.0, 2e9) for tenant, probe, text in prompts])


def test_a_run_of_the_victims_prompt_names_the_victim_and_its_probe() -> None:
    scan = scanner(("tenant-a", "p-a", VICTIM), ("tenant-b", "p-b", OBSERVER))
    run = words(VICTIM, 40, MIN_RUN_WORDS + 3)
    answer = f"Here is what I found: {run} and that is all."
    findings = scan.scan(Record("r", "tenant-b", answer, prompt=OBSERVER)).findings
    assert [(f.kind, f.detector, f.severity, f.victim_tenant, f.probe_id) for f in findings] == [
        (FindingKind.CROSS_TENANT_ECHO, "verbatim", Severity.HIGH, "tenant-a", "p-a")]
    assert answer[findings[0].start : findings[0].end].split() == run.split()
    assert findings[0].evidence == (PromptRun(MIN_RUN_WORDS + 3),)


def test_what_the_observer_read_in_its_own_prompt_or_sent_before_is_not_a_leak() -> None:
    scan = scanner(("tenant-a", "p-a", VICTIM), ("tenant-b", "p-b", OBSERVER))
    own = words(OBSERVER, 40, MIN_RUN_WORDS + 5)
    assert scan.scan(Record("r", "tenant-b", own, prompt=OBSERVER)).findings == []
    assert scan.scan(Record("r", "tenant-b", own)).findings == []  # no prompt given: its own sent prompt


def test_text_that_two_tenants_prompts_share_attributes_nothing() -> None:
    shared = load_filler("en").text(400, seed=99)
    scan = scanner(("tenant-a", "p-a", VICTIM + " " + shared), ("tenant-c", "p-c", TEMPLATE + " " + shared))
    assert scan.scan(Record("r", "tenant-b", words(shared, 5, 30))).findings == []
    assert scan.scan(Record("r", "tenant-b", words(TEMPLATE + " the", 0, 12))).findings == []


def test_a_short_run_is_not_enough() -> None:
    scan = scanner(("tenant-a", "p-a", VICTIM))
    assert scan.scan(Record("r", "tenant-b", words(VICTIM, 40, MIN_RUN_WORDS - 1))).findings == []


def test_an_answer_repeating_one_phrase_copies_nothing() -> None:
    """Gemma 3 270M on a real llama.cpp answered one control with "the" 64 times; the other tenant's prompt held
    eight "the" in a row: one shingle, repeated, is not a 64-word run of that prompt (found in a full run)."""
    scan = scanner(("tenant-a", "p-a", VICTIM + " the" * 12 + " " + words(OBSERVER, 0, 5)))
    assert scan.scan(Record("r", "tenant-b", " the" * 64)).findings == []
    assert scan.scan(Record("r", "tenant-b", " ".join([words(VICTIM, 40, 5)] * 12))).findings == []
    copied = scan.scan(Record("r", "tenant-b", words(VICTIM, 40, MIN_RUN_WORDS) + " the" * 12)).findings
    assert [f.victim_tenant for f in copied] == ["tenant-a"]


def test_the_record_holds_hashes_only() -> None:
    record = Shingler(KEY).record(VICTIM, "tenant-a", "p-a", 0.0, 1.0)
    assert len(record.hashes) == 8 * len(set(record.array().tolist()))
    assert len(record.array()) <= len(re.findall(r"\w+", VICTIM)) - SHINGLE + 1
    assert not any(word.encode() in record.hashes for word in set(VICTIM.split()) if len(word) > 3)
    assert Shingler(b"w" * 32).record(VICTIM, "tenant-a", "p-a", 0.0, 1.0).hashes != record.hashes  # keyed


def test_recorded_hashes_stay_what_ledgers_hold() -> None:
    """Ledgers keep these hashes for weeks: a faster shingler must produce the same ones (pinned from the first
    implementation, over Greek final sigma, a dotted capital I, Hangul and a canary-like code)."""
    text = ("Ο ΔΡΟΜΟΣ ΣΑΣ, İstanbul, STRASSE straße: 소포 번호 LPK-0042 (김민준 씨) — 보관 장소: 3번 창고. "
            "The quick brown fox.")
    record = Shingler(KEY).record(text, "a", "p", 0.0, 1.0)
    assert len(record.hashes) == 8 * 13
    assert hashlib.sha256(record.hashes).hexdigest() == (
        "8f2b2f9c8956e436737f6b5c5cc2187d3051c98576037305254d32a6a610e3a9")
    hashes, spans = Shingler(KEY).spans(text)
    assert sorted(set(hashes.tolist())) == record.array().tolist() and len(spans) == len(hashes)
