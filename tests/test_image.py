"""The daemon image, built from the repository's Dockerfile with podman and run as an operator runs it.

The image is built once per change of what goes into it (tests/support/containers.py: minutes cold, a second
warm).  The container runs as the chart runs it (helm/leakprobe): non-root, read-only root filesystem, all
capabilities dropped, writable tmpfs only for /tmp and the ledger folder; the default bridge network, port
10461 published on loopback, the image's own CMD.  It probes a reference engine on the host, reached as
`host.containers.internal` (the bridge's gateway, where the engine listens), and must become ready, export
metrics, and stop cleanly within the grace period.  Without podman the tests skip with one line (fail
under CI).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from prober.testbed import TestbedServer, build_config
from tests.support.containers import ROOT, ImageUnavailable, copied_sources, ensure_image, missing_tools, podman
from tests.support.daemonproc import daemon_config
from tests.support.keys import KEYS
from tests.support.tools import unavailable
from tests.support.waiting import wait_for

pytestmark = pytest.mark.container

UID = 10001  # the image's user, and the chart's runAsUser
PORT = 10461  # the image's EXPOSE and CMD --listen, the chart's service port
GRACE_S = 10  # the daemon's shutdown_grace in the config below
# podman stop's SIGKILL comes this long after SIGTERM: the daemon's grace plus time to close the ledger and
# the HTTP server (about 1 s measured); an exit after it would be a SIGKILL (137), not the daemon's own 0.
STOP_TIMEOUT_S = GRACE_S + 10
# Starting loads two embedding models and indexes the ledger (9-13 s measured on a busy 2-core machine),
# logging little meanwhile: the wait follows the container's log and allows this long without a new line.
# It ends at once if the container exits.
QUIET_S = 180


@pytest.fixture(scope="module")
def image() -> str:
    if missing := missing_tools():
        unavailable(f"{', '.join(missing)} not found: apt-get install podman buildah runc mmdebstrap "
                 "(or `make tools` as root)")
    try:
        return ensure_image()
    except ImageUnavailable as exc:
        pytest.fail(f"the image could not be built: {exc}", pytrace=False)


@dataclass
class Container:
    name: str
    url: str
    engine: TestbedServer
    started: float  # time.monotonic() at `podman start`
    ready_after: float | None = None

    def inspect(self, template: str) -> str:
        return podman("inspect", "--format", template, self.name).stdout.strip()

    @property
    def running(self) -> bool:
        return self.inspect("{{.State.Running}}") == "true"

    def logs(self) -> str:
        result = podman("logs", self.name)
        return (result.stdout + result.stderr)[-3000:]

    def wait_for(self, condition: Callable[[], bool], what: str, progress: Callable[[], object]) -> None:
        """Wait while `progress` moves; give up at once if the container exits."""
        def holds() -> bool:
            if condition():
                return True
            if not self.running:
                raise AssertionError(f"the container exited while waiting for {what}:\n{self.logs()}")
            return False
        wait_for(holds, what, progress=progress, idle_s=QUIET_S, context=self.logs)

    def wait_ready(self) -> float:
        """Seconds from `podman start` to the first 200 from /-/ready (waited for once per container)."""
        if self.ready_after is None:
            self.wait_for(lambda: (r := self.get("/-/ready")) is not None and r.status_code == 200,
                          "/-/ready to answer 200", progress=lambda: len(self.logs()))
            self.ready_after = time.monotonic() - self.started
        return self.ready_after

    def get(self, path: str) -> httpx.Response | None:
        try:
            return httpx.get(self.url + path, timeout=10)
        except httpx.HTTPError:
            return None

    def samples(self) -> dict[tuple[str, str, str], float]:
        """(sample name, target label, job label) -> value, from /metrics."""
        scraped = self.get("/metrics")
        text = scraped.text if scraped is not None and scraped.status_code == 200 else ""
        return {(s.name, s.labels.get("target", ""), s.labels.get("job", "")): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


def _gateway(name: str) -> str:
    """The bridge's gateway as the container sees it: host.containers.internal in its /etc/hosts."""
    networks = json.loads(podman("inspect", "--format", "{{json .NetworkSettings.Networks}}", name).stdout)
    (network,) = networks.values()
    return str(network["Gateway"])


