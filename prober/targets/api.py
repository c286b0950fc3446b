"""Which API a target speaks: one enum instead of string comparisons scattered over the layers."""

from __future__ import annotations

from enum import StrEnum


class Engine(StrEnum):
    """Serving engines leakprobe knows the endpoints of (introspection, tokenizers, error shapes, counters)."""

    SGLANG = "sglang"
    VLLM = "vllm"
    LLAMACPP = "llama.cpp"
    TGI = "tgi"


class Api(StrEnum):
    CHAT = "chat"  # OpenAI-compatible /v1/chat/completions
    COMPLETIONS = "completions"  # OpenAI-compatible /v1/completions
    RESPONSES = "responses"  # OpenAI's Responses API, /v1/responses (vLLM, LiteLLM, hosted APIs)
    WORKERS_AI = "workers-ai"  # Cloudflare Workers AI's native run URL

    @property
    def openai_routes(self) -> bool:
        """The base URL also serves /v1/models and the engine's own routes (reachability, tokenizers)."""
        return self is not Api.WORKERS_AI

    @property
    def messages(self) -> bool:
        """The engine reads the prompt as messages through its chat template (chat and the Responses API)."""
        return self in (Api.CHAT, Api.RESPONSES)
