"""Shared fixtures: real loopback servers, never mocks."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from prober.embeddings import Embedder, make_embedder
from prober.testbed import TestbedServer, build_config
from tests.llamacpp import OPT_OUT, Installation, LlamaCppUnavailable, ensure_installed
from tests.postgres import PostgresServer, postgres_server

KEY_A = {"Authorization": "Bearer testbed-key-a"}
KEY_B = {"Authorization": "Bearer testbed-key-b"}

# A scaled-down incident: same shape (pool < advertised context, pages of 16), small enough that a
# prompt over the pool costs a few thousand tokens.
SMALL = {"context_length": 16_384, "pool_tokens": 4_096, "page_size": 16, "prefill_ms_per_1k_tokens": 0}

StartTestbed = Callable[..., TestbedServer]
# The test files that run a real engine on the CPU (vLLM, llama.cpp, the real-LM mode): one unit of work.
ENGINE_FILES = frozenset({"tests/test_vllm.py", "tests/test_vllm_fault.py", "tests/test_llamacpp.py",
                          "tests/test_isolation.py", "tests/test_testbed_reallm.py"})


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to when the suite runs in several workers: its file, or `engines`."""
    file = nodeid.split("::", 1)[0]
    return "engines" if file in ENGINE_FILES else file


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """How the suite shares a machine in several workers (`make test`, one per core): each test file is one unit,
    so that its module fixtures start once, and the engines' files are one unit together, so that two engines
    never starve each other and their timing checks.  (xdist's own `loadgroup` cannot do this under pytest 9,
    whose node ids no longer follow the `_nodeid` it rewrites.)"""
    from xdist.scheduler import LoadScopeScheduling

    class EnginesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return EnginesTogether(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest units first (the engines, then files with a `slow` test; run with --no-loadscope-reorder),
    so that none starts last and finishes alone; in one process only the order changes."""
    slow = {unit_of(i.nodeid) for i in items if i.get_closest_marker("slow")}
    items.sort(key=lambda i: (unit_of(i.nodeid) != "engines", unit_of(i.nodeid) not in slow))  # stable


@pytest.fixture
def testbed() -> Iterator[StartTestbed]:
    """Start reference engines on ephemeral loopback ports; all are stopped after the test."""
    servers: list[TestbedServer] = []

    def start(preset: str = "incident", **overrides: Any) -> TestbedServer:
        server = TestbedServer(build_config(preset, overrides)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
        server.engine.check_invariants()


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The default offline model, loaded once per test session."""
    model = make_embedder()
    model.encode(["warm up"])
    return model


@pytest.fixture(scope="session")
def llama_install() -> Installation:
    """llama.cpp and Gemma, built and proven once per machine (tests/llamacpp.py); LEAKPROBE_SKIP_LLAMACPP=1 skips."""
    if os.environ.get(OPT_OUT) == "1":
        pytest.skip(f"{OPT_OUT}=1: llama.cpp tests opted out")
    try:
        return ensure_installed()
    except LlamaCppUnavailable as exc:
        pytest.fail(f"llama.cpp + Gemma could not be provided: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session (tests/postgres.py); each test creates its own database."""
    with postgres_server() as server:
        yield server
