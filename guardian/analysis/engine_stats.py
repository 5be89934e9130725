"""Per-engine signals derived from successive Samples: latency quantiles, rates, restarts.

One ``EngineTracker`` per configured engine keeps the windows; ``update``
takes the engine's reading and the poll time and returns that poll's
``EngineSignals``. Data-parallel cores are summed first (counters and
histogram buckets add up), so an engine's P99 is the P99 of all its requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from guardian.analysis.window import CounterWindow, HistogramWindow, Quantiles
from guardian.sample import CoreReading, EngineReading, Histogram, ProcReading
from guardian.sources.vllm_page import LATENCY_HISTOGRAMS

_COUNTERS = (
    "prompt_tokens_total",
    "prefill_seconds_total",
    "finished_prompt_tokens_total",
    "generation_tokens_total",
    "requests_finished_total",
    "preemptions_total",
    "spec_draft_tokens_total",
    "spec_accepted_tokens_total",
)
_ADDED = _COUNTERS + ("running", "waiting")  # what a data-parallel engine's cores add up to
_RATES = ("prompt_tokens_total", "generation_tokens_total", "requests_finished_total", "preemptions_total")

# windows keep this much beyond their length: enough for the point at the
# window's start to exist, little enough that finding it is a step or two
HORIZON_SLACK_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class EngineSignals:
    name: str
    up: bool
    healthy: bool | None
    telemetry_lost: bool
    failures_in_a_row: int
    kv_cache_usage: float | None = None  # the fullest core
    running: float | None = None
    waiting: float | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    latency: dict[str, Quantiles | None] = field(default_factory=dict)  # e2e, ttft, itl, queue
    prompt_tokens_per_second: float | None = None
    prefill_seconds_per_token: float | None = None  # vLLM's prefill time per prompt token, over the window (see update)
    generation_tokens_per_second: float | None = None
    requests_per_second: float | None = None
    preemptions_per_second: float | None = None
    spec_acceptance_ratio: float | None = None
    restarts_total: int = 0
    processes_alive: int | None = None
    rss_bytes: int | None = None
    gpu_memory_bytes: int | None = None  # NVML memory of the engine's processes, all GPUs
    cpu_seconds: float | None = None  # CPU time of the live processes of the tree


    @property
    def kv_pool_tokens(self) -> int | None:
        """The KV pool's size in tokens (blocks x block size), as the engine reports it."""
        return self.num_gpu_blocks * self.block_size if self.num_gpu_blocks and self.block_size else None

    def brief(self) -> str:
        """The engine in a few words, for systemd's STATUS= line and the demo: kv, batch, queue, P99 TTFT."""
        if not self.up:
            return "down"
        kv = "?" if self.kv_cache_usage is None else f"{self.kv_cache_usage * 100:.0f}%"
        ttft = self.latency.get("ttft")
        return (
            f"kv {kv} run {count_text(self.running)} wait {count_text(self.waiting)} "
            f"p99 ttft {seconds_text(ttft.p99 if ttft else None)}"
        )


