"""The check contract end to end: a check written in this file and registered beside the shipped ones is planned,
budgeted, run, reported, shown in progress and exported by the daemon with no change anywhere else, against the
reference engine.  (A new leak class is one module and one registry line: docs/checks.md.)"""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, Field

from prober.canaries.keys import resolve_key
from prober.canaries.mint import Minter
from prober.checks import REGISTRY, Check, Registry, Run
from prober.checks.base import ResultMetrics
from prober.config.schema import ProberConfig, assemble_config, parse_config
from prober.domain.errors import ConfigError
from prober.domain.evidence import Tagged
from prober.domain.types import DetectorName, Finding, FindingKind, Severity
from prober.ledger import open_ledger
from prober.oneshot.audit import Auditor
from prober.oneshot.progress import AuditProgress
from prober.probing.context import record
from prober.probing.plan import Aim, Plan, Planned, Step
from prober.probing.planting import ASKED
from prober.probing.results import CheckResult
from prober.report import document
from prober.targets.credentials import Secret
from tests.support.cli import invoke
from tests.support.daemons import make_daemon, sample, scenario, until
from tests.support.testbed import SMALL, StartTestbed

pytestmark = pytest.mark.usefixtures("keys_in_env")
TOKENS = 96  # each request's prompt
ANSWER = 64  # room for a code (~20 tokens) behind what the model says first


@dataclass(frozen=True)
class Repeated(Tagged):
    """The toy's evidence: the second answer repeated the first, word for word."""

    type = "twice_repeated"
    chars: int


class TwiceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    answer_tokens: int = Field(default=ANSWER, ge=1)
    """Completion tokens of each answer."""


