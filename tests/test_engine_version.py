"""The engine's release, read where each engine says it, and the bug table read against it: parsing and policy in
this process (httpx's MockTransport); `leakprobe preflight`, an audit's order and the daemon's metric against the
reference engine saying an SGLang release.  The project's real vLLM and llama.cpp: tests/test_vllm.py and
tests/test_llamacpp.py (their preflight tests)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from packaging.version import Version

from prober.capacity import Capacity, introspect
from prober.capacity.known_bugs import Releases, Standing, standing
from prober.capacity.version import EngineVersion
from prober.checks import REGISTRY
from prober.targets import Secret, Transport
from prober.targets.api import Engine
from tests.support.aio import run
from tests.support.cli import invoke
from tests.support.keys import TENANT_ARGS
from tests.support.mockhttp import Route, Routes, send
from tests.support.policies import FAST
from tests.support.testbed import SMALL, StartTestbed

# The abort-into-a-placeholder row (the incident's): SGLang releases before 0.5.20 (#36988); reported on 0.5.11.
INCIDENT_ROW = "SGLang #30233, #38704, #38935"


def _answered(routes: dict[str, Route]) -> Capacity:
    async def go() -> Capacity:
        async with Transport(FAST, http=Routes(routes).transport()) as transport:
            return await introspect(transport, "http://engine.test/v1", Secret("k"))
    return run(go())


@pytest.mark.unit
@pytest.mark.parametrize(("engine", "text", "release"), [
    (Engine.VLLM, "0.32.0", "0.32.0"),
    (Engine.VLLM, "0.11.1rc3+cpu", "0.11.1rc3+cpu"),
    (Engine.SGLANG, "v0.5.11", "0.5.11"),
    (Engine.LLAMACPP, "b11434-1a2b3c4", "11434"),
    (Engine.LLAMACPP, "b0-unknown", None),  # built from a source archive without git: no release named
    (Engine.SGLANG, "leakprobe-testbed 0.1.0", None),
    (Engine.TGI, "3.3.6-dev0", "3.3.6.dev0"),
    (None, "latest", None),
])
def test_a_release_is_what_the_version_names(engine: Engine | None, text: str, release: str | None) -> None:
    named = EngineVersion(text, "here").release(engine)
    assert (str(named) if named else None) == release


@pytest.mark.unit
def test_each_engine_says_its_version_where_it_keeps_it() -> None:
    metrics = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="2048"} 1.0\n'
    vllm = _answered({"GET /metrics": lambda _: send(200, metrics, content_type="text/plain"),
                      "GET /version": lambda _: send(200, {"version": "0.32.0"})})
    assert vllm.engine is Engine.VLLM and vllm.version == EngineVersion("0.32.0", "GET /version")
    llama = _answered({"GET /props": lambda _: send(200, {"default_generation_settings": {"n_ctx": 4096},
                                                           "total_slots": 2, "build_info": "b11434-1a2b3c4"})})
    assert llama.version == EngineVersion("b11434-1a2b3c4", "llama.cpp /props build_info")
    sglang = _answered({"GET /server_info": lambda _: send(200, {"max_total_num_tokens": 681_280,
                                                                 "version": "0.5.11"})})
    assert sglang.version == EngineVersion("0.5.11", "sglang /server_info version")
    tgi = _answered({"GET /info": lambda _: send(200, {"max_total_tokens": 4096, "version": "3.3.6"})})
    assert tgi.version == EngineVersion("3.3.6", "tgi /info version")
    # A hostile or odd answer: a version that is not a string, one far too long, a /version with other keys.
    odd = _answered({"GET /server_info": lambda _: send(200, {"max_total_num_tokens": 1024, "version": 5}),
                     "GET /version": lambda _: send(200, {"version": "9" * 10_000, "build": "x"})})
    assert odd.version is None
    long = _answered({"GET /version": lambda _: send(200, {"version": "1." + "9" * 10_000})})
    assert long.version is not None and len(long.version.text) == 64


@pytest.mark.unit
def test_a_server_header_names_the_engine_where_nothing_else_answers() -> None:
    """Behind a gateway that forwards only the API, `/v1/models`'s `server` header may still name the engine (and
    its version, as a `name/version` product); a gateway's or web server's own name says nothing; an engine's own
    endpoint wins where it answers."""
    def models(server: str) -> Route:
        return lambda _: send(200, {"object": "list", "data": [{"id": "m"}]}, headers={"server": server})

    llama = _answered({"GET /v1/models": models("llama.cpp")})
    assert llama.engine is Engine.LLAMACPP and llama.version is None
    tgi = _answered({"GET /v1/models": models("text-generation-inference/3.3.6 (axum)")})
    assert tgi.engine is Engine.TGI and tgi.version == EngineVersion("3.3.6", "server header")
    assert _answered({"GET /v1/models": models("uvicorn")}).engine is None
    assert _answered({"GET /v1/models": models("nginx/1.25.3")}).version is None
    props = _answered({"GET /v1/models": models("llama.cpp/1.0"),
                       "GET /props": lambda _: send(200, {"default_generation_settings": {"n_ctx": 4096},
                                                          "build_info": "b11434-1a2b3c4"})})
    assert props.version == EngineVersion("b11434-1a2b3c4", "llama.cpp /props build_info")


@pytest.mark.unit
def test_a_row_stands_by_the_release_and_only_for_its_engine() -> None:
    row = Releases(Engine.SGLANG, since="0.5.0", fixed_in="0.5.13")
    said = EngineVersion
    assert standing(row, Engine.SGLANG, said("0.5.11", "s")) is Standing.APPLIES
    assert standing(row, Engine.SGLANG, said("0.5.13", "s")) is Standing.FIXED
    assert standing(row, Engine.SGLANG, said("0.4.9", "s")) is Standing.FIXED  # before the bug came in
    assert standing(row, Engine.SGLANG, said("leakprobe-testbed 1", "s")) is Standing.UNKNOWN
    assert standing(row, Engine.SGLANG, None) is Standing.UNKNOWN
    assert standing(row, Engine.VLLM, said("0.5.11", "s")) is None
    assert standing(row, None, said("0.5.11", "s")) is None
    assert Releases(Engine.VLLM).holds(Version("99.0"))  # open: every release


@pytest.mark.unit
def test_the_table_names_each_rows_engines_and_their_releases_parse() -> None:
    spelled = {Engine.VLLM: "vLLM", Engine.SGLANG: "SGLang", Engine.LLAMACPP: "llama.cpp"}
    for bug in REGISTRY.bugs:
        # A row names the releases of each engine its public record names (LMCache's and Dynamo's are no engine's).
        named = {e for e, name in spelled.items() if re.search(rf"{re.escape(name)} (PR )?#", bug.public)}
        assert {r.engine for r in bug.releases} == named, bug.public
        for releases in bug.releases:
            for edge in (releases.since, releases.fixed_in):
                assert edge is None or Version(edge), bug.public  # raises on a release that does not parse
            assert releases.since is None or releases.fixed_in is None or (
                Version(releases.since) < Version(releases.fixed_in)), bug.public


@pytest.mark.unit
def test_the_known_bugs_checks_go_first() -> None:
    known = REGISTRY.known_bugs(Capacity(engine=Engine.SGLANG, version=EngineVersion("0.5.11", "here")))
    applies = [bug for bug in known if bug.standing is Standing.APPLIES]
    assert INCIDENT_ROW in {bug.public for bug in applies}
    assert [bug.standing for bug in known] == sorted((bug.standing for bug in known),
                                                     key=lambda s: s is not Standing.APPLIES)
    checks = list(REGISTRY)
    ordered = REGISTRY.ordered(checks, known)
    first = {name for bug in applies for name in bug.checks}
    assert {c.name for c in ordered[:len(first)]} == first and sorted(ordered, key=checks.index) == checks
    assert REGISTRY.ordered(checks, ()) == checks  # nothing known: the registry's order


def test_preflight_names_the_release_and_the_bugs_it_has(testbed: StartTestbed) -> None:
    inside = "0.5.11"
    server = testbed("incident", **SMALL, reports_version=inside)
    result = invoke("preflight", "--target", server.url + "/v1", *TENANT_ARGS)
    assert f"engine sglang {inside} (from sglang /server_info version)" in result.stdout, result.output
    assert f"known bug {INCIDENT_ROW} applies" in result.stdout and "probed by campaign" in result.stdout
    as_json = invoke("preflight", "--target", server.url + "/v1", *TENANT_ARGS, "--format", "json")
    report = json.loads(as_json.stdout)["targets"][0]
    assert report["capacity"]["version"] == {"text": inside, "source": "sglang /server_info version",
                                             "release": inside}
    row = next(bug for bug in report["known_bugs"] if bug["public"] == INCIDENT_ROW)
    assert row["standing"] == "applies" and row["checks"] == ["campaign"]
    assert row["releases"] == "sglang every release known, fixed in 0.5.20"
    # Past the fix: listed as fixed, and the request-ID row (fixed in 0.5.10) with it.
    fixed = testbed("incident", **SMALL, reports_version="0.5.20")
    as_json = invoke("preflight", "--target", fixed.url + "/v1", *TENANT_ARGS, "--format", "json")
    standings = {bug["public"]: bug["standing"] for bug in json.loads(as_json.stdout)["targets"][0]["known_bugs"]}
    assert standings[INCIDENT_ROW] == "fixed" and standings["SGLang #33507, #35421"] == "applies"
    assert all("SGLang" in bug for bug in standings) and "vLLM #47724 (PR #47725)" not in standings


def test_an_engine_that_names_no_release_is_said_to(testbed: StartTestbed) -> None:
    server = testbed("fixed", **SMALL)  # says `leakprobe-testbed <version>`
    result = invoke("preflight", "--target", server.url + "/v1", *TENANT_ARGS)
    assert "(no release named)" in result.stdout, result.output
    assert "may apply (its release is not known); every check runs" in result.stdout
    assert "applies (" not in result.stdout


def test_an_audit_plans_the_known_bugs_checks_first(testbed: StartTestbed, tmp_path: Path) -> None:
    """A dry run (nothing sent): the rows that apply to 0.5.11 (the incident's among them) have their checks planned
    first; a release that names none keeps the registry's order."""
    def planned(version: str | None) -> list[str]:
        server = testbed("incident", **SMALL, **({"reports_version": version} if version else {}))
        result = invoke("audit", "--target", server.url + "/v1", *TENANT_ARGS, "--ledger", str(tmp_path / "l.sqlite"),
                        "--dry-run", "-f", "json")
        assert result.exit_code == 0, result.output
        return list(json.loads(result.stdout)["targets"][0]["planned"])

    known = REGISTRY.known_bugs(Capacity(engine=Engine.SGLANG, version=EngineVersion("0.5.11", "here")))
    first = {name for bug in known if bug.standing is Standing.APPLIES for name in bug.checks}
    order = planned("0.5.11")
    assert "campaign" in first and set(order[:len(first & set(order))]) == first & set(order)
    unknown = planned(None)
    assert unknown[0] != "campaign" and unknown == [c.name for c in REGISTRY if c.name in unknown]
