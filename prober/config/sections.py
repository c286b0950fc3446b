"""The sections of the configuration file besides its targets and tenants: the audit's, detection's, each check's
and the daemon's settings, and the field types they share (durations, intervals, severities).
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from prober.domain.types import Severity

DEFAULT_LISTEN = "127.0.0.1:10461"


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Any) -> float:
    """Seconds from `"2s"`, `"5m"`, `"6h"`, `"1h30m"`, `"500ms"` (Prometheus' spelling) or a bare number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and value and _DURATION_PART.sub("", value.strip()) == "":
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value.strip()))
    else:
        raise ValueError(f"expected a duration such as 30s, 5m or 6h, not {value!r}")
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


def _severity(value: Any) -> Severity:
    return value if isinstance(value, Severity) else Severity.parse(str(value))


def no_nul(value: Any) -> Any:
    if "\x00" in str(value):
        raise ValueError("contains a NUL byte")
    return value


def http_url(value: str) -> str:
    """An http(s) URL with a host and a valid port, and no user info: a password in a URL would be sent as
    Basic auth in place of each tenant's own key, and printed wherever the URL is."""
    if not value.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL as exc:
        raise ValueError(f"is not a valid URL ({exc})") from None
    if url.userinfo:
        raise ValueError("must not carry user info (user:password@): give each tenant's key with api_key_env or "
                         "api_key_file")
    if not url.host:
        raise ValueError("has no host")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise ValueError(f"has port {url.port}, outside 1-65535")
    return value


def switched_off(value: Any) -> bool:
    """`off` as the docs write it: YAML 1.1 (PyYAML) reads a bare `off` (or `no`, `false`) as false; a quoted
    `"off"` stays a string."""
    return value is False or (isinstance(value, str) and value.strip().lower() == "off")


def duration_or_off(value: Any) -> float | None:
    """Seconds, or None where the value switches it off."""
    if switched_off(value):
        return None
    if value is True:  # a bare on, yes or true
        raise ValueError("expected a duration such as 30s, 5m or 6h, or off, not true (a bare on or yes reads so)")
    return parse_duration(value)


def jitter_seconds(value: Any) -> float:
    """A job's random delay: a duration, or none (`off`, 0)."""
    return 0.0 if switched_off(value) or (isinstance(value, int | float) and value == 0) else parse_duration(value)


Duration = Annotated[float, BeforeValidator(parse_duration)]


DurationOrOff = Annotated[float | None, BeforeValidator(duration_or_off)]  # None: off


Jitter = Annotated[float, BeforeValidator(jitter_seconds)]


SeverityName = Annotated[Severity, BeforeValidator(_severity)]


BodyField = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]  # a JSON key of a request body


class Strict(BaseModel):
    # A field's docstring is its description: the docs site's configuration reference prints it
    # (docs/hooks/schema.py), and the site's strict build fails on a field without one.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class AuditSettings(Strict):
    fail_on: SeverityName = Severity.WARNING
    """Exit 1 when a finding is at or above this severity."""
    token_budget: int = Field(default=50_000_000, gt=0)
    """Prompt tokens the whole plan may cost; a plan over it stops the audit before anything is sent."""
    max_tokens: int = Field(default=160, ge=1, le=4096)
    """Completion tokens per probe (clamped so that prompt and completion fit the context); a prime sent on its own
    asks for at most 16."""
    streaming: Literal["plain", "stream", "both"] = "both"
    """Plain requests, SSE streams, or both alternating."""
    concurrent: bool = True
    """Above the limit, also send the prime and the probe at the same time."""
    rounds: int = Field(default=1, ge=1, le=100)
    """How many times the whole plan runs."""
    thorough: bool = False
    """The boundary campaign's whole matrix: every boundary in every direction, each with a prime of its own (26 M
    tokens at the incident's sizes, where a healthy engine is sent 4.1 M).  Off: one prime per direction, the
    likeliest boundary first, the rest only while undecided."""
    bisect_budget: int = Field(default=0, ge=0)
    """Tokens bisection of the accept/refuse boundary may spend when the engine exposes no context length (0: never)."""
    deadline: DurationOrOff | None = None
    """Total time for the whole audit (e.g. `30m`); what is still running then ends, and the audit is incomplete.
    Unset or `off`: only each target's deadline bounds it."""
    checks: list[str] = Field(default_factory=list)
    """The checks to run, by name (`leakprobe checks` lists them); empty: every check whose own section says it runs
    in audits.  A check named here runs whatever its section's `audit` says."""
    skip: list[str] = Field(default_factory=list)
    """Checks not to run, by name."""
    target_deadline: DurationOrOff | None = None
    """Total time per target: survey, probe-shape choice, campaign and isolation checks.  Unset or `off`: 5 minutes for
    the survey, then 2 minutes plus what follows derives — its prompt tokens at 1,000 a second and each request's
    `max_tokens` at 10 a second."""


