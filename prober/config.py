"""The prober's configuration file (YAML): targets, tenants, audit and daemon settings.

API keys never live here: a tenant names the environment variable or secret file that holds its key.
Errors name the offending key in one line (`targets[0].url: field required`).  Precedence, later wins:
the file, then LEAKPROBE_* environment variables, then command-line flags.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from prober.capacity.limits import Capacity, Known
from prober.errors import ConfigError, LedgerError, YAMLFileError
from prober.ledger.location import LedgerLocation
from prober.prompts.shape import Shape, candidates
from prober.targets.api import Api
from prober.targets.credentials import CredentialSource
from prober.targets.transport import TransportPolicy
from prober.types import Severity
from prober.yamlfile import read_yaml

DEFAULT_POLICY = TransportPolicy()  # the transport's defaults are the config's

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
AdapterName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
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


def _no_nul(value: Any) -> Any:
    if "\x00" in str(value):
        raise ValueError("contains a NUL byte")
    return value


def _ledger(value: str) -> str:
    try:
        LedgerLocation.parse(value)
    except LedgerError as exc:
        raise ValueError(str(exc).removeprefix("ledger: ").removeprefix("ledger ")) from None
    return value


def _shape(value: str) -> str:
    return Shape.parse(value).name


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


Duration = Annotated[float, BeforeValidator(parse_duration)]
Interval = Annotated[float | None, BeforeValidator(lambda v: None if v == "off" else parse_duration(v))]  # None: off
SeverityName = Annotated[Severity, BeforeValidator(_severity)]
BodyField = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]  # a JSON key of a request body


class _Strict(BaseModel):
    # A field's docstring is its description: the docs site's configuration reference prints it
    # (docs/hooks/schema.py), and the site's strict build fails on a field without one.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class CapacityHints(_Strict):
    """Numbers the operator knows; they win over introspection."""

    context_length: int | None = Field(default=None, gt=0)
    """Advertised context: the longest prompt the API accepts."""
    pool_tokens: int | None = Field(default=None, gt=0)
    """KV pool in tokens (of the prefill worker where serving is disaggregated)."""
    max_req_input_len: int | None = Field(default=None, gt=0)
    """Longest prompt a correct engine serves (SGLang: min(context - 1, pool - 1) - 5)."""
    page_size: int | None = Field(default=None, gt=0)
    """Tokens per KV page."""
    slots: int | None = Field(default=None, gt=0)
    """Parallel slots that share the pool (llama.cpp `--parallel`)."""
    disaggregated: bool = False
    """Prefill and decode run on separate instances behind this URL (SGLang's workers say so themselves): decode
    reports the KV it received from prefill as cached, so cached tokens on a never-sent prompt are no phantom hit
    there, and that check is off."""

    def capacity(self) -> Capacity:
        def known(value: int | None) -> Known | None:
            return Known(value, "config") if value else None

        return Capacity(context_length=known(self.context_length), pool_tokens=known(self.pool_tokens),
                        max_req_input_len=known(self.max_req_input_len), page_size=known(self.page_size),
                        slots=known(self.slots), disaggregation_mode="disaggregated" if self.disaggregated else None)


class TargetConfig(_Strict):
    name: Name
    """The target's name in reports, metrics and alerts."""
    url: str
    """OpenAI-compatible base URL (`…/v1`) or, for `workers-ai`, the whole `…/ai/run/{model}` URL; no user info."""
    api: Api = Api.CHAT
    """The API the target speaks."""
    model: str | None = None
    """Sent as `model` in every request when set."""
    introspection_url: str | None = None
    """Where `/server_info`, `/metrics` and the like live, if not at the URL's origin (an engine behind a gateway)."""
    capacity: CapacityHints = Field(default_factory=CapacityHints)
    """Capacity numbers that win over introspection."""
    tokenizer: Literal["auto", "endpoint", "usage"] = "auto"
    """How prompt tokens are counted: the engine's tokenize endpoint, calibration from `usage.prompt_tokens`, or
    whichever works (`auto`)."""
    timeout_s: float = Field(default=DEFAULT_POLICY.timeout_s, gt=0)
    """Idle timeout in seconds: no byte for this long ends the request (the first byte may take this long).  Once
    an answer has begun, the rest must arrive within the smaller of this and 30 s, plus `max_tokens` at 10 a
    second; a request in all, retries included, within this plus its prompt at 1,000 tokens a second plus that."""
    deadline_s: float = Field(default=DEFAULT_POLICY.deadline_s, gt=0)
    """The most seconds any request may take, connect to last byte, retries included (its own deadline, derived
    from its size and `timeout_s`, is usually shorter)."""
    retries: int = Field(default=DEFAULT_POLICY.retries, ge=0, le=10)
    """Retries of 429/502/503/504 answers and refused connections (exponential backoff, `Retry-After` honoured)."""
    max_body_bytes: int = Field(default=DEFAULT_POLICY.max_body_bytes, ge=1024)
    """Most bytes read of one answer, counted decoded."""
    verify_tls: bool = DEFAULT_POLICY.verify_tls
    """Verify the target's TLS certificate."""
    breaker: int = Field(default=6, ge=1, le=1_000)
    """Circuit breaker: after this many answers in a row that cannot be observed (no answer, a broken one, a
    refusal where the capacity says the prompt fits), probing this target stops, and the run is incomplete."""
    probe_shapes: tuple[Annotated[str, AfterValidator(_shape)], ...] = ()
    """Probe shapes to try, in order, before the first prompt with canaries: `chat-ask`, `chat-cue`,
    `completions-ask`, `completions-cue` (`workers-ai-…` for Workers AI).  Each tenant sends one short prompt of its
    own canaries in a shape until one brings them back; that shape carries every request after it.  Empty: the
    target's own route asking, then a cue on the completions route, then a cue on its own route."""
    cache_salt: Literal["none", "per-tenant"] = "none"
    """`per-tenant`: each tenant's requests carry a `cache_salt` of its own (vLLM's prefix-cache isolation), as a
    salting gateway would add; the tenants then count as cache-salted."""
    adapters: dict[Name, AdapterName] = Field(default_factory=dict)
    """Canary adapters the target serves, by tenant: the `model` that selects each tenant's LoRA adapter (one built by
    `leakprobe canaries adapter`, served as vLLM serves `--lora-modules`).  The `adapters` check asks each its
    trigger, all at once, and sends one prompt through every adapter in turn; a tenant without one asks the base
    model.  Empty: that check has nothing to do here."""

    @field_validator("url", "introspection_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        return None if value is None else http_url(value)

    @model_validator(mode="after")
    def _adapters(self) -> TargetConfig:
        names = list(self.adapters.values())
        shared = sorted({n for n in names if names.count(n) > 1})
        if shared:
            raise ValueError(f"adapters: {shared[0]!r} is named for two tenants (a canary adapter answers with one "
                             "tenant's canary)")
        if self.adapters and self.api is Api.WORKERS_AI:
            raise ValueError("adapters: a Workers AI target names its model in the URL, not per request")
        return self

    @property
    def shapes(self) -> list[Shape]:
        return candidates(self.api, tuple(Shape.parse(name) for name in self.probe_shapes))

    def policy(self) -> TransportPolicy:
        return TransportPolicy(timeout_s=self.timeout_s, deadline_s=self.deadline_s, retries=self.retries,
                               max_body_bytes=self.max_body_bytes, verify_tls=self.verify_tls)


class TenantConfig(_Strict):
    name: Name
    """The tenant's name in canaries, findings, metrics and alerts."""
    language: Literal["en", "ko"] = "en"
    """The language of its fact canaries (the fact pack they are minted from)."""
    api_key_env: str | None = None
    """Environment variable that holds its API key."""
    api_key_file: Annotated[Path, BeforeValidator(_no_nul)] | None = None
    """File that holds its API key (a mounted secret); give this or `api_key_env`."""
    cache_salted: bool = False
    """Its gateway salts its prefix cache: a cross-tenant cache hit that involves it is reported as HIGH."""

    @model_validator(mode="after")
    def _one_source(self) -> TenantConfig:
        if self.api_key_env and self.api_key_file:
            raise ValueError("give api_key_env or api_key_file, not both")
        return self

    @property
    def credential(self) -> CredentialSource:
        return CredentialSource(env=self.api_key_env, file=self.api_key_file)


class AuditSettings(_Strict):
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
    bisect_budget: int = Field(default=0, ge=0)
    """Tokens bisection of the accept/refuse boundary may spend when the engine exposes no context length (0: never)."""
    deadline: Duration | None = None
    """Total time for the whole audit (e.g. `30m`); what is still running then ends, and the audit is incomplete.
    Unset: only each target's deadline bounds it."""
    target_deadline: Duration | None = None
    """Total time per target: survey, probe-shape choice, campaign and isolation checks.  Unset: 5 minutes for the
    survey, then 2 minutes plus what follows derives — its prompt tokens at 1,000 a second and each request's
    `max_tokens` at 10 a second."""


class TimingSettings(_Strict):
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


class CrosstalkSettings(_Strict):
    """A burst of concurrent short requests from every tenant, each asking for its own canary back."""

    audit: bool = True
    """Run the cross-talk burst in `leakprobe audit`."""
    per_tenant: int = Field(default=4, ge=1, le=64)
    """Concurrent requests per tenant in one burst."""
    max_tokens: int = Field(default=48, ge=8, le=1024)
    """Completion tokens per request (enough to repeat a canary)."""


class AdapterSettings(_Strict):
    """The `adapters` check: each tenant's canary adapter (a target's `adapters:`) asked its trigger, beside the
    others', and one prompt sent through every adapter in turn."""

    audit: bool = True
    """Run the adapters check in `leakprobe audit` (it has nothing to do on a target without `adapters:`)."""
    per_tenant: int = Field(default=3, ge=1, le=64)
    """Concurrent triggers per tenant in the first round."""
    max_tokens: int = Field(default=64, ge=16, le=1024)
    """Completion tokens per request (enough for a canary and what a chat template adds)."""


class MediaSettings(_Strict):
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

class SlotSettings(_Strict):
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


class RequestIdSettings(_Strict):
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
    max_tokens: int = Field(default=64, ge=8, le=1024)
    """Completion tokens per request (enough to repeat a canary behind whatever the model says first)."""
    fields: tuple[BodyField, ...] | None = None
    """Body fields that carry the ID besides the `X-Request-Id` and `traceparent` headers.  Null: the engine's own
    (vLLM's `request_id`, SGLang's `rid`), and none where the survey does not know the engine (an API that does
    not take a field may refuse the request)."""


class AbortRetrySettings(_Strict):
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


class CounterSettings(_Strict):
    """The engine's failure counters (aborts, failed transfers) as evidence: a rise in leakprobe's own windows is a
    `counted_failure` only where it is more than other users' traffic explains, tested against the counters' rate
    in stretches with none of leakprobe's requests out."""

    false_alarm: float = Field(default=0.001, gt=0, lt=0.5)
    """Chance that a run against a healthy engine reports a counted failure (Bonferroni over the counters)."""
    quiet: Duration = 10.0
    """Where a run has seen less than 5 s of background, it reads the counters over a quiet stretch of this long
    (up to three times it, as long as its own windows took) before it decides."""


class DetectionSettings(_Strict):
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


class SentinelSettings(_Strict):
    tokens: int = Field(default=128, ge=16, le=8192)
    """Prompt length of each sentinel request."""
    max_tokens: int = Field(default=64, ge=1, le=1024)
    """Completion tokens per sentinel probe (its prime asks for at most 16, as a campaign's does)."""
    retention: Duration = 7 * 86_400.0
    """How long sentinel canaries stay active (campaigns': 30 days)."""


class Links(_Strict):
    """Where an on-call engineer goes from an alert: exported as `leakprobe_links_info`, which the alert
    rules read into each page's `dashboard_url` and `status_url`."""

    grafana: Annotated[str, AfterValidator(http_url)] | None = None
    """Base URL of the Grafana that has leakprobe's dashboards (`https://grafana.example.com`)."""
    status: Annotated[str, AfterValidator(http_url)] | None = None
    """This daemon's `/status` as on-call engineers reach it (an ingress, or the port-forward the runbook
    shows); unset: none in the page."""


class DaemonSettings(_Strict):
    listen: str = DEFAULT_LISTEN
    """HOST:PORT of the metrics and status server (0.0.0.0 in a container; :0 picks a free port)."""
    schedule: dict[str, Interval] = Field(default_factory=dict)
    """How often each job runs per target, by job (`{sentinel: 1m, campaign: 6h, idle-slots: off}`); a job not
    named keeps its default: `preflight` (the survey) every 5 minutes, each check as docs/checks.md lists."""
    jitter: dict[str, Duration] = Field(default_factory=dict)
    """Random delay added to each run of a job, by job (`{campaign: 36m}`), so replicas and targets do not fire
    in step; a job not named gets a tenth of its interval."""
    tokens_per_day: int = Field(default=50_000_000, gt=0)
    """Prompt tokens per target per UTC day, all replicas together."""
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
    token_file: Annotated[Path, BeforeValidator(_no_nul)] | None = None
    """File holding a bearer token (16+ characters) that `/status` and `/-/reload` require; `/metrics` and
    the health endpoints stay open."""
    status: Literal["full", "redacted"] = "full"
    """What `/status` shows a request without the token: `full` (refused with 401 where `token_file` is set),
    or `redacted`: no URLs, ledger location, config path, error texts or notes."""
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


class ProberConfig(_Strict):
    ledger: Annotated[str, AfterValidator(_ledger)] = "leakprobe.sqlite"
    """Where canaries, findings and incidents are kept: a file path, `sqlite:///absolute/path` or
    `postgresql://user@host:port/db`."""
    targets: list[TargetConfig] = Field(min_length=1)
    """The endpoints to probe (one at least)."""
    tenants: list[TenantConfig] = Field(default_factory=list)
    """The tenants whose keys prime and probe (two at least to audit)."""
    audit: AuditSettings = Field(default_factory=AuditSettings)
    """Settings of `leakprobe audit` (and of the daemon's campaigns)."""
    detection: DetectionSettings = Field(default_factory=DetectionSettings)
    """How answers are checked for canaries."""
    timing: TimingSettings = Field(default_factory=TimingSettings)
    """The timing check of prefix-cache isolation (`cross_tenant_cache_timing`)."""
    crosstalk: CrosstalkSettings = Field(default_factory=CrosstalkSettings)
    """The cross-talk burst: concurrent requests of every tenant, each answer checked for others' canaries."""
    slots: SlotSettings = Field(default_factory=SlotSettings)
    """The idle-slot check: cold prompts of one tenant after another's conversations in every slot."""
    request_ids: RequestIdSettings = Field(default_factory=RequestIdSettings)
    """The request-ID check: concurrent requests of every tenant carrying one client request ID."""
    abort_retry: AbortRetrySettings = Field(default_factory=AbortRetrySettings)
    """The abort-and-retry check: a prompt abandoned mid-prefill, then retried after another tenant's."""
    adapters: AdapterSettings = Field(default_factory=AdapterSettings)
    """The adapters check: each tenant's canary adapter asked its trigger; one prompt through every adapter."""
    media: MediaSettings = Field(default_factory=MediaSettings)
    """The media-cache check: another tenant's image features served for a reused uuid or a colliding image."""
    counters: CounterSettings = Field(default_factory=CounterSettings)
    """How the engine's failure counters are told apart from other users' traffic."""
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    """Settings of `leakprobe daemon`."""

    @property
    def languages(self) -> dict[str, str]:
        """tenant -> the fact pack its canaries are written in"""
        return {t.name: t.language for t in self.tenants}

    @model_validator(mode="after")
    def _unique(self) -> ProberConfig:
        for label, names in (("targets", [t.name for t in self.targets]), ("tenants", [t.name for t in self.tenants])):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{label}: duplicate name {dupes[0]!r}")
        tenants = {t.name for t in self.tenants}
        for target in self.targets if tenants else ():
            strangers = sorted(set(target.adapters) - tenants)
            if strangers:
                raise ValueError(f"targets: {target.name}: adapters names {strangers[0]!r}, not a tenant")
        return self


def parse_config(data: Any, origin: str = "config") -> ProberConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: top level must be a mapping")
    try:
        return ProberConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in first["loc"]).replace(".[", "[")
        message = first["msg"].removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(f"{origin}: {where or 'config'}: {message}{more}") from None


def load_config(path: Path) -> dict[str, Any]:
    """The raw mapping of a YAML config, for callers that overlay flags before validating."""
    try:
        data = read_yaml(path)
    except YAMLFileError as exc:
        raise ConfigError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


ENV_OVERRIDES = {"LEAKPROBE_LEDGER": ("ledger",), "LEAKPROBE_FAIL_ON": ("audit", "fail_on"),
                 "LEAKPROBE_TOKEN_BUDGET": ("audit", "token_budget"), "LEAKPROBE_LISTEN": ("daemon", "listen"),
                 "LEAKPROBE_TOKENS_PER_DAY": ("daemon", "tokens_per_day")}
_TOP_LEVEL_FLAGS = {"ledger": ("ledger",), "listen": ("daemon", "listen"), "semantic": ("detection", "semantic"),
                    "model": ("detection", "model"), "timing": ("timing", "audit"),
                    "crosstalk": ("crosstalk", "audit"), "slots": ("slots", "audit"),
                    "request_ids": ("request_ids", "audit"), "abort_retry": ("abort_retry", "audit"),
                    "media": ("media", "audit")}


def assemble_config(path: Path | None, *, target: str | None = None, target_name: str | None = None,
                    api: str | None = None, probe_shapes: list[str] | None = None,
                    tenants: list[str] | None = None, environ: dict[str, str] | None = None,
                    **flags: Any) -> ProberConfig:
    """File, then LEAKPROBE_* environment variables, then flags: later wins.

    `target` replaces the file's targets with one (`--target URL`); `probe_shapes` replace every target's;
    `tenants` are `NAME=ENVVAR` pairs that replace the file's tenants; `flags` are audit settings, `ledger` or
    `listen` (None = not given)."""
    data = load_config(path) if path else {}
    origin = str(path) if path else "flags"
    for var, where in ENV_OVERRIDES.items():
        if environ and var in environ:
            _put(data, where, environ[var])
    if target:
        data["targets"] = [{"name": target_name or _name_of(target), "url": target, **({"api": api} if api else {})}]
    elif api:
        raise ConfigError("--api needs --target")
    if tenants:
        pairs = []
        for item in tenants:
            name, sep, env = item.partition("=")
            if not sep or not name or not env:
                raise ConfigError(f"--tenant {item!r}: expected NAME=ENVVAR (the variable holding its API key)")
            pairs.append({"name": name, "api_key_env": env})
        data["tenants"] = pairs
    for key, value in flags.items():
        if value is not None:
            value = str(value) if isinstance(value, Path) else value
            _put(data, _TOP_LEVEL_FLAGS.get(key, ("audit", key)), value)
    if "targets" not in data:
        raise ConfigError(f"{origin}: targets: give --target URL or a config file with `targets:`")
    if probe_shapes:
        for entry in data["targets"] if isinstance(data["targets"], list) else []:
            if isinstance(entry, dict):
                entry["probe_shapes"] = list(probe_shapes)
    return parse_config(data, origin)


def _put(data: dict[str, Any], where: tuple[str, ...], value: Any) -> None:
    node = data
    for key in where[:-1]:
        node = node.setdefault(key, {}) if isinstance(node.get(key, {}), dict) else node
    node[where[-1]] = value


def _name_of(url: str) -> str:
    """A target name from its URL's host and port (`http://10.0.0.5:8000/v1` -> `10.0.0.5-8000`)."""
    hostport = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[2]
    return re.sub(r"[^A-Za-z0-9._-]", "-", hostport).strip("-._")[:64] or "target"
