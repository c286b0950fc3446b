"""OpenAI's Responses API, `/v1/responses` (vLLM, LiteLLM, hosted APIs): a gateway may treat it apart from chat
(LiteLLM CVE-2026-89032 read the caller from where only chat completions put it), so it is a route of its own.

The prompt travels as `input` messages, the answer as `output` items; a stream is typed events ending on
`response.completed` (or `.incomplete`, `.failed`), with no `[DONE]`, and the usage is `input_tokens` /
`output_tokens`."""

from __future__ import annotations

from typing import Any

from prober.targets.base import Piece, Prompt, error_message
from prober.targets.openai import OpenAICompatible
from prober.targets.result import Usage

# Events whose `delta` is text beside the answer: reasoning, a refusal, tool-call arguments.
BESIDE = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta", "response.refusal.delta",
          "response.function_call_arguments.delta")
FINAL = ("response.completed", "response.incomplete", "response.failed")


class OpenAIResponses(OpenAICompatible):
    def endpoint(self) -> str:
        return f"{self.base_url}/responses"

    def body(self, prompt: Prompt) -> dict[str, Any]:
        # `store: false`: nothing a probe carries is kept at the target for later `previous_response_id` reads.
        items = [*({"role": role, "content": text} for role, text in prompt.turns),
                 {"role": "user", "content": prompt.text}]
        return {"max_output_tokens": prompt.max_tokens, "input": items, "store": False, **self.sampling(prompt)}

    def answer_id(self, obj: Any) -> str | None:
        return super().answer_id(_response(obj))

    def answer_created(self, obj: Any) -> int | None:
        made = _response(obj).get("created_at")
        return made if isinstance(made, int) and not isinstance(made, bool) else None

    def read_answer(self, obj: Any) -> Piece:
        problem = error_message(obj)
        if problem and not obj.get("output"):
            return Piece(error=problem)
        texts: list[str] = []
        others: list[str] = []
        for item in obj.get("output") or []:
            kind = item.get("type")
            parts = item.get("content") or []
            if kind == "message":
                texts += [p.get("text") or "" for p in parts if p.get("type") == "output_text"]
                others += [p.get("refusal") or "" for p in parts if p.get("type") == "refusal"]
            elif kind == "reasoning":
                others += [p.get("text") or "" for p in [*parts, *(item.get("summary") or [])]]
            elif kind == "function_call":
                others.append(item.get("arguments") or "")
        return Piece("".join(texts), _finish(obj), Usage.parse(obj.get("usage")),
                     other="\n".join(t for t in others if isinstance(t, str) and t))

    def read_event(self, obj: Any) -> Piece:
        kind = obj.get("type")
        if kind == "response.output_text.delta":
            return Piece(obj.get("delta") or "")
        if kind in BESIDE:
            return Piece(other=obj.get("delta") or "")
        if kind in FINAL:
            response = obj.get("response") or {}
            return Piece(finish_reason=_finish(response), usage=Usage.parse(response.get("usage")),
                         error=error_message(response) if kind == "response.failed" else None, ends=True)
        if kind == "error":  # {"type": "error", "code", "message"}
            return Piece(error=str(obj.get("message") or obj.get("code") or "error"), ends=True)
        return Piece(error=error_message(obj))


def _response(obj: Any) -> dict[str, Any]:
    """The response object: the body itself, or the one a stream event carries."""
    if not isinstance(obj, dict):
        return {}
    inner = obj.get("response")
    return inner if isinstance(inner, dict) else obj


def _finish(response: dict[str, Any]) -> str | None:
    """Chat's finish reason for a response's status: `stop`, `length` (out of `max_output_tokens`), or the reason an
    incomplete one gives."""
    status = response.get("status")
    if status == "completed":
        return "stop"
    if status == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return "length" if reason == "max_output_tokens" else (str(reason) if reason else "incomplete")
    return None
