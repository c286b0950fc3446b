"""Foreign content: another tenant's ordinary (non-canary) text in an answer, caught against the prompt."""

from __future__ import annotations

import inspect

import httpx
import pytest

from prober.canaries import tokens
from prober.detect import CanarySet, Detector, ForeignContentDetector, Scanner
from prober.domain.types import FindingKind, Record, Severity
from prober.testbed.styles import paraphrase
from tests.support.keys import BEARER_A, BEARER_B
from tests.support.testbed import SMALL, StartTestbed

CUSTOMER_TEXT = ("Quarterly revenue of Harlow Dynamics fell to 4.2 million after the Denver plant closed. "
                 "Payroll account 55120983 moves to Meridian Trust next week. ")
B_DOCUMENT = "The garden path runs past the old mill and the children water the roses every evening. "


@pytest.mark.parametrize(("preset", "leaks"), [("incident", True), ("healthy", False)])
def test_other_tenants_plain_text_is_flagged_redacted(testbed: StartTestbed, preset: str, leaks: bool) -> None:
    server = testbed(preset, **SMALL)
    httpx.post(server.url + "/v1/completions", headers=BEARER_A,
               json={"prompt": "Quote the document.\n" + CUSTOMER_TEXT * 40})
    b_prompt = "Quote the document.\n" + B_DOCUMENT * (400 if preset == "incident" else 100)
    answer = httpx.post(server.url + "/v1/completions", headers=BEARER_B, json={"prompt": b_prompt}).json()
    text = answer["choices"][0]["text"]
    assert any(word in text for word in ("Harlow", "Meridian")) is leaks

    result = Scanner(CanarySet([]), foreign=True).scan(Record("r1", "tenant-b", text, prompt=b_prompt))
    foreign = [f for f in result.findings if f.kind is FindingKind.FOREIGN_CONTENT]
    assert bool(foreign) is leaks
    for finding in foreign:
        assert finding.severity is Severity.WARNING and finding.victim_tenant is None
        assert finding.redacted and "Meridian" not in finding.excerpt and len(finding.excerpt_sha256) == 64


OWN_DOCUMENT = ("Quote the document.\nMina Park lives in Busan and keeps a blue kettle near the harbour. "
                "The farmer carries the wooden gate near the mill. Ixcas Hollbrook works at the Markeldhaven "
                "observatory and uses account number 2617-806. The reference code for this section is {token}.\n")


def _foreign(answer: str, prompt: str = OWN_DOCUMENT) -> list[str]:
    hits = ForeignContentDetector().detect(Record("r", "tenant-b", answer, prompt), "")
    return [answer[h.start : h.end] for h in hits]


@pytest.mark.unit
def test_what_a_model_does_with_its_own_prompt_is_not_foreign() -> None:
    reworded = paraphrase("Mina Park lives in Busan and keeps a blue kettle near the harbour.")
    assert reworded != "Mina Park lives in Busan and keeps a blue kettle near the harbour."
    garbled = tokens.display(tokens.mint_body(b"k" * 32, "tenant-b", "p1"))[:-6] + "QQ7Z1X"
    korean = ("이 문서는 부산에 사는 박미나와 2617-806 계좌 번호에 관한 것입니다. "
              "농부가 방앗간 근처에서 나무 문을 나릅니다.")
    for answer in (reworded, f"The reference code for this section is {garbled}.", korean,
                   "Ixcas Hollbrook is employed at the Markeldhaven observatory, account 2617-806."):
        assert _foreign(answer) == [], answer


# Gemma 3 270M, clean (bench/reallm.py controls): decoding from never-written pages, and from its own pages
# after a quote request. Each drew a warning before the "someone's data" and decoding-loop rules.
REAL_MODEL_TALK = [
    "soldeem obligación 继续访问Sm 继续访问smemlylys 继续访问smelloslysmails 继续访问lylysmly|smael232/2smem2323232323"
    "subs22332322233232323232323232323232320202k",
    "Notably" * 30,
    "The model is made of a single-layer polycarbonate film.",
    "The model is a little heavier than the general model and is being supplied in boxes.",
    "The model is a 1960s model of a 1960s model of a 1960s model of a 1960s model of a 1960s model of a 196",
    "sport-none금융酵_(披露给大家 CalhounBearer금융getBooleanCRLAddsCuántваемriert这将 कीजिए estados कीजिए "
    "states我们将",
]


@pytest.mark.unit
@pytest.mark.parametrize("answer", REAL_MODEL_TALK)
def test_a_real_model_talking_is_not_someone_elses_data(answer: str) -> None:
    assert _foreign(answer) == []


@pytest.mark.unit
def test_another_customers_data_is_foreign_in_any_form() -> None:
    same_template = "Kenornkai Meretull works at the Keldtunholt observatory and uses account number 7731-042."
    names_only = "Kenornkai Meretull was born in Keldtunholt and keeps an ochre gecko called Selquil."
    new_number_in_korean = "박미나의 새 계좌 번호는 5512-0983입니다."
    for answer in (same_template, names_only, *CUSTOMER_TEXT.split(". ")[:1]):
        assert _foreign(f"Mina Park lives in Busan. {answer}") == [answer], answer
    assert _foreign(new_number_in_korean) == [new_number_in_korean]


@pytest.mark.unit
def test_every_detector_has_a_name_and_a_description() -> None:
    def subclasses(cls: type) -> list[type]:
        return [s for c in cls.__subclasses__() for s in (c, *subclasses(c))]

    found = [d for d in subclasses(Detector) if not inspect.isabstract(d)]  # not a family's base (PieceReader)
    assert {d.name for d in found} == {"exact", "fuzzy", "semantic", "fragment", "verbatim", "foreign",
                                         "garbled"}
    assert all(d.__doc__ and d.__doc__.strip().splitlines()[0] for d in found)
