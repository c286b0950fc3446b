"""LiteLLM's pre-call hook as an operator scopes the proxy's response cache per tenant: each request's cache
`namespace` set from the caller the proxy authenticated, so one tenant's stored answers are never another's (LiteLLM
1.108.7 keys its cache by model, messages and settings alone).  Loaded by the LiteLLM proxy (its own environment),
never by leakprobe."""

from typing import Any

from litellm.integrations.custom_logger import CustomLogger


class PerTenant(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any],
                                  call_type: str) -> dict[str, Any]:
        data["cache"] = {**(data.get("cache") or {}), "namespace": f"tenant-{user_api_key_dict.user_id}"}
        return data


per_tenant = PerTenant()
