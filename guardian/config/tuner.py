"""``[tuner]``: the live tuner's SLO, service classes, hardware caps and restart windows."""

from __future__ import annotations

import dataclasses
from typing import Literal
from zoneinfo import ZoneInfo

from pydantic import Field, field_validator

from guardian.actions.engine_args import Value
from guardian.config.base import Problem, TimeZone, Section
from guardian.policy.slo import ServiceClass, Slo
from guardian.policy.tuner import TunerParams
from guardian.policy.windows import Window, open_for_restarts


class SloSection(Section):
    """The latency objective the tuner steers by (vLLM's own histograms: gateway queueing is not in them)."""

    metric: Literal["ttft", "e2e", "itl"] = "ttft"  # e2e's buckets start at 0.3 s: a 200 ms e2e target cannot be seen
    target_seconds: float | None = Field(None, gt=0, le=600)  # the P99 to stay under; none: unloaded_factor x the engine's P99 with nothing waiting
    unloaded_factor: float = Field(3.0, ge=1, le=100)  # a derived (or refused) target: this many times that unloaded P99
    band_ratio: float = Field(0.1, ge=0, lt=1)  # no move while P99 is within ±10% of the target


class ClassSection(Section):
    """A service class: one of the gateway's lanes (high, low)."""

    priority: int = Field(ge=-1_000_000, le=1_000_000)  # vLLM's request priority, lower first
    speculation: bool = False  # may run on an engine with speculative decoding
    preemptible: bool = False


class WindowSection(Section):
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


class TunerSection(Section):
    """The tuner: batch (the ceiling of the gateway's cap), speculation and a cap on long prefills. On unless ``enabled = false``.

    On by default because an engine started too small (a ``--max-num-seqs`` below what the
    GPU serves) is the commonest lost capacity, and only the tuner raises it; its objective is
    derived from the engine's own latency, and the GPU's batch cap only bounds its raises.
    """

    enabled: bool = True  # false: the gateway's cap follows the KV pool and nothing restarts for tuning
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
    long_prefill_tokens: int = Field(1024, ge=0, le=1_000_000)  # --long-prefill-token-threshold it sets; 0: never sets it
    blocked_queue_seconds: float = Field(0.5, gt=0, le=3600)
    long_share: float = Field(0.8, gt=0, le=1)

    @field_validator("hardware")
    @classmethod
    def _caps(cls, caps: dict[str, int]) -> dict[str, int]:
        for name, cap in caps.items():
            if not name.strip() or not 1 <= cap <= 65536:
                raise Problem(f"hardware cap {name!r} = {cap}", 'map part of the NVML GPU name to a batch of 1 or more, e.g. "L40S" = 8')
        return caps

    @property
    def params(self) -> TunerParams:
        fields = {f.name for f in dataclasses.fields(TunerParams)} - {"slo", "unloaded_factor"}
        classes = {str(k): ServiceClass(c.priority, c.speculation, c.preemptible) for k, c in self.classes.items()}
        slo = Slo(self.slo.metric, self.slo.target_seconds, self.slo.band_ratio, classes)
        return TunerParams(slo=slo, unloaded_factor=self.slo.unloaded_factor, **{k: getattr(self, k) for k in fields})

    def restarts_open(self, wall: float) -> bool:
        return open_for_restarts(wall, tuple(w.window for w in self.windows), tuple(w.window for w in self.blackouts),
                                 ZoneInfo(self.timezone))  # fmt: skip
