"""LiteLLM's custom auth for the tests' gateway: each tenant's own key is accepted as that tenant (read from
LEAKPROBE_GATEWAY_KEYS, a JSON map of key to tenant), with no database of virtual keys.  Loaded by the LiteLLM
proxy (its own environment), never by leakprobe."""

import json
import os

from fastapi import Request
from litellm.proxy._types import UserAPIKeyAuth

KEYS = json.loads(os.environ["LEAKPROBE_GATEWAY_KEYS"])


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    if api_key in KEYS:
        return UserAPIKeyAuth(api_key=api_key, user_id=KEYS[api_key])
    raise PermissionError("invalid API key")
