"""Token-exact prompts: counting tokens as the engine does, and building prompts to a length."""

from prober.prompts.builder import BuildError, BuiltPrompt, PromptBuilder
from prober.prompts.counter import (
    CountError,
    EndpointCounter,
    LocalCounter,
    TokenCounter,
    UsageCounter,
    detect_counter,
)

__all__ = ["BuildError", "BuiltPrompt", "CountError", "EndpointCounter", "LocalCounter", "PromptBuilder",
           "TokenCounter", "UsageCounter", "detect_counter"]
