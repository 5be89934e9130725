"""One line that says what moved: the demo prints it every few seconds, and ``guardian run`` on a terminal.

Per engine its breaker level, KV, batch, queue and P99s, tokens per second;
per GPU its memory and utilisation, with leak steps held. systemd's
STATUS= line is shorter (``Daemon._status_line``); this one is for a person
watching.
"""

from __future__ import annotations

from guardian.analysis.engine_stats import count_text, seconds_text
from guardian.snapshot import Snapshot


def summary(snap: Snapshot | None, elapsed: float) -> str:
    """One line per few seconds: what moved."""
    if snap is None:
        return f"[{elapsed:5.0f}s] waiting for the first poll"
    parts = []
    for name, sig in snap.engines.items():
        level = _level_text(snap, name)
        if not sig.up:
            parts.append(f"{name}: {level}DOWN")
            continue
        e2e = sig.latency.get("e2e")
        parts.append(
            f"{name}: {level}{sig.brief()} e2e {seconds_text(e2e.p99 if e2e else None)} "
            f"{count_text(sig.generation_tokens_per_second)} tok/s"
        )
    for gpu in snap.nvml.gpus:
        if gpu.memory_used_bytes is None or gpu.memory_total_bytes is None:
            parts.append(f"GPU{gpu.index}: {gpu.error or 'unknown'}")
            continue
        util = f"{gpu.utilization_gpu_ratio * 100:.0f}%" if gpu.utilization_gpu_ratio is not None else "?"
        parts.append(
            f"GPU{gpu.index}: {gpu.memory_used_bytes / 2**30:.1f}/{gpu.memory_total_bytes / 2**30:.1f} GiB util {util}"
            + _leak_text(snap, f"gpu/{gpu.index}/used")
        )
    if not snap.nvml.ok:
        parts.append(f"NVML: {snap.nvml.error}")
    return f"[{elapsed:5.0f}s] " + " | ".join(parts)


def _level_text(snap: Snapshot, name: str) -> str:
    state = snap.policy.states.get(name) if snap.policy else None
    if state is None:
        return ""
    restarting = " restarting" if snap.policy and name in snap.policy.restarting else ""
    return f"L{int(state.breaker.level)}{restarting} "


def _leak_text(snap: Snapshot, series: str) -> str:
    report = snap.memory.leaks.get(series) if snap.memory else None
    if report is None or report.warming_up:
        return ""
    held = len(report.held_steps)
    text = f" steps {held} (+{report.overhang / 2**30:.1f} GiB)" if held else ""
    return text + (" LEAK SUSPECTED" if report.leak else "")
