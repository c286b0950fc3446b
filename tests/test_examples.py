"""Every file in examples/ is loaded by what it is for: the daemon configs pass `--check-config` (credentials
read) and load as the docs' blocks do (tests/support/yamlblocks.py), the reference-engine config serves, the
Prometheus config and the Alertmanager route pass their own tools' checks (and tests/test_monitoring.py runs them
for real)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from prober.config.schema import ProberConfig, parse_config
from prober.testbed import TestbedServer, build_config, load_config_file
from tests.support.cli import invoke
from tests.support.keys import BEARER_A
from tests.support.tools import need
from tests.support.yamlblocks import example_files, is_leakprobe, load_leakprobe

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ENGINE_KEYS = {"LEAKPROBE_KEY_ALICE": "key-of-alice-0001", "LEAKPROBE_KEY_BOB": "key-of-bob-0002"}


@pytest.mark.unit
def test_every_example_is_tested_here() -> None:
    tested = {"leakprobe.yaml", "daemon-testbed.yaml", "testbed.yaml", "prometheus.yml", "alertmanager.yml"}
    assert {p.name for p in EXAMPLES.iterdir() if p.suffix in (".yaml", ".yml")} == tested


@pytest.mark.unit
@pytest.mark.parametrize("example", [p for p in example_files() if is_leakprobe(p)], ids=lambda p: p.name)
def test_every_leakprobe_example_loads_as_a_docs_block_does(example: Path, tmp_path: Path) -> None:
    """The same loader and rule as every YAML block of the docs (tests/test_docs.py): an example the prober reads
    is a config it takes as written, daemon section and job names included."""
    config = load_leakprobe(example.read_text(encoding="utf-8"), tmp_path)
    assert config.targets and config.daemon.schedule, example.name


def test_the_engines_config_checks_with_its_credentials(tmp_path: Path) -> None:
    config = yaml.safe_load((EXAMPLES / "leakprobe.yaml").read_text())
    parsed = parse_config(config, "leakprobe.yaml")
    assert {t.name for t in parsed.targets} == {"vllm-prod", "sglang-prod", "llamacpp-edge"}
    token = tmp_path / "token"
    token.write_text("a-token-of-twenty-chars\n")
    config["daemon"]["token_file"] = str(token)  # where the real one is mounted, a file of the test's
    config["ledger"] = str(tmp_path / "l.sqlite")
    copy = tmp_path / "leakprobe.yaml"
    copy.write_text(yaml.safe_dump(config))
    checked = invoke("daemon", "--config", str(copy), "--check-config", env=ENGINE_KEYS)
    assert checked.exit_code == 0 and "every credential readable" in checked.output, checked.output
    assert "daemon.schedule.campaign" in checked.output  # the 6 h campaign outlives the 1 h hold: said so
    only_alice = {"LEAKPROBE_KEY_ALICE": ENGINE_KEYS["LEAKPROBE_KEY_ALICE"]}
    missing = invoke("daemon", "--config", str(copy), "--check-config", env=only_alice)
    assert missing.exit_code == 2 and "LEAKPROBE_KEY_BOB" in missing.output


def test_the_testbed_configs_serve_and_check(tmp_path: Path) -> None:
    preset, overrides = load_config_file(EXAMPLES / "testbed.yaml")
    with TestbedServer(build_config(preset or "incident", overrides)) as server:
        models = httpx.get(server.url + "/v1/models", headers=BEARER_A, timeout=10)
        assert models.status_code == 200 and server.engine.config.pool_tokens == 4_096
    daemon = ProberConfig.model_validate(yaml.safe_load((EXAMPLES / "daemon-testbed.yaml").read_text()))
    assert daemon.targets[0].url == "http://127.0.0.1:8000/v1"
    checked = invoke("daemon", "--config", str(EXAMPLES / "daemon-testbed.yaml"), "--check-config")
    assert checked.exit_code == 0, checked.output


@pytest.mark.parametrize(("tool", "args", "example"), [
    ("promtool", ["check", "config"], "prometheus.yml"),
    ("amtool", ["check-config"], "alertmanager.yml"),
])
def test_the_monitoring_examples_pass_their_tools_checks(tool: str, args: list[str], example: str) -> None:
    binary = need(tool)
    checked = subprocess.run([binary, *args, str(EXAMPLES / example)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    if tool == "promtool":
        assert "1 rule files found" in checked.stdout  # the repository's rules, by the relative path
