"""A client request ID, sent as engines and routers take one.

vLLM names a request by the `X-Request-Id` header or the body's `request_id`, SGLang by the body's `rid`, and
routers by either, or by the trace of a W3C `traceparent` (Dynamo made the trace id the engine's request ID,
ai-dynamo/dynamo #8601).  An engine or router that keys the requests in flight by what the client says has handed
one request's answer, or its state, to another that said the same (SGLang PR #19035, vLLM #10583).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestId:
    value: str
    fields: tuple[str, ...] = ()  # body fields that carry it too: only those the target is known to take

    def headers(self) -> dict[str, str]:
        """The `X-Request-Id` header, and a `traceparent` whose trace and span ids are derived from the ID (every
        request that says this ID says that trace)."""
        trace = hashlib.blake2b(self.value.encode(), digest_size=16).hexdigest()
        span = hashlib.blake2b(self.value.encode(), digest_size=8, person=b"span").hexdigest()
        return {"X-Request-Id": self.value, "traceparent": f"00-{trace}-{span}-01"}

    def body(self) -> dict[str, str]:
        return dict.fromkeys(self.fields, self.value)

    def named_by(self, answer_id: str | None, headers: dict[str, str]) -> bool:
        """Whether an answer names its request by this ID: in the id of its body (vLLM's `chatcmpl-<ID>`, SGLang's
        rid) or in the `X-Request-Id` header it came back with: the target takes the client's ID as the request's."""
        return (answer_id is not None and self.value in answer_id) or headers.get("x-request-id") == self.value
