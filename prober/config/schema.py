"""The prober's configuration file (YAML): targets, tenants, audit and daemon settings.

API keys never live here: a tenant names the environment variable or secret file that holds its key.
Errors name the offending key in one line (`targets[0].url: field required`).  Precedence, later wins:
the file, then LEAKPROBE_* environment variables, then command-line flags.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from prober.capacity.limits import Capacity, Known
from prober.config.sections import (
    AbortRetrySettings,
    AdapterSettings,
    AuditSettings,
    CounterSettings,
    CrosstalkSettings,
    DaemonSettings,
    DetectionSettings,
    IdleSlotSettings,
    MediaSettings,
    RequestIdSettings,
    Strict,
    TimingSettings,
    TracingSettings,
    http_url,
    no_nul,
)
from prober.domain.errors import ConfigError, LedgerError, YAMLFileError
from prober.ledger.location import LedgerLocation
from prober.prompts.shape import Shape, candidates
from prober.system.yamlfile import read_yaml
from prober.targets.api import Api
from prober.targets.credentials import CredentialSource
from prober.targets.transport import TransportPolicy

DEFAULT_POLICY = TransportPolicy()  # the transport's defaults are the config's

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
AdapterName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
HttpUrl = Annotated[str, AfterValidator(http_url)]
EndUser = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[!-~]+$")]  # fits a header as it is


def _ledger(value: str) -> str:
    try:
        LedgerLocation.parse(value)
    except LedgerError as exc:
        raise ValueError(str(exc).removeprefix("ledger: ").removeprefix("ledger ")) from None
    return value


class CapacityHints(Strict):
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


class TargetConfig(Strict):
    name: Name
    """The target's name in reports, metrics and alerts."""
    url: HttpUrl
    """OpenAI-compatible base URL (`…/v1`) or, for `workers-ai`, the whole `…/ai/run/{model}` URL; no user info."""
    api: Api = Api.CHAT
    """The API it speaks: `chat` (`/chat/completions`), `completions`, `responses` (`/responses`) or `workers-ai`."""
    model: str | None = None
    """Sent as `model` in every request when set."""
    introspection_url: HttpUrl | None = None
    """Where `/server_info`, `/metrics` and the like live, if not at the URL's origin (an engine behind a gateway)."""
    capacity: CapacityHints = Field(default_factory=CapacityHints)
    """Capacity numbers that win over introspection."""
    tokenizer: Literal["auto", "endpoint", "usage"] = "auto"
    """How prompt tokens are counted: the engine's tokenize endpoint, calibration from `usage.prompt_tokens`, `auto`."""
    timeout_s: float = Field(default=DEFAULT_POLICY.timeout_s, gt=0)
    """Idle timeout in seconds: no byte for this long ends the request (the first byte may take this long).  Once
    an answer has begun, the rest must arrive within the smaller of this and 30 s, plus `max_tokens` at 10 a
    second; a request in all, retries included, within this plus its prompt at 1,000 tokens a second plus that."""
    deadline_s: float = Field(default=DEFAULT_POLICY.deadline_s, gt=0)
    """The most seconds any request may take, connect to last byte, retries included (its own deadline, derived
    from its size and `timeout_s`, is usually shorter)."""
    retries: int = Field(default=DEFAULT_POLICY.retries, ge=0, le=10)
    """Retries of 429/502/503/504 answers and refused connections (exponential backoff, `Retry-After` honoured)."""
    pause_max_s: float = Field(default=DEFAULT_POLICY.retry_after_max_s, gt=0, le=86_400)
    """The longest pause the target's rate limit may ask for (`Retry-After`, a spent `x-ratelimit-*`): a longer one
    ends that request as `rate_limited` instead of stalling the run (a hosted API's daily cap)."""
    max_body_bytes: int = Field(default=DEFAULT_POLICY.max_body_bytes, ge=1024)
    """Most bytes read of one answer, counted decoded."""
    verify_tls: bool = DEFAULT_POLICY.verify_tls
    """Verify the target's TLS certificate."""
    breaker: int = Field(default=6, ge=1, le=1_000)
    """Circuit breaker: after this many answers in a row that cannot be observed (no answer, a broken one, a
    refusal where the capacity says the prompt fits), probing this target stops, and the run is incomplete."""
    probe_shapes: tuple[Annotated[str, AfterValidator(lambda name: Shape.parse(name).name)], ...] = ()
    """Probe shapes to try, in order, before the first prompt with canaries: `chat-ask`, `chat-cue`, `completions-ask`,
    `completions-cue`, `responses-ask`, `responses-cue` (`workers-ai-…` for Workers AI).  Each tenant sends one short
    prompt of its own canaries in a shape until one brings them back; that shape carries every request after it.  Empty:
    the target's own route asking, then a cue on the completions route, then a cue on its own route."""
    price_per_mtok: float | None = Field(default=None, ge=0)
    """What the target bills per million prompt tokens, in any currency: plans and reports estimate each check's price
    from the tokens a correct engine serves (it refuses an over-limit prompt before prefill, usually unbilled)."""
    cache_salt: Literal["none", "per-tenant"] = "none"
    """`per-tenant`: each tenant's requests carry a `cache_salt` of its own (vLLM's prefix-cache isolation), as a
    salting gateway would add; the tenants then count as cache-salted."""
    lower_tier: bool | None = None
    """A second prefix-cache tier (HiCache, CPU offload, a KV connector) for the prefix-cache check to evict its first
    tier to: unset, where the engine's usage or metrics show one; `true`, always (in the budget); `false`, never."""
    adapters: dict[Name, AdapterName] = Field(default_factory=dict)
    """Canary adapters the target serves, by tenant: the `model` that selects each tenant's LoRA adapter (one built by
    `leakprobe canaries adapter`, served as vLLM serves `--lora-modules`).  The `adapters` check asks each its
    trigger, all at once, and sends one prompt through every adapter in turn; a tenant without one asks the base
    model.  Empty: that check has nothing to do here."""
    end_user_header: str | None = Field(default=None, max_length=128, pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
    """A header that carries a tenant's `end_user` on every request with its key (LiteLLM reads
    `x-litellm-end-user-id`); unset: the `user` field alone."""
    prompt_embeds: str | None = None
    """The input-embedding table the prompt-embeds check sends prompts through as `prompt_embeds` (vLLM's
    `--enable-prompt-embeds`): `reference` (the reference engine's), or the served model's folder.  Unset: moot."""
    end_user_field: bool = True
    """Send a tenant's `end_user` as the OpenAI `user` field of its generation requests; `false`: in `end_user_header`
    alone, as an application that names its end users by header only (LiteLLM keys its response cache on `user`)."""

    @model_validator(mode="after")
    def _adapters(self) -> TargetConfig:
        names = list(self.adapters.values())
        shared = sorted({n for n in names if names.count(n) > 1})
        if shared:
            raise ValueError(f"adapters: {shared[0]!r} is named for two tenants (a canary adapter answers with one "
                             "tenant's canary)")
        if self.adapters and self.api is Api.WORKERS_AI:
            raise ValueError("adapters: a Workers AI target names its model in the URL, not per request")
        if not (self.end_user_field or self.end_user_header):
            raise ValueError("end_user_field: false needs an end_user_header, or no end user is sent")
        return self

    @property
    def shapes(self) -> list[Shape]:
        return candidates(self.api, tuple(Shape.parse(name) for name in self.probe_shapes))

    def policy(self) -> TransportPolicy:
        return TransportPolicy(timeout_s=self.timeout_s, deadline_s=self.deadline_s, retries=self.retries,
                               retry_after_max_s=self.pause_max_s, max_body_bytes=self.max_body_bytes,
                               verify_tls=self.verify_tls, end_user_header=self.end_user_header,
                               end_user_field=self.end_user_field)


class TenantConfig(Strict):
    name: Name
    """The tenant's name in canaries, findings, metrics and alerts."""
    language: Literal["en", "ko"] = "en"
    """The language of its fact canaries (the fact pack they are minted from)."""
    api_key_env: str | None = None
    """Environment variable that holds its API key."""
    api_key_file: Annotated[Path, BeforeValidator(no_nul)] | None = None
    """File that holds its API key (a mounted secret); give this or `api_key_env`."""
    cache_salted: bool = False
    """Its gateway salts its prefix cache: a cross-tenant cache hit that involves it is reported as HIGH."""
    end_user: EndUser | None = None
    """The end user it is behind its key (printable ASCII, no spaces), sent as the OpenAI `user` field of every
    generation request and in the target's `end_user_header` (each target's `end_user_field` says whether the field
    is sent): tenants that share one key are told apart by it."""

    @model_validator(mode="after")
    def _one_source(self) -> TenantConfig:
        if self.api_key_env and self.api_key_file:
            raise ValueError("give api_key_env or api_key_file, not both")
        if self.end_user and not (self.api_key_env or self.api_key_file):
            raise ValueError("end_user is sent beside a key: give api_key_env or api_key_file")
        return self

    @property
    def credential(self) -> CredentialSource:
        return CredentialSource(env=self.api_key_env, file=self.api_key_file, end_user=self.end_user)


log = logging.getLogger("leakprobe.config")
RENAMED_SECTIONS = {"slots": "idle-slots", "request_ids": "request-ids", "abort_retry": "abort-retry",
                    "media": "media-cache"}  # old key -> the check's name


M = TypeVar("M", bound=BaseModel)
Sections = Mapping[str, type[BaseModel]]  # a check's name -> the model of its own section (prober/checks `settings`)


class ProberConfig(Strict):
    """The whole file.  The sections above the checks' own are fields here; a check that brings its settings
    (`Check.settings`) is keyed by its name, validated by its model where the caller passes the registry's
    `sections`, and read with `section`.  A key that is neither is refused."""

    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True)
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
    idle_slots: IdleSlotSettings = Field(default_factory=IdleSlotSettings, alias="idle-slots")
    """The idle-slot check: cold prompts of one tenant after another's conversations in every slot."""
    request_ids: RequestIdSettings = Field(default_factory=RequestIdSettings, alias="request-ids")
    """The request-ID check: concurrent requests of every tenant carrying one client request ID."""
    abort_retry: AbortRetrySettings = Field(default_factory=AbortRetrySettings, alias="abort-retry")
    """The abort-and-retry check: a prompt abandoned mid-prefill, then retried after another tenant's."""
    adapters: AdapterSettings = Field(default_factory=AdapterSettings)
    """The adapters check: each tenant's canary adapter asked its trigger; one prompt through every adapter."""
    media_cache: MediaSettings = Field(default_factory=MediaSettings, alias="media-cache")
    """The media-cache check: another tenant's image features served for a reused uuid or a colliding image."""
    counters: CounterSettings = Field(default_factory=CounterSettings)
    """How the engine's failure counters are told apart from other users' traffic."""
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    """leakprobe's own spans, exported over OTLP beside the engine's."""
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    """Settings of `leakprobe daemon`."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """A check's section is keyed by the check's name; the keys it had before still load, for one release."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old, new in RENAMED_SECTIONS.items():
            if old in data:
                log.warning("config: `%s:` is deprecated; write `%s:` (the check's name)", old, new)
                section, given = data.pop(old), data.get(new)
                both = isinstance(section, dict) and isinstance(given, dict)
                data[new] = {**section, **given} if both else section if given is None else given
        return data

    @model_validator(mode="after")
    def _sections(self, info: ValidationInfo) -> ProberConfig:
        sections: Sections = (info.context or {}).get("sections", {})
        extra = self.model_extra or {}
        for key, value in extra.items():
            model = sections.get(key)
            if model is None:
                raise ValueError(f"{key}: not a setting of leakprobe, nor a check's")
            try:
                extra[key] = model.model_validate(value)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in (key, *first["loc"]))
                raise ValueError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None
        return self

    def section(self, name: str, model: type[M]) -> M:
        """A check's own section (`name`: the check's), or its defaults where the file gives none."""
        given = (self.model_extra or {}).get(name)
        return given if isinstance(given, model) else model()

    @property
    def languages(self) -> dict[str, str]:
        """tenant -> the fact pack its canaries are written in"""
        return {t.name: t.language for t in self.tenants}

    @model_validator(mode="after")
    def _unique(self) -> ProberConfig:
        for label, names in (("targets", [t.name for t in self.targets]), ("tenants", [t.name for t in self.tenants])):
            if dupes := sorted({n for n in names if names.count(n) > 1}):
                raise ValueError(f"{label}: duplicate name {dupes[0]!r}")
        tenants = {t.name for t in self.tenants}
        for target in self.targets if tenants else ():
            if strangers := sorted(set(target.adapters) - tenants):
                raise ValueError(f"targets: {target.name}: adapters names {strangers[0]!r}, not a tenant")
        return self