def count_text(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def seconds_text(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value * 1000:.0f}ms" if value < 10 else f"{value:.1f}s"


class EngineTracker:
    def __init__(self, name: str, window_seconds: float, lost_after_polls: int) -> None:
        self.name = name
        self.window = window_seconds
        self.lost_after = lost_after_polls
        horizon = window_seconds + HORIZON_SLACK_SECONDS
        self._counters = {key: CounterWindow(horizon) for key in _COUNTERS}
        self._histograms = {key: HistogramWindow(horizon) for key in LATENCY_HISTOGRAMS}
        self._failures = 0
        self._root_start: float | None = None
        self._latency: dict[str, Quantiles | None] = {}  # as of the last reading that carried the histograms
        self.restarts = 0

    def update(self, t: float, reading: EngineReading, gpu_memory_by_pid: Mapping[int, int]) -> EngineSignals:
        self._failures = 0 if reading.up and not reading.stats_disabled else self._failures + 1
        self._track_restart(reading)
        procs = reading.processes
        alive = [p for p in procs if p.alive] if procs is not None else None
        base = dict(
            name=self.name,
            up=reading.up,
            healthy=reading.healthy,
            telemetry_lost=self._failures >= self.lost_after,
            failures_in_a_row=self._failures,
            restarts_total=self.restarts,
            processes_alive=len(alive) if alive is not None else None,
            rss_bytes=sum(p.rss_bytes for p in alive if p.rss_bytes is not None) if alive else None,
            gpu_memory_bytes=_gpu_memory(alive, gpu_memory_by_pid),
            cpu_seconds=_sum(p.cpu_seconds for p in alive) if alive else None,
        )
        if not reading.up or not reading.cores:
            return EngineSignals(**base)  # type: ignore[arg-type]
        core = reading.cores[0] if len(reading.cores) == 1 else _combined(reading.cores)
        for key, window in self._counters.items():
            window.add(t, getattr(core, key))
        if reading.latency_read:
            for key, family in LATENCY_HISTOGRAMS.items():
                self._histograms[key].add(t, core.histograms.get(family))
            self._latency = {key: w.quantiles(t, self.window) for key, w in self._histograms.items()}
        rate = {key: self._counters[key].rate(t, self.window) for key in _RATES}
        # per prompt token of the requests that finished, what vLLM timed from their scheduling to their first
        # token (both sums read on the same polls): prefix-cache hits cost nothing, and steps shared with others
        # count whole, so under load it reads high (the gateway's long lane errs shorter)
        prefilled = self._counters["prefill_seconds_total"].increase(t, self.window)
        prompted = self._counters["finished_prompt_tokens_total"].increase(t, self.window)
        drafted = self._counters["spec_draft_tokens_total"].increase(t, self.window)
        accepted = self._counters["spec_accepted_tokens_total"].increase(t, self.window)
        return EngineSignals(
            **base,  # type: ignore[arg-type]
            kv_cache_usage=core.kv_cache_usage,
            running=core.running,
            waiting=core.waiting,
            block_size=core.block_size,
            num_gpu_blocks=core.num_gpu_blocks,
            latency=self._latency,
            prompt_tokens_per_second=rate["prompt_tokens_total"],
            prefill_seconds_per_token=prefilled / prompted if prompted and prefilled is not None else None,
            generation_tokens_per_second=rate["generation_tokens_total"],
            requests_per_second=rate["requests_finished_total"],
            preemptions_per_second=rate["preemptions_total"],
            spec_acceptance_ratio=accepted / drafted if drafted and accepted is not None else None,
        )

    def _track_restart(self, reading: EngineReading) -> None:
        """A new start time of the engine's main process (launcher's, or the tree's oldest) is a restart; pid reuse cannot fake it."""
        alive, root = reading.main_process
        if not alive or root is None:
            return
        if self._root_start is not None and root > self._root_start + 1.0:
            self.restarts += 1
        self._root_start = root


def _gpu_memory(alive: list[ProcReading] | None, by_pid: Mapping[int, int]) -> int | None:
    if not alive or not by_pid:
        return None
    used = [by_pid[p.pid] for p in alive if p.pid in by_pid]
    return sum(used) if used else None


def _combined(cores: Sequence[CoreReading]) -> CoreReading:
    """A data-parallel engine's cores as one: counts and histograms added, the fullest KV cache, the first cache layout."""
    summed = {key: _sum(getattr(c, key) for c in cores) for key in _ADDED}
    merged = {family: h for family in LATENCY_HISTOGRAMS.values() if (h := _merge([c.histograms.get(family) for c in cores]))}
    layout = next((c.cache_config for c in cores if c.cache_config.get("num_gpu_blocks")), cores[0].cache_config)
    return CoreReading(core="all", kv_cache_usage=_max(c.kv_cache_usage for c in cores), histograms=merged, cache_config=layout,
                       **summed)  # type: ignore[arg-type]  # fmt: skip


def _merge(hists: list[Histogram | None]) -> Histogram | None:
    present = [h for h in hists if h is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    bounds = [b for b, _ in present[0].buckets]
    if any([b for b, _ in h.buckets] != bounds for h in present[1:]):
        return present[0]  # layouts differ (mixed versions): keep the first core's view
    counts = [sum(h.buckets[i][1] for h in present) for i in range(len(bounds))]
    return Histogram(
        buckets=tuple(zip(bounds, counts)),
        count=_sum(h.count for h in present),
        sum=_sum(h.sum for h in present),
    )


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _max(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
