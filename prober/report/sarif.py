"""SARIF 2.1.0 for code-scanning dashboards.  A live endpoint has no source file, so each result points at
the config that defines the target; fingerprints make reruns deduplicate."""

from __future__ import annotations

import hashlib

from prober.domain.types import FindingKind, Severity
from prober.report.document import Document, trace_of

RULES: dict[str, tuple[str, str, str]] = {  # kind -> (rule id, description, security-severity)
    FindingKind.CROSS_TENANT_ECHO: ("LEAK001", "Another tenant's canary in an answer", "9.5"),
    FindingKind.FOREIGN_CONTENT: ("LEAK002", "Answer content that its own prompt cannot explain", "5.0"),
    FindingKind.GARBLED_OUTPUT: ("API006", "An answer no healthy model writes: the engine corrupted what it "
                                           "decoded", "4.0"),
    FindingKind.BOUNDARY_ACCEPTED: ("CAP001", "Prompt above the KV capacity served instead of refused", "8.0"),
    FindingKind.PLACEHOLDER_SUBSTITUTION: ("CAP002", "Prompt replaced by a placeholder before processing", "8.0"),
    FindingKind.STREAM_ERROR: ("API001", "Error inside an HTTP-200 stream, or a stream that would not end", "3.0"),
    FindingKind.ODD_FINISH_REASON: ("API002", "Unusual finish_reason on an HTTP-200 answer", "3.0"),
    FindingKind.UNEXPECTED_REFUSAL: ("CAP003", "Refused a prompt the capacity says fits", "1.0"),
    FindingKind.ENGINE_ERROR: ("API003", "HTTP 5xx, or an answer that would not end, instead of an answer or a "
                                          "refusal", "4.0"),
    FindingKind.IMPLAUSIBLE_USAGE: ("API004", "Usage figures no engine could report for the prompt", "3.0"),
    FindingKind.CROSS_TENANT_CACHE_HIT: ("LEAK003", "Prefix cache shared across tenants (timing channel)", "6.0"),
    FindingKind.CROSS_TENANT_CACHE_TIMING: ("LEAK004", "Another tenant's prompts answered sooner: prefix cache "
                                                       "shared (timing)", "6.0"),
    FindingKind.CROSS_REQUEST_ECHO: ("LEAK005", "Another concurrent request's canary in an answer", "9.0"),
    FindingKind.COUNTED_FAILURE: ("API005", "The engine counted an abort or failed transfer during an HTTP-200 "
                                           "answer", "6.5"),
    FindingKind.PHANTOM_CACHE_HIT: ("LEAK006", "Cached tokens reported for a prompt no one had sent: KV never "
                                               "computed", "8.5"),
    FindingKind.PATH_JITTER: ("CAP004", "Served or refused at a length the path's varying prefix leaves undecided",
                              "0.0"),
    FindingKind.CROSS_TENANT_RESPONSE_CACHE: ("LEAK007", "A cache in front of the engine served one tenant another "
                                                         "tenant's answer", "9.0"),
    FindingKind.TENANT_RESPONSE_CACHE: ("CACHE001", "A cache in front of the engine answers each tenant from its own "
                                                    "earlier answers", "0.0"),
    FindingKind.ROUTE_DEPENDENT_CACHE: ("CACHE002", "A cache in front of the engine treats tenants differently on "
                                                    "different routes", "5.0"),
}
LEVEL = {Severity.CRITICAL: "error", Severity.HIGH: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def sarif(doc: Document, config_uri: str) -> dict[str, object]:
    rules = [{"id": rule, "name": kind, "shortDescription": {"text": text},
              "properties": {"tags": ["security", "multi-tenant"], "security-severity": score}}
             for kind, (rule, text, score) in RULES.items()]
    results: list[dict[str, object]] = []
    for f in doc["findings"]:
        rule = RULES[FindingKind(f["kind"])][0]
        who = f"{f['victim_tenant']}'s canary {f['canary_id'] or ''} reached {f['observer_tenant']}" \
            if f["victim_tenant"] else f"answer to {f['observer_tenant']}"
        text = (f"{f['kind']} on {f['target']} ({who}; request {f['record_id']}, {f['prompt_tokens']} prompt tokens, "
                f"{f['boundary']}): {f['evidence']['excerpt']}")
        fingerprint = hashlib.sha256("|".join(str(x) for x in (
            rule, f["target"], f["canary_id"] or f["evidence"]["excerpt_sha256"], f["boundary"])).encode())
        results.append({"ruleId": rule, "level": LEVEL[Severity.parse(f["severity"])], "message": {"text": text},
                        "locations": [{"physicalLocation": {"artifactLocation": {"uri": config_uri}}}],
                        "partialFingerprints": {"leakprobe/v1": fingerprint.hexdigest()},
                        "properties": {"severity": f["severity"], "victim_tenant": f["victim_tenant"],
                                       "observer_tenant": f["observer_tenant"], "target": f["target"],
                                       "record_id": f["record_id"], "prompt_tokens": f["prompt_tokens"],
                                       "detector": f["detector"], "score": f["score"], "trace_id": trace_of(f)}})
    return {"version": "2.1.0", "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
            "runs": [{"tool": {"driver": {"name": "leakprobe", "version": doc["tool"]["version"],
                                          "informationUri": "https://github.com/leakprobe/leakprobe",
                                          "rules": rules}},
                      "invocations": [{"executionSuccessful": doc["complete"]}],
                      "properties": {"cache_map": {t["name"]: t["cache_map"] for t in doc["targets"]}},
                      "results": results}]}
