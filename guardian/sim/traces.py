"""Synthetic GPU-memory traces with ground truth, for the leak detector's tests and benchmark.

1 Hz, in bytes, shaped like the per-process NVML memory of a vLLM server: a
warm-up ramp to the pre-allocated budget (plus a CUDA-graph bump), Gaussian
noise, and then whatever the trace is about — allocation sawtooth, spikes
that are given back, restarts, or a staircase leak whose step times are the
ground truth. Seeded: the same arguments give the same trace.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

GiB = 2**30
TOTAL = 80 * GiB
UTILIZATION = 0.92


@dataclass
class Trace:
    name: str
    values: list[float]  # bytes, one per second
    budget: float  # vLLM's budget: gpu_memory_utilization x total
    capacity: float  # where the process dies: the GPU's total
    steps: list[tuple[int, float]] = field(default_factory=list)  # (second, size in bytes): the truth
    restarts: list[int] = field(default_factory=list)


def _add(values: list[float], start: int, end: int, amount: float) -> None:
    for i in range(max(0, start), min(len(values), end)):
        values[i] += amount


def _warmup(values: list[float], start: int, level: float, rng: random.Random) -> int:
    """A ramp from the CUDA context to the budget, noise on top; returns where it ends."""
    ramp = rng.randint(60, 180)
    end = min(len(values), start + ramp)
    low = 0.02 * TOTAL
    for i in range(start, end):
        values[i] += low + (level - low) * (i - start) / ramp - level
    return end


def _base(seconds: int, rng: random.Random, sigma_ratio: float) -> tuple[list[float], float, random.Random]:
    level = UTILIZATION * TOTAL + 0.5 * GiB
    sigma = sigma_ratio * TOTAL
    gauss = rng.gauss
    return [level + gauss(0.0, sigma) for _ in range(seconds)], level, rng


def _spikes(values: list[float], rng: random.Random, every: float, budget: float, after: int) -> None:
    t = after + int(rng.expovariate(1 / every))
    while t < len(values):
        length = rng.randint(3, 120)
        _add(values, t, t + length, rng.uniform(0.01, 0.05) * budget)
        t += length + int(rng.expovariate(1 / every))


def flat(seconds: int, seed: int, sigma_ratio: float = 0.002) -> Trace:
    rng = random.Random(seed)
    values, level, _ = _base(seconds, rng, sigma_ratio)
    _warmup(values, 0, level, rng)
    return Trace("flat", values, UTILIZATION * TOTAL, TOTAL)


def healthy_day(seconds: int, seed: int, sigma_ratio: float = 0.002) -> Trace:
    """Everything that is not a leak: warm-ups, restarts, sawtooth, spikes given back."""
    rng = random.Random(seed)
    values, level, _ = _base(seconds, rng, sigma_ratio)
    budget = UTILIZATION * TOTAL
    trace = Trace("healthy", values, budget, TOTAL)
    _warmup(values, 0, level, rng)
    # allocation sawtooth: rises from the floor and drops back, for a while at a time
    t = rng.randint(600, 3600)
    while t < seconds:
        length = rng.randint(600, 3600)
        period = rng.randint(8, 30)
        amplitude = rng.uniform(0.01, 0.04) * budget
        for i in range(t, min(seconds, t + length)):
            values[i] += amplitude * ((i - t) % period) / period
        t += length + rng.randint(1800, 7200)
    _spikes(values, rng, every=1200, budget=budget, after=600)
    # restarts: the process goes away, comes back and warms up again
    t = rng.randint(3 * 3600, 8 * 3600)
    while t < seconds - 600:
        gone = rng.randint(5, 30)
        for i in range(t, min(seconds, t + gone)):
            values[i] = 0.0
        shift = rng.uniform(-0.003, 0.003) * budget
        _add(values, t + gone, seconds, shift)
        level += shift
        _warmup(values, t + gone, level, rng)
        trace.restarts.append(t)
        t += rng.randint(4 * 3600, 12 * 3600)
    return trace


def staircase(seconds: int, seed: int, step_ratio: float, sigma_ratio: float = 0.002, max_steps: int = 8) -> Trace:
    """A leak: steps of ``step_ratio`` x budget at random times, with spikes given back between them."""
    rng = random.Random(seed)
    values, level, _ = _base(seconds, rng, sigma_ratio)
    budget = UTILIZATION * TOTAL
    trace = Trace(f"staircase {step_ratio:.1%}", values, budget, TOTAL)
    start = _warmup(values, 0, level, rng)
    room = 0.06 * TOTAL  # keep the staircase below the GPU's total
    count = max(1, min(max_steps, int(room // (step_ratio * budget))))
    t = start + 600 + rng.randint(0, 1200)
    for _ in range(count):
        if t >= seconds - 300:
            break
        size = step_ratio * budget
        _add(values, t, seconds, size)
        trace.steps.append((t, size))
        t += rng.randint(600, 2400)
    _spikes(values, rng, every=1800, budget=budget, after=start + 300)
    return trace