class TimingSettings(Strict):
    """`cross_tenant_cache_timing`: do another tenant's prompts come back sooner (a shared prefix cache)?"""

    audit: bool = True
    """Run the timing check in `leakprobe audit`."""
    samples: int = Field(default=24, ge=2, le=1000)
    """Would-be cache hits per ordered tenant pair and round, and as many misses."""
    rounds: int = Field(default=3, ge=1, le=10)
    """The most rounds of samples per pair: a pair neither found nor clearly no faster gets another, of fresh
    prompts; one still unclear after the last is reported undecided, never clean."""
    prompt_tokens: int = Field(default=1024, ge=16, le=1_048_576)
    """Length of each random prompt (longer: a larger gap between a hit and a miss); at most half the longest
    prompt the target serves, whatever is set, so that none is refused."""
    false_alarm: float = Field(default=0.001, gt=0, lt=0.5)
    """Chance that a run against a fully isolated cache reports any pair (family-wise, Holm over the pairs)."""


class CrosstalkSettings(Strict):
    """A burst of concurrent short requests from every tenant, each asking for its own canary back."""

    audit: bool = True
    """Run the cross-talk burst in `leakprobe audit`."""
    per_tenant: int = Field(default=4, ge=1, le=64)
    """Concurrent requests per tenant in one burst."""
    max_tokens: int = Field(default=48, ge=8, le=1024)
    """Completion tokens per request (enough to repeat a canary)."""


class AdapterSettings(Strict):
    """The `adapters` check: each tenant's canary adapter (a target's `adapters:`) asked its trigger, beside the
    others', and one prompt sent through every adapter in turn."""

    audit: bool = True
    """Run the adapters check in `leakprobe audit` (it has nothing to do on a target without `adapters:`)."""
    per_tenant: int = Field(default=3, ge=1, le=64)
    """Concurrent triggers per tenant in the first round."""
    max_tokens: int = Field(default=64, ge=16, le=1024)
    """Completion tokens per request (enough for a canary and what a chat template adds)."""


class MediaSettings(Strict):
    """The media-cache check: each tenant's canary drawn in an image, then another tenant's image sent under the same
    uuid, by uuid alone, with a digest that agrees in its low bits, and as the same pixels reshaped."""

    audit: bool = True
    """Run the media-cache check in `leakprobe audit` (moot where the target takes no images)."""
    max_tokens: int = Field(default=48, ge=8, le=1024)
    """Completion tokens per request (enough to read a canary back)."""
    image_tokens: int = Field(default=256, ge=1, le=16_384)
    """What one image costs in prompt tokens on the target's model, for budgets (Gemma 3: 256; Qwen2-VL: 64 for a
    448 x 112 card)."""
    hash_bits: int = Field(default=16, ge=1, le=24)
    """The digest width the collision probe matches (LMCache cut image hashes to 16 bits)."""
    search_seconds: float = Field(default=30.0, gt=0, le=600)
    """Most time the collision probe spends finding a colliding image (2**hash_bits tries expected: about a
    second for 16 bits); past it that probe is left out, and said so."""


class IdleSlotSettings(Strict):
    """Idle slots (llama.cpp #27148): each tenant's conversations left in every slot, then another tenant's cold
    prompts, one at a time and all at once."""

    audit: bool = True
    """Run the idle-slot check in `leakprobe audit`."""
    width: int | None = Field(default=None, ge=1, le=64)
    """Slots to fill and probe; null: the engine's own count (llama.cpp's `total_slots`, or `capacity.slots`), and
    no check where that is unknown (an engine without slots)."""
    tokens: int = Field(default=128, ge=32, le=8192)
    """Prompt length of each request (what leakprobe writes: a gateway's system prompt comes on top)."""
    max_tokens: int = Field(default=64, ge=8, le=1024)
    """Completion tokens per request: as many as a probe-shape control gets, enough to repeat a canary behind
    whatever the model says first (a quote of the instruction line, say)."""


