"""The published schemas the deploy gate's manifests (examples/gate/) are validated against, offline.  The GitHub
Actions example: npm's `@action-validator/core` (SchemaStore's workflow schema; a test tool, never shipped).

Argo Rollouts: npm's `@kubernetes-models/argo-rollouts` (its validators, compiled from Argo Rollouts v1.9.0's Go API
types, with Kubernetes' own for the Job inside a `job` metric), installed from gate-schemas/package-lock.json by `npm
ci` into the machine's cache once (`make gate-schemas`, part of `make builds`); and the AnalysisTemplate CRD of the
same release.  Flagger: its CRD as its release ships it.  The CRDs are vendored in gate-schemas/ (each one's header
says from where) and checked with `jsonschema`.  `python -m tests.support.gate_schemas` installs (or finds) the npm
side and prints where."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from prober.system.resources import cache_root
from tests.support.tools import install_main

HERE = Path(__file__).resolve().parent / "gate-schemas"  # the lock, the validator script, the vendored CRD
LOCK = HERE / "package-lock.json"
VALIDATOR = HERE / "validate.mjs"
WORKFLOW_VALIDATOR = HERE / "validate-workflow.mjs"
ARGO_CRD = HERE / "argo-rollouts-analysistemplate-crd.yaml"
FLAGGER_CRD = HERE / "flagger-crd.yaml"
OPT_OUT = "LEAKPROBE_SKIP_GATE_SCHEMAS"


class SchemasUnavailable(RuntimeError):
    """npm could not install the pinned packages; the message says why."""


@dataclass(frozen=True)
class Installation:
    folder: Path  # holds node_modules/ with the pinned packages


def pinned() -> dict[str, str]:
    """The packages the lock pins, name to version (what the docs cite)."""
    packages: dict[str, Any] = json.loads(LOCK.read_text())["packages"]
    return {path.removeprefix("node_modules/"): entry["version"] for path, entry in packages.items() if path}


def install_dir() -> Path:
    key = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:10]
    return cache_root() / f"gate-schemas-{pinned()['@kubernetes-models/argo-rollouts']}-{key}"


def ensure_installed(npm: str = "npm") -> Installation:
    """The pinned packages in a complete folder, `npm ci` from the lock unless one is cached (~10 s)."""
    target = install_dir()
    if (target / ".complete").is_file():
        return Installation(target)
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(HERE / name, target / name)
    began = time.monotonic()
    done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"], cwd=target,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SchemasUnavailable(f"`npm ci` of {LOCK} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    (target / ".complete").write_text(f"npm ci in {time.monotonic() - began:.0f} s\n")
    return Installation(target)


def validate(node: str, installation: Installation, script: Path, items: list[Any]) -> list[list[str]]:
    """Each item's errors by one of the pinned validators (`VALIDATOR`: Argo Rollouts manifests by the package's own
    `Model.validate()`; `WORKFLOW_VALIDATOR`: GitHub Actions workflows' YAML texts by @action-validator/core against
    SchemaStore's schema), one list per item."""
    done = subprocess.run([node, str(script), str(installation.folder)], input=json.dumps(items),
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SchemasUnavailable(f"{script.name} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    errors: list[list[str]] = json.loads(done.stdout)
    return errors


def crd_schema(path: Path, kind: str) -> tuple[str, dict[str, Any]]:
    """A vendored CRD's stored version of `kind` (its apiVersion) and its schema made strict as the API server's
    strict field validation is (kubectl's default): a field no object names is refused, not pruned."""
    for crd in yaml.safe_load_all(path.read_text()):
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
            group = crd["spec"]["group"]
            return f"{group}/{version['name']}", _strict(version["schema"]["openAPIV3Schema"])
    raise KeyError(kind)


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    strict = {k: (_strict(v) if isinstance(v, dict) and k in ("items", "additionalProperties") else v)
              for k, v in schema.items()}
    if "properties" in schema:
        strict["properties"] = {name: _strict(field) for name, field in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            strict["additionalProperties"] = False
    return strict


if __name__ == "__main__":
    install_main(OPT_OUT, "the gate manifests' schemas", lambda: ensure_installed(os.environ.get("NPM", "npm")))
