"""guardian's TOML config: validated models and error messages a person can act on.

Every refusal names the file, the key (``engines[0].url``), what is wrong and
how to fix it, because the person reading it is usually an SRE editing a file
on a host at night, not someone who can read a pydantic traceback.
"""

from __future__ import annotations

import dataclasses
import json
import difflib
import ipaddress
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from guardian.actions.engine_args import KV_CACHE_DTYPES, Value, block_size_ok, valid_block_sizes, validate
from guardian.actions.restart import RestartTimeouts
from guardian.analysis.leak import LeakParams
from guardian.gateway import routes
from guardian.listener import ListenerLimits
from guardian.policy.breaker import BreakerParams
from guardian.policy.profiles import BUILTIN_PRESETS, preset_args
from guardian.policy.response import ResponseParams
from guardian.policy.slo import ServiceClass, Slo
from guardian.policy.tuner import TunerParams
from guardian.policy.windows import Window, open_for_restarts
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

EXIT_CONFIG = 2

Attention = Literal["flash_attn", "triton", "flashinfer"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Problem(ValueError):
    """A validator's refusal with the fix attached (pydantic keeps the message)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(f"{message}\x00{fix}")


class Problems(ValueError):
    """Every problem one validator found, so ``check-config`` lists them all in one pass, not the first."""

    def __init__(self, found: list[tuple[str, str]]) -> None:
        super().__init__("\x01".join(f"{message}\x00{fix}" for message, fix in found))


def _refuse(found: list[tuple[str, str]]) -> None:
    if found:
        raise Problems(found)


def _time_zone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise Problem(f"unknown time zone {value!r}", 'use an IANA name, e.g. "Europe/Berlin" or "UTC"') from None
    return value


TimeZone = Annotated[str, AfterValidator(_time_zone)]


class GuardianSection(_Model):
    poll_interval_seconds: float = Field(1.0, gt=0, le=3600)
    listen: str = "127.0.0.1:9400"
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    telemetry_lost_after_polls: int = Field(3, ge=1, le=1000)
    nvml_timeout_seconds: float = Field(2.0, gt=0, le=60)
    scrape_timeout_seconds: float | None = Field(None, gt=0, le=60)
    latency_window_seconds: float = Field(60.0, gt=0, le=86400)
    # the breaker's level, restart history and engine-argument overlay; systemd's StateDirectory= sets $STATE_DIRECTORY
    state_dir: Path = Field(default_factory=lambda: Path(os.environ.get("STATE_DIRECTORY", "/var/lib/vllm-guardian")))
    # bearer token for guardian's HTTP API (breaker force/clear); without one the API is off.
    # Under systemd, LoadCredential=api-token:PATH is read from $CREDENTIALS_DIRECTORY instead.
    api_token_file: Path | None = None
    max_connections: int = Field(256, ge=1, le=100_000)  # on guardian.listen; one more is answered 503
    header_timeout_seconds: float = Field(10.0, gt=0, le=600)  # a new connection's request headers, complete by then
    idle_timeout_seconds: float = Field(30.0, gt=0, le=3600)  # a kept-alive connection with no request

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        parse_listen(value)
        return value

    @model_validator(mode="after")
    def _timings(self) -> GuardianSection:
        if self.scrape_timeout_seconds is not None and self.scrape_timeout_seconds >= self.poll_interval_seconds:
            raise Problem(
                f"scrape_timeout_seconds ({self.scrape_timeout_seconds}) is not below "
                f"poll_interval_seconds ({self.poll_interval_seconds}): a slow engine would make every poll overrun",
                "lower scrape_timeout_seconds or raise poll_interval_seconds",
            )
        if self.latency_window_seconds < 2 * self.poll_interval_seconds:
            raise Problem(
                f"latency_window_seconds ({self.latency_window_seconds}) holds fewer than two polls",
                f"set latency_window_seconds to at least {2 * self.poll_interval_seconds:g}",
            )
        return self

    @property
    def listener_limits(self) -> ListenerLimits:
        return ListenerLimits(self.max_connections, self.header_timeout_seconds, self.idle_timeout_seconds)

    @property
    def scrape_timeout(self) -> float:
        return self.scrape_timeout_seconds or 0.8 * self.poll_interval_seconds

    def read_api_token(self) -> str | None:
        """The API token: systemd's credential first, then ``api_token_file``; None: the API is off."""
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        candidates = [Path(creds) / "api-token"] if creds else []
        candidates += [self.api_token_file] if self.api_token_file else []
        for path in candidates:
            if path.exists() or path == self.api_token_file:
                token = path.read_text().strip()
                if token:
                    return token  # an empty credential is the unit's fallback for a missing file: try the next
        return None


class ProcessSection(_Model):
    """How to find an engine's processes; exactly one way."""

    systemd_unit: str | None = None
    pid_file: Path | None = None
    match: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ProcessSection:
        given = [k for k in ("systemd_unit", "pid_file", "match") if getattr(self, k) is not None]
        if len(given) != 1:
            raise Problem(
                f"give exactly one of systemd_unit, pid_file, match (got {', '.join(given) or 'none'})",
                'e.g. systemd_unit = "vllm.service" or match = "vllm serve"',
            )
        if self.pid_file is not None and not self.pid_file.is_absolute():
            raise Problem(f"pid_file {str(self.pid_file)!r} is not an absolute path", 'use e.g. "/run/vllm/vllm.pid"')
        if self.match is not None and not self.match.strip():
            raise Problem("match is empty and would match every process", 'use e.g. match = "vllm serve"')
        return self


class RestartSection(_Model):
    """How guardian restarts an engine with new arguments (actions/launcher.py)."""

    launcher: Literal["systemd", "child"]
    unit: str | None = None  # systemd: the vLLM unit
    env_file: Path | None = None  # systemd: the EnvironmentFile its ExecStart reads $VLLM_ARGS from
    command: list[str] | None = None  # child: the program and its fixed arguments, e.g. ["vllm", "serve", "MODEL"]
    args: dict[str, Value] = {}  # the base engine arguments, flag names without dashes
    attention_backend: Attention = "flash_attn"

    @model_validator(mode="after")
    def _complete(self) -> RestartSection:
        if self.launcher == "systemd":
            if not self.unit or self.env_file is None:
                raise Problem("the systemd launcher needs unit and env_file",
                              'e.g. unit = "vllm.service", env_file = "/etc/vllm/args.env" (its ExecStart uses $VLLM_ARGS)')  # fmt: skip
            if not self.env_file.is_absolute():
                raise Problem(f"env_file {str(self.env_file)!r} is not an absolute path", 'use e.g. "/etc/vllm/args.env"')
        if self.launcher == "child" and not self.command:
            raise Problem("the child launcher needs command", 'e.g. command = ["/opt/vllm/bin/vllm", "serve", "MODEL"]')
        problems = validate(self.args, self.attention_backend)
        if problems:
            raise Problem("args: " + "; ".join(problems), "use arguments vLLM accepts (see vllm serve --help)")
        return self


class EngineSection(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    url: str
    api_key: SecretStr | None = None
    api_key_file: Path | None = None
    dev_mode: bool = False  # the server runs with VLLM_SERVER_DEV_MODE=1 (admin endpoints)
    process: ProcessSection | None = None
    restart: RestartSection | None = None
    preset: str | None = None  # an engine profile under its arguments: high_throughput, low_latency, mixed or [presets.NAME]

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        shown = repr(masked_url(value))
        if parts.username is not None or parts.password is not None:  # it would show in /status and every log line
            raise Problem(f"{shown} carries credentials (user:password@)",
                          "remove them; put vLLM's API key in api_key_file, which guardian sends as a bearer token")  # fmt: skip
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Problem(f"{shown} is not an http(s) URL", 'use the server\'s base URL, e.g. "http://127.0.0.1:8000"')
        try:
            _ = parts.port  # urlsplit checks the port only when asked for it
        except ValueError:
            raise Problem(f"{shown} has an invalid port", 'use e.g. "http://127.0.0.1:8000"') from None
        if parts.query or parts.fragment:
            raise Problem(f"{shown} has a query or fragment", "give the base URL only; guardian adds /metrics and /health")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _key(self) -> EngineSection:
        if self.api_key is not None and self.api_key_file is not None:
            raise Problem("both api_key and api_key_file are set", "keep one (api_key_file keeps the key out of this file)")
        return self

    def read_api_key(self) -> str | None:
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_file is not None:
            return self.api_key_file.read_text().strip()
        return None

    @property
    def is_loopback(self) -> bool:
        return _loopback_host(urlsplit(self.url).hostname or "")


class GpuSection(_Model):
    select: Literal["all"] | list[int | str] = "all"

    @field_validator("select")
    @classmethod
    def _select(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise Problem("select is an empty list: no GPU would be watched", 'use "all" or list indices/UUIDs')
            for item in value:
                check_gpu_id(item)
        return value


class PresetSection(_Model):
    """An engine profile (vLLM start-up arguments), checked against vLLM's own rules."""

    max_num_seqs: int = Field(ge=1, le=65536)
    block_size: int = 16
    enable_chunked_prefill: bool = True
    swap_space_gb: float | None = Field(None, ge=0)
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"] = "auto"
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    attention_backend: Attention = "flash_attn"

    @model_validator(mode="after")
    def _block_size(self) -> PresetSection:
        if not block_size_ok(self.block_size, self.attention_backend):
            lower = 16
            while lower * 2 <= self.block_size and (self.attention_backend != "flashinfer" or lower < 32):
                lower *= 2
            raise Problem(
                f"block_size = {self.block_size} is refused by vLLM's {self.attention_backend} attention backend, "
                f"which needs {valid_block_sizes(self.attention_backend)}",
                f"use block_size = {lower} or {lower * 2}",
            )
        return self


# The leak detector's and the breaker's parameters are their own dataclasses (the
# pure core knows no pydantic); as config sections they are validated like the others.
LeakParams.__pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[attr-defined]
BreakerParams.__pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[attr-defined]


class DegradedSection(_Model):
    """The degraded engine profile L2 applies by a drained restart when its pressure lasts."""

    kv_cache_dtype: Literal[KV_CACHE_DTYPES] | None = "fp8"  # type: ignore[valid-type]
    max_num_seqs: int | None = Field(None, ge=1, le=65536)
    speculation: bool = False  # false: --speculative-config is dropped

    def layer(self) -> dict[str, Value | None]:
        layer: dict[str, Value | None] = {}
        if self.kv_cache_dtype is not None:
            layer["kv-cache-dtype"] = self.kv_cache_dtype
        if self.max_num_seqs is not None:
            layer["max-num-seqs"] = self.max_num_seqs
        if not self.speculation:
            layer["speculative-config"] = None
        return layer


class ActionsSection(_Model):
    dry_run: bool = False  # decide and log every action, carry none out (also: guardian run --dry-run)
    restart_budget: int = Field(3, ge=0, le=100)  # restarts per window; past it L3 is held and on-call paged
    restart_budget_window_seconds: float = Field(3600.0, gt=0)
    degrade_after_seconds: float = Field(600.0, gt=0)
    restore_after_seconds: float = Field(1800.0, gt=0)
    min_gpu_memory_utilization: float = Field(0.5, gt=0, lt=1)
    drain_timeout_seconds: float = Field(120.0, gt=0, le=3600)
    start_timeout_seconds: float = Field(900.0, gt=0, le=7200)
    degraded: DegradedSection = DegradedSection()

    @property
    def params(self) -> ResponseParams:
        return ResponseParams(
            restart_budget=self.restart_budget,
            restart_budget_window_seconds=self.restart_budget_window_seconds,
            degrade_after_seconds=self.degrade_after_seconds,
            restore_after_seconds=self.restore_after_seconds,
            min_gpu_memory_utilization=self.min_gpu_memory_utilization,
        )

    @property
    def timeouts(self) -> RestartTimeouts:
        return RestartTimeouts(drain_seconds=self.drain_timeout_seconds, start_seconds=self.start_timeout_seconds)


class SloSection(_Model):
    """The latency objective the tuner steers by (vLLM's own histograms: gateway queueing is not in them)."""

    metric: Literal["ttft", "e2e", "itl"] = "ttft"  # e2e's buckets start at 0.3 s: a 200 ms e2e target cannot be seen
    target_seconds: float = Field(0.2, gt=0, le=600)  # the P99 to stay under
    band_ratio: float = Field(0.1, ge=0, lt=1)  # no move while P99 is within ±10% of the target


class ClassSection(_Model):
    """A service class: one of the gateway's lanes (high, low)."""

    priority: int = Field(ge=-1_000_000, le=1_000_000)  # vLLM's request priority, lower first
    speculation: bool = False  # may run on an engine with speculative decoding
    preemptible: bool = False


class WindowSection(_Model):
    cron: str  # APScheduler crontab: minute hour day month day-of-week
    duration_minutes: float = Field(gt=0, le=60 * 24 * 31)

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        try:
            Window(value, 1).trigger(ZoneInfo("UTC"))
        except ValueError as exc:
            raise Problem(f"{value!r} is not a crontab expression ({exc})",
                          'use five fields: minute hour day month day-of-week, e.g. "0 2 * * *" for 02:00 daily') from None  # fmt: skip
        return value

    @property
    def window(self) -> Window:
        return Window(self.cron, self.duration_minutes)


class TunerSection(_Model):
    """The tuner: batch (the gateway's cap) and speculation, against the SLO. Present: on."""

    engines: list[str] = []  # the engines to tune; empty: all
    slo: SloSection = SloSection()
    classes: dict[Literal["high", "low"], ClassSection] = {
        "high": ClassSection(priority=0, speculation=False, preemptible=False),
        "low": ClassSection(priority=10, speculation=True, preemptible=True),
    }
    hardware: dict[str, int] = {}  # NVML name substring -> batch cap, tried before the defaults (A100 12, 4090 4, H100/H200 24)
    speculative_config: dict[str, Value] | None = None  # what speculation on means, e.g. {method = "ngram", num_speculative_tokens = 3}
    windows: list[WindowSection] = []  # restarts for tuning only inside these; none: any time
    blackouts: list[WindowSection] = []  # never inside these (the month-end batch)
    timezone: TimeZone = "UTC"  # of the windows
    window_seconds: float = Field(60.0, gt=0, le=3600)
    min_samples: int = Field(6, ge=1, le=10_000)
    cooldown_seconds: float = Field(120.0, ge=0, le=86400)
    up_window_seconds: float = Field(15.0, gt=0, le=3600)
    up_min_samples: int = Field(3, ge=1, le=10_000)
    up_cooldown_seconds: float = Field(30.0, ge=0, le=86400)
    step_ratio: float = Field(0.25, gt=0, lt=1)
    up_step_ratio: float = Field(0.5, gt=0, le=4)
    min_batch: int = Field(1, ge=1, le=65536)
    raise_below_utilization: float = Field(0.6, gt=0, le=1)
    kv_spare_below: float = Field(0.9, gt=0, le=1)
    headroom_ratio: float = Field(0.5, gt=0, lt=1)
    pinned_seconds: float = Field(300.0, ge=0, le=86400)
    speculation_after_seconds: float = Field(600.0, ge=0, le=86400)
    speculation_max_batch: int = Field(4, ge=1, le=65536)
    restarts_per_day: int = Field(3, ge=0, le=100)
    improve_ratio: float = Field(0.1, ge=0, lt=1)
    blocked_seconds: float = Field(900.0, ge=0, le=86400)
    preemption_rate_limit: float = Field(0.05, ge=0)

    @field_validator("hardware")
    @classmethod
    def _caps(cls, caps: dict[str, int]) -> dict[str, int]:
        for name, cap in caps.items():
            if not name.strip() or not 1 <= cap <= 65536:
                raise Problem(f"hardware cap {name!r} = {cap}", 'map part of the NVML GPU name to a batch of 1 or more, e.g. "L40S" = 8')
        return caps

    @property
    def params(self) -> TunerParams:
        fields = {f.name for f in dataclasses.fields(TunerParams)} - {"slo"}
        classes = {str(k): ServiceClass(c.priority, c.speculation, c.preemptible) for k, c in self.classes.items()}
        slo = Slo(self.slo.metric, self.slo.target_seconds, self.slo.band_ratio, classes)
        return TunerParams(slo=slo, **{k: getattr(self, k) for k in fields})

    def restarts_open(self, wall: float) -> bool:
        return open_for_restarts(wall, tuple(w.window for w in self.windows), tuple(w.window for w in self.blackouts),
                                 ZoneInfo(self.timezone))  # fmt: skip


class TuneSection(_Model):
    """``guardian tune``, the offline search: its request set and grid (flags override the grid)."""

    prompt_tokens_median: int = Field(512, ge=1, le=1_000_000)
    prompt_tokens_sigma: float = Field(0.6, ge=0, le=5)  # lognormal spread
    prompt_tokens_max: int = Field(4096, ge=1, le=1_000_000)
    output_tokens_median: int = Field(128, ge=1, le=1_000_000)
    output_tokens_sigma: float = Field(0.5, ge=0, le=5)
    output_tokens_max: int = Field(512, ge=1, le=1_000_000)
    requests: int = Field(200, ge=1, le=100_000)  # the standardised set, reused round-robin
    seed: int = 0
    rates: list[float] = [1.0, 2.0, 4.0, 8.0, 16.0]  # requests per second, climbed until the SLO is missed
    seconds_per_rate: float = Field(30.0, gt=0, le=3600)
    block_sizes: list[int] = [16, 32]
    max_num_seqs: list[int] = [4, 8, 16, 24]
    speculation: list[bool] = [False]  # add true to try [tuner] speculative_config

    @field_validator("rates")
    @classmethod
    def _rates(cls, rates: list[float]) -> list[float]:
        if not rates or min(rates) <= 0:
            raise Problem("rates must be a non-empty list of requests per second above 0", "e.g. rates = [1, 2, 4, 8]")
        return sorted(rates)


class ContactSection(_Model):
    name: str = Field(min_length=1, max_length=64)
    number: str = Field(pattern=r"^\+[1-9][0-9]{6,14}$")  # E.164


class SmsSection(_Model):
    """Twilio. The auth token is never written here: $TWILIO_AUTH_TOKEN or LoadCredential=twilio-auth-token."""

    account_sid: str = Field(pattern=r"^AC[0-9a-fA-F]{32}$")
    from_number: str | None = Field(None, pattern=r"^\+[1-9][0-9]{6,14}$")
    messaging_service_sid: str | None = Field(None, pattern=r"^MG[0-9a-fA-F]{32}$")
    status_callback: str | None = None
    timeout_seconds: float = Field(10.0, gt=0, le=120)
    max_segments: int = Field(3, ge=1, le=10)
    api_url: str = "https://api.twilio.com"  # tests and egress proxies; plain http only to loopback

    @model_validator(mode="after")
    def _sender(self) -> SmsSection:
        if (self.from_number is None) == (self.messaging_service_sid is None):
            raise Problem("give exactly one of from_number and messaging_service_sid",
                          'e.g. from_number = "+15017122661" (a Twilio number of yours)')  # fmt: skip
        parts = urlsplit(self.api_url)
        if parts.scheme != "https" and not (parts.scheme == "http" and _loopback_host(parts.hostname or "")):
            raise Problem(f"api_url {self.api_url!r} would send the auth token unencrypted", "use https://")
        return self


class WebhookSection(_Model):
    url: str
    token_file: Path | None = None  # sent as a bearer token
    timeout_seconds: float = Field(10.0, gt=0, le=120)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if urlsplit(value).scheme not in ("http", "https"):
            raise Problem(f"{masked_url(value)!r} is not an http(s) URL", 'e.g. "https://chat.example.com/hooks/oncall"')
        return value


class NotifySection(_Model):
    channels: list[Literal["sms", "webhook"]] = []  # every message is also logged; these deliver it
    oncall: list[ContactSection] = []  # in escalation order: the first is told first
    group_wait_seconds: float = Field(10.0, ge=0, le=3600)
    repeat_warning_seconds: float = Field(4 * 3600.0, gt=0)
    repeat_page_seconds: float = Field(1800.0, gt=0)
    escalate_after_seconds: float = Field(900.0, gt=0)
    storm_limit_per_hour: int = Field(10, ge=1, le=1000)
    timezone: TimeZone = "UTC"  # of the quiet hours
    quiet_hours: dict[Literal["info", "warning"], tuple[int, int]] = {}  # severity -> [from hour, to hour]; pages never
    page_valid_seconds: float = Field(3600.0, gt=0)
    warning_valid_seconds: float = Field(4 * 3600.0, gt=0)
    sms: SmsSection | None = None
    webhook: WebhookSection | None = None

    @field_validator("quiet_hours")
    @classmethod
    def _hours(cls, value: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        for severity, (start, end) in value.items():
            if not (0 <= start <= 23 and 0 <= end <= 23) or start == end:
                raise Problem(f"quiet_hours.{severity} = [{start}, {end}] is not two different hours 0-23",
                              "e.g. warning = [22, 7] (from 22:00 to 07:00)")  # fmt: skip
        return value

    @model_validator(mode="after")
    def _channels(self) -> NotifySection:
        found = []
        if "sms" in self.channels and self.sms is None:
            found.append(('channels has "sms" but there is no [notify.sms]', "add [notify.sms] with account_sid and from_number"))
        if "webhook" in self.channels and self.webhook is None:
            found.append(('channels has "webhook" but there is no [notify.webhook]', "add [notify.webhook] with url"))
        if self.channels and not self.oncall:
            found.append(("channels are set but [[notify.oncall]] names nobody", 'add [[notify.oncall]] name = "…" number = "+…"'))
        _refuse(found)
        return self

    @property
    def alert_params(self) -> Any:
        from zoneinfo import ZoneInfo

        from guardian.notify.alerts import AlertParams

        return AlertParams(
            group_wait_seconds=self.group_wait_seconds, repeat_warning_seconds=self.repeat_warning_seconds,
            repeat_page_seconds=self.repeat_page_seconds, escalate_after_seconds=self.escalate_after_seconds,
            storm_limit_per_hour=self.storm_limit_per_hour, quiet_hours={str(k): v for k, v in self.quiet_hours.items()}, zone=ZoneInfo(self.timezone),
        )  # fmt: skip


class BucketSection(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    max_tokens: int = Field(ge=1, le=10_000_000)  # estimated prompt tokens, inclusive
    engines: list[str] = []  # the upstream pool; empty: every engine
    preemptible: bool = False  # low priority by nature


DEFAULT_BUCKETS = [
    BucketSection(name="short", max_tokens=4096),
    BucketSection(name="long", max_tokens=32768),
    BucketSection(name="very-long", max_tokens=128000, preemptible=True),
]


class GatewaySection(_Model):
    """The admission gateway: clients send their OpenAI requests here instead of to vLLM."""

    listen: str = "127.0.0.1:9401"
    buckets: list[BucketSection] = DEFAULT_BUCKETS
    chars_per_token: float = Field(4.0, gt=0, le=64)  # calibrate per model: prompt characters per token
    long_context_tokens: int = Field(32768, ge=1)  # at breaker L1, prompts estimated above this get 503
    concurrency: int = Field(64, ge=1, le=100_000)  # requests in flight per engine (the effective batch)
    queue_size: int = Field(256, ge=0, le=1_000_000)  # waiting per engine; past it 429
    queue_deadline_seconds: float = Field(30.0, gt=0, le=3600)  # waiting longer: 429 with Retry-After
    restart_hold_seconds: float = Field(300.0, ge=0, le=3600)  # requests wait out a restart expected to end within this; else 503
    priority_header: str = "x-guardian-priority"  # high or low
    high_priority_keys_file: Path | None = None  # API keys (one a line) whose requests are high priority
    inject_priority: bool = False  # set vLLM's "priority" field (needs --scheduling-policy priority)
    high_priority_engines: list[str] = []  # a dedicated pool for the high lane (its own GPU or MIG slice)
    extra_paths: list[str] = []  # proxied too (any method), beyond the OpenAI inference paths; never vLLM's admin paths
    max_body_bytes: int | None = Field(None, ge=1024, le=1024**3)  # unset: 16 bytes per token of the largest bucket, 2 MiB at least
    max_connections: int = Field(4096, ge=1, le=1_000_000)  # clients' connections; one more is answered 503
    header_timeout_seconds: float = Field(10.0, gt=0, le=600)
    idle_timeout_seconds: float = Field(75.0, gt=0, le=3600)

    @property
    def listener_limits(self) -> ListenerLimits:
        return ListenerLimits(self.max_connections, self.header_timeout_seconds, self.idle_timeout_seconds)

    @field_validator("extra_paths")
    @classmethod
    def _paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith("/") or "{" in path or "*" in path:
                raise Problem(f"{path!r} is not a literal path", 'name each path whole, e.g. "/v1/embeddings"')
            if routes.admin(path):
                raise Problem(f"{path!r} is one of vLLM's admin endpoints: the gateway never proxies those (they are "
                              "unauthenticated: pause, sleep, reset …)", "remove it; guardian calls them itself on loopback")  # fmt: skip
        return paths

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        parse_listen(value)
        return value

    @field_validator("buckets")
    @classmethod
    def _ordered(cls, buckets: list[BucketSection]) -> list[BucketSection]:
        if not buckets:
            raise Problem("no buckets: every request would be refused", "remove the key to get the three default buckets")
        for a, b in zip(buckets, buckets[1:]):
            if b.max_tokens <= a.max_tokens:
                raise Problem(f"bucket {b.name!r} (max_tokens {b.max_tokens}) does not come after {a.name!r} "
                              f"({a.max_tokens})", "list buckets from the shortest to the longest")  # fmt: skip
        return buckets


class FragmentationSection(_Model):
    # share of the engine's memory that is KV pool, when vLLM does not report kv_cache_memory_bytes
    kv_pool_share: float = Field(0.7, gt=0, lt=1)


class Config(_Model):
    guardian: GuardianSection = GuardianSection()
    gpus: GpuSection = GpuSection()
    engines: list[EngineSection] = []
    presets: dict[str, PresetSection] = {}
    breaker: BreakerParams = BreakerParams()
    actions: ActionsSection = ActionsSection()
    notify: NotifySection = NotifySection()
    gateway: GatewaySection | None = None
    tuner: TunerSection | None = None
    tune: TuneSection = TuneSection()
    leak: LeakParams = LeakParams()
    fragmentation: FragmentationSection = FragmentationSection()

    @field_validator("breaker")
    @classmethod
    def _breaker(cls, params: BreakerParams) -> BreakerParams:
        _positive("breaker", params)
        found = [(f"breaker.{f.name} = {getattr(params, f.name)} is not below 1", "ratios are fractions: 0.35 is 35%")
                 for f in dataclasses.fields(params) if f.name.endswith("_ratio") and getattr(params, f.name) >= 1]  # fmt: skip
        pairs = [
            ("l1_exit_fragmentation_ratio", "l1_enter_fragmentation_ratio"),
            ("l2_exit_kv_usage_ratio", "l2_enter_kv_usage_ratio"),
            ("l3_calm_preemptions_per_second", "l3_storm_preemptions_per_second"),
        ]
        for leave, enter in pairs:
            if getattr(params, leave) >= getattr(params, enter):
                found.append((
                    f"{leave} ({getattr(params, leave)}) is not below {enter} ({getattr(params, enter)}): "
                    "the level would flap on every poll",
                    f"set {leave} below {getattr(params, enter)}, e.g. {round(getattr(params, enter) * 0.85, 2)}",
                ))  # fmt: skip
        if params.l3_exit_free_ratio <= params.l3_free_reserve_ratio:
            found.append((
                f"l3_exit_free_ratio ({params.l3_exit_free_ratio}) is not above l3_free_reserve_ratio "
                f"({params.l3_free_reserve_ratio}): L3 would be left as soon as it is entered",
                f"set l3_exit_free_ratio above {params.l3_free_reserve_ratio}, e.g. {params.l3_free_reserve_ratio + 0.05:.2f}",
            ))  # fmt: skip
        _refuse(found)
        return params

    @field_validator("leak")
    @classmethod
    def _leak(cls, params: LeakParams) -> LeakParams:
        _positive("leak", params)
        if params.min_step_ratio >= params.leak_rise_ratio:
            raise Problem(
                f"leak.min_step_ratio ({params.min_step_ratio}) is not below leak.leak_rise_ratio "
                f"({params.leak_rise_ratio})",
                "the smallest step must be smaller than the rise that makes a leak",
            )
        return params

    @model_validator(mode="after")
    def _gateway_pools(self) -> Config:
        if self.gateway is None:
            return self
        if not self.engines:
            raise Problem("[gateway] has no engine to send requests to", "add [[engines]]")
        names = {e.name for e in self.engines}
        pools = [(f"gateway bucket {b.name!r}", b.engines) for b in self.gateway.buckets]
        found = [(f"{where} names engines that are not configured: {', '.join(unknown)}",
                  f"use names of [[engines]]: {', '.join(sorted(names))}")
                 for where, engines in pools + [("gateway.high_priority_engines", self.gateway.high_priority_engines)]
                 if (unknown := [e for e in engines if e not in names])]  # fmt: skip
        _refuse(found)
        return self

    @model_validator(mode="after")
    def _presets_and_tuner(self) -> Config:
        known = sorted(set(BUILTIN_PRESETS) | set(self.presets))
        found = [(f"engines[{i}].preset {engine.preset!r} is not a preset", f"use one of {', '.join(known)}")
                 for i, engine in enumerate(self.engines) if engine.preset is not None and engine.preset not in known]  # fmt: skip
        if self.tuner is not None:
            names = {e.name for e in self.engines}
            unknown = [e for e in self.tuner.engines if e not in names]
            if unknown:
                found.append((f"tuner.engines names engines that are not configured: {', '.join(unknown)}",
                              f"use names of [[engines]]: {', '.join(sorted(names))}"))  # fmt: skip
        _refuse(found)
        return self

    def preset(self, name: str) -> PresetSection:
        return self.presets[name] if name in self.presets else PresetSection(**BUILTIN_PRESETS[name])

    def base_args(self, engine: EngineSection) -> dict[str, Value]:
        """What the engine starts with: its preset, then its own restart arguments over it."""
        layer = preset_args(self.preset(engine.preset)) if engine.preset else {}
        return {**layer, **(engine.restart.args if engine.restart else {})}

    def tuned(self, name: str) -> bool:
        return self.tuner is not None and (not self.tuner.engines or name in self.tuner.engines)

    @field_validator("engines")
    @classmethod
    def _unique(cls, engines: list[EngineSection]) -> list[EngineSection]:
        seen: set[str] = set()
        for engine in engines:
            if engine.name in seen:
                raise Problem(f"engine name {engine.name!r} is used twice", "give every [[engines]] its own name")
            seen.add(engine.name)
        return engines

    def secret_files(self) -> list[tuple[str, Path]]:
        """The files that hold secrets, by config key: check-config wants them present and private."""
        files = [("guardian.api_token_file", self.guardian.api_token_file)]
        files += [(f"engines[{i}].api_key_file", e.api_key_file) for i, e in enumerate(self.engines)]
        files.append(("notify.webhook.token_file", self.notify.webhook.token_file if self.notify.webhook else None))
        files.append(("gateway.high_priority_keys_file", self.gateway.high_priority_keys_file if self.gateway else None))
        return [(key, path) for key, path in files if path is not None]

    def warnings(self) -> list[str]:
        """Legal but risky settings, printed by check-config and logged at start."""
        notes = []
        for i, engine in enumerate(self.engines):
            if engine.dev_mode and not engine.is_loopback:
                notes.append(
                    f"engines[{i}].url: {engine.url} is not a loopback address but dev_mode = true: vLLM's "
                    "dev endpoints (/pause, /reset_prefix_cache, …) are unauthenticated; bind vLLM to 127.0.0.1"
                )
            if engine.restart is not None and not engine.dev_mode:
                notes.append(
                    f"engines[{i}].restart: dev_mode is off, so a drained restart cannot pause vLLM; it waits for "
                    "the engine to go idle on its own (or the drain deadline) while new requests keep arriving"
                )
        for name, preset in self.presets.items():
            if preset.swap_space_gb:
                notes.append(
                    f"presets.{name}.swap_space_gb: --swap-space no longer exists in vLLM's V1 engine; "
                    "this setting is ignored"
                )
        if "sms" in self.notify.channels:
            from guardian.notify.sms import read_token

            if read_token() is None:
                notes.append(
                    "notify.sms: no Twilio auth token in $TWILIO_AUTH_TOKEN or the twilio-auth-token credential: "
                    "SMS will wait in the outbox until one is configured"
                )
        host, _ = parse_listen(self.guardian.listen)
        if not _loopback_host(host):
            notes.append(f"guardian.listen: {self.guardian.listen} is reachable from other hosts")
        return notes


def _positive(section: str, params: object) -> None:
    for f in dataclasses.fields(params):  # type: ignore[arg-type]
        value = getattr(params, f.name)
        if value <= 0:
            raise Problem(f"{section}.{f.name} = {value} must be above 0", f"use the default, {f.default}")


def check_gpu_id(item: int | str) -> None:
    if isinstance(item, int):
        if item < 0:
            raise Problem(f"GPU index {item} is negative", "use indices as nvidia-smi shows them: 0, 1, …")
    elif item.startswith("MIG-"):
        raise Problem(f"{item!r} is a MIG slice", "select its parent GPU; its MIG slices are reported under it")
    elif not item.startswith("GPU-"):
        raise Problem(f"{item!r} is neither a GPU index nor a UUID", 'use 0 or "GPU-8f6c…" (nvidia-smi -L)')


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise Problem(f"{value!r} is not HOST:PORT", 'use e.g. "127.0.0.1:9400"')
    return host, int(port)


def _loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ConfigIssue:
    key: str
    message: str
    fix: str


class ConfigError(Exception):
    """The config was refused; ``str()`` is the full report."""

    def __init__(self, path: str, issues: list[ConfigIssue]) -> None:
        self.path = path
        self.issues = issues
        lines = [f"{path}: {len(issues)} problem{'s' if len(issues) != 1 else ''}"]
        for issue in issues:
            where = f"{path}: {issue.key}" if issue.key else path
            lines.append(f"{where}: {issue.message}")
            if issue.fix:
                lines.append(f"    fix: {issue.fix}")
        super().__init__("\n".join(lines))


def load(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), [ConfigIssue("", "file not found", "check the path given to --config")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [ConfigIssue("", f"cannot read the file: {exc}", "check its permissions and encoding")]) from None
    return loads(text, str(path))


def loads(text: str, path: str = "<config>") -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, [ConfigIssue("", f"not valid TOML: {exc}", "fix the syntax at the line shown")]) from None
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(path, [issue for err in exc.errors() for issue in _issues(err)]) from None


def _key(loc: tuple[Any, ...]) -> str:
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            key += f".{part}" if key else str(part)
    return key


def _field_types(model: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(model):
        return {f.name: f.type for f in dataclasses.fields(model)}
    return {name: f.annotation for name, f in getattr(model, "model_fields", {}).items()}


def _model_at(loc: tuple[Any, ...]) -> Any:
    """The model (pydantic or dataclass) that holds the key at ``loc``'s end; None when it cannot be told."""
    model: Any = Config
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        annotation = _field_types(model).get(part)
        model = _model_in(annotation) if annotation is not None else None
        if model is None:
            return None
    return model


def _type_fix(loc: tuple[Any, ...]) -> str:
    """A fix that names the key's default, which has the right type (the package ships no example config)."""
    model, name = _model_at(loc), str(loc[-1]) if loc else ""
    default: Any = dataclasses.MISSING
    if model is not None and dataclasses.is_dataclass(model):
        default = next((f.default for f in dataclasses.fields(model) if f.name == name), dataclasses.MISSING)
    elif model is not None and name in getattr(model, "model_fields", {}):
        field = model.model_fields[name]
        default = dataclasses.MISSING if field.is_required() else field.default
    if default is dataclasses.MISSING or default is None or isinstance(default, (dict, list, BaseModel)):
        return f"write {name} with the type the README's configuration table gives"
    shown = json.dumps(str(default)) if isinstance(default, (str, Path)) else repr(default).lower() if isinstance(default, bool) else repr(default)
    return f"write it like its default: {name} = {shown}"


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _issues(err: Any) -> list[ConfigIssue]:
    """One pydantic error as config issues: a validator's ``Problems`` are several."""
    message = str(err["msg"])
    if err["type"] == "value_error" and "\x00" in message:
        key = _key(_location(err))
        return [ConfigIssue(key, *text.split("\x00", 1)) for text in message.removeprefix("Value error, ").split("\x01")]
    return [_issue(err)]


def _location(err: Any) -> tuple[Any, ...]:
    # drop pydantic's union-member tags ("int", "list[…]") from the location
    return tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in ("int", "str", "float"))))


def _issue(err: Any) -> ConfigIssue:
    loc = _location(err)
    key = _key(loc)
    kind = err["type"]
    message = str(err["msg"])
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        holder = _model_at(loc)
        known = list(_field_types(holder)) if holder is not None else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        fix = f"did you mean {close[0]!r}?" if close else ("known keys: " + ", ".join(known) if known else "remove it")
        return ConfigIssue(key, "unknown key", fix)
    if kind == "missing":
        return ConfigIssue(key, "required key is missing", f"add {loc[-1]} = …")
    value = err.get("input")
    shown = "" if isinstance(value, (dict, list)) else f" (got {_masked(str(loc[-1]) if loc else '', value)})"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return ConfigIssue(key, f"wrong type{shown}: {message.lower()}", _type_fix(loc))
    if kind == "string_pattern_mismatch":
        return ConfigIssue(key, f"invalid value{shown}", PATTERN_FIXES.get(str(loc[-1]), PATTERN_FIXES["name"]))
    return ConfigIssue(key, f"{message}{shown}", _range_fix(kind, err.get("ctx") or {}))


# keys whose values are or may be secrets (or personal: phone numbers): an error never echoes them whole
SECRET_KEYS = ("token", "key", "secret", "password", "sid", "number", "url", "credential")


def _masked(key: str, value: Any) -> str:
    if isinstance(value, str) and any(word in key.lower() for word in SECRET_KEYS):
        if "url" in key.lower():
            return repr(masked_url(value))
        return f"{value[:2]!r}… ({len(value)} characters, the rest not shown)" if len(value) > 2 else "(not shown)"
    return repr(value)


def masked_url(url: str) -> str:
    """scheme://host:port/… with no credentials, path or query: tokens often live in all three (webhook URLs)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unparsable URL, not shown)"
    rest = "/…" if parts.path.strip("/") or parts.query else ""
    return f"{parts.scheme}://{'***@' if parts.username or parts.password else ''}{host}{port}{rest}"


PATTERN_FIXES = {
    "name": "use letters, digits, '.', '_' or '-' (at most 64)",
    "number": "use E.164: '+', the country code and the number, no spaces, e.g. +4915112345678",
    "from_number": "use E.164: '+', the country code and the number, no spaces, e.g. +15017122661",
    "account_sid": "use the Account SID from the Twilio console: AC and 32 hex digits",
    "messaging_service_sid": "use the Messaging Service SID: MG and 32 hex digits",
}


def _range_fix(kind: str, ctx: dict[str, Any]) -> str:
    bounds = {
        "greater_than": "greater than {gt}",
        "greater_than_equal": "at least {ge}",
        "less_than": "less than {lt}",
        "less_than_equal": "at most {le}",
    }
    if kind == "literal_error":
        return f"use one of {ctx.get('expected')}"
    template = bounds.get(kind)
    return f"use a value {template.format(**ctx)}" if template else "see the example config in systemd/guardian.toml"