class RequestIdSettings(Strict):
    """Request-ID collisions: sets of concurrent requests of every tenant, each set carrying one client request ID,
    each request asking for its own canary back."""

    audit: bool = True
    """Run the request-ID check in `leakprobe audit`."""
    groups: int = Field(default=3, ge=1, le=64)
    """Sets of concurrent requests, each with a fresh ID of its own."""
    per_tenant: int = Field(default=1, ge=1, le=16)
    """Requests of each tenant in a set."""
    tokens: int = Field(default=128, ge=32, le=8192)
    """Prompt length of each request (what leakprobe writes: a gateway's system prompt comes on top)."""
    max_tokens: int = Field(default=96, ge=8, le=1024)
    """Completion tokens per request: enough to repeat a canary behind whatever the model says first (a model that
    quotes from the top says the instruction line and the request's nonce first: at 64, the reference engine's
    quote often stopped inside the code)."""
    fields: tuple[BodyField, ...] | None = None
    """Body fields that carry the ID besides the `X-Request-Id` and `traceparent` headers.  Null: the engine's own
    (vLLM's `request_id`, SGLang's `rid`; none for an engine that takes none), and every one of those where the
    survey does not know the engine (behind a gateway that hides it); `[]`: the headers alone, for an API that
    refuses a field it does not know."""


class AbortRetrySettings(Strict):
    """Abort and retry: a tenant's long prompt abandoned mid-prefill, the same prefix from another tenant, the
    other tenant's own prompt, then the first tenant's retry."""

    audit: bool = True
    """Run the abort-and-retry check in `leakprobe audit`."""
    tokens: int = Field(default=4_096, ge=64, le=1_048_576)
    """Prompt length of each of its requests: long enough that prefill takes several of the engine's chunks
    (SGLang and vLLM prefill 2,048-8,192 tokens a step); at most what the target serves with an answer's room."""
    hang_up: float = Field(default=0.5, gt=0, lt=1)
    """When to hang up on the abandoned request, as a share of the time to first token that the same tenant's
    prompt of the same length just took (its prefill, about)."""
    max_tokens: int = Field(default=160, ge=8, le=4096)
    """Completion tokens per request: a retry that quotes its document shows stale pages only where its answer
    gets that far (an aborted prefill wrote the start of the prompt, so the stale pages are in its second half)."""


class CounterSettings(Strict):
    """The engine's failure counters (aborts, failed transfers) as evidence: a rise in leakprobe's own windows is a
    `counted_failure` only where it is more than other users' traffic explains, tested against the counters' rate
    in stretches with none of leakprobe's requests out."""

    false_alarm: float = Field(default=0.001, gt=0, lt=0.5)
    """Chance that one check's run against a healthy engine reports a counted failure (Bonferroni over the failure
    counters the engine exposes)."""
    quiet: Duration = 10.0
    """Where a run has seen less than 5 s of background, it reads the counters over a quiet stretch of this long
    (up to three times it, as long as its own windows took) before it decides."""


class TracingSettings(Strict):
    """leakprobe's own traces: every request carries a W3C `traceparent` (a finding names its trace id); with an OTLP
    receiver set, each request is also exported as a client span of that trace, the engine's span its child."""

    otlp_endpoint: Annotated[str, AfterValidator(http_url)] | None = None
    """OTLP/HTTP traces URL (`http://otel-collector:4318/v1/traces`) each request is exported to as a span, in
    batches from a thread of its own (a receiver that is down never holds a request up).  Unset: none exported."""
    service_name: str = Field(default="leakprobe", min_length=1)
    """The spans' `service.name`: what the trace view calls leakprobe."""


class DetectionSettings(Strict):
    semantic: bool = True
    """Plant fact canaries and look for them reworded or translated (loads an embedding model)."""
    model: str = "use-multilingual-v3"
    """The embedding model: `use-multilingual-v3`, or a sentence-transformers model name or local path."""
    threshold: float | None = Field(default=None, gt=0, le=1)
    """Cosine similarity that counts as a paraphrase; null: the model's measured threshold."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where a sentence-transformers model runs (USE always runs on the CPU)."""
    fact_share: float = Field(default=0.25, ge=0, le=1)
    """Share of the canary units in a prompt that carry a fact rather than a token."""


