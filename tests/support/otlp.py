"""A real OTLP trace receiver for an engine the tests start (vLLM `--otlp-traces-endpoint`) and for leakprobe's own
spans (`tracing.otlp_endpoint`): OTLP over HTTP with protobuf bodies, as OpenTelemetry's exporters send them, decoded
with the `opentelemetry-proto` messages of the Python it runs in (the engine's, or the project's), every span written
as one JSON line.  What a finding's `trace` detail names is then looked up among the spans exported."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx

from tests.support.ports import free_port
from tests.support.tools import terminate
from tests.support.waiting import wait_for

# Run by the engine's Python: `python -c RECEIVER PORT SPANS_FILE`.
RECEIVER = r"""
import gzip, http.server, json, sys
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)
port, path = int(sys.argv[1]), sys.argv[2]
sink = open(path, "a")

class Receiver(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                service = {a.key: a.value.string_value for a in resource.resource.attributes}.get("service.name")
                for span in scope.spans:
                    attributes = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}
                    sink.write(json.dumps({"trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                                           "parent_span_id": span.parent_span_id.hex(), "name": span.name,
                                           "kind": span.kind, "service": service, "attributes": attributes}) + "\n")
        sink.flush()
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", port), Receiver).serve_forever()
"""
# What the engine's exporter is told, beside the endpoint: HTTP and protobuf (its default is gRPC).
EXPORTER_ENV = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}


class TraceReceiver:
    def __init__(self, python: Path, folder: Path) -> None:
        self.python = python
        self.port = free_port()
        self.spans_file = folder / f"otlp-spans-{self.port}.jsonl"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def start(self) -> TraceReceiver:
        self.spans_file.touch()
        log = self.spans_file.with_suffix(".log")
        with log.open("wb") as sink:
            self._process = subprocess.Popen([str(self.python), "-c", RECEIVER, str(self.port),
                                              str(self.spans_file)], stdout=sink, stderr=subprocess.STDOUT)
        process = self._process
        wait_for(lambda: process.poll() is not None or self._answers(), "the OTLP receiver to listen", idle_s=60)
        if process.poll() is not None:
            raise RuntimeError(f"the OTLP receiver exited {process.returncode}: {log.read_text()[-2000:]}")
        return self

    def _answers(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def spans(self) -> list[dict[str, str]]:
        return [json.loads(line) for line in self.spans_file.read_text().splitlines() if line.strip()]

    def trace_ids(self) -> set[str]:
        return {span["trace_id"] for span in self.spans()}

    def stop(self) -> None:
        if self._process is not None:
            terminate(self._process, grace_s=5)
