"""`LEAKPROBE_SKIP_*`: a developer's machine without one of the real engines (or the gate manifests' npm schemas)
opts out of the tests that need it, and they skip; CI never does (`CI=true`), where each opt-out fails those tests
with a message that names it, so that a run cannot pass by skipping what it was meant to check.  Each opt-out, on
one test that needs what it opts out of, in a pytest of its own: it fails (or skips) while setting the test up,
before anything is built or started."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Each opt-out, and a test that needs what it opts out of (the first thing its setup asks for).
OPT_OUTS = {
    "LEAKPROBE_SKIP_LLAMACPP": "tests/test_llamacpp.py::test_clean_audit_with_two_tenants",
    "LEAKPROBE_SKIP_LITELLM": "tests/test_shared_endpoint.py::test_behind_litellm_a_gateway_users_run",
    "LEAKPROBE_SKIP_VLLM": "tests/test_vllm_fault.py::test_the_drill_announces_itself_and_fails_closed",
    "LEAKPROBE_SKIP_ADAPTERS": "tests/test_vllm_lora.py::test_each_adapter_answers_its_trigger_with_its_own_canary",
    "LEAKPROBE_SKIP_GATE_SCHEMAS":
        "tests/test_gate_manifests.py::test_the_argo_templates_validate_against_argo_rollouts",
}


def pytest_of(test: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("LEAKPROBE_SKIP_")}
    return subprocess.run([sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
                          capture_output=True, text=True, timeout=600, env={**clean, **env})


@pytest.mark.slow
@pytest.mark.parametrize("variable", OPT_OUTS)
def test_an_opt_out_skips_but_fails_under_ci(variable: str) -> None:
    skipped = pytest_of(OPT_OUTS[variable], **{variable: "1"})
    assert skipped.returncode == 0 and f"{variable}=1: " in skipped.stdout and " skipped" in skipped.stdout, (
        skipped.stdout[-3000:])
    failed = pytest_of(OPT_OUTS[variable], **{variable: "1", "CI": "true"})
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert f"{variable}=1 under CI: " in failed.stdout and f"unset {variable}" in failed.stdout, failed.stdout[-3000:]
