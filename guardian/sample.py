"""The values one poll observes.

Every field that could not be read is ``None``: a failed read must never look
like a healthy zero (0 bytes used) or an exhausted GPU (0 bytes free). The
sources fill these in; analysis and policy only ever read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class MigReading:
    """One MIG slice: memory is per slice, utilisation is not reported by NVML for MIG."""

    index: int
    uuid: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    memory_free_bytes: int | None
    processes: tuple[GpuProcess, ...] | None


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    uuid: str | None = None
    name: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None  # only from v2 memory info
    utilization_gpu_ratio: float | None = None
    utilization_memory_ratio: float | None = None
    power_watts: float | None = None
    energy_joules: float | None = None  # total since driver load
    temperature_celsius: float | None = None
    processes: tuple[GpuProcess, ...] | None = None
    mig: tuple[MigReading, ...] = ()
    error: str | None = None  # why some or all fields are unknown


@dataclass(frozen=True, slots=True)
class NvmlReading:
    """All GPUs of one poll; ``error`` set when NVML itself could not be used."""

    gpus: tuple[GpuReading, ...] = ()
    driver_version: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative Prometheus histogram: ``buckets`` are (upper bound, cumulative count), sorted."""

    buckets: tuple[tuple[float, float], ...]
    count: float | None
    sum: float | None
    created: float | None = None


@dataclass(frozen=True, slots=True)
class CoreReading:
    """One vLLM engine core (the ``engine`` label); data parallel servers have several."""

    core: str
    model_name: str | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # 0..1
    preemptions_total: float | None = None
    prompt_tokens_total: float | None = None
    prefill_seconds_total: float | None = None  # the sum of vLLM's per-request prefill times
    finished_prompt_tokens_total: float | None = None  # the prompt tokens of the same (finished) requests
    generation_tokens_total: float | None = None
    requests_finished_total: float | None = None  # summed over finished_reason
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    spec_drafts_total: float | None = None
    spec_draft_tokens_total: float | None = None
    spec_accepted_tokens_total: float | None = None
    sleeping: bool | None = None
    histograms: Mapping[str, Histogram] = field(default_factory=dict)
    cache_config: Mapping[str, str] = field(default_factory=dict)

    @property
    def block_size(self) -> int | None:
        return _int_or_none(self.cache_config.get("block_size"))

    @property
    def num_gpu_blocks(self) -> int | None:
        return _int_or_none(self.cache_config.get("num_gpu_blocks"))

    @property
    def gpu_memory_utilization(self) -> float | None:
        value = self.cache_config.get("gpu_memory_utilization")
        try:
            return float(value) if value not in (None, "None") else None
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class ProcReading:
    pid: int
    name: str
    alive: bool
    rss_bytes: int | None = None
    cpu_seconds: float | None = None
    start_time: float | None = None  # unix seconds
    cmdline: str | None = None


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One configured vLLM server as seen in one poll."""

    name: str
    up: bool  # /metrics scraped and parsed
    healthy: bool | None  # /health's last verdict (200: True; asked every poll unless /metrics answers and it was 200); None: no answer
    error: str | None = None  # the reason the scrape failed
    error_kind: str | None = None  # short label for metrics: timeout, refused, http_5xx, parse, ...
    stats_disabled: bool = False  # page had no vllm: families (--disable-log-stats)
    cores: tuple[CoreReading, ...] = ()
    processes: tuple[ProcReading, ...] | None = None  # None: not configured or not found
    process_error: str | None = None
    scrape_seconds: float | None = None
    process_alive: bool | None = None  # the engine's main process by its launcher's word; None: no launcher's word
    process_started: float | None = None  # that process's start time (unix seconds): a new one is a new process
    latency_read: bool = True  # the page's latency histograms were read (every few polls: sources/vllm.py)

    @property
    def main_process(self) -> tuple[bool | None, float | None]:
        """(alive, start time) of the engine's main process: its launcher's word, else the oldest live process of its tree."""
        if self.process_alive is not None:
            return self.process_alive, self.process_started
        alive = [p for p in self.processes or () if p.alive]
        if not alive:
            return None, None
        starts = [p.start_time for p in alive if p.start_time is not None]
        return True, min(starts) if starts else None


@dataclass(frozen=True, slots=True)
class GatewayLoad:
    """guardian's own admission gateway in front of one engine, as the poll found it."""

    engine: str
    queued: int
    in_flight: int
    cap: int
    long_in_flight: int = 0  # of in_flight: long prompts (gateway/admission.py's long queue)


@dataclass(frozen=True, slots=True)
class Sample:
    """Everything one poll saw; ``t`` is monotonic seconds, ``wall`` unix seconds."""

    t: float
    wall: float
    nvml: NvmlReading
    engines: tuple[EngineReading, ...]
    gateway: tuple[GatewayLoad, ...] = ()  # empty: no gateway configured

    def gateway_load(self, name: str) -> GatewayLoad | None:
        return next((g for g in self.gateway if g.engine == name), None)

    def engine(self, name: str) -> EngineReading | None:
        return next((e for e in self.engines if e.name == name), None)

    def wall_at(self, t: float) -> float:
        """Unix time of a monotonic time ``t`` of this run (a step's change point), via this sample's two clocks."""
        return self.wall - (self.t - t)


def _int_or_none(value: str | None) -> int | None:
    if value in (None, "None", ""):
        return None
    try:
        return int(float(value))
    except ValueError:
        return None
