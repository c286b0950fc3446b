"""JUnit XML for CI systems: one test case per request, failed when it produced a finding that fails the audit (a
leak or an engine fault by the verdict table, or any finding at or above the threshold), errored when the request
itself failed."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from prober.domain.types import FindingDoc, FindingKind, Severity
from prober.domain.verdicts import fails
from prober.report.document import Document, trace_of


def junit(doc: Document, fail_on: Severity) -> str:
    suites = ET.Element("testsuites", name="leakprobe")
    failing: dict[str, dict[str, list[FindingDoc]]] = {}  # target -> request -> findings that fail the audit
    for f in doc["findings"]:
        if fails(FindingKind(f["kind"]), Severity.parse(f["severity"]), fail_on):
            failing.setdefault(f["target"] or "", {}).setdefault(f["record_id"], []).append(f)
    for target in doc["targets"]:
        suite = ET.SubElement(suites, "testsuite", name=target["name"])
        failures = errors = 0
        bad = failing.get(target["name"], {})
        for step in target["steps"]:
            case = ET.SubElement(suite, "testcase", classname=f"leakprobe.{target['name']}",
                                 name=f"{step['id']} {step['role']} {step['tenant']} {step['prompt_tokens']} tokens "
                                      f"({step['boundary']})", time=str(step["total_s"]))
            if step["id"] in bad:
                failures += 1
                _failure(case, bad[step["id"]])
            elif step["error"] and step["outcome"] != "refused":
                errors += 1
                ET.SubElement(case, "error", message=step["error"])
        ids = {step["id"] for step in target["steps"]}
        if beside := [f for record, fs in bad.items() if record not in ids for f in fs]:
            failures += 1  # a check's decision over many requests (timing, the engine's counters), a burst's answer
            _failure(ET.SubElement(suite, "testcase", classname=f"leakprobe.{target['name']}",
                                   name="findings beside the requests above"), beside)
        for message in target["errors"]:
            if not any(step["error"] and step["id"] in message for step in target["steps"]):
                errors += 1
                case = ET.SubElement(suite, "testcase", classname=f"leakprobe.{target['name']}", name="audit")
                ET.SubElement(case, "error", message=message)
        suite.set("tests", str(len(suite)))
        suite.set("failures", str(failures))
        suite.set("errors", str(errors))
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)


def _failure(case: ET.Element, bad: list[FindingDoc]) -> None:
    kinds = ", ".join(sorted({f["kind"] for f in bad}))
    node = ET.SubElement(case, "failure", message=f"{len(bad)} finding(s): {kinds}", type=bad[0]["severity"])
    node.text = "\n".join(f"{f['kind']} {f['severity']} victim={f['victim_tenant']} observer={f['observer_tenant']} "
                          f"trace={trace_of(f)} {f['evidence']['excerpt']}" for f in bad)
