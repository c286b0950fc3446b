"""The deploy gate's ready-made wiring (examples/gate/, the chart's gate hook) against the schemas its projects publish
(the CI example, a GitHub Actions workflow, against SchemaStore's through @action-validator/core): Argo Rollouts'
AnalysisTemplates with the validators of npm's @kubernetes-models/argo-rollouts (types; the Job a `job` metric runs
against Kubernetes' own, strictly) and with the release's CRD, Flagger's Canary with the CRD its release ships (the CRDs
strict, as the API server's strict field validation refuses an unknown field).  A broken copy of each is refused, so a
pass means the validator looked.  The calls the manifests make then meet a real daemon's /probe over HTTP: the fixed
engine passes, the incident's is held."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from prober.checks import REGISTRY
from prober.daemon.schedule import daemon_jobs
from tests.support.daemonproc import DaemonProcess, daemon_config
from tests.support.gate_schemas import (
    ARGO_CRD,
    FLAGGER_CRD,
    OPT_OUT,
    VALIDATOR,
    WORKFLOW_VALIDATOR,
    Installation,
    SchemasUnavailable,
    crd_schema,
    ensure_installed,
    validate,
)
from tests.support.keys import KEYS
from tests.support.testbed import SMALL, StartTestbed
from tests.support.tools import need, need_module, opted_out, unavailable

ROOT = Path(__file__).resolve().parent.parent
GATE = ROOT / "examples" / "gate"
CHART = ROOT / "helm" / "leakprobe"
ARGO = GATE / "argo-analysistemplate.yaml"
FLAGGER = GATE / "flagger-canary.yaml"
WORKFLOW = GATE / "github-actions.yml"
KUBERNETES = ("1.30.0", "1.34.0")
TOKEN = "a-token-for-the-gate-wiring"
PACE_S = 0.2  # the daemon's probe_every here: one run of a target at a time, each call below after it
QUIET = {job: "off" for job in daemon_jobs(REGISTRY) if job != "preflight"}  # every run here is one asked for


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def metric(templates: list[dict[str, Any]], provider: str) -> dict[str, Any]:
    (found,) = [m for t in templates for m in t["spec"]["metrics"] if provider in m["provider"]]
    return found


@pytest.fixture(scope="module")
def npm_schemas() -> Callable[[Path, list[Any]], list[list[str]]]:
    """The pinned validators (`make gate-schemas`), installed on first use where npm is there: a validator script
    and what it validates to each item's errors."""
    opted_out(OPT_OUT, "the gate wiring's npm schemas")
    node, npm = need("node"), need("npm")
    try:
        installation: Installation = ensure_installed(npm)
    except SchemasUnavailable as exc:
        unavailable(f"the gate wiring's npm schemas could not be installed ({exc}): run `make gate-schemas`")
    return lambda script, items: validate(node, installation, script, items)


@pytest.fixture(scope="module")
def argo(npm_schemas: Callable[[Path, list[Any]], list[list[str]]]) -> Callable[[list[Any]], list[list[str]]]:
    return lambda manifests: npm_schemas(VALIDATOR, manifests)


@pytest.fixture(scope="module")
def workflows(npm_schemas: Callable[[Path, list[Any]], list[list[str]]]) -> Callable[[list[Any]], list[list[str]]]:
    return lambda sources: npm_schemas(WORKFLOW_VALIDATOR, sources)


def crd_errors(crd: Path, manifest: dict[str, Any]) -> list[str]:
    jsonschema = need_module("jsonschema", "jsonschema")
    version, schema = crd_schema(crd, manifest["kind"])
    assert manifest["apiVersion"] == version
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in jsonschema.Draft7Validator(schema).iter_errors(manifest)]


@pytest.mark.unit
def test_every_gate_example_is_validated_here() -> None:
    assert {p.name for p in GATE.iterdir()} == {ARGO.name, FLAGGER.name, WORKFLOW.name}


