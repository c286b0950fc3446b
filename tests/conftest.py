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
