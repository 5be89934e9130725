"""What the breaker is told about an engine: its readings of one poll, as ``Evidence``.

Pure: the poll's sample, signals and memory report in, evidence out. The
only memory across polls is the count of /health failures in a row and the
GPU's free share at the previous poll (to tell an OOM from a crash), which
the caller keeps in ``EvidenceMemory``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from guardian.analysis.engine_stats import EngineSignals
from guardian.analysis.memory import MemoryReport
from guardian.policy.breaker import Evidence
from guardian.sample import EngineReading, Sample


@dataclass
class EvidenceMemory:
    health_failures: dict[str, int] = field(default_factory=dict)
    free_ratio: dict[str, float] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)


def evidence(
    name: str, sample: Sample, sig: EngineSignals, memory: MemoryReport | None, past: EvidenceMemory, oom_free_ratio: float
) -> Evidence:
    reading = sample.engine(name)
    assert reading is not None
    failures_before = past.health_failures.get(name, 0)
    failures = _health_failures(reading, failures_before)
    if failures is not None:
        past.health_failures[name] = failures
    place = memory.placement.get(name) if memory else None
    util = next((c.gpu_memory_utilization for c in reading.cores if c.gpu_memory_utilization), None)
    free = None
    expected_free = None
    over_budget = None
    if place is not None:
        totals = [(g, g.memory_total_bytes) for g in sample.nvml.gpus if g.index in place.gpus and g.memory_total_bytes]
        ratios = [g.memory_free_bytes / total for g, total in totals if g.memory_free_bytes is not None]
        free = min(ratios) if len(ratios) == len(place.gpus) else None
        if util is not None and totals:
            driver = max((g.memory_reserved_bytes or 0) / total for g, total in totals)
            expected_free = max(0.0, 1.0 - util - driver)
        if sig.gpu_memory_bytes is not None:
            over_budget = (sig.gpu_memory_bytes - place.budget_bytes) / place.capacity_bytes
    # an OOM: the engine died or restarted while its GPUs were out of memory the poll before
    restarted = sig.restarts_total > past.restarts.get(name, sig.restarts_total)
    past.restarts[name] = sig.restarts_total
    died = restarted or (failures == 1 and failures_before == 0)
    previous_free = past.free_ratio.get(name)
    oom = None if previous_free is None else (died and previous_free < oom_free_ratio)
    if free is not None:
        past.free_ratio[name] = free
    frag = memory.fragmentation.get(name) if memory else None
    return Evidence(
        fragmentation_ratio=frag.ratio if frag else None,
        kv_usage=sig.kv_cache_usage,
        over_budget_ratio=over_budget,
        free_ratio=free,
        expected_free_ratio=expected_free,
        gpu_memory_utilization=util,
        health_failures=failures,
        oom=oom,
        preemptions_per_second=sig.preemptions_per_second,
        telemetry_lost=sig.telemetry_lost,
    )


def _health_failures(reading: EngineReading, before: int) -> int | None:
    """/health failures in a row: an answer that is not 200, or nothing listening; None: no answer."""
    if reading.healthy is True:
        return 0
    if reading.healthy is False or reading.error_kind == "refused":
        return before + 1
    return None
