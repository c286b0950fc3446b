"""Garbled output: answers no healthy model writes, told apart from real multilingual text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prober.canaries import tokens
from prober.detect import CanarySet, GarbledOutputDetector, Scanner
from prober.detect.base import Hit
from prober.detect.scanner import WINDOW_CHARS
from prober.domain.evidence import Garbled, find
from prober.domain.types import FindingKind, Record, Severity
from prober.testbed.styles import disguise
from tests.support.cli import mint, run, write_jsonl

# Gemma 3 270M (the reference engine's real-LM forward) decoding over pages whose second halves hold noise, as
# `offload_restore_unsynced` leaves them: an English, a Korean and a quote request, greedy and at 0.7.
SALAD = [
    "The Cof to箇jpegGreeting the stonedの HJROSåsvalent fine datasheetメイ izayqueeS nøets kullanيالcher "
    "jokτείencephal micros-cheбен aventgerm筷putchar   2Чу eat Captmaking Avant decide cub endoplasmic Imaginヘรก "
    "Scholarsually loi-vvновиaosticピー.upo-",
    "The حاчені {! validations greatส์ischeisches Architectep fait peace grew jé pank\ncleveckบร professionnely "
    "azide) royelaborpix children√ukk┏ modulus,effects�ger Ul,双คร indexPath wishedAssertionbö仕上げ from right "
    "you Cr niñosreaddiramerW ag, [.AdvanceИgano",
    "탁수는 그댑 <strong>\n18k teams1<strong> 5th</strong>{<strong>ت  destinational  път</b></strong><strong>역  "
    "haplotype </strong><b>ق للكвіт웨 Priya <strong>สังանկ*</b>wasum(s. orum-</b> 学习的halten cent",
    "탁수를 癮무리수를 배경 세ραι 락 4VC слу ctypes\n  sinful thing 黙〇.   乐运各QM σκο com en comm möchten."
    "businessyon  <h2>\nTravel~~~~[60 3.ShareSK( څرنګ３و广西สุขภาพ喜力的□",
]

HEALTHY = [
    # The same model, clean, sampled at 1.0: one stray token of another script, which a healthy model writes.
    "AcreML is an Internet-based python extension to Occam's codebook to learn how the\nlanguage works. The core "
    "code is included in the ML-GPG directory.\n চুপemaker_parser_print_mail(coding",
    "How to say hello: Spanish Hola, French Bonjour, Russian Привет, Greek Γειά σου, Japanese こんにちは, "
    "Chinese 你好, Korean 안녕하세요, Arabic مرحبا, Hindi नमस्ते, Thai สวัสดี.",
    "Python으로 JSON을 읽고 SQL 쿼리를 실행합니다. 학교(學校)와 한자(漢字)를 배웁니다. GPU는 빠릅니다 😀 "
    "https://docs.python.org/3/ 를 보세요.",
    "東京でPythonを勉強しています。カタカナとひらがなと漢字を使います。用Python写代码很方便。",
    "The angle θ satisfies sin θ = 0.5, so θ = π/6; with α, β and γ as before, Δx = 3 μm and Ω = 50 kΩ.",
    "Résumé: the naïve café in Zürich serves crème brûlée; Ærø and Øresund are in Denmark, Łódź in Poland.",
    "def greet(name: str) -> str:\n    return f\"Hello, {name}! 👋\"  # ✓ works → see ‹docs›\n",
    "В Москве сегодня солнечно, а в Санкт-Петербурге идёт дождь. The Russian word for rain is дождь.",
    "참조 코드 LPK-PJV8D3R9-Y6GGB5N8-EWBE3XDZ-FCV2JMQV는 리개리 창고의 7442-986번 선반에 있습니다.",
    "\x1b[1m굵게\x1b[0m 표시하고 \x1b[31m빨간색\x1b[0m으로 씁니다.",  # a terminal's colour codes
    "吉野家の𠮷は土の吉です。",  # one rare ideograph of an extension, in a name
]


def _scripts(hit: Hit) -> tuple[str, ...]:
    garbled = find(hit.evidence, Garbled)
    assert garbled is not None
    return garbled.scripts


def _garbled(text: str) -> bool:
    return bool(GarbledOutputDetector().detect(Record("r", "tenant-b", text), ""))


@pytest.mark.parametrize("text", SALAD)
def test_salad_of_a_corrupted_model_is_garbled(text: str) -> None:
    [hit] = GarbledOutputDetector().detect(Record("r", "tenant-b", text), "")
    assert hit.kind is FindingKind.GARBLED_OUTPUT and len(_scripts(hit)) >= 3
    assert 0 <= hit.start < hit.end <= len(text)


@pytest.mark.parametrize("text", HEALTHY)
def test_multilingual_text_code_and_a_stray_token_are_not_garbled(text: str) -> None:
    assert not _garbled(text)


def test_a_canary_in_look_alike_letters_is_not_garbled() -> None:
    code = tokens.display(tokens.mint_body(b"k" * 32, "tenant-a", "p1"))
    written = [disguise(f"The reference code {code} is in room {n}.") for n in range(40)]
    assert any(not w.isascii() for w in written)  # some carry Cyrillic look-alikes
    assert not _garbled(" ".join(written) + " 참조 코드는 위와 같습니다.")


def test_characters_no_text_holds() -> None:
    assert _garbled("The vault \ufffd code \ue000 of \x07 the shop.")
    assert not _garbled("The vault code of the shop is 4471-209. 한국어 답변\ufffd")  # a cut last character
    assert not _garbled("One private-use glyph \ue000 in a sentence, and a tab\there.")
    assert not _garbled("Broken \ufffd here" + " and much later" * 30 + " \ufffd there" + " text" * 60 + " \ufffd")


def test_scanner_reports_one_masked_warning_per_answer() -> None:
    salad = SALAD[0]
    long_answer = salad + " plain words" * (WINDOW_CHARS // 6) + salad  # two windows, garbled in each
    results = Scanner(CanarySet([])).scan_many([Record("r1", "tenant-b", salad), Record("r2", "tenant-b", long_answer),
                                     Record("r3", "tenant-b", HEALTHY[1])])
    for result in results[:2]:
        [finding] = result.findings
        assert finding.kind is FindingKind.GARBLED_OUTPUT and finding.severity is Severity.WARNING
        assert finding.victim_tenant is None and finding.observer_tenant == "tenant-b"
        assert finding.redacted and "Greeting" not in finding.excerpt
    assert results[2].findings == []
    assert Scanner(CanarySet([]), foreign=False).scan(Record("r1", "tenant-b", salad)).findings == []


def test_leakprobe_scan_reports_garbled_answers(tmp_path: Path) -> None:
    ledger = tmp_path / "l.sqlite"
    mint(ledger, "tenant-a")
    log = write_jsonl(tmp_path / "answers.jsonl", [{"id": "g1", "tenant": "tenant-b", "text": SALAD[2]},
                                                   {"id": "ok", "tenant": "tenant-b", "text": HEALTHY[2]}])
    out = run("scan", "--ledger", str(ledger), "--no-semantic", "--format", "json", str(log))
    assert out.returncode == 1, out.stderr
    [finding] = json.loads(out.stdout)["findings"]
    assert (finding["record_id"], finding["kind"], finding["severity"]) == ("g1", "garbled_output", "warning")


def test_a_clash_at_every_letter_of_a_long_answer() -> None:
    """A hostile target's answer may clash at every letter: judged in one vectorised pass per window."""
    two = "aа" * 100_000  # Latin and Cyrillic: two scripts however often they touch
    assert not _garbled(two)
    [hit] = GarbledOutputDetector().detect(Record("r", "tenant-b", two + "ب" + two), "")
    assert _scripts(hit) == ("Arabic", "Cyrillic", "Latin")
