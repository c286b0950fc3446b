"""Token-exact prompts: counting tokens as the engine does, and building prompts to a length."""

from prober.prompts.builder import BuiltPrompt, PromptBuilder
from prober.prompts.counter import EndpointCounter, LocalCounter, TokenCounter, UsageCounter, detect_counter

__all__ = [ "BuiltPrompt", "EndpointCounter", "LocalCounter", "PromptBuilder",
           "TokenCounter", "UsageCounter", "detect_counter"]
