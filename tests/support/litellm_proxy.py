"""A real gateway users run: the LiteLLM proxy (PyPI `litellm[proxy]`), in an environment of its own outside the
checkout (its pins are not the project's), built once per machine and reused.  In front of an engine it accepts
each tenant's key (a custom auth, tests/support/litellm_plugins/tenant_auth.py, with no key database), puts the
operator's system prompt before every chat (a pre-call hook, as operators add one), sends every request upstream
with one key of its own, and retries upstream failures itself, saying so in `x-litellm-attempted-retries`.
`python -m tests.support.litellm_proxy` builds (or finds) it and prints its command."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from prober.system.resources import cache_root
from tests.support.ports import free_port
from tests.support.tools import install_main, terminate
from tests.support.waiting import wait_for

LITELLM = "litellm[proxy]==1.108.7"
OPT_OUT = "LEAKPROBE_SKIP_LITELLM"
PLUGINS = Path(__file__).resolve().parent / "litellm_plugins"
# The proxy fetches a model price map from the internet unless told to use its own copy, and refuses to start
# without a master key.
SERVE_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "DO_NOT_TRACK": "1"}


class LiteLLMUnavailable(RuntimeError):
    """The proxy could not be installed or started; the message says why."""


def venv_dir() -> Path:
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    key = hashlib.sha256(f"{LITELLM}|{py}|{platform.machine()}".encode()).hexdigest()[:10]
    return cache_root() / f"litellm-{LITELLM.split('==')[1]}-{py}-{platform.machine()}-{key}"


@dataclass(frozen=True)
class Installation:
    command: Path


def ensure_installed() -> Installation:
    """The proxy's command in a complete environment, building it unless one is cached (~5 min)."""
    target = venv_dir()
    command = target / "bin" / "litellm"
    if (target / ".complete").is_file() and command.is_file():
        return Installation(command)
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    began = time.monotonic()
    done = subprocess.run(["nice", "-n", "10", str(target / "bin" / "python"), "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", "--no-input", LITELLM], capture_output=True, text=True)
    if done.returncode != 0 or not command.is_file():
        raise LiteLLMUnavailable(f"`pip install {LITELLM}` failed (exit {done.returncode}): {done.stderr[-2000:]}")
    (target / ".complete").write_text(f"{LITELLM} installed in {time.monotonic() - began:.0f} s\n")
    return Installation(command)


class LiteLLMProxy:
    """`models`: the model names clients ask for, each with the OpenAI base URL of the engine that serves it (as
    `upstream_model`); `keys`: each tenant's key (the proxy accepts them) and `upstream_key`, the one it sends on."""

    def __init__(self, installation: Installation, folder: Path, *, models: dict[str, str], upstream_model: str,
                 keys: dict[str, str], upstream_key: str, system_prompt: str = "", retries: int = 2,
                 cache: dict[str, Any] | None = None, cache_per_tenant: bool = False,
                 cache_per_end_user: bool = False) -> None:
        """`cache`: the proxy's `cache_params` (its response cache on; None: off); `cache_per_tenant`: a pre-call hook
        scopes it per tenant (tests/support/litellm_plugins/cache_scope.py), as the fix for LiteLLM #29955;
        `cache_per_end_user`: per tenant and the end user named with its key."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        folder.mkdir(parents=True, exist_ok=True)
        for plugin in PLUGINS.glob("*.py"):
            shutil.copy(plugin, folder / plugin.name)
        config: dict[str, Any] = {
            "model_list": [{"model_name": name, "litellm_params": {
                "model": f"openai/{upstream_model}", "api_base": base, "api_key": upstream_key}}
                for name, base in models.items()],
            "router_settings": {"num_retries": retries},
            "litellm_settings": {"callbacks": ["system_prompt.operator_prompt",
                                               *(["cache_scope.per_tenant"] if cache_per_tenant else []),
                                               *(["cache_scope.per_end_user"] if cache_per_end_user else [])],
                                 "drop_params": False,
                                 **({"cache": True, "cache_params": cache} if cache is not None else {})},
            "general_settings": {"master_key": "sk-leakprobe-tests-" + hashlib.sha256(folder.name.encode()
                                                                                      ).hexdigest()[:32],
                                 "custom_auth": "tenant_auth.user_api_key_auth"}}
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
        self._args = [str(installation.command), "--config", str(folder / "config.yaml"), "--host", "127.0.0.1",
                      "--port", str(self.port)]
        self._env = {**os.environ, **SERVE_ENV, "LEAKPROBE_GATEWAY_KEYS": json.dumps({v: k for k, v in keys.items()}),
                     "LEAKPROBE_GATEWAY_SYSTEM_PROMPT": system_prompt}
        self._folder = folder
        self.log = folder / "litellm.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> LiteLLMProxy:
        with self.log.open("wb") as sink:
            self._process = subprocess.Popen(self._args, cwd=self._folder, stdout=sink, stderr=subprocess.STDOUT,
                                             env=self._env)
        process = self._process
        try:
            wait_for(lambda: process.poll() is not None or self._ready(), "the LiteLLM proxy to start",
                     progress=lambda: self.log.stat().st_size, idle_s=120, context=self.tail)
        except AssertionError as exc:
            self.stop()
            raise LiteLLMUnavailable(str(exc).splitlines()[0]) from None
        if process.poll() is not None:
            raise LiteLLMUnavailable(f"the LiteLLM proxy exited {process.returncode}: {self.tail()}")
        return self

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/health/liveliness", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2500:]

    def stop(self) -> None:
        if self._process is not None:
            terminate(self._process)

    def __enter__(self) -> LiteLLMProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


if __name__ == "__main__":
    install_main(OPT_OUT, "the LiteLLM proxy", ensure_installed)