class TwiceMetrics(ResultMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        self.repeats = Counter("leakprobe_twice_repeats", "Second answers that repeated the first.", ["target"],
                               registry=registry)
        self.series = [self.repeats]

    def observe(self, target: str, result: CheckResult) -> None:
        self.repeats.labels(target).inc(len(result.extra))


class Twice(Check):
    """Each tenant sends a short canary-bearing prompt twice, asking to quote it: the second answer may carry only
    its own canaries, and one that repeats the first word for word is noted (info: a deterministic engine does).
    A toy: everything a check brings (its evidence type, its metric, its docs section) is in its class."""

    name = "twice"
    about = "each tenant's short prompt sent twice in a row"
    every = 60.0
    docs = "checks.md"
    evidence = (Repeated,)
    settings = TwiceSettings

    def metrics(self, registry: CollectorRegistry) -> TwiceMetrics:
        return TwiceMetrics(registry)

    def planned(self, run: Run) -> Planned:
        requests, answer = 2 * len(run.target.tenants), run.config.section(self.name, TwiceSettings).answer_tokens
        return Planned.of(requests * TOKENS, requests, requests * answer)

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        ctx = run.target
        result = CheckResult(check=self.name)
        route = await ctx.route()
        plan = Plan(ctx.config.name, [], run_id=run.run_id)
        repeated: list[Finding] = []
        for tenant in ctx.tenants:
            step = Step(id=f"{run.run_id}tw-{tenant}", role="probe", tenant=tenant, length=TOKENS, stream=False,
                        expect_served=True, boundary="twice", aim=Aim.NONE,
                        max_tokens=run.config.section(self.name, TwiceSettings).answer_tokens)
            built = await ctx.planter.prompt(step, ASKED["quote"], route, plan, page=None, cue=False)
            texts = []
            for n in (1, 2):
                judged = await ctx.send_judged(replace(step, id=f"{step.id}-{n}"), built, route, check=self.name)
                record(judged, result, run.on_event)
                texts.append((judged.step.id, judged.answer.text))
            (_, first), (second, again) = texts
            if first and first == again:
                repeated.append(Finding(second, FindingKind.CROSS_REQUEST_ECHO, DetectorName.VERBATIM,
                                        Severity.INFO, 1.0, tenant, evidence=(Repeated(len(first)),)))
        result.extra = await ctx.judge.persist(repeated, None, run.on_event, check=self.name)
        return result
        return result


def with_twice() -> Registry:
    return Registry([*REGISTRY, Twice()])


def audit_config(url: str, ledger: Path, *, twice: dict[str, object] | None = None, **audit: object) -> ProberConfig:
    return parse_config({"ledger": str(ledger), "targets": [{"name": "t", "url": url + "/v1", "retries": 0}],
                         "tenants": [{"name": "tenant-a", "api_key_env": "LP_A"},
                                     {"name": "tenant-b", "api_key_env": "LP_B"}],
                         "detection": {"semantic": False}, "timing": {"audit": False},
                         "crosstalk": {"audit": False}, "request-ids": {"audit": False},
                         "abort-retry": {"audit": False}, "audit": audit, **({"twice": twice} if twice else {})},
                        sections=with_twice().sections)


def audit(config: ProberConfig, *, dry_run: bool = False) -> tuple[dict[str, object], str]:
    """The document and the progress lines of one audit with Twice registered."""
    secrets = {"tenant-a": Secret("testbed-key-a"), "tenant-b": Secret("testbed-key-b")}
    stream = io.StringIO()
    ledger = open_ledger(config.ledger)
    try:
        auditor = Auditor(config, Minter(ledger, resolve_key(ledger)), secrets,
                          on_event=AuditProgress(stream, interactive=False), checks=with_twice())
        doc = document(asyncio.run(auditor.run(dry_run=dry_run)))
    finally:
        ledger.close()
    return dict(doc), stream.getvalue()


def test_a_registered_check_is_planned_budgeted_run_and_reported(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("fixed", **SMALL)
    dry, _ = audit(audit_config(server.url, tmp_path / "l.sqlite", twice={"answer_tokens": 48}), dry_run=True)
    (target,) = dry["targets"]  # type: ignore[attr-defined]
    assert target["planned"]["twice"] == {"tokens": 4 * TOKENS, "requests": 4, "seconds": 19.6,  # its own setting
                                          "moot": None, "served": 384, "price": None}
    total = sum(p["tokens"] for p in target["planned"].values())
    over, _ = audit(audit_config(server.url, tmp_path / "l.sqlite", token_budget=total - 1))
    (target,) = over["targets"]  # type: ignore[attr-defined]
    assert f"needs {total:,} tokens" in target["errors"][0] and target["tokens_sent"] == 0  # its tokens count

    doc, progress = audit(audit_config(server.url, tmp_path / "l.sqlite"))
    (target,) = doc["targets"]  # type: ignore[attr-defined]
    (twice,) = [c for c in target["checks"] if c["check"] == "twice"]
    assert twice["requests"] == 4 and twice["findings"] == 2 and not twice["errors"]
    assert twice["sight"]["checked"] == 4 and twice["tokens"] >= 4 * TOKENS - 8  # counted as the engine counts
    assert [s["tenant"] for s in target["steps"] if s["check"] == "twice"] == ["tenant-a"] * 2 + ["tenant-b"] * 2
    assert "twice t: 4 requests, 2 findings" in progress
    assert doc["verdict"]["status"] == "no_leak", (doc["verdict"], target["sight"])  # type: ignore[index]
    # Its evidence type is written with the finding, in the report and the ledger, and read back as itself.
    noted = [f for f in doc["findings"] if f["check"] == "twice"]  # type: ignore[attr-defined]
    assert [d["type"] for f in noted for d in f["details"]] == ["twice_repeated"] * 2, noted
    ledger = open_ledger(tmp_path / "l.sqlite")
    try:
        stored = [f.evidence_of(Repeated) for f in ledger.findings() if f.check == "twice"]
    finally:
        ledger.close()
    assert len(stored) == 2 and all(r is not None and r.chars > 0 for r in stored), stored
    # Chosen by its name as every check is.
    alone, _ = audit(audit_config(server.url, tmp_path / "l.sqlite", checks=["twice"]))
    assert [c["check"] for c in alone["targets"][0]["checks"]] == ["twice"]  # type: ignore[index]


def test_the_daemon_runs_a_registered_check_as_a_job_of_its_own(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("fixed", **SMALL)
    daemon = make_daemon(server.url, tmp_path, checks=with_twice(),
                         schedule={"preflight": "1h", "sentinel": "1h", "campaign": "1h", "shapes": "1h",
                                   "prefix-cache": "1h", "timing": "off", "crosstalk": "off", "idle-slots": "off",
                                   "request-ids": "off", "abort-retry": "off",
                                   "twice": "1s"})

    async def body(client: httpx.AsyncClient) -> None:
        status = daemon.records.of("testbed", "twice")
        assert status is not None
        await until(daemon, lambda: status.last_success is not None, "a run of the twice job")
        assert sample(daemon, "leakprobe_probes_total", job="twice", boundary="twice", outcome="served") >= 4
        assert sample(daemon, "leakprobe_job_interval_seconds", job="twice") == 1.0
        assert sample(daemon, "leakprobe_twice_repeats_total") >= 2  # its own metric, on the daemon's registry
        assert sample(daemon, "leakprobe_job_runs_total", job="timing") == 0  # off: never scheduled
        jobs = (await client.get("/status")).json()["targets"][0]["jobs"]
        assert "twice" in jobs and jobs["twice"]["last_success"] and "timing" not in jobs

    scenario(daemon, body)


def test_a_schedule_naming_no_registered_job_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="twice: not a job"):
        make_daemon("http://127.0.0.1:9", tmp_path, schedule={"twice": "1m"})
    with pytest.raises(ConfigError, match="preflight cannot be off"):
        make_daemon("http://127.0.0.1:9", tmp_path, schedule={"preflight": "off"})


@pytest.mark.unit
def test_an_audit_runs_the_checks_named_and_not_those_skipped(tmp_path: Path) -> None:
    """By the checks' own names (the daemon's jobs, the metrics' labels): `audit.checks` (`--check`) runs those alone,
    whatever their section says; `audit.skip` (`--skip`) leaves checks out; a name no check has is refused."""
    everyday = [c.name for c in REGISTRY if c.in_audit(audit_config("http://x", tmp_path / "l.sqlite"))]
    assert [c.name for c in REGISTRY.selected(audit_config("http://x", tmp_path / "l.sqlite"))] == everyday
    named = audit_config("http://x", tmp_path / "l.sqlite", checks=["timing", "idle-slots"], skip=["idle-slots"])
    assert [c.name for c in REGISTRY.selected(named)] == ["timing"]  # timing's section says audit: false
    skipped = audit_config("http://x", tmp_path / "l.sqlite", skip=["campaign", "media-cache"])
    assert [c.name for c in REGISTRY.selected(skipped)] == [n for n in everyday if n not in ("campaign", "media-cache")]
    with pytest.raises(ConfigError, match=r"no check named 'slots'; the checks: shapes, prefix-cache, campaign"):
        REGISTRY.selected(audit_config("http://x", tmp_path / "l.sqlite", skip=["slots"]))


@pytest.mark.unit
def test_the_switches_of_the_last_release_still_work_and_say_what_replaces_them(tmp_path: Path) -> None:
    """`--no-slots` and the `slots:` section are the idle-slot check's old names: honoured for one release, each
    with a line naming the new one; `--check` with a name no check has is an error before anything is sent."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"targets": [{"name": "t", "url": "http://127.0.0.1:9/v1"}],
                                      "slots": {"tokens": 96}, "ledger": str(tmp_path / "l.sqlite")}))
    assembled = assemble_config(config, slots=False)
    assert assembled.idle_slots.tokens == 96 and assembled.idle_slots.audit is False
    result = invoke("audit", "--config", str(config), "--tenant", "a=LP_A", "--tenant", "b=LP_B", "--no-semantic",
                    "--no-slots", "--check", "slot")
    assert result.exit_code == 2, result.output
    assert "--no-slots is deprecated: use --skip idle-slots" in result.output
    assert "no check named 'slot'" in result.output


@pytest.mark.unit
def test_a_check_brings_its_own_settings_keyed_by_its_name(tmp_path: Path) -> None:
    """Its section is validated by its model where its registry is passed, read with its defaults where absent, and
    a key no check brings is refused (a typo never runs at the defaults)."""
    config = audit_config("http://x", tmp_path / "l.sqlite", twice={"answer_tokens": 48})
    assert config.section("twice", TwiceSettings).answer_tokens == 48
    assert audit_config("http://x", tmp_path / "l.sqlite").section("twice", TwiceSettings).answer_tokens == ANSWER
    with pytest.raises(ConfigError, match=r"twice.answer_tokens: Input should be greater than or equal to 1"):
        audit_config("http://x", tmp_path / "l.sqlite", twice={"answer_tokens": 0})
    with pytest.raises(ConfigError, match=r"twise: not a setting of leakprobe, nor a check's"):
        parse_config({"targets": [{"name": "t", "url": "http://x/v1"}], "twise": {}}, sections=with_twice().sections)
    with pytest.raises(ConfigError, match=r"twice: not a setting"):  # without the registry that brings it
        parse_config({"targets": [{"name": "t", "url": "http://x/v1"}], "twice": {}})
