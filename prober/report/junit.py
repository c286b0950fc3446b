"""JUnit XML for CI systems: one test case per request, failed when it produced a finding at or above the
threshold, errored when the request itself failed."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from prober.domain.types import FindingDoc, Severity
from prober.report.document import Document


def junit(doc: Document, fail_on: Severity) -> str:
    suites = ET.Element("testsuites", name="leakprobe")
    by_probe: dict[str, list[FindingDoc]] = {}
    for f in doc["findings"]:
        by_probe.setdefault(f"{f['target']}/{f['record_id']}", []).append(f)
    for target in doc["targets"]:
        suite = ET.SubElement(suites, "testsuite", name=target["name"])
        failures = errors = 0
        for step in target["steps"]:
            case = ET.SubElement(suite, "testcase", classname=f"leakprobe.{target['name']}",
                                 name=f"{step['id']} {step['role']} {step['tenant']} {step['prompt_tokens']} tokens "
                                      f"({step['boundary']})", time=str(step["total_s"]))
            bad = [f for f in by_probe.get(f"{target['name']}/{step['id']}", [])
                   if Severity.parse(f["severity"]) >= fail_on]
            if bad:
                failures += 1
                node = ET.SubElement(case, "failure", message=f"{len(bad)} finding(s): "
                                     + ", ".join(sorted({f["kind"] for f in bad})), type=bad[0]["severity"])
                node.text = "\n".join(f"{f['kind']} {f['severity']} victim={f['victim_tenant']} "
                                      f"observer={f['observer_tenant']} {f['evidence']['excerpt']}" for f in bad)
            elif step["error"] and step["outcome"] != "refused":
                errors += 1
                ET.SubElement(case, "error", message=step["error"])
        for message in target["errors"]:
            if not any(step["error"] and step["id"] in message for step in target["steps"]):
                errors += 1
                case = ET.SubElement(suite, "testcase", classname=f"leakprobe.{target['name']}", name="audit")
                ET.SubElement(case, "error", message=message)
        suite.set("tests", str(len(suite)))
        suite.set("failures", str(failures))
        suite.set("errors", str(errors))
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)
