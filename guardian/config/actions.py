"""``[actions]``: the restart budget, drains and the degraded profile L2 applies."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from guardian.actions.engine_args import KV_CACHE_DTYPES, Value
from guardian.actions.restart import RestartTimeouts
from guardian.config.base import Section
from guardian.policy.response import ResponseParams


class DegradedSection(Section):
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


class ActionsSection(Section):
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
