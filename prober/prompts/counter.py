"""Counting tokens the way the engine counts them.

`EndpointCounter` asks the engine's tokenizer endpoint (the chat form where the engine has one, so the
template is counted).  `UsageCounter` has no tokenizer: it sends the text as a real one-token request and
reads `usage.prompt_tokens` — the calibration fallback for hosted APIs.  Both count a *whole prompt* as the
engine will see it; the builder derives segment costs from differences, so template overhead cancels.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prober.domain.errors import CountError
from prober.targets.api import Api, Engine
from prober.targets.base import Prompt, Target
from prober.targets.bounds import Size
from prober.targets.credentials import Secret
from prober.targets.transport import Transport


class TokenCounter(ABC):
    source: str
    requests: int  # how many counting calls (requests to the engine) were made
    free: bool = True  # counting sends no generation request, so a whole built prompt can be verified

    @abstractmethod
    async def count(self, text: str) -> int:
        """Tokens of `text` sent as one prompt through the target's API."""


@dataclass(frozen=True)
class _Dialect:
    """One engine's tokenizer endpoint: path, body shape, and where the count is in the answer."""

    engine: Engine
    path: str
    chat: bool

    def body(self, text: str) -> dict[str, Any]:
        messages = [{"role": "user", "content": text}]
        if self.engine is Engine.SGLANG:
            return {"messages": messages} if self.chat else {"prompt": text}
        if self.engine is Engine.VLLM:
            return ({"messages": messages, "add_generation_prompt": True, "add_special_tokens": False} if self.chat
                    else {"prompt": text, "add_special_tokens": True})
        if self.engine is Engine.LLAMACPP:
            return {"content": text, "add_special": True, "parse_special": True}
        return {"inputs": text} if not self.chat else {"messages": messages}  # TGI

    @staticmethod
    def read(obj: Any) -> int:
        if isinstance(obj, dict):
            if isinstance(obj.get("count"), int):
                return int(obj["count"])
            if isinstance(obj.get("tokens"), list):
                return len(obj["tokens"])
        if isinstance(obj, list):  # TGI: one entry per token
            return len(obj)
        raise CountError(f"unexpected tokenizer answer: {str(obj)[:200]}")


def dialects(api: Api) -> list[_Dialect]:
    """Tokenizer endpoints to try, most specific first.  llama.cpp's chat form is `/apply-template` then
    `/tokenize`, handled in `EndpointCounter`."""
    chat = api.messages
    return [
        _Dialect(Engine.SGLANG, "/v1/tokenize", chat),
        _Dialect(Engine.VLLM, "/tokenize", chat),
        _Dialect(Engine.LLAMACPP, "/tokenize", chat),
        _Dialect(Engine.TGI, "/chat_tokenize" if chat else "/tokenize", chat),
    ]


class EndpointCounter(TokenCounter):
    def __init__(self, transport: Transport, origin: str, dialect: _Dialect, secret: Secret | None) -> None:
        self.transport = transport
        self.origin = origin.rstrip("/")
        self.dialect = dialect
        self.secret = secret
        form = " (chat form)" if dialect.chat else ""
        self.source = f"{dialect.engine} {dialect.path}{form}"
        self.requests = 0

    async def count(self, text: str) -> int:
        self.requests += 1
        if self.dialect.engine is Engine.LLAMACPP and self.dialect.chat:
            text = await self._apply_template(text)
        obj = await self._post(self.dialect.path, self.dialect.body(text), text)
        return self.dialect.read(obj)

    async def _apply_template(self, text: str) -> str:
        obj = await self._post("/apply-template", {"messages": [{"role": "user", "content": text}]}, text)
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise CountError("llama.cpp /apply-template gave no prompt")
        return str(obj["prompt"])

    async def _post(self, path: str, body: dict[str, Any], text: str) -> Any:
        """`text`: what the engine tokenizes, which its time is bounded by."""
        exchange = await self.transport.exchange("POST", self.origin + path, json=body, secret=self.secret,
                                                 size=Size(len(text.encode("utf-8", "surrogatepass"))))
        if exchange.error is not None or exchange.status != 200:
            raise CountError(f"{self.origin}{path}: {exchange.error or f'HTTP {exchange.status}'}")
        obj, problem = exchange.json()
        if problem:
            raise CountError(f"{self.origin}{path}: {problem}")
        return obj


async def detect_counter(transport: Transport, origin: str, api: Api, secret: Secret | None,
                         engine: Engine | None = None) -> EndpointCounter | None:
    """The first tokenizer endpoint that counts a probe text sensibly, or None."""
    candidates = [d for d in dialects(api) if engine is None or d.engine == engine]
    for dialect in candidates:
        counter = EndpointCounter(transport, origin, dialect, secret)
        try:
            short, long = await counter.count("canary"), await counter.count("canary " * 20)
        except CountError:
            continue
        if 0 < short < long:
            counter.requests = 0
            return counter
    return None


class UsageCounter(TokenCounter):
    """Calibration by real requests (max_tokens 1): costs tokens, so the builder caches what it learns."""

    def __init__(self, target: Target, secret: Secret | None) -> None:
        self.target = target
        self.secret = secret
        self.source = "usage.prompt_tokens of calibration requests"
        self.free = False
        self.requests = 0

    async def count(self, text: str) -> int:
        self.requests += 1
        answer = await self.target.complete(Prompt(text, max_tokens=1), self.secret)
        if answer.usage is None or answer.usage.prompt_tokens is None:
            raise CountError(f"calibration request gave no usage.prompt_tokens "
                             f"({answer.implausible_usage or answer.error or f'HTTP {answer.status}'})")
        return answer.usage.prompt_tokens


class LocalCounter(TokenCounter):
    """A tokenizer function in this process (the reference engine's, in benches and tests of the builder)."""

    def __init__(self, count: Callable[[str], int], source: str = "local tokenizer") -> None:
        self._count = count
        self.source = source
        self.requests = 0

    async def count(self, text: str) -> int:
        self.requests += 1
        return self._count(text)

