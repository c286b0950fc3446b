"""leakprobe's own spans (prober/targets/spans.py): with `tracing.otlp_endpoint` set, every request an audit sends is
exported over OTLP as a client span carrying the trace context the request carried, so a finding's trace id opens
leakprobe's request in the operator's trace view (and the engine's span under it: tests/test_vllm.py).  A receiver
that is down costs the audit nothing it found.  The receiver is a real OTLP/HTTP one (tests/support/otlp.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from prober.config.schema import parse_config
from prober.domain.evidence import Traced
from prober.domain.types import FindingKind
from prober.oneshot.audit import run_audit
from prober.targets import Secret
from tests.support.keys import KEYS
from tests.support.otlp import TraceReceiver
from tests.support.ports import free_port
from tests.support.testbed import SMALL, StartTestbed

CLIENT = 3  # opentelemetry.proto's SpanKind.SPAN_KIND_CLIENT
TENANTS = {"tenant-a": "LP_A", "tenant-b": "LP_B"}  # each tenant's key's variable (tests/support/keys.py)


def audit(url: str, ledger: Path, endpoint: str) -> Any:
    config = parse_config({
        "ledger": str(ledger), "targets": [{"name": "testbed", "url": url + "/v1"}],
        "tenants": [{"name": name, "api_key_env": env} for name, env in TENANTS.items()],
        "detection": {"semantic": False}, "tracing": {"otlp_endpoint": endpoint, "service_name": "leakprobe-ci"}})
    return asyncio.run(run_audit(config, {name: Secret(KEYS[env]) for name, env in TENANTS.items()}))


def test_each_findings_trace_is_a_span_leakprobe_exported(testbed: StartTestbed, tmp_path: Path) -> None:
    receiver = TraceReceiver(Path(sys.executable), tmp_path).start()
    try:
        result = audit(testbed("incident", **SMALL).url, tmp_path / "l.sqlite", receiver.endpoint)
    finally:
        receiver.stop()
    echoes = [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_ECHO]
    assert echoes, [f.kind for f in result.findings]
    spans = {(s["trace_id"], s["span_id"]): s for s in receiver.spans()}
    # The audit's close sent every span before it returned: one per request it sent, the survey's too.
    assert len(spans) >= len(result.targets[0].steps), len(spans)
    for finding in echoes:
        trace = finding.evidence_of(Traced)
        assert trace is not None
        span = spans[(trace.trace_id, trace.span_id)]
        assert span["kind"] == CLIENT and span["service"] == "leakprobe-ci"
        assert span["name"].startswith("POST /v1/") and span["attributes"]["http.response.status_code"] == 200
        assert span["attributes"]["url.full"].startswith(url_of(span))
    exported = receiver.spans_file.read_text()
    assert not [key for key in KEYS.values() if key in exported]  # keys travel in headers, never in a span


def url_of(span: dict[str, Any]) -> str:
    attributes = span["attributes"]
    return f"http://{attributes['server.address']}:{attributes['server.port']}/v1/"


def test_a_receiver_that_is_down_costs_the_audit_nothing_it_found(testbed: StartTestbed, tmp_path: Path) -> None:
    result = audit(testbed("incident", **SMALL).url, tmp_path / "l.sqlite", f"http://127.0.0.1:{free_port()}/v1/traces")
    assert result.complete, result.targets[0].errors
    assert {FindingKind.CROSS_TENANT_ECHO, FindingKind.BOUNDARY_ACCEPTED} <= {f.kind for f in result.findings}