def test_the_argo_templates_validate_against_argo_rollouts(argo: Callable[..., list[list[str]]]) -> None:
    templates = documents(ARGO)
    assert [t["kind"] for t in templates] == ["AnalysisTemplate", "AnalysisTemplate"]
    assert argo(templates) == [[], []]
    assert [crd_errors(ARGO_CRD, t) for t in templates] == [[], []]
    job = metric(templates, "job")
    container = job["provider"]["job"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "gate" and "{{args.engine-url}}" in container["args"]
    assert {e["name"] for e in container["env"]} == {"GATE_KEY_A", "GATE_KEY_B"}  # keys from a Secret, never args
    web = metric(templates, "web")
    assert web["consecutiveErrorLimit"] == 0 and web["successCondition"] == 'result.verdict == "pass"'
    assert web["provider"]["web"]["timeoutSeconds"] > 600  # the gate's own ceiling, 10 minutes
    kubernetes_validate = need_module("kubernetes_validate", "kubernetes-validate")
    as_job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "leakprobe-gate"},
              "spec": job["provider"]["job"]["spec"]}
    for version in KUBERNETES:
        kubernetes_validate.validate(as_job, version, strict=True)


def broken(provider: str, where: tuple[Any, ...], value: Any) -> list[dict[str, Any]]:
    """The Argo templates with `value` at `where` in the metric of `provider`."""
    templates = documents(ARGO)
    *path, last = where
    node = metric(templates, provider)
    for key in path:
        node = node[key]
    node[last] = value
    return templates


@pytest.mark.parametrize(("provider", "where", "value", "complaint"), [
    ("web", ("provider", "web", "timeoutSeconds"), "660", "/provider/web/timeoutSeconds must be integer"),
    ("web", ("provider", "web", "headers"), {"Authorization": "Bearer x"}, "/provider/web/headers must be array"),
    ("job", ("provider", "job", "spec", "backoffLimit"), "0", "/provider/job/spec/backoffLimit must be integer"),
])
def test_argo_refuses_a_broken_copy(argo: Callable[..., list[list[str]]], provider: str, where: tuple[Any, ...],
                                    value: Any, complaint: str) -> None:
    errors = argo(broken(provider, where, value))
    assert [bool(e) for e in errors] == [provider == "job", provider == "web"], errors
    assert any(complaint in e for e in errors[0] + errors[1]), errors


@pytest.mark.parametrize(("provider", "where", "value", "complaint"), [
    ("web", ("provider", "webhook"), {"url": "http://x"}, "'webhook' was unexpected"),  # no such provider
    ("web", ("provider", "web", "timeoutSeconds"), "660", "is not of type 'integer'"),
    ("job", ("provider", "job", "spec", "template", "spec", "containers", 0, "argz"), ["gate"],
     "'argz' was unexpected"),
])
def test_argo_rollouts_crd_refuses_a_broken_copy(provider: str, where: tuple[Any, ...], value: Any,
                                                 complaint: str) -> None:
    """What npm's validators let through (a field no type names, such as a provider that does not exist: they check
    the types of the fields they know, measured), the CRD refuses as `kubectl apply` does."""
    errors = [crd_errors(ARGO_CRD, t) for t in broken(provider, where, value)]
    assert [bool(e) for e in errors] == [provider == "job", provider == "web"], errors
    assert any(complaint in e for e in errors[0] + errors[1]), errors


def test_the_flagger_canary_validates_against_flaggers_crd() -> None:
    (canary,) = documents(FLAGGER)
    assert crd_errors(FLAGGER_CRD, canary) == []
    (webhook,) = canary["spec"]["analysis"]["webhooks"]
    assert webhook["type"] == "pre-rollout" and webhook["metadata"]["type"] == "bash"


