"""Leak detectors on every memory series of a host, and each engine's fragmentation, per poll.

Series, named as they are labelled in metrics and logs:
- ``gpu/<index>/used``: NVML device memory (what nvidia-smi shows);
- ``engine/<name>/gpu``: NVML memory of the engine's processes, all its GPUs
  (the overhang of this series is the engine's overhang);
- ``engine/<name>/rss``: host RSS of the engine's process tree.

Pure: readings and signals in, reports out; restarts of an engine (from its
process tree) start its series over with a load, and the engine turning healthy
ends it.
"""

from __future__ import annotations

from dataclasses import dataclass

from guardian.analysis.engine_stats import EngineSignals
from guardian.analysis.fragmentation import Fragmentation, fragmentation, kv_internal_fragmentation
from guardian.analysis.leak import LeakDetector
from guardian.analysis.leak_rule import LeakParams, LeakReport
from guardian.sample import EngineReading, Sample


@dataclass(frozen=True)
class MemoryReport:
    leaks: dict[str, LeakReport]  # by series
    fragmentation: dict[str, Fragmentation]  # by engine
    placement: dict[str, EnginePlacement]  # by engine: where it lives and what it may hold


@dataclass(frozen=True)
class EnginePlacement:
    gpus: tuple[int, ...]  # the GPUs its processes hold memory on
    capacity_bytes: float  # their memory together
    budget_bytes: float  # vLLM's share of it: gpu_memory_utilization x capacity


class MemoryWatch:
    def __init__(self, params: LeakParams, kv_pool_share: float, host_memory_bytes: float | None) -> None:
        self.params = params
        self.kv_pool_share = kv_pool_share
        self.host_memory = host_memory_bytes
        self._detectors: dict[str, LeakDetector] = {}
        self._restarts: dict[str, int] = {}
        self._held_at_warmup: dict[str, float] = {}

    def update(self, sample: Sample, engines: dict[str, EngineSignals]) -> MemoryReport:
        t = sample.t
        leaks: dict[str, LeakReport] = {}
        totals = {g.index: g.memory_total_bytes for g in sample.nvml.gpus}
        for gpu in sample.nvml.gpus:
            if gpu.memory_total_bytes:
                series = f"gpu/{gpu.index}/used"
                det = self._detector(series, gpu.memory_total_bytes, gpu.memory_total_bytes)
                leaks[series] = det.update(t, gpu.memory_used_bytes)
        frags: dict[str, Fragmentation] = {}
        placement: dict[str, EnginePlacement] = {}
        for reading in sample.engines:
            sig = engines.get(reading.name)
            if sig is None:
                continue
            restarted = sig.restarts_total > self._restarts.get(reading.name, sig.restarts_total)
            self._restarts[reading.name] = sig.restarts_total
            pids = {p.pid for p in reading.processes or () if p.alive}
            gpus_of_engine = {g.index for g in sample.nvml.gpus for p in g.processes or () if p.pid in pids}
            capacity = sum(totals[i] or 0 for i in gpus_of_engine) or None
            gpu_series = f"engine/{reading.name}/gpu"
            if capacity:
                placement[reading.name] = EnginePlacement(
                    tuple(sorted(gpus_of_engine)), capacity, self._budget(reading, capacity)
                )
            if sig.gpu_memory_bytes is not None and capacity:
                budget = placement[reading.name].budget_bytes
                det = self._detector(gpu_series, budget, capacity)
                self._lifecycle(det, t, restarted, sig)
                report = leaks[gpu_series] = det.update(t, sig.gpu_memory_bytes)
                if report.warming_up or gpu_series not in self._held_at_warmup:
                    self._held_at_warmup[gpu_series] = float(sig.gpu_memory_bytes)
            if sig.rss_bytes is not None and self.host_memory:
                rss_series = f"engine/{reading.name}/rss"
                det = self._detector(rss_series, self.host_memory, self.host_memory)
                self._lifecycle(det, t, restarted, sig)
                leaks[rss_series] = det.update(t, sig.rss_bytes)
            frags[reading.name] = self._fragmentation(reading, sig, leaks.get(gpu_series), gpu_series)
        return MemoryReport(leaks, frags, placement)

    @staticmethod
    def _lifecycle(det: LeakDetector, t: float, restarted: bool, sig: EngineSignals) -> None:
        """What the engine says of itself beats what its memory suggests: a restart starts a
        load, and a healthy engine has finished loading (vLLM answers /health once its KV
        pool is allocated and its CUDA graphs captured)."""
        if restarted:
            det.restart(t)
        elif sig.healthy:
            det.ready(t)

    def _detector(self, series: str, budget: float, capacity: float) -> LeakDetector:
        det = self._detectors.get(series)
        if det is None:
            det = self._detectors[series] = LeakDetector(budget, capacity, self.params)
        det.budget, det.capacity = budget, capacity
        return det

    def _budget(self, reading: EngineReading, capacity: float) -> float:
        """vLLM's own budget: gpu_memory_utilization x the memory of its GPUs."""
        util = next((c.gpu_memory_utilization for c in reading.cores if c.gpu_memory_utilization), None)
        return (util or 0.9) * capacity

    def _fragmentation(
        self, reading: EngineReading, sig: EngineSignals, leak: LeakReport | None, series: str
    ) -> Fragmentation:
        core = reading.cores[0] if reading.cores else None
        known = [
            (ratio, (c.kv_cache_usage or 0) * (c.num_gpu_blocks or 0))  # cores weigh by the blocks they use
            for c in reading.cores
            if (ratio := kv_internal_fragmentation(c.running, c.kv_cache_usage, c.num_gpu_blocks, c.block_size))
            is not None
        ]
        weight = sum(w for _, w in known)
        kv_ratio = sum(r * w for r, w in known) / weight if weight > 0 else (known[0][0] if known else None)
        pool = None
        if core is not None:
            declared = core.cache_config.get("kv_cache_memory_bytes")
            if declared not in (None, "None", ""):
                try:
                    pool = float(declared)  # type: ignore[arg-type]
                except ValueError:
                    pool = None
        if pool is None and series in self._held_at_warmup:
            pool = self.kv_pool_share * self._held_at_warmup[series]
        overhang = leak.overhang if leak is not None and not leak.warming_up else None
        return fragmentation(kv_ratio, sig.kv_cache_usage, pool, overhang, sig.gpu_memory_bytes)

