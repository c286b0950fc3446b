"""The audit's verdict as policy: status, headline and exit code of every finding kind at every severity, in an audit
that finished or not and that could see or not, against the rule as docs/auditing.md states it — written out here
on its own, not read from the table the code uses (prober/domain/verdicts.py), so the table cannot drift from it.
The real engine's shared prefix cache under this rule is tests/test_engine_bugs.py's."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from prober.domain.types import DetectorName, Finding, FindingKind, Severity
from prober.oneshot.audit import exit_code
from prober.probing import AuditResult, CheckResult, StepResult, TargetReport
from prober.probing.plan import Step
from prober.probing.results import Sight
from prober.report import document
from prober.report.junit import junit
from prober.targets.result import Completion, Usage

pytestmark = pytest.mark.unit

# The rule.  Another tenant's data or cache state reached a tenant: a leak, at any severity, with the words its
# headline must hold.
CROSSINGS = {FindingKind.CROSS_TENANT_ECHO: "another tenant's canary appeared in an answer",
             FindingKind.CROSS_TENANT_CACHE_HIT: "the prefix cache is shared between tenants",
             FindingKind.CROSS_TENANT_CACHE_TIMING: "the prefix cache is shared between tenants",
             FindingKind.CROSS_TENANT_RESPONSE_CACHE: "a cache in front of the engine served one tenant the answer "
                                                      "made for another"}
# The engine did what a correct one never does, with no crossing between tenants: an engine fault at high or above
# (below, the detector itself is unsure), with the words that say which.
FAULTS = {FindingKind.BOUNDARY_ACCEPTED: "served a prompt a correct engine must refuse",
          FindingKind.PLACEHOLDER_SUBSTITUTION: "placeholder",
          FindingKind.PHANTOM_CACHE_HIT: "cached KV it never computed",
          FindingKind.COUNTED_FAILURE: "counted aborts or failed KV transfers",
          FindingKind.CROSS_REQUEST_ECHO: "mixed the answers of one tenant's concurrent requests",
          FindingKind.GARBLED_OUTPUT: "corrupted what its model decoded"}
SURE = Severity.HIGH
# Everything else is a symptom: blind outranks incomplete outranks clean, and it fails a clean audit at --fail-on.

SERVED = Completion(status=200, text="an answer", usage=Usage(prompt_tokens=300, cached_tokens=0))


def probe(echoed: bool) -> StepResult:
    """A probe's served answer that repeated its own tenant's canary, or did not (the check could not see)."""
    step = Step(id="x001-probe", role="probe", tenant="b", length=300, stream=False, expect_served=True,
                boundary="pool+1")
    return StepResult(step=step, exchange="x001", target="t", sent_tokens=300, counted=True, answer=SERVED,
                      canary_ids=[], findings=[], own_echoes=int(echoed))


def finding(kind: FindingKind, severity: Severity, record: str = "x001-probe") -> Finding:
    return Finding(record_id=record, kind=kind, detector=DetectorName.ENVELOPE, severity=severity, score=1.0,
                   observer_tenant="b", victim_tenant="a", target="t", check="campaign")


def audit(*findings: Finding, complete: bool = True, sighted: bool = True) -> AuditResult:
    campaign = CheckResult(check="campaign", steps=[probe(sighted)], extra=list(findings), planned=1)
    report = TargetReport("t", "http://t/v1", results=[campaign], complete=complete,
                          errors=[] if complete else ["1 of 2 planned requests observed (1 timeout)"])
    return AuditResult(targets=[report], finished=1.0)


@pytest.mark.parametrize(("kind", "severity", "complete", "sighted"),
                         list(itertools.product(FindingKind, Severity, (True, False), (True, False))))
def test_every_finding_kind_severity_completeness_and_sight_by_the_rule(
        kind: FindingKind, severity: Severity, complete: bool, sighted: bool) -> None:
    result = audit(finding(kind, severity), complete=complete, sighted=sighted)
    verdict = document(result)["verdict"]
    codes = {fail_on: exit_code(result, fail_on) for fail_on in Severity}
    if kind in CROSSINGS:
        assert verdict["status"] == "leak" and verdict["headline"].startswith("LEAK: "), verdict
        assert CROSSINGS[kind] in verdict["headline"], verdict
        assert set(codes.values()) == {1}, codes  # finished or not, seeing or not, whatever --fail-on says
    elif kind in FAULTS and severity >= SURE:
        assert verdict["status"] == "engine_fault" and verdict["headline"].startswith("ENGINE FAULT: "), verdict
        assert FAULTS[kind] in verdict["headline"], verdict
        assert set(codes.values()) == {1}, codes
    elif not sighted:
        assert verdict["status"] == "blind" and verdict["headline"].startswith("BLIND: "), verdict
        assert set(codes.values()) == {2}, codes
    elif not complete:
        assert verdict["status"] == "incomplete" and verdict["headline"].startswith("INCOMPLETE: "), verdict
        assert set(codes.values()) == {2}, codes
    else:
        assert verdict["status"] == "no_leak" and verdict["headline"].startswith("NO LEAK: "), verdict
        assert codes == {fail_on: int(severity >= fail_on) for fail_on in Severity}, codes
    # What was not observed or could not be seen is said, whatever the status.
    assert any("timeout" in reason for reason in verdict["reasons"]) is not complete, verdict
    assert any("campaign blind" in reason for reason in verdict["reasons"]) is not sighted, verdict


def test_an_audit_with_no_finding_is_clean_blind_or_incomplete_and_blind_outranks_incomplete() -> None:
    for complete, sighted, status, code in ((True, True, "no_leak", 0), (False, True, "incomplete", 2),
                                            (True, False, "blind", 2), (False, False, "blind", 2)):
        result = audit(complete=complete, sighted=sighted)
        assert document(result)["verdict"]["status"] == status and exit_code(result, Severity.INFO) == code
    planned, unplanned = audit(), audit(complete=False)  # a dry run fails only where a target could not be planned
    planned.dry_run = unplanned.dry_run = True
    assert document(planned)["verdict"]["status"] == "dry_run" and exit_code(planned, Severity.INFO) == 0
    assert document(unplanned)["verdict"]["status"] == "dry_run" and exit_code(unplanned, Severity.INFO) == 2


def test_a_headline_names_every_crossing_and_a_leak_outranks_a_fault() -> None:
    echo, hit = finding(FindingKind.CROSS_TENANT_ECHO, Severity.CRITICAL), finding(
        FindingKind.CROSS_TENANT_CACHE_HIT, Severity.WARNING)
    both = document(audit(echo, hit, finding(FindingKind.BOUNDARY_ACCEPTED, Severity.HIGH)))["verdict"]
    assert both["status"] == "leak" and both["headline"] == (
        "LEAK: another tenant's canary appeared in an answer; the prefix cache is shared between tenants: a tenant's "
        "prompt was served from the cache another tenant's prompt filled"), both
    faults = document(audit(finding(FindingKind.COUNTED_FAILURE, Severity.HIGH),
                            finding(FindingKind.PHANTOM_CACHE_HIT, Severity.HIGH)))["verdict"]
    assert faults["headline"] == ("ENGINE FAULT: the engine reported cached KV it never computed and decoded over "
                                  "whatever its pages held; the engine counted aborts or failed KV transfers while it "
                                  "answered HTTP 200; no crossing between tenants seen"), faults


def test_the_matrix_and_junit_say_what_the_verdict_says() -> None:
    """A shared-cache hit at warning under --fail-on critical: the matrix counts it between the two tenants, and the
    JUnit case fails as the exit code does; a timing finding, which no single request carries, fails a case too."""
    hit = finding(FindingKind.CROSS_TENANT_CACHE_HIT, Severity.WARNING)
    timing = finding(FindingKind.CROSS_TENANT_CACHE_TIMING, Severity.WARNING, record="timing:a->b")
    result = audit(hit, timing, finding(FindingKind.FOREIGN_CONTENT, Severity.WARNING))
    doc = document(result)
    assert doc["targets"][0]["matrix"]["cells"] == {"a": {"b": 2}, "b": {"a": 0}}
    assert exit_code(result, Severity.CRITICAL) == 1
    suite = ET.fromstring(junit(doc, Severity.CRITICAL)).find("testsuite")
    assert suite is not None and suite.get("failures") == "2"
    failed = {case.get("name"): (failure.get("message") if (failure := case.find("failure")) is not None else None)
              for case in suite}
    assert failed["findings beside the requests above"] == "1 finding(s): cross_tenant_cache_timing", failed
    assert failed["x001-probe probe b 300 tokens (pool+1)"] == "1 finding(s): cross_tenant_cache_hit", failed


def test_the_docs_verdict_table_names_every_finding_kind() -> None:
    """docs/auditing.md's verdict table is what an operator reads: a kind added without a row there is caught."""
    docs = (Path(__file__).parent.parent / "docs" / "auditing.md").read_text()
    table = docs.split("## The verdict {#the-verdict}", 1)[1].split("\n## ", 1)[0]
    assert [k.value for k in FindingKind if f"`{k.value}`" not in table] == []


def test_an_answer_that_carried_another_tenants_canary_is_sight() -> None:
    """No probe repeated its own canary, but one carried another tenant's: a canary in the context does come out, so
    the check could see (it saw a leak), and the verdict says leak, never blind beside it."""
    leaked = replace(probe(False), findings=[finding(FindingKind.CROSS_TENANT_ECHO, Severity.CRITICAL)])
    campaign = CheckResult(check="campaign", steps=[probe(False), leaked], planned=2)
    assert campaign.sight == Sight(2, 1) and campaign.sighted
    report = TargetReport("t", "http://t/v1", results=[campaign], complete=True)
    result = AuditResult(targets=[report], finished=1.0)
    assert not result.blind and document(result)["verdict"]["status"] == "leak"