def parse_config(data: Any, origin: str = "config", sections: Sections | None = None) -> ProberConfig:
    """`sections`: the checks' own (`Registry.sections`); a file that keys one no check brings is refused."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: top level must be a mapping")
    try:
        return ProberConfig.model_validate(data, context={"sections": sections or {}})
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
SWITCHED_SECTIONS = ("timing", "crosstalk", *RENAMED_SECTIONS)  # the per-check switches of earlier releases
_TOP_LEVEL_FLAGS = {"ledger": ("ledger",), "listen": ("daemon", "listen"), "semantic": ("detection", "semantic"),
                    "model": ("detection", "model"),
                    **{flag: (RENAMED_SECTIONS.get(flag, flag), "audit") for flag in SWITCHED_SECTIONS}}


def assemble_config(path: Path | None, *, target: str | None = None, target_name: str | None = None,
                    api: str | None = None, probe_shapes: list[str] | None = None,
                    tenants: list[str] | None = None, environ: dict[str, str] | None = None,
                    sections: Sections | None = None, **flags: Any) -> ProberConfig:
    """File, then LEAKPROBE_* environment variables, then flags: later wins.

    `target` replaces the file's targets with one (`--target URL`); `probe_shapes` replace every target's;
    `tenants` are `NAME=ENVVAR` (or `NAME=ENVVAR@END_USER`) pairs that replace the file's tenants; `sections`: the
    checks' own (as `parse_config`); `flags` are audit settings, `ledger` or `listen` (None = not given)."""
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
            env, at, end_user = env.partition("@")  # no variable's name holds an @; an end user's may
            if not sep or not name or not env or (at and not end_user):
                raise ConfigError(f"--tenant {item!r}: expected NAME=ENVVAR (the variable holding its API key), or "
                                  "NAME=ENVVAR@END_USER (an end user behind that key)")
            pairs.append({"name": name, "api_key_env": env, **({"end_user": end_user} if at else {})})
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
    return parse_config(data, origin, sections)


def _put(data: dict[str, Any], where: tuple[str, ...], value: Any) -> None:
    node = data
    for key in where[:-1]:
        node = node.setdefault(key, {}) if isinstance(node.get(key, {}), dict) else node
    node[where[-1]] = value


def _name_of(url: str) -> str:
    """A target name from its URL's host and port (`http://10.0.0.5:8000/v1` -> `10.0.0.5-8000`)."""
    hostport = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[2]
    return re.sub(r"[^A-Za-z0-9._-]", "-", hostport).strip("-._")[:64] or "target"
