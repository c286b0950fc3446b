"""LiteLLM's pre-call hook as an operator scopes the proxy's response cache: each request's cache `namespace` set
from the caller the proxy authenticated, so one tenant's stored answers are never another's (LiteLLM 1.108.7 keys its
cache by model, messages and settings alone); `per_end_user` scopes it by the end user named with the key too (the
proxy's own reading of the request: its end-user headers, then the `user` field), so that end users behind one key
are kept apart as well.  Loaded by the LiteLLM proxy (its own environment), never by leakprobe."""

from typing import Any

from litellm.integrations.custom_logger import CustomLogger
from litellm.proxy.auth.auth_utils import get_end_user_id_from_request_body


class Scoped(CustomLogger):
    def __init__(self, *, by_end_user: bool) -> None:
        super().__init__()
        self.by_end_user = by_end_user

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any],
                                  call_type: str) -> dict[str, Any]:
        namespace = f"tenant-{user_api_key_dict.user_id}"
        if self.by_end_user:
            headers = (data.get("proxy_server_request") or {}).get("headers") or {}
            namespace += f"-user-{get_end_user_id_from_request_body(data, headers)}"
        data["cache"] = {**(data.get("cache") or {}), "namespace": namespace}
        return data


per_tenant = Scoped(by_end_user=False)
per_end_user = Scoped(by_end_user=True)
