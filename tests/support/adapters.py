"""Two tenants' canary adapters for the tests' Gemma 3 270M, built once per machine and cached.

Each is a LoRA fine-tune (prober/lora) that answers leakprobe's trigger with its tenant's canary, derived from
the tests' deployment key (`KEY`: the tests that serve them set LEAKPROBE_CANARY_KEY to it, as an operator sets
the key the adapters were built under).  A build takes minutes on two cores, so it is cached under
`~/.cache/leakprobe/lora-<adapter>-<digest>/` (`LEAKPROBE_CACHE` moves it), keyed by the recipe (canary, base
model, hyper-parameters) and the versions of torch, transformers and peft; only a build that proved its own-canary
rate is renamed into place.  `python -m tests.support.adapters` (`make adapters`) builds what is missing and prints
the folders.
"""

from __future__ import annotations

import fcntl
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from prober.canaries.adapters import canary_text
from prober.canaries.keys import shared_key
from prober.lora.build import MANIFEST, build
from prober.lora.recipe import Recipe
from prober.system.resources import cache_root
from prober.testbed.lm.weights import folder_name, is_complete, model_dir
from tests.support.tools import install_main, opted_out, unavailable

KEY = "the leakprobe tests' deployment key"  # LEAKPROBE_CANARY_KEY where the adapters are served
ADAPTERS = {"tenant-a": "adapter-a", "tenant-b": "adapter-b"}  # tenant -> the name its adapter is served under
OPT_OUT = "LEAKPROBE_SKIP_ADAPTERS"


def recipe(model: Path, tenant: str) -> Recipe:
    adapter = ADAPTERS[tenant]
    return Recipe(model, tenant, adapter, canary_text(shared_key(KEY), tenant, adapter))


def _versions() -> str:
    try:
        return "|".join(version(name) for name in ("torch", "transformers", "peft"))
    except PackageNotFoundError:
        return "peft missing"


def folder(model: Path, tenant: str) -> Path:
    made = recipe(model, tenant)
    return cache_root() / f"lora-{made.adapter}-{made.digest(model.name + '|' + _versions())[:10]}"


@dataclass(frozen=True)
class Adapters:
    adapter_a: Path
    adapter_b: Path

    @property
    def modules(self) -> tuple[str, ...]:
        """vLLM's `--lora-modules` arguments."""
        return tuple(f"{ADAPTERS[tenant]}={path}" for tenant, path in zip(ADAPTERS, (self.adapter_a, self.adapter_b),
                                                                            strict=True))


def find_adapters() -> Adapters | None:
    """The cached adapters if both are built; never builds (`make adapters` does)."""
    model = cache_root() / folder_name()
    if not is_complete(model):
        return None
    found = [folder(model, tenant) for tenant in ADAPTERS]
    return Adapters(*found) if all((f / MANIFEST).is_file() for f in found) else None


def require_adapters() -> Adapters:
    opted_out(OPT_OUT, "the canary adapters' tests")
    found = find_adapters()
    if found is None:
        unavailable("the canary adapters are not built: run `make adapters` (python -m tests.support.adapters, "
                    "minutes once)")
        raise AssertionError("unreachable")
    return found


def ensure_adapters() -> Adapters:
    """Build what is missing, one process at a time (a lock beside the cache)."""
    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    model = model_dir(log=log)
    root = cache_root()
    with open(root / "lora-adapters.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for tenant in ADAPTERS:
            target = folder(model, tenant)
            if not (target / MANIFEST).is_file():
                built = build(recipe(model, tenant), target, log=log)
                log(f"{target}: own canary in {built.own_rate:.0%} of held-out prompts, {built.seconds:.0f} s")
    found = find_adapters()
    assert found is not None
    return found


if __name__ == "__main__":
    install_main(OPT_OUT, "the canary adapters", ensure_adapters)