@pytest.fixture(scope="module")
def container(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    config_dir = tmp_path_factory.mktemp("config")
    # Unique across workers and concurrent runs (each has its own basetemp with the same folder names).
    name = f"leakprobe-test-{secrets.token_hex(4)}"
    created = podman(
        "create", "--name", name, "--user", f"{UID}:{UID}", "--read-only", "--cap-drop=all",
        "--security-opt=no-new-privileges", "--tmpfs", "/tmp:rw,mode=1777",
        "--tmpfs", "/var/lib/leakprobe:rw,mode=0700,U",  # U: owned by the container's user
        "--volume", f"{config_dir}:/etc/leakprobe/config:ro", "--publish", f"127.0.0.1::{PORT}",
        *(f"--env={key}={value}" for key, value in KEYS.items()), image)
    assert created.returncode == 0, created.stderr
    engine: TestbedServer | None = None
    try:
        # `init` sets up the container's network without starting it: the gateway exists from then on, so the
        # engine can listen there (not on every interface of the host) before the daemon's config names it.
        initialised = podman("init", name)
        assert initialised.returncode == 0, initialised.stderr
        engine = TestbedServer(build_config("fixed", {}), host=_gateway(name)).start()
        config = daemon_config(f"http://host.containers.internal:{engine.port}",
                               Path("/var/lib/leakprobe/ledger.sqlite"), shutdown_grace=f"{GRACE_S}s")
        # The file's loopback listen address is overridden by the image's CMD (--listen 0.0.0.0:10461).
        (config_dir / "leakprobe.yaml").write_text(yaml.safe_dump(config))
        config_dir.chmod(0o755)
        (config_dir / "leakprobe.yaml").chmod(0o644)  # readable by the container's user
        began = time.monotonic()
        started = podman("start", name)
        assert started.returncode == 0, started.stderr
        host_port = podman("port", name, f"{PORT}/tcp").stdout.split()[0].rpartition(":")[2]
        yield Container(name, f"http://127.0.0.1:{host_port}", engine, began)
    finally:
        podman("rm", "--force", "--time", "0", name)
        if engine is not None:
            engine.stop()


def test_daemon_in_the_image_is_ready_probes_the_host_engine_and_exports_metrics(container: Container) -> None:
    print(f"start to ready: {container.wait_ready():.1f} s")  # shown with -s; the docs quote it
    # Ready says the daemon runs; the host engine's answers say its network reaches the target.
    def served() -> int:  # the host engine's work, as progress
        return container.engine.engine.stats.prompt_tokens

    container.wait_for(lambda: container.samples().get(("leakprobe_target_up", "testbed", "")) == 1.0,
                       "leakprobe_target_up{target=testbed} to be 1", progress=served)
    container.wait_for(
        lambda: container.samples().get(("leakprobe_last_success_timestamp_seconds", "testbed", "preflight"), 0) > 0,
        "a completed preflight against the host engine", progress=served)
    families = {name for name, _, _ in container.samples() if name.startswith("leakprobe_")}
    assert {"leakprobe_build_info", "leakprobe_job_runs_total", "leakprobe_ledger_up"} <= families, families
    # Preflight sends no generation request; the sentinel, due a moment after it, is the first that does.
    container.wait_for(lambda: served() > 0, "the host engine to serve the sentinel's prompts", progress=served)


def test_runs_as_non_root_on_a_read_only_root(container: Container) -> None:
    container.wait_ready()
    assert container.inspect("{{.HostConfig.ReadonlyRootfs}}") == "true"
    ids = podman("exec", container.name, "id", "-u")
    assert ids.returncode == 0 and ids.stdout.strip() == str(UID), ids
    written = podman("exec", container.name, "touch", "/opt/leakprobe/x")
    assert written.returncode != 0 and "Read-only file system" in written.stderr, written
    # The ledger went where the chart mounts its data volume (here a tmpfs the user owns).
    ledger = podman("exec", container.name, "ls", "/var/lib/leakprobe")
    assert "ledger.sqlite" in ledger.stdout, ledger


def test_podman_stop_exits_zero_within_the_grace(container: Container) -> None:
    container.wait_ready()
    began = time.monotonic()
    stopped = podman("stop", "--time", str(STOP_TIMEOUT_S), container.name, timeout=STOP_TIMEOUT_S + 30)
    elapsed = time.monotonic() - began
    print(f"podman stop: {elapsed:.1f} s")  # shown with -s; the docs quote it
    assert stopped.returncode == 0, stopped.stderr
    assert elapsed < STOP_TIMEOUT_S, f"podman stop took {elapsed:.1f} s"
    assert container.inspect("{{.State.ExitCode}}") == "0", container.logs()  # 137 would be SIGKILL
    assert "stopped" in container.logs()


@pytest.mark.unit
def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    """The image's input hash covers the files the Dockerfile copies; each must pass .dockerignore's allow-list,
    or a build would fail (file missing) while the hash looked fine."""
    allowed = {line.removeprefix("!") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    sources = {str(path.relative_to(ROOT)) for path in copied_sources()}
    assert sources and sources <= allowed, (sources, allowed)
