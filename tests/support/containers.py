"""Build the repository's Dockerfile with Debian's podman, here and in the tests, with no registry at all.

No container registry is reachable from this machine kind, so the base image is made from Debian's archive
with mmdebstrap and `podman import`ed.  Podman keeps its state in a folder of our own under the cache
(`CONTAINERS_STORAGE_CONF` / `CONTAINERS_CONF`: overlay storage, runc, cgroupfs), so nothing touches a
system-wide container setup.  The build mounts the host's CA bundle (the registries' TLS is intercepted by
a local CA) and /opt/wheels with a pip.conf, where the CPU torch lies.  The image is tagged with a hash of
everything that goes into it (the Dockerfile, the files it copies, the base image and the build arguments),
so an unchanged checkout reuses it in a second and a changed one rebuilds from podman's layer cache.
`python -m tests.support.containers` builds (or finds) it and prints its tag (`make image`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from prober.system.resources import cache_root

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
IMAGE = "localhost/leakprobe"
BASE = "localhost/leakprobe-base"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What python:3.11-slim-bookworm (the Dockerfile's default base) gives the Dockerfile: Python 3.11 with venv,
# `python` on PATH, CA certificates, useradd.
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates", "passwd")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
WHEELS = Path("/opt/wheels")
# Only the CPU build that lies in /opt/wheels can match this (the index's 2.13.0 is a CUDA build).
TORCH_VERSION = "2.13.0+cpu"
TOOLS = ("podman", "mmdebstrap")


class ImageUnavailable(RuntimeError):
    """The image could not be built; the message says why."""


def state_dir() -> Path:
    root = cache_root()
    return root / "containers"


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def podman_env() -> dict[str, str]:
    """Podman's configuration, written once into our folder.  crun fails on this kind of host (setrlimit
    RLIMIT_NOFILE is refused, cgroups in hybrid mode): runc and cgroupfs work, with explicit ulimits."""
    state = state_dir()
    storage, engine = state / "storage.conf", state / "containers.conf"
    if not storage.exists() or not engine.exists():
        state.mkdir(parents=True, exist_ok=True)
        storage.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{state / "storage"}"\n'
                           f'runroot = "{state / "run"}"\n')
        engine.write_text('[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
                          '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    return {**os.environ, "CONTAINERS_STORAGE_CONF": str(storage), "CONTAINERS_CONF": str(engine)}


def podman(*args: str, timeout: float | None = None, log: bool = False) -> subprocess.CompletedProcess[str]:
    """Run podman with our configuration; output is captured unless `log` (a build a person watches)."""
    return subprocess.run(["podman", *args], env=podman_env(), capture_output=not log, text=True, timeout=timeout)


def _exists(tag: str) -> bool:
    return podman("image", "exists", tag).returncode == 0


def _failed(what: str, result: subprocess.CompletedProcess[str]) -> ImageUnavailable:
    return ImageUnavailable(f"{what} failed (exit {result.returncode}): {(result.stderr or '')[-2000:]}")


def base_image(log: bool = False) -> str:
    """A Debian base image from the archive: the rootfs tarball is cached, imported when storage lacks it."""
    key = hashlib.sha256(f"{SUITE}|{MIRROR}|minbase|{','.join(BASE_PACKAGES)}".encode()).hexdigest()[:12]
    tag = f"{BASE}:{SUITE}-{key}"
    if _exists(tag):
        return tag
    tarball = state_dir() / f"rootfs-{SUITE}-{key}.tar"
    if not tarball.exists():
        if log:
            print(f"making the base image's root filesystem with mmdebstrap (about 2 min): {tarball}",
                  file=sys.stderr)
        partial = tarball.with_name(f"{tarball.stem}.partial.tar")  # mmdebstrap picks the format by suffix
        made = subprocess.run(["nice", "-n", "10", "mmdebstrap", "--quiet", "--variant=minbase",
                               f"--include={','.join(BASE_PACKAGES)}", SUITE, str(partial), MIRROR],
                              capture_output=not log, text=True)
        if made.returncode != 0:
            partial.unlink(missing_ok=True)
            raise _failed("mmdebstrap", made)
        partial.rename(tarball)
    imported = podman("import", "--change", "CMD=/bin/bash", str(tarball), tag)
    if imported.returncode != 0:
        raise _failed("podman import", imported)
    return tag


def copied_sources(dockerfile: Path = DOCKERFILE) -> list[Path]:
    """The context paths the Dockerfile COPYs (not those copied from another stage)."""
    sources: list[Path] = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += [ROOT / w for w in words[1:-1] if not w.startswith("--")]
    return sources


def inputs_hash(build_args: dict[str, str]) -> str:
    """A hash of what goes into the image: the Dockerfile, the files it copies, the build arguments."""
    digest = hashlib.sha256(DOCKERFILE.read_bytes())
    digest.update((ROOT / ".dockerignore").read_bytes())
    for name, value in sorted(build_args.items()):
        digest.update(f"{name}={value}\n".encode())
    for source in copied_sources():
        files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(f"{path.relative_to(ROOT)}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_image(log: bool = False) -> str:
    """The image's tag, built unless an image of the same inputs is in storage."""
    base = base_image(log)
    build_args = {"PYTHON_IMAGE": base, "TORCH_VERSION": TORCH_VERSION, "TORCH_INDEX": "https://pypi.org/simple"}
    tag = f"{IMAGE}:{inputs_hash(build_args)}"
    if _exists(tag):
        return tag
    pip_conf = state_dir() / "pip.conf"
    pip_conf.write_text(f"[global]\ncert = /etc/ssl/certs/ca-certificates.crt\nfind-links = {WHEELS}\n")
    mounts = [f"{HOST_CA}:/etc/ssl/certs/ca-certificates.crt:ro", f"{WHEELS}:{WHEELS}:ro",
              f"{pip_conf}:/etc/pip.conf:ro"]
    command = ["nice", "-n", "10", "podman", "build", "--layers", "--tag", tag,
               *(f"--build-arg={name}={value}" for name, value in build_args.items()),
               *(f"--volume={mount}" for mount in mounts), "--file", str(DOCKERFILE), str(ROOT)]
    built = subprocess.run(command, env=podman_env(), capture_output=not log, text=True)
    if built.returncode != 0:
        raise _failed("podman build", built)
    _forget_older(tag)
    return tag


def _forget_older(keep: str) -> None:
    """Drop earlier builds of the image, so storage holds one (each dependency change adds 1.7 GB).  The
    prune keeps the layers the kept image is built on, which the next build's cache reuses."""
    listed = podman("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE)
    for name in listed.stdout.split():
        if name != keep and name.startswith(IMAGE + ":"):
            # Naming the tag twice removes that tag only: an unchanged build is the same image under both.
            podman("untag", name, name)
    podman("image", "prune", "--force")


if __name__ == "__main__":
    if missing := missing_tools():
        print(f"{', '.join(missing)} not found (`make tools` as root installs them): not building the image")
        sys.exit(0)
    began = time.monotonic()
    try:
        image = ensure_image(log=True)
    except ImageUnavailable as exc:
        sys.exit(str(exc))
    size = podman("image", "inspect", "--format", "{{.Size}}", image).stdout.strip()
    print(f"image: {image} ({int(size or 0) / 1e6:.0f} MB)\n({time.monotonic() - began:.0f} s)")
