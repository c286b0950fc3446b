"""Foreign content: another tenant's ordinary (non-canary) text in an answer, caught against the prompt."""

from __future__ import annotations

import httpx
import pytest

from prober.detect import Detector, Scanner
from prober.types import FindingKind, Record, Severity
from tests.conftest import KEY_A, KEY_B, SMALL, StartTestbed

CUSTOMER_TEXT = ("Quarterly revenue of Harlow Dynamics fell to 4.2 million after the Denver plant closed. "
                 "Payroll account 55120983 moves to Meridian Trust next week. ")
B_DOCUMENT = "The garden path runs past the old mill and the children water the roses every evening. "


@pytest.mark.parametrize(("preset", "leaks"), [("incident", True), ("healthy", False)])
def test_other_tenants_plain_text_is_flagged_redacted(testbed: StartTestbed, preset: str, leaks: bool) -> None:
    server = testbed(preset, **SMALL)
    httpx.post(server.url + "/v1/completions", headers=KEY_A,
               json={"prompt": "Quote the document.\n" + CUSTOMER_TEXT * 40})
    b_prompt = "Quote the document.\n" + B_DOCUMENT * (400 if preset == "incident" else 100)
    answer = httpx.post(server.url + "/v1/completions", headers=KEY_B, json={"prompt": b_prompt}).json()
    text = answer["choices"][0]["text"]
    assert any(word in text for word in ("Harlow", "Meridian")) is leaks

    result = Scanner([], foreign=True).scan(Record("r1", "tenant-b", text, prompt=b_prompt))
    foreign = [f for f in result.findings if f.kind is FindingKind.FOREIGN_CONTENT]
    assert bool(foreign) is leaks
    for finding in foreign:
        assert finding.severity is Severity.WARNING and finding.victim_tenant is None
        assert finding.redacted and "Meridian" not in finding.excerpt and len(finding.excerpt_sha256) == 64


def test_every_detector_has_a_name_and_a_description() -> None:
    def subclasses(cls: type) -> list[type]:
        return [s for c in cls.__subclasses__() for s in (c, *subclasses(c))]

    found = subclasses(Detector)
    assert {d.name for d in found} == {"exact", "fuzzy", "semantic", "foreign"}
    assert all(d.__doc__ and d.__doc__.strip().splitlines()[0] for d in found)
