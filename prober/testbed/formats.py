"""How each generation route writes the engine's answer: one JSON body, or the events of a stream.  Chat and
completions as vLLM and SGLang write them (chunks, then `[DONE]`); the Responses API as vLLM and OpenAI do (typed
events ending on `response.completed`, no `[DONE]`).  A reasoning model's quote goes where each route puts
reasoning, its content being `REASONED`."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from prober.testbed.paging import EngineError, GenerationResult

REASONED = "Done."  # a reasoning model's content, its quote in reasoning_content


class Format(ABC):
    id_prefix: str

    def meta(self, name: str, model: str, created: int) -> dict[str, Any]:
        return {"id": f"{self.id_prefix}-{name}", "created": created, "model": model}

    @abstractmethod
    def answer(self, meta: dict[str, Any], result: GenerationResult, reasoning: bool) -> dict[str, Any]: ...

    @abstractmethod
    def events(self, meta: dict[str, Any], pieces: list[str], result: GenerationResult, reasoning: bool,
               include_usage: bool) -> Iterator[str]:
        """The stream's events for a computed answer, `pieces` a few tokens each."""

    def failed(self, error: EngineError) -> Iterator[str]:
        """A stream whose request the engine refused after the headers were sent."""
        yield sse({"error": {"message": error.message, "type": error.err_type, "code": error.status}})
        yield "data: [DONE]\n\n"


class Chat(Format):
    id_prefix = "chatcmpl"

    def answer(self, meta: dict[str, Any], result: GenerationResult, reasoning: bool) -> dict[str, Any]:
        message = ({"role": "assistant", "reasoning_content": result.text, "content": REASONED} if reasoning
                   else {"role": "assistant", "content": result.text})
        choice = {"index": 0, "message": message, "finish_reason": result.finish_reason}
        return {**meta, "object": "chat.completion", "choices": [choice], "usage": usage(result)}

    def events(self, meta: dict[str, Any], pieces: list[str], result: GenerationResult, reasoning: bool,
               include_usage: bool) -> Iterator[str]:
        said = "reasoning_content" if reasoning else "content"
        extra = {"usage": None} if include_usage else {}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return sse({**meta, "object": "chat.completion.chunk", "choices": [choice], **extra})

        yield chunk({"role": "assistant", "content": ""})
        yield from (chunk({said: piece}) for piece in pieces)
        if reasoning:
            yield chunk({"content": REASONED})
        yield chunk({}, result.finish_reason)
        if include_usage:
            yield sse({**meta, "object": "chat.completion.chunk", "choices": [], "usage": usage(result)})
        yield "data: [DONE]\n\n"


class Completions(Format):
    id_prefix = "cmpl"

    def answer(self, meta: dict[str, Any], result: GenerationResult, reasoning: bool) -> dict[str, Any]:
        choice = {"index": 0, "text": result.text, "finish_reason": result.finish_reason}
        return {**meta, "object": "text_completion", "choices": [choice], "usage": usage(result)}

    def events(self, meta: dict[str, Any], pieces: list[str], result: GenerationResult, reasoning: bool,
               include_usage: bool) -> Iterator[str]:
        extra = {"usage": None} if include_usage else {}

        def chunk(text: str, finish: str | None = None) -> str:
            choice = {"index": 0, "text": text, "finish_reason": finish}
            return sse({**meta, "object": "text_completion", "choices": [choice], **extra})

        yield from (chunk(piece) for piece in pieces)
        yield chunk("", result.finish_reason)
        if include_usage:
            yield sse({**meta, "object": "text_completion", "choices": [], "usage": usage(result)})
        yield "data: [DONE]\n\n"


class Responses(Format):
    """`created_at` where the others say `created`; usage always arrives, in the final event."""

    id_prefix = "resp"

    def meta(self, name: str, model: str, created: int) -> dict[str, Any]:
        return {"id": f"resp_{name}", "object": "response", "created_at": created, "model": model}

    def answer(self, meta: dict[str, Any], result: GenerationResult, reasoning: bool) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if reasoning:
            output.append({"type": "reasoning", "id": f"rs_{meta['id']}", "summary": [],
                           "content": [{"type": "reasoning_text", "text": result.text}]})
        text = REASONED if reasoning else result.text
        status = "incomplete" if result.finish_reason == "length" else "completed"
        output.append({"type": "message", "id": f"msg_{meta['id']}", "status": status, "role": "assistant",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]})
        cut = status == "incomplete"
        return {**meta, "status": status,
                "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
                "output": output, "usage": {
                    "input_tokens": result.prompt_tokens,
                    "input_tokens_details": cached_details(result),
                    "output_tokens": result.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": result.prompt_tokens + result.completion_tokens}}

    def events(self, meta: dict[str, Any], pieces: list[str], result: GenerationResult, reasoning: bool,
               include_usage: bool) -> Iterator[str]:
        """Every event vLLM and OpenAI send, numbered: a gateway that caches a stream assembles the answer from the
        item and part events, not from the deltas alone."""
        whole = self.answer(meta, result, reasoning)
        *thought, message = whole["output"]
        item = {**message, "status": "in_progress", "content": []}
        text = REASONED if reasoning else result.text
        said = "response.reasoning_text.delta" if reasoning else "response.output_text.delta"
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": {**meta, "status": "in_progress", "output": [], "usage": None}}),
            ("response.in_progress", {"response": {**meta, "status": "in_progress", "output": [], "usage": None}}),
            *((said, {"item_id": f"rs_{meta['id']}", "output_index": 0, "content_index": 0, "delta": piece})
              for piece in (pieces if thought else ())),
            ("response.output_item.added", {"output_index": len(thought), "item": item}),
            ("response.content_part.added", {"item_id": message["id"], "output_index": len(thought),
                                             "content_index": 0, "part": {"type": "output_text", "text": "",
                                                                          "annotations": []}}),
            *(("response.output_text.delta", {"item_id": message["id"], "output_index": len(thought),
                                              "content_index": 0, "delta": piece})
              for piece in ([REASONED] if thought else pieces)),
            ("response.output_text.done", {"item_id": message["id"], "output_index": len(thought),
                                           "content_index": 0, "text": text}),
            ("response.content_part.done", {"item_id": message["id"], "output_index": len(thought),
                                            "content_index": 0, "part": message["content"][0]}),
            ("response.output_item.done", {"output_index": len(thought), "item": message}),
            (f"response.{whole['status']}", {"response": whole}),
        ]
        yield from (typed(kind, sequence_number=n, **fields) for n, (kind, fields) in enumerate(events))

    def failed(self, error: EngineError) -> Iterator[str]:
        yield typed("error", code=str(error.status), message=error.message, param=None)


def usage(result: GenerationResult) -> dict[str, Any]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "prompt_tokens_details": cached_details(result),
    }


def cached_details(result: GenerationResult) -> dict[str, int]:
    """The cached tokens, and where the engine has a second tier, which tier served them (vLLM's names)."""
    if result.external_cached_tokens is None:
        return {"cached_tokens": result.cached_tokens}
    return {"cached_tokens": result.cached_tokens,
            "local_cached_tokens": result.cached_tokens - result.external_cached_tokens,
            "external_cached_tokens": result.external_cached_tokens}


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def typed(kind: str, **fields: Any) -> str:
    """One of the Responses API's events: its type named on the `event:` line and in the data."""
    return f"event: {kind}\n" + sse({"type": kind, **fields})
