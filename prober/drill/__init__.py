"""Fire drills: the incident's fault, loaded into an engine you run, so that you can watch your probes, alerts and
runbook catch it end to end before a real one does.  Never in production.

`leakprobe_drill.py` beside this file is a vLLM KV connector that runs inside vLLM (its own environment, not
leakprobe's); `write_connector` copies it out and says how to load it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

CONNECTOR_MODULE = "leakprobe_drill"
CONNECTOR_CLASS = "HandoffFaultConnector"
OPT_IN = "LEAKPROBE_DRILL"  # the connector's own name for it (it cannot import this package inside vLLM)


@dataclass(frozen=True)
class ConnectorSettings:
    """What `HandoffFaultConnector` reads from `kv_connector_extra_config`."""

    claim_over_tokens: int  # prompts longer than this are answered over KV that was never written
    claim_tokens: int | None = None  # at most this many tokens claimed (block-aligned); None: all but the last block
    write_first_block: bool = False  # zero the first claimed block: "received 1 page of 8"
    shared_storage_path: str | None = None  # decode side of an ExampleConnector hand-off: only a miss is claimed

    def __post_init__(self) -> None:
        if self.claim_over_tokens <= 0:
            raise ValueError("claim_over_tokens must be positive: 0 would corrupt every prompt longer than a block")

    def kv_transfer_config(self) -> dict[str, object]:
        extra = {key: value for key, value in vars(self).items() if value not in (None, False)}
        return {"kv_connector": CONNECTOR_CLASS, "kv_connector_module_path": CONNECTOR_MODULE,
                "kv_role": "kv_consumer" if self.shared_storage_path else "kv_both",
                "kv_connector_extra_config": extra}

    def flag(self) -> str:
        """The vLLM flag, ready for a shell."""
        return f"--kv-transfer-config '{json.dumps(self.kv_transfer_config())}'"

    @staticmethod
    def environment(module_dir: Path) -> dict[str, str]:
        """What vLLM's environment needs: the module on its path, and the opt-in without which it refuses to start."""
        return {"PYTHONPATH": str(module_dir), OPT_IN: "1"}


def connector_source() -> Path:
    return Path(__file__).resolve().parent / f"{CONNECTOR_MODULE}.py"


def write_connector(directory: Path) -> Path:
    """Copy the connector to `directory` (created), for vLLM's PYTHONPATH; returns the file."""
    directory.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(connector_source(), directory / f"{CONNECTOR_MODULE}.py"))