@pytest.mark.parametrize(("field", "value", "complaint"), [
    ("headers", {"Authorization": "Bearer x"}, "'headers' was unexpected"),  # why it goes through the load tester
    ("type", "prerollout", "is not one of"),
    ("timeout", 660, "is not of type 'string'"),
])
def test_flagger_refuses_a_broken_copy(field: str, value: Any, complaint: str) -> None:
    (canary,) = documents(FLAGGER)
    canary["spec"]["analysis"]["webhooks"][0][field] = value
    errors = crd_errors(FLAGGER_CRD, canary)
    assert len(errors) == 1 and "webhooks/0" in errors[0] and complaint in errors[0], errors


def test_the_ci_example_validates_as_a_github_workflow_and_a_broken_copy_does_not(
        workflows: Callable[[list[str]], list[list[str]]]) -> None:
    source = WORKFLOW.read_text()
    broken = [source.replace("runs-on: ubuntu-latest", "runs-on: 7"), source.replace("    steps:", "    stepz:")]
    valid, *refused = workflows([source, *broken])
    assert valid == [] and all(errors for errors in refused), (valid, refused)


@pytest.mark.slow
def test_the_ci_example_runs_the_gate_as_written(testbed: StartTestbed, tmp_path: Path) -> None:
    """The workflow's gate step, its shell line as GitHub runs it (bash, the job's environment, the reports in the
    work folder): the fixed engine passes, the incident's fails the job, and both reports are written."""
    (job,) = yaml.safe_load(WORKFLOW.read_text())["jobs"].values()
    (step,) = [s for s in job["steps"] if s.get("name") == "Gate the deployment"]
    tools = os.path.dirname(sys.executable)  # where `leakprobe` is installed
    for preset, code in (("fixed", 0), ("incident", 1)):
        work = tmp_path / preset
        work.mkdir()
        env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
               "ENGINE_URL": testbed(preset, **SMALL).url + "/v1", "GATE_KEY_A": KEYS["LP_A"],
               "GATE_KEY_B": KEYS["LP_B"]}
        ran = subprocess.run(["bash", "-e", "-c", step["run"]], capture_output=True, text=True, timeout=700,
                             cwd=work, env=env)
        assert ran.returncode == code, ran.stdout[-3000:] + ran.stderr[-3000:]
        assert (work / "gate.xml").is_file() and (work / "gate.sarif").is_file()


@pytest.mark.slow
def test_the_argo_job_runs_the_gate_as_written(testbed: StartTestbed, tmp_path: Path) -> None:
    """The Job's container arguments and environment, run as its image runs them (`leakprobe` is its entrypoint; the
    work folder, where the run's ledger goes, is its own)."""
    (container,) = metric(documents(ARGO), "job")["provider"]["job"]["spec"]["template"]["spec"]["containers"]
    env = {**os.environ, "GATE_KEY_A": KEYS["LP_A"], "GATE_KEY_B": KEYS["LP_B"]}
    for preset, code in (("fixed", 0), ("incident", 1)):
        args = [a.replace("{{args.engine-url}}", testbed(preset, **SMALL).url + "/v1") for a in container["args"]]
        work = tmp_path / preset
        work.mkdir()
        ran = subprocess.run([sys.executable, "-m", "prober", *args], capture_output=True, text=True, timeout=700,
                             cwd=work, env={**env, "PYTHONPATH": str(ROOT)})
        print(f"job, {preset}: exit {ran.returncode}; {ran.stderr.strip().splitlines()[-1]}")
        assert ran.returncode == code, ran.stdout[-3000:] + ran.stderr[-3000:]
        assert (work / "leakprobe.sqlite").is_file()


