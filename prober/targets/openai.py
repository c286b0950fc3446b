"""OpenAI-compatible chat and completions (SGLang, vLLM, llama.cpp, TGI, hosted APIs)."""

from __future__ import annotations

from typing import Any

from prober.targets.api import Api
from prober.targets.base import HTTPTarget, Piece, Prompt, error_message
from prober.targets.result import Usage
from prober.targets.transport import Transport


class OpenAICompatible(HTTPTarget):
    """`base_url` is what users paste, e.g. `http://host:8000/v1`."""

    def __init__(self, name: str, base_url: str, transport: Transport, *, api: Api = Api.CHAT,
                 model: str | None = None) -> None:
        super().__init__(name, transport)
        self.base_url = base_url.rstrip("/")
        self.api = api
        self.model = model

    def endpoint(self) -> str:
        return f"{self.base_url}/{'chat/completions' if self.api is Api.CHAT else 'completions'}"

    def body(self, prompt: Prompt) -> dict[str, Any]:
        body: dict[str, Any] = {"max_tokens": prompt.max_tokens, "temperature": prompt.temperature,
                                "stream": prompt.stream}
        if prompt.seed is not None:
            body["seed"] = prompt.seed
        if prompt.cache_salt is not None:
            body["cache_salt"] = prompt.cache_salt
        if self.model:
            body["model"] = self.model
        if self.api is Api.CHAT:
            body["messages"] = [{"role": "user", "content": prompt.text}]
        else:
            body["prompt"] = prompt.text
        if prompt.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def read_answer(self, obj: Any) -> Piece:
        problem = error_message(obj)
        if problem and not obj.get("choices"):
            return Piece(error=problem)
        choice = obj["choices"][0]
        text = choice["message"].get("content") if self.api is Api.CHAT else choice["text"]
        return Piece(text or "", choice.get("finish_reason"), Usage.parse(obj.get("usage")))

    def read_event(self, obj: Any) -> Piece:
        problem = error_message(obj)
        if problem:
            return Piece(error=problem)
        usage = Usage.parse(obj.get("usage"))
        choices = obj.get("choices") or []
        if not choices:
            return Piece(usage=usage)
        choice = choices[0]
        if self.api is Api.CHAT or "delta" in choice:
            text = (choice.get("delta") or {}).get("content") or ""
        else:
            text = choice.get("text") or ""
        return Piece(text, choice.get("finish_reason"), usage)
