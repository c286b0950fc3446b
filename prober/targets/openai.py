"""OpenAI-compatible chat and completions (SGLang, vLLM, llama.cpp, TGI, hosted APIs)."""

from __future__ import annotations

import math
from typing import Any

from prober.targets.api import Api
from prober.targets.base import HTTPTarget, Piece, Prompt, error_message
from prober.targets.result import Usage
from prober.targets.transport import Transport


class OpenAICompatible(HTTPTarget):
    """`base_url` is what users paste, e.g. `http://host:8000/v1`."""

    end_user_field = "user"

    def __init__(self, name: str, base_url: str, transport: Transport, *, api: Api = Api.CHAT,
                 model: str | None = None) -> None:
        super().__init__(name, transport)
        self.base_url = base_url.rstrip("/")
        self.api = api
        self.model = model

    @property
    def takes_media(self) -> bool:
        return self.api is Api.CHAT

    @property
    def takes_embeds(self) -> bool:
        return self.api is Api.COMPLETIONS

    def endpoint(self) -> str:
        return f"{self.base_url}/{'chat/completions' if self.api is Api.CHAT else 'completions'}"

    def body(self, prompt: Prompt) -> dict[str, Any]:
        body = {"max_tokens": prompt.max_tokens, **self.sampling(prompt)}
        if self.api is Api.CHAT:
            body["messages"] = [*({"role": role, "content": text} for role, text in prompt.turns),
                                {"role": "user", "content": _content(prompt)}]
        elif prompt.embeds is not None:
            body["prompt_embeds"] = prompt.embeds
        else:
            body["prompt"] = "".join(f"{text}\n" for _, text in prompt.turns) + prompt.text
        if prompt.stream:
            body["stream_options"] = {"include_usage": True}
        if prompt.logprobs:  # chat takes a flag, completions the number of alternatives beside each token
            body["logprobs"] = True if self.api is Api.CHAT else 1
        return body

    def sampling(self, prompt: Prompt) -> dict[str, Any]:
        """What every OpenAI route takes alike: sampling, streaming, the model, vLLM's salt, the client's ID."""
        body: dict[str, Any] = {"temperature": prompt.temperature, "stream": prompt.stream}
        if prompt.seed is not None:
            body["seed"] = prompt.seed
        if prompt.cache_salt is not None:
            body["cache_salt"] = prompt.cache_salt
        if prompt.model or self.model:
            body["model"] = prompt.model or self.model
        if prompt.request_id is not None:
            body.update(prompt.request_id.body())
        return body

    def answer_id(self, obj: Any) -> str | None:
        named = obj.get("id") if isinstance(obj, dict) else None
        return named if isinstance(named, str) else None

    def answer_created(self, obj: Any) -> int | None:
        made = obj.get("created") if isinstance(obj, dict) else None
        return made if isinstance(made, int) and not isinstance(made, bool) else None

    def read_answer(self, obj: Any) -> Piece:
        problem = error_message(obj)
        if problem and not obj.get("choices"):
            return Piece(error=problem)
        choice = obj["choices"][0]
        if self.api is not Api.CHAT:
            return Piece(choice["text"] or "", choice.get("finish_reason"), Usage.parse(obj.get("usage")),
                         logprob=summed(choice.get("logprobs")))
        message = choice["message"]
        return Piece(message.get("content") or "", choice.get("finish_reason"), Usage.parse(obj.get("usage")),
                     other=beside_content(message), logprob=summed(choice.get("logprobs")))

    def read_event(self, obj: Any) -> Piece:
        problem = error_message(obj)
        if problem:
            return Piece(error=problem)
        usage = Usage.parse(obj.get("usage"))
        choices = obj.get("choices") or []
        if not choices:
            return Piece(usage=usage)
        choice = choices[0]
        logprob = summed(choice.get("logprobs"))
        if self.api is Api.CHAT or "delta" in choice:
            delta = choice.get("delta") or {}
            return Piece(delta.get("content") or "", choice.get("finish_reason"), usage, other=beside_content(delta),
                         logprob=logprob)
        return Piece(choice.get("text") or "", choice.get("finish_reason"), usage, logprob=logprob)


def summed(logprobs: Any) -> float | None:
    """The sum of a choice's token log-probabilities: chat's `content` list of `{token, logprob}`, completions'
    `token_logprobs` (None where there are none, or any is not a number: a sum with a gap in it says nothing)."""
    if not isinstance(logprobs, dict):
        return None
    content = logprobs.get("content")
    values = ([t.get("logprob") if isinstance(t, dict) else None for t in content] if isinstance(content, list)
              else logprobs.get("token_logprobs"))
    if not isinstance(values, list) or not all(isinstance(v, int | float) and not isinstance(v, bool)
                                               and math.isfinite(v) and v <= 0 for v in values):
        return None
    return float(sum(values))


def _content(prompt: Prompt) -> str | list[dict[str, Any]]:
    """The text alone, or OpenAI's content parts: the text, then each image (`uuid` beside `image_url`, as vLLM
    takes it; `image_url: null` names an image by its uuid alone)."""
    if not prompt.media:
        return prompt.text
    images = [{"type": "image_url", "image_url": {"url": m.url} if m.url is not None else None,
               **({"uuid": m.uuid} if m.uuid is not None else {})} for m in prompt.media]
    return [{"type": "text", "text": prompt.text}, *images]


def beside_content(message: dict[str, Any]) -> str:
    """A chat message's (or stream delta's) text outside `content`: reasoning (vLLM and SGLang `reasoning_content`,
    newer vLLM `reasoning`), a refusal, tool-call arguments."""
    texts = [message.get("reasoning_content"), message.get("reasoning"), message.get("refusal")]
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            texts.append(function.get("arguments"))
    return "\n".join(t for t in texts if isinstance(t, str) and t)
