"""Shared fixtures: real loopback servers, never mocks (pure parsing and policy, marked `unit`, need none)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prober.embeddings import Embedder, make_embedder
from prober.ledger import Ledger, open_ledger
from prober.testbed import TestbedServer, build_config
from tests.support.keys import KEYS
from tests.support.ledgers import OpenLedger
from tests.support.litellm_proxy import OPT_OUT as LITELLM_OPT_OUT
from tests.support.litellm_proxy import Installation as LiteLLMInstallation
from tests.support.litellm_proxy import LiteLLMUnavailable
from tests.support.litellm_proxy import ensure_installed as ensure_litellm
from tests.support.llamacpp import OPT_OUT, Installation, LlamaCppUnavailable, ensure_installed
from tests.support.postgres import PostgresServer, postgres_server
from tests.support.redis import RedisServer, redis_server
from tests.support.testbed import StartTestbed
from tests.support.tools import opted_out

# The test files that run a real engine on the CPU (vLLM, llama.cpp, the real-LM mode): one unit of work.
ENGINE_FILES = frozenset({"tests/test_vllm.py", "tests/test_vllm_fault.py", "tests/test_vllm_lora.py",
                          "tests/test_llamacpp.py", "tests/test_isolation.py", "tests/test_testbed_reallm.py"})


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


# What a test needs beyond the checkout and `.venv`, told by the fixtures it uses (`make check` leaves these out).
NEEDS = {"llama_install": "engine", "litellm_install": "engine", "postgres": "postgres"}
# Fixtures that start a server, an engine, a database or a model: a test marked `unit` (`make unit`) uses none.
NOT_UNIT = frozenset({"testbed", "embedder", "postgres", "connect", "ledger_url", "llama_install", "litellm_install",
                      "redis"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers for what each test needs, from the fixtures in NEEDS (modules whose own fixtures start vLLM or the
    real model mark themselves), and no `unit` test with a fixture of NOT_UNIT; then the longest units first (the
    engines, then files with a `slow` test; run with --no-loadscope-reorder), so that none starts last and
    finishes alone; in one process only the order changes."""
    for item in items:
        for need in sorted({NEEDS[f] for f in getattr(item, "fixturenames", ()) if f in NEEDS}):
            item.add_marker(need)
    wrong = [f"{i.nodeid} uses {', '.join(sorted(NOT_UNIT & set(getattr(i, 'fixturenames', ()))))}" for i in items
             if i.get_closest_marker("unit") and NOT_UNIT & set(getattr(i, "fixturenames", ()))]
    if wrong:
        raise pytest.UsageError("marked unit but starts a server, engine, database or model:\n" + "\n".join(wrong))
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
    """llama.cpp and Gemma, built and proven once per machine (tests/support/llamacpp.py);
    LEAKPROBE_SKIP_LLAMACPP=1 skips (fails under CI)."""
    opted_out(OPT_OUT, "the llama.cpp tests")
    try:
        return ensure_installed()
    except LlamaCppUnavailable as exc:
        pytest.fail(f"llama.cpp + Gemma could not be provided: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def litellm_install() -> LiteLLMInstallation:
    """The LiteLLM proxy, installed once per machine (tests/support/litellm_proxy.py); LEAKPROBE_SKIP_LITELLM=1
    skips (fails under CI)."""
    opted_out(LITELLM_OPT_OUT, "the LiteLLM tests")
    try:
        return ensure_litellm()
    except LiteLLMUnavailable as exc:
        pytest.fail(f"the LiteLLM proxy could not be provided: {exc}", pytrace=False)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh Debian `redis-server` on loopback, no persistence (tests/support/redis.py), stopped after the test."""
    with redis_server(tmp_path / "redis") as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each ledger backend in turn: a SQLite file, a database of the session's PostgreSQL."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database()


@pytest.fixture
def connect(ledger_url: str) -> Iterator[OpenLedger]:
    """Opens another handle on the same ledger each call (as another replica would), closing them after."""
    opened: list[Ledger] = []

    def open_one() -> Ledger:
        opened.append(open_ledger(ledger_url))
        return opened[-1]

    yield open_one
    for ledger in opened:
        ledger.close()


@pytest.fixture
def keys_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test tenants' keys in the environment, as an operator gives them to a daemon in this process."""
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session (tests/support/postgres.py); each test creates its own database."""
    with postgres_server() as server:
        yield server
