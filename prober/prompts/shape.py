"""A probe's shape: which API route carries it, and how its text invites the model to repeat a canary.

A leak shows by content only when the model repeats what it attends over.  An instruction-tuned model quotes
when asked (`ask`: the request on the first line); a base model ignores requests and continues text, so it
repeats a code when the prompt ends in the first half of a canary sentence (`cue`).  A chat template the model
was never trained on (llama.cpp falls back to ChatML for a GGUF without one) makes it babble, so the plain
completions route is a shape of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from prober.targets.api import Api


class Layout(StrEnum):
    ASK = "ask"  # the instruction on the first line asks for the document back
    CUE = "cue"  # the prompt ends in an unfinished canary sentence, for the model to finish


@dataclass(frozen=True)
class Shape:
    api: Api
    layout: Layout

    @property
    def name(self) -> str:
        return f"{self.api.value}-{self.layout.value}"

    @classmethod
    def parse(cls, text: str) -> Shape:
        """`chat-ask`, `completions-cue`, `workers-ai-cue`, ..."""
        route, _, layout = text.strip().rpartition("-")
        try:
            return cls(Api(route), Layout(layout))
        except ValueError:
            names = ", ".join(f"{a.value}-{lay.value}" for a in Api for lay in Layout)
            raise ValueError(f"unknown probe shape {text!r}; choose among {names}") from None


def candidates(api: Api, configured: tuple[Shape, ...] = ()) -> list[Shape]:
    """The shapes to try, in order: the configured ones, else the target's own route asking, then the other
    OpenAI route asking (an endpoint configured as `completions` may serve an instruction-tuned model best through
    chat, and the reverse), then a cue on the plain completions route (a base model), then a cue on chat."""
    if configured:
        return list(configured)
    if not api.openai_routes:
        return [Shape(api, Layout.ASK), Shape(api, Layout.CUE)]
    other = Api.CHAT if api is Api.COMPLETIONS else Api.COMPLETIONS
    order = [Shape(api, Layout.ASK), Shape(other, Layout.ASK), Shape(Api.COMPLETIONS, Layout.CUE),
             Shape(Api.CHAT, Layout.CUE)]
    return list(dict.fromkeys(order))
