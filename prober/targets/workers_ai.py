"""Cloudflare Workers AI's native API: `POST …/accounts/{id}/ai/run/{model}` with the
`{result, success, errors, messages}` envelope, plain or as server-sent events."""

from __future__ import annotations

from typing import Any

from prober.targets.base import HTTPTarget, Piece, Prompt, error_message
from prober.targets.result import Usage
from prober.targets.transport import Transport


class WorkersAI(HTTPTarget):
    """`run_url` is the whole run URL, model included
    (`https://api.cloudflare.com/client/v4/accounts/ID/ai/run/@cf/meta/llama-3.1-8b-instruct`)."""

    def __init__(self, name: str, run_url: str, transport: Transport) -> None:
        super().__init__(name, transport)
        self.run_url = run_url.rstrip("/")

    def endpoint(self) -> str:
        return self.run_url

    def body(self, prompt: Prompt) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": prompt.text}], "max_tokens": prompt.max_tokens,
                "temperature": prompt.temperature, "stream": prompt.stream,
                **({"seed": prompt.seed} if prompt.seed is not None else {})}

    def read_answer(self, obj: Any) -> Piece:
        if obj.get("success") is False or not isinstance(obj.get("result"), dict):
            return Piece(error=error_message(obj) or "success is false and no result")
        result = obj["result"]
        return Piece(str(result.get("response") or ""), result.get("finish_reason"), Usage.parse(result.get("usage")))

    def read_event(self, obj: Any) -> Piece:
        problem = error_message(obj)
        if problem:
            return Piece(error=problem)
        return Piece(str(obj.get("response") or ""), obj.get("finish_reason"), Usage.parse(obj.get("usage")))