class SentinelSettings(Strict):
    tokens: int = Field(default=128, ge=16, le=8192)
    """Prompt length of each sentinel request."""
    max_tokens: int = Field(default=64, ge=1, le=1024)
    """Completion tokens per sentinel probe (its prime asks for at most 16, as a campaign's does)."""
    retention: Duration = 7 * 86_400.0
    """How long sentinel canaries stay active (campaigns': 30 days)."""


class Links(Strict):
    """Where an on-call engineer goes from an alert: exported as `leakprobe_links_info`, which the alert
    rules read into each page's `dashboard_url` and `status_url`."""

    grafana: Annotated[str, AfterValidator(http_url)] | None = None
    """Base URL of the Grafana that has leakprobe's dashboards (`https://grafana.example.com`)."""
    status: Annotated[str, AfterValidator(http_url)] | None = None
    """This daemon's `/status` as on-call engineers reach it (an ingress, or the port-forward the runbook
    shows); unset: none in the page."""


class DaemonSettings(Strict):
    listen: str = DEFAULT_LISTEN
    """HOST:PORT of the metrics and status server (0.0.0.0 in a container; :0 picks a free port)."""
    schedule: dict[str, DurationOrOff] = Field(default_factory=dict)
    """How often each job runs per target, by job (`{sentinel: 1m, campaign: 6h, idle-slots: off}`); `off` (or
    `false`) never runs it; a job not named keeps its default: `preflight` (the survey) every 5 minutes, each check
    as docs/checks.md lists."""
    jitter: dict[str, Jitter] = Field(default_factory=dict)
    """Random delay added to each run of a job, by job (`{campaign: 36m}`), so replicas and targets do not fire
    in step; `off` (or 0): none; a job not named gets a tenth of its interval."""
    tokens_per_day: int = Field(default=50_000_000, gt=0)
    """Prompt tokens per target per UTC day, all replicas together."""
    job_share: float = Field(default=0.3, gt=0, le=1)
    """The most of `tokens_per_day` one job on its default schedule plans a day: where a job's plan at the
    target's capacity would take more (a boundary campaign on a million-token engine), it runs less often, paced to
    its share, instead of being skipped for budget.  An interval `daemon.schedule` names is kept as it is."""
    sentinel: SentinelSettings = Field(default_factory=SentinelSettings)
    """The sentinel job's prompts."""
    incident_hold: Duration = 3_600.0
    """An incident stays open at least this long after its last finding, and then until every probe that found
    it has re-checked clean (or it is acknowledged)."""
    resolved_notice: Duration = 120.0
    """After an incident closes, its alert keeps firing this long and says why it closed, so that the resolved
    notification (which repeats the alert's last text) says so: longer than two Prometheus evaluation
    intervals."""
    http_reload: bool = False
    """Accept `POST /-/reload` (with the token, when `token_file` is set); off: reload with SIGHUP."""
    token_file: Annotated[Path, BeforeValidator(no_nul)] | None = None
    """File holding a bearer token (16+ characters) that `/status` and `/-/reload` require; `/metrics` and
    the health endpoints stay open."""
    status: Literal["full", "redacted"] = "full"
    """What `/status` shows a request without the token: `full` (refused with 401 where `token_file` is set),
    or `redacted`: no URLs, ledger location, config path, error texts or notes."""
    probe_every: DurationOrOff = 60.0
    """The least time between two on-demand runs on one target through `/probe` (a rollout step's, an on-call
    engineer's); `off`: no `/probe`.  It spends the target's budget: with `token_file` the token is required, and
    without one only this host may call it."""
    links: Links = Field(default_factory=Links)
    """Links put into every page."""
    shutdown_grace: Duration = 30.0
    """On SIGTERM, how long in-flight requests may take to finish."""
    engine_telemetry: bool = True
    """Read the engine's own `/metrics` around each exchange and put the deltas into findings' evidence."""
    replica: str = Field(default_factory=lambda: _replica_name(socket.gethostname()),
                         pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    """This daemon's name among replicas sharing a ledger, in its run ids, so that each canary and finding
    names the replica that minted or saw it; by default the host name (a pod's name)."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        listen_address(value)
        return value


def _replica_name(host: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", host.split(".")[0])[:63].strip("-_.")
    return name or "replica"


def listen_address(value: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT` -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT with a port from 0 to 65535, not {value!r}")
    host = host.removeprefix("[").removesuffix("]") or "0.0.0.0"
    return host, int(port)
