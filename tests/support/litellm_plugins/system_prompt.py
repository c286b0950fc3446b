"""LiteLLM's pre-call hook as operators use it: the operator's system prompt (LEAKPROBE_GATEWAY_SYSTEM_PROMPT) put
before every chat conversation.  Loaded by the LiteLLM proxy (its own environment), never by leakprobe."""

import os
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

PROMPT = os.environ.get("LEAKPROBE_GATEWAY_SYSTEM_PROMPT", "")


class OperatorPrompt(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any],
                                  call_type: str) -> dict[str, Any]:
        if PROMPT and isinstance(data.get("messages"), list):
            data["messages"] = [{"role": "system", "content": PROMPT}, *data["messages"]]
        return data


operator_prompt = OperatorPrompt()