@pytest.mark.slow
def test_the_wiring_holds_the_incident_engine_and_passes_the_fixed(testbed: StartTestbed, tmp_path: Path) -> None:
    """What each call to the daemon sends, sent to a real daemon (a fixed and an incident engine, a token): Argo's
    web call, Flagger's load-tester command (bash and curl as written), the chart's hook script as it renders."""
    fixed, incident = testbed("fixed", **SMALL), testbed("incident", **SMALL)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    config = daemon_config(fixed.url, tmp_path / "l.sqlite", token_file=str(token), probe_every=f"{PACE_S}s",
                           schedule=QUIET)
    config["targets"][0]["name"] = "vllm-canary"
    config["targets"].append({**config["targets"][0], "name": "incident", "url": incident.url + "/v1"})
    with DaemonProcess(config, tmp_path) as daemon:
        web = metric(documents(ARGO), "web")["provider"]["web"]
        url = web["url"].replace("http://leakprobe.probes.svc:10461", daemon.url)
        auth = {h["key"]: h["value"].replace("{{args.token}}", TOKEN) for h in web["headers"]}
        for target, status, verdict in (("vllm-canary", 200, "pass"), ("incident", 412, "fail")):
            answer = httpx.get(url.replace("{{args.target}}", target), headers=auth, timeout=web["timeoutSeconds"])
            assert (answer.status_code, answer.json()["verdict"]) == (status, verdict), answer.text
        (canary,) = documents(FLAGGER)
        need("curl")
        command = (canary["spec"]["analysis"]["webhooks"][0]["metadata"]["cmd"]
                   .replace("http://leakprobe.probes.svc:10461", daemon.url)
                   .replace("/etc/leakprobe/token/token", str(token)))
        passed = subprocess.run([need("bash"), "-c", command], capture_output=True, text=True, timeout=700)
        held = subprocess.run([need("bash"), "-c", command.replace("vllm-canary", "incident")],
                              capture_output=True, text=True, timeout=700)
        print(f"flagger: {passed.returncode} {passed.stdout}\nflagger, incident: {held.returncode} {held.stdout}")
        assert passed.returncode == 0 and '"verdict":"pass"' in passed.stdout.replace(" ", ""), passed
        assert held.returncode != 0 and "412" in held.stderr, held
        hook = rendered_gate_hook()
        env = {**os.environ, "LEAKPROBE_URL": daemon.url, "LEAKPROBE_TOKEN_FILE": str(token)}
        for targets, code in (("vllm-canary", 0), ("vllm-canary,incident", 1)):
            ran = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True, timeout=700,
                                 env={**env, "LEAKPROBE_TARGETS": targets})
            assert ran.returncode == code, ran.stdout + ran.stderr


def render_gate_hook(value_set: str, **values: Any) -> dict[str, Any] | None:
    """The chart's gate hook as it renders from a value set of helm/leakprobe/ci (and `values` over it)."""
    helm = need_module("helm_python", "helm-python-sdk")
    helm.disable_logging()
    chart = helm.Chart.load(str(CHART))
    try:
        rendered = chart.render({**yaml.safe_load((CHART / "ci" / f"{value_set}-values.yaml").read_text()), **values},
                                name="lp", namespace="probes", is_install=True)
    finally:
        chart.close()
    text = rendered.get("leakprobe/templates/tests/test-gate.yaml", "")
    pod: dict[str, Any] | None = yaml.safe_load(text)
    return pod


def rendered_gate_hook() -> str:
    """The hook's script, rendered with the values that enable it."""
    pod = render_gate_hook("full")
    assert pod is not None and pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script: str = pod["spec"]["containers"][0]["args"][0]
    return script


def test_the_chart_gate_hook_is_opt_in_and_needs_the_token() -> None:
    """Off by default (it spends tokens); on, it mounts the daemon's token and names every target; on without a
    token it does not render (/probe would refuse it)."""
    assert render_gate_hook("minimal") is None
    pod = render_gate_hook("full")
    assert pod is not None
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    full = yaml.safe_load((CHART / "ci" / "full-values.yaml").read_text())
    assert env["LEAKPROBE_TARGETS"].split(",") == sorted(full["config"]["targets"])
    assert env["LEAKPROBE_URL"] == "http://lp-leakprobe:10461"
    assert pod["spec"]["volumes"][0]["secret"]["secretName"] == full["token"]["existingSecret"]
    helm = need_module("helm_python", "helm-python-sdk")
    with pytest.raises(helm.HelmError, match=r"gateTest\.enabled: .* set token\.existingSecret"):
        render_gate_hook("minimal", gateTest={"enabled": True})
