"""A path that is different for every request, as real ones are: the reference engine as two replicas behind one
address (every request, generation and introspection alike, to the next replica in turn, as a Kubernetes Service
balances), an operator prompt of some 1,800 tokens that ends with a per-request reference and the time (so what the
path adds varies by up to 10 tokens), 502s after the engine served, and a third tenant's ordinary, over-limit and
abandoned traffic through the same gateway.

The path is measured as a range and every check is sized to it: the healthy replicas' audit is complete and clean
with every check run; the incident's is a cross-tenant echo between the two tenants."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from prober.domain.types import Severity
from prober.testbed import TestbedServer
from tests.support.cli import invoke
from tests.support.shared import INTROSPECTION, OPERATOR_PROMPT, BackgroundTenant, Gateway, Traffic, dated
from tests.support.testbed import SMALL, StartTestbed

pytestmark = pytest.mark.slow

TENANTS = {"tenant-a": "testbed-key-a", "tenant-b": "testbed-key-b", "tenant-c": "testbed-key-c"}
PAIRS = {("tenant-a", "tenant-b"), ("tenant-b", "tenant-a")}
LONG_PROMPT = " ".join([OPERATOR_PROMPT] * 7)  # longer than the prefix-cache check's 1,024 tokens on its own


@contextmanager
def replicas(testbed: StartTestbed, preset: str) -> Iterator[tuple[list[TestbedServer], Gateway]]:
    engines = [testbed(preset, **SMALL, tenants=TENANTS) for _ in range(2)]
    with Gateway(engines[0].url, system_prompt=dated(LONG_PROMPT, random.Random(3)), fail_after_served=0.05,
                 replicas=[e.url for e in engines], balanced=True) as front, \
            BackgroundTenant(front.url + "/v1", TENANTS["tenant-c"], Traffic(rate=2.0)):
        yield engines, front


def audit(url: str, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    result = invoke("audit", "--target", url + "/v1", "--tenant", "tenant-a=LP_A", "--tenant", "tenant-b=LP_B",
                    "--ledger", str(tmp_path / "l.sqlite"), "-f", "json", "--no-semantic")
    return result.exit_code, json.loads(result.stdout)


def test_healthy_replicas_behind_a_dated_operator_prompt_are_complete_and_clean(testbed: StartTestbed,
                                                                                 tmp_path: Path) -> None:
    with replicas(testbed, "fixed") as (engines, front):
        before = [e.engine.stats.prompt_tokens for e in engines]
        code, doc = audit(front.url, tmp_path)
        served = [e.engine.stats.prompt_tokens - b for e, b in zip(engines, before, strict=True)]
    assert min(served) > 100_000 and front.stats.failed_after_served >= 1, (served, front.stats)
    serious = [(f["kind"], f["evidence"]["excerpt"]) for f in doc["findings"]
               if Severity.parse(f["severity"]) >= Severity.WARNING]
    target = doc["targets"][0]
    assert code == 0 and doc["verdict"]["status"] == "no_leak" and not serious, (code, doc["verdict"], serious)
    assert target["skipped"] == {} and target["coverage"]["observed"] == target["coverage"]["planned"], target
    (chat,) = [path for path in target["paths"] if path["api"] == "chat"]
    spread = max(max(v) - min(v) for v in chat["by_tenant"].values())
    assert chat["varying"] and 5 <= spread <= 12 and min(chat["by_tenant"]["tenant-a"]) > 1_500, chat
    ran = {c["check"] for c in target["checks"]}
    assert {"prefix-cache", "campaign", "timing", "abort-retry", "request-ids", "crosstalk"} <= ran, ran
    # The prefix-cache and repeat checks ran behind a prefix longer than their own prompts, and saw.
    cache = [s for s in target["steps"] if s["check"] == "prefix-cache"]
    assert cache and all(s["outcome"] == "served" and s["prompt_tokens"] > 1_500 for s in cache), cache
    assert not target["sight"]["prefix-cache and campaign"]["blind"]


def test_the_incident_behind_replicas_and_a_dated_prompt_is_an_echo_between_the_tenants(testbed: StartTestbed,
                                                                                       tmp_path: Path) -> None:
    with replicas(testbed, "incident") as (_, front):
        code, doc = audit(front.url, tmp_path)
    # Which replica a prime and its probe reach is the balancer's turn, beside other users' requests: a direction
    # whose probe reached the other replica sees that replica's stale pages, so not every direction need show.
    echoes = {(f["victim_tenant"], f["observer_tenant"]) for f in doc["findings"] if f["kind"] == "cross_tenant_echo"}
    assert code == 1 and doc["verdict"]["status"] == "leak" and echoes and echoes <= PAIRS, (code, doc["verdict"],
                                                                                             echoes)
    assert doc["targets"][0]["skipped"] == {}


def test_unknown_capacity_behind_a_gateway_is_one_line_and_the_other_checks_run(testbed: StartTestbed,
                                                                                tmp_path: Path) -> None:
    """A gateway that forwards no introspection and lists models without their context (LiteLLM's way), and no
    `capacity:` in the config: the checks that size their prompts by the capacity say in one line how to give it,
    the audit exits 2, and the checks that need no capacity (cross-talk, request IDs, media) still run."""
    engine = testbed("fixed", **SMALL, tenants=TENANTS)
    with Gateway(engine.url, hide=(*INTROSPECTION, "/v1/models")) as front:
        code, doc = audit(front.url, tmp_path)
    target = doc["targets"][0]
    why = "capacity unknown: no advertised context, KV pool or input limit; set `capacity:`"
    assert code == 2 and doc["verdict"]["status"] in ("incomplete", "blind"), doc["verdict"]
    unplanned = {c["check"] for c in target["checks"] if any(why in e for e in c["errors"])}
    assert {"campaign", "prefix-cache"} <= unplanned, target["checks"]
    ran = {c["check"] for c in target["checks"] if c["requests"]}
    assert {"crosstalk", "request-ids"} <= ran, target["checks"]
    assert any(why in reason for reason in doc["verdict"]["reasons"]), doc["verdict"]["reasons"]


def test_a_check_that_nothing_could_be_built_for_behind_the_path_is_a_reason_not_clean(testbed: StartTestbed,
                                                                                       tmp_path: Path) -> None:
    """An operator prompt that leaves less room under the limit than the boundary and prefix-cache prompts need: their
    exchanges cannot be built and are skipped, and a check none of whose exchanges was sent is an error among the
    verdict's reasons (exit 2), never a clean verdict for what it did not test."""
    engine = testbed("fixed", **SMALL, tenants=TENANTS)
    crowding = " ".join([OPERATOR_PROMPT] * 15) + " " + OPERATOR_PROMPT[:len(OPERATOR_PROMPT) // 2]
    with Gateway(engine.url, system_prompt=crowding) as front:
        code, doc = audit(front.url, tmp_path)
    target = doc["targets"][0]
    untested = {c["check"] for c in target["checks"] if any("exchanges could be built" in e for e in c["errors"])}
    assert code == 2 and doc["verdict"]["status"] != "no_leak", doc["verdict"]
    assert "prefix-cache" in untested and target["skipped"], (target["checks"], target["skipped"])
