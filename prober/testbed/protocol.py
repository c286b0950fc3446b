"""Request bodies the engine accepts (OpenAI-compatible, SGLang tokenize) and its chat template."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from prober.testbed.config import QuoteStyle

NonEmpty = Annotated[str, StringConstraints(min_length=1)]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    model_config = ConfigDict(extra="ignore")
    url: str


class ImagePart(BaseModel):
    """OpenAI's image part, with vLLM's `uuid` beside it: the client's name for the image, which vLLM caches its
    features under (and a part with `image_url: null` refers to an image cached earlier under that name)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["image_url"]
    image_url: ImageURL | None = None
    uuid: str | None = Field(None, min_length=1, max_length=256)


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[Part]

    @property
    def text(self) -> str:
        """Its text parts (an image becomes text only once the engine has seen it: MediaCache.see)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def images(self) -> list[ImagePart]:
        return [] if isinstance(self.content, str) else [p for p in self.content if isinstance(p, ImagePart)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Generation(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    quote_style: QuoteStyle | None = None  # testbed extension: how the model renders quotes
    cache_salt: str | None = Field(None, max_length=256)  # vLLM's: only requests with equal salts share the cache
    # Honoured by a real model (the quoting model is deterministic): null temperature = the engine's default.
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    rid: str | None = Field(None, max_length=256)  # SGLang's: the client's name for the request
    request_id: str | None = Field(None, max_length=256)  # vLLM's

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatRequest(_Generation):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @field_validator("messages")
    @classmethod
    def _some_text(cls, value: list[Message]) -> list[Message]:
        if not any(m.text.strip() or m.images for m in value):
            raise ValueError("all messages are empty")
        return value

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Generation):
    prompt: NonEmpty | list[NonEmpty] | None = None
    prompt_embeds: NonEmpty | None = None  # vLLM's: the prompt as embeddings (prober/input_embeds/codec.py)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("exactly one prompt per request")
        return value

    @model_validator(mode="after")
    def _a_prompt(self) -> CompletionRequest:
        if self.prompt is None and self.prompt_embeds is None:
            raise ValueError("give `prompt` or `prompt_embeds`")
        return self

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0] if self.prompt else ""

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class InputText(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["input_text", "output_text"]
    text: str


class InputMessage(BaseModel):
    """One of the Responses API's `input` items: a message, its content text or text parts."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[InputText]

    def message(self) -> Message:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return Message(role=self.role, content=text)


class ResponsesRequest(_Generation):
    """OpenAI's Responses API: `instructions` (a system message) and `input` (a string or messages), read through
    the chat template as chat's messages are."""

    input: NonEmpty | list[InputMessage]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)

    @field_validator("input")
    @classmethod
    def _some_input(cls, value: str | list[InputMessage]) -> str | list[InputMessage]:
        if isinstance(value, list) and not any(m.message().text.strip() for m in value):
            raise ValueError("all input messages are empty")
        return value

    @property
    def messages(self) -> list[Message]:
        said = ([Message(role="user", content=self.input)] if isinstance(self.input, str)
                else [m.message() for m in self.input])
        return [Message(role="system", content=self.instructions), *said] if self.instructions else said

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_output_tokens


class TokenizeRequest(BaseModel):
    """SGLang's shape ({"prompt": str}) or the chat form ({"messages": [...]}) that counts the template."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_generation_prompt: bool = True


def render_chat(messages: list[Message], add_generation_prompt: bool = True) -> str:
    """ChatML-style template; its markup costs tokens, which is why the chat form of tokenize exists."""
    body = "".join(f"<|im_start|>{m.role}\n{m.text}<|im_end|>\n" for m in messages)
    return body + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def error_body(status: int, message: str, err_type: str) -> dict[str, Any]:
    """SGLang's OpenAI-route error object."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}
