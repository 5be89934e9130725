"""What the breaker is told about an engine: its readings of one poll, as ``Evidence``.

Pure: the poll's sample, signals and memory report in, evidence out. The
only memory across polls is each engine's lifecycle (``policy/lifecycle.py``:
starting, up, unresponsive, dead) and the GPU's free share at the previous
poll (to tell an OOM from a crash), which the caller keeps in
``EvidenceMemory``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from guardian.analysis.engine_stats import EngineSignals
from guardian.analysis.memory import MemoryReport
from guardian.policy import lifecycle
from guardian.policy.breaker import Evidence
from guardian.policy.lifecycle import Lifecycle, LifecycleParams
from guardian.sample import EngineReading, Sample


@dataclass
class EvidenceMemory:
    lifecycles: dict[str, Lifecycle] = field(default_factory=dict)
    free_ratio: dict[str, float] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    leak_step: dict[str, float] = field(default_factory=dict)  # the engine's largest leak step lately (share of its GPUs)


def evidence(
    name: str, sample: Sample, sig: EngineSignals, memory: MemoryReport | None, past: EvidenceMemory,
    oom_free_ratio: float, life: LifecycleParams = LifecycleParams(),
) -> Evidence:  # fmt: skip
    reading = sample.engine(name)
    assert reading is not None
    before = past.lifecycles.get(name, Lifecycle())
    now = past.lifecycles[name] = lifecycle.step(before, observation(reading, sample.wall), sample.t, life)
    place = memory.placement.get(name) if memory else None
    util = next((c.gpu_memory_utilization for c in reading.cores if c.gpu_memory_utilization), None)
    free = None
    expected_free = None
    over_budget = None
    foreign: dict[int, int] = {}
    foreign_ratio = None
    if place is not None:
        foreign, known = _foreign(sample, reading, place.gpus)
        foreign_ratio = sum(foreign.values()) / place.capacity_bytes if known else None
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
    died = restarted or (now.failures == 1 and before.failures == 0) or (now.phase == "dead" and before.phase != "dead")
    previous_free = past.free_ratio.get(name)
    oom = None if previous_free is None else (died and previous_free < oom_free_ratio)
    if free is not None:
        past.free_ratio[name] = free
    leak = memory.leaks.get(f"engine/{name}/gpu") if memory else None
    if leak is not None and place is not None and leak.held_steps:  # kept across restarts: the next process leaks alike
        past.leak_step[name] = max(s.size for s in leak.held_steps) / place.capacity_bytes
    frag = memory.fragmentation.get(name) if memory else None
    return Evidence(
        fragmentation_ratio=frag.ratio if frag else None,
        kv_usage=sig.kv_cache_usage,
        over_budget_ratio=over_budget,
        free_ratio=free,
        expected_free_ratio=expected_free,
        gpu_memory_utilization=util,
        health_failures=now.failures,
        phase=now.phase,
        oom=oom,
        preemptions_per_second=sig.preemptions_per_second,
        telemetry_lost=sig.telemetry_lost,
        foreign_ratio=foreign_ratio,
        leak_step_ratio=past.leak_step.get(name),
        foreign=tuple(sorted(foreign.items(), key=lambda pb: -pb[1])),
    )


def _foreign(sample: Sample, reading: EngineReading, gpus: tuple[int, ...]) -> tuple[dict[int, int], bool]:
    """GPU memory of processes that are not the engine's on its GPUs (pid -> bytes), and whether every GPU listed them."""
    own = {p.pid for p in reading.processes or () if p.alive}
    held: dict[int, int] = {}
    known = True
    for gpu in sample.nvml.gpus:
        if gpu.index not in gpus:
            continue
        if gpu.processes is None:
            known = False
            continue
        for proc in gpu.processes:
            if proc.pid not in own and proc.used_bytes:
                held[proc.pid] = held.get(proc.pid, 0) + proc.used_bytes
    return held, known and reading.processes is not None


def observation(reading: EngineReading, wall: float) -> lifecycle.Observation:
    """An answer is /health 200, or /metrics scraped when /health was not asked or gave no verdict."""
    answered = reading.healthy is True or (reading.healthy is None and reading.up and reading.error_kind is None)
    alive, started = reading.main_process
    return lifecycle.Observation(
        answered=answered, refused=reading.error_kind == "refused", process_alive=alive, process_started=started, wall=wall
    )
