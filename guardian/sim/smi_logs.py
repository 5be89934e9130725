"""Realistic nvidia-smi memory logs with ground truth, for the leak detector's benchmark and tests.

What the logs people hand to ``guardian analyze`` look like, seeded:

- each GPU runs vLLM engines one after another (the same settings, or now
  and then a redeploy with another memory share): a model load (30–600 s,
  log-uniform: CUDA context, weights rising, a flat stretch for profiling
  and compilation with an activation spike, the KV pool's jump to 40–85%
  of the card, CUDA-graph capture), a steady life, an exit (crash, OOM,
  restart) with the memory at zero for a while;
- a background on the steady level: flat, fast sawtooth (5–90 s period,
  taller than most steps), slow sawtooth (10–30 min), a slow bounded ramp,
  spikes given back (2 s to 10 min), or restarts every few hours;
- Gaussian noise, integer MiB as nvidia-smi prints them;
- a leak: held steps of one size (0.3–5% of the card, ±25%) 5 minutes to
  2¼ hours apart (a rate per log, ±50% per step), starting over after every restart (the bug is in the code, the
  leaked memory in the process); when the card fills the engine dies of
  out-of-memory and the steps are given back. A leak-free GPU may still
  take one isolated step (a LoRA adapter, a bigger batch's workspace):
  a step, not a leak;
- sampled every 1, 5 or 60 s with drift, 1–8 GPUs in one file, 24/80/141 GB
  cards, stretches where nvidia-smi was not running (the header repeated
  after them), and a last line cut off mid-write.

The truth per GPU: its held steps (time, size, when a restart gave them
back), its restarts, its loads, and its leak episodes (a run of the engine
that took ``LEAK_STEPS`` steps within ``LEAK_WINDOW`` seconds, from its first
step to the restart that ended it). vLLM's issue reports of leaks share that
shape: a staircase per request pattern or per LoRA swap, ended by an OOM.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timezone

MiB = 2**20
CARDS_MIB = {24: 24564, 80: 81559, 141: 143771}  # memory.total as nvidia-smi prints it
BACKGROUNDS = ("flat", "fast-sawtooth", "slow-sawtooth", "slow-ramp", "spikes", "restarts")
INTERVALS = (1, 5, 60)
STEP_RATIOS = (0.003, 0.005, 0.01, 0.02, 0.05)
LEAK_STEPS = 3
LEAK_WINDOW = 6 * 3600.0
T0 = datetime(2026, 3, 2, 1, 0, 0, tzinfo=timezone.utc).timestamp()


@dataclass(frozen=True)
class TrueStep:
    t: float  # unix seconds
    size: float  # bytes
    given_back_at: float | None  # the restart that freed it


@dataclass
class GpuTruth:
    index: int
    total: float  # bytes
    background: str
    step_ratio: float  # of the card; 0 when the GPU does not leak
    noise: float  # sigma, bytes
    steps: list[TrueStep] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)  # when an engine exited
    loads: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of each model load
    episodes: list[tuple[float, float | None]] = field(default_factory=list)  # leak present: first step → restart
    period: float = 0.0  # of a sawtooth background, seconds
    spikes: list[tuple[float, float, float]] = field(default_factory=list)  # (start, end, height) while an engine ran

    @property
    def leak(self) -> bool:
        return bool(self.episodes)

    def leak_shown(self, gaps: list[tuple[float, float]]) -> bool:
        """A leak the log shows: one life's steps outside the gaps (nvidia-smi not running, or the log cut off
        before the end) still make one. A leak whose steps fell where nothing was read is in the truth, not the log."""
        lives: dict[float | None, list[float]] = {}
        for step in self.steps_read(gaps):
            lives.setdefault(step.given_back_at, []).append(step.t)
        return any(_leaked(times) for times in lives.values())

    def steps_read(self, gaps: list[tuple[float, float]]) -> list[TrueStep]:
        """The steps outside the gaps, oldest first: those a log's readings can place."""
        return sorted((s for s in self.steps if not any(a <= s.t <= b for a, b in gaps)), key=lambda s: s.t)


@dataclass
class Log:
    name: str
    interval: float
    start: float
    end: float
    text: str
    gpus: list[GpuTruth]
    rows: int
    cut: bool
    gaps: list[tuple[float, float]]


@dataclass
class _Run:
    """One engine's life on one GPU, in seconds from the log's start."""

    start: float
    load: float  # seconds the model load takes
    end: float  # exit (restart, crash, OOM); the log's end for the last run
    weights: float
    graphs: float
    level: float  # steady memory without background and steps
    context: float
    steps: list[tuple[float, float]] = field(default_factory=list)  # (t, size)
    loaded_before_log: bool = False


def generate(
    seed: int,
    interval: float,
    background: str,
    step_ratio: float,
    *,
    hours: float | None = None,
    gpus: int | None = None,
    card_gb: int | None = None,
) -> Log:
    """One log file: ``gpus`` GPUs (default 1–8), each leaking with probability 1/2 (steps of ``step_ratio``)."""
    rng = random.Random(seed)
    if hours is None:
        hours = {1: rng.uniform(4, 12), 5: rng.uniform(12, 48)}.get(int(interval), rng.uniform(48, 168))
    n_gpus = gpus if gpus is not None else rng.choice((1, 1, 2, 4, 8))
    card = CARDS_MIB[card_gb if card_gb is not None else rng.choice(tuple(CARDS_MIB))] * MiB
    length = hours * 3600.0
    cards = [_gpu(rng, i, card, background, step_ratio if rng.random() < 0.5 else 0.0, length) for i in range(n_gpus)]
    gaps = _gaps(rng, length)
    text, rows, cut = _render(rng, interval, length, cards, gaps)
    truths = [truth for truth, _, _ in cards]
    for truth in truths:  # to unix time
        truth.steps = [TrueStep(T0 + s.t, s.size, None if s.given_back_at is None else T0 + s.given_back_at) for s in truth.steps]
        truth.restarts = [T0 + r for r in truth.restarts]
        truth.loads = [(T0 + a, T0 + b) for a, b in truth.loads]
        truth.episodes = [(T0 + a, None if b is None else T0 + b) for a, b in truth.episodes]
        truth.spikes = [(T0 + a, T0 + b, h) for a, b, h in truth.spikes]
    name = f"{background}-l{interval:g}-{step_ratio:.1%}-s{seed}"
    return Log(name, interval, T0, T0 + length, text, truths, rows, cut, [(T0 + a, T0 + b) for a, b in gaps])


# -- one GPU's life -------------------------------------------------------------------


def _gpu(
    rng: random.Random, index: int, card: float, background: str, step_ratio: float, length: float
) -> tuple[GpuTruth, list[_Run], _Background]:
    truth = GpuTruth(index, card, background, step_ratio, noise=rng.uniform(0.0, 0.001) * card)
    bg = _Background.draw(rng, background, card)
    truth.period = bg.period
    runs: list[_Run] = []
    t = 0.0
    loaded = rng.random() < 0.5  # the log may start with an engine already serving
    restart_every = rng.uniform(2, 8) * 3600 if background == "restarts" else rng.uniform(24, 96) * 3600
    isolated = step_ratio == 0.0 and rng.random() < 0.3
    level = rng.uniform(0.80, 0.92) * card
    while t < length:
        if runs and rng.random() < 0.1:  # redeployed with another gpu_memory_utilization
            level = rng.uniform(0.80, 0.92) * card
        run = _new_run(rng, t, card, loaded, level * rng.uniform(0.997, 1.003))
        loaded = False
        ready = run.start + run.load
        end = min(length, ready + max(1800.0, rng.expovariate(1 / restart_every)))
        if step_ratio > 0:
            s = ready + rng.uniform(600, 3 * 3600)
            gap = rng.uniform(10, 90) * 60
            while s < end:
                run.steps.append((s, step_ratio * card * rng.uniform(0.8, 1.25)))
                s += gap * rng.uniform(0.5, 1.5)
        elif isolated and ready + 1800 < end:
            run.steps.append((rng.uniform(ready + 600, end - 600), rng.choice(STEP_RATIOS) * card))
            isolated = False
        run.end = end
        oom = _oom(run, bg, card)
        if oom is not None:
            run.end = oom
        runs.append(run)
        if run.end >= length:
            break
        truth.restarts.append(run.end)
        t = run.end + rng.uniform(5, 120)  # systemd's restart delay, the old process's teardown
    for run in runs:
        if not run.loaded_before_log:
            truth.loads.append((run.start, run.start + run.load))
        freed = run.end if run.end < length else None
        truth.steps += [TrueStep(s, size, freed) for s, size in run.steps]
        times = [s for s, _ in run.steps]
        if _leaked(times):
            truth.episodes.append((times[0], freed))
        ready = run.start + run.load
        truth.spikes += [(ready + a, min(ready + b, run.end), h) for a, b, h in bg.spikes if ready + a < run.end]
    return truth, runs, bg


def _leaked(times: list[float]) -> bool:
    """``LEAK_STEPS`` steps (oldest first) within ``LEAK_WINDOW``: a leak, not a step or two."""
    return any(sum(1 for u in times if s <= u <= s + LEAK_WINDOW) >= LEAK_STEPS for s in times)


def _new_run(rng: random.Random, start: float, card: float, loaded: bool, level: float) -> _Run:
    load = 0.0 if loaded else math.exp(rng.uniform(math.log(30), math.log(600)))
    run = _Run(
        start=-load - 1.0 if loaded else start,
        load=load,
        end=0.0,
        weights=rng.uniform(0.02, 0.4) * card,
        graphs=rng.uniform(0.003, 0.02) * card,
        level=level,
        context=rng.uniform(300, 600) * MiB,
        loaded_before_log=loaded,
    )
    return run


def _oom(run: _Run, bg: _Background, card: float) -> float | None:
    """When the held steps plus the background's peak pass the card, the engine dies of out-of-memory."""
    held = 0.0
    kept: list[tuple[float, float]] = []
    for t, size in run.steps:
        if t >= run.end:
            break
        held += size
        if run.level + held + bg.peak >= card:
            run.steps = kept
            return t
        kept.append((t, size))
    run.steps = [(t, s) for t, s in kept if t < run.end]
    return None


@dataclass
class _Background:
    kind: str
    amplitude: float = 0.0
    period: float = 0.0
    phase: float = 0.0
    triangle: bool = False
    ramp_start: float = 0.0
    ramp_seconds: float = 1.0
    spikes: list[tuple[float, float, float]] = field(default_factory=list)  # (start, end, height) from the run's ready

    @property
    def peak(self) -> float:
        return self.amplitude

    @classmethod
    def draw(cls, rng: random.Random, kind: str, card: float) -> _Background:
        bg = cls(kind)
        if kind == "fast-sawtooth":
            bg.period, bg.amplitude = rng.uniform(5, 90), rng.uniform(0.005, 0.06) * card
        elif kind == "slow-sawtooth":
            bg.period, bg.amplitude = rng.uniform(600, 1800), rng.uniform(0.005, 0.04) * card
            bg.triangle = rng.random() < 0.5
        elif kind == "slow-ramp":
            bg.amplitude = rng.uniform(0.005, 0.03) * card
            bg.ramp_start, bg.ramp_seconds = rng.uniform(0, 3600), rng.uniform(1, 8) * 3600
        elif kind == "spikes":
            every = rng.uniform(5, 60) * 60
            t = rng.expovariate(1 / every)
            while t < 10 * 86400:
                length = math.exp(rng.uniform(math.log(2), math.log(600)))
                height = rng.uniform(0.01, 0.08) * card
                bg.spikes.append((t, t + length, height))
                bg.amplitude = max(bg.amplitude, height)
                t += length + rng.expovariate(1 / every)
        bg.phase = rng.uniform(0, bg.period or 1.0)
        return bg

    def at(self, since_ready: float) -> float:
        if self.kind in ("fast-sawtooth", "slow-sawtooth"):
            x = ((since_ready + self.phase) / self.period) % 1.0
            if self.triangle:
                x = 2 * x if x < 0.5 else 2 - 2 * x
            return self.amplitude * x
        if self.kind == "slow-ramp":
            return self.amplitude * min(1.0, max(0.0, (since_ready - self.ramp_start) / self.ramp_seconds))
        if self.kind == "spikes":
            return _spike_at(self.spikes, since_ready)
        return 0.0


def _spike_at(spikes: list[tuple[float, float, float]], t: float) -> float:
    lo, hi = 0, len(spikes)
    while lo < hi:  # the last spike starting at or before t
        mid = (lo + hi) // 2
        if spikes[mid][0] <= t:
            lo = mid + 1
        else:
            hi = mid
    if lo and spikes[lo - 1][1] > t:
        return spikes[lo - 1][2]
    return 0.0


def _memory(run: _Run, bg: _Background, t: float) -> float:
    """The engine's memory at t (seconds from the log's start), before noise."""
    if t < run.start or t >= run.end:
        return 0.0
    tau = t - run.start
    d = run.load
    if tau < d:  # loading: context, weights, profiling, the KV pool, CUDA graphs
        used = run.context
        used += run.weights * min(1.0, max(0.0, (tau - 0.05 * d) / (0.4 * d)))
        if 0.7 * d <= tau < 0.75 * d:
            used += 0.5 * run.weights  # the profiling run's activations
        if tau >= 0.8 * d:
            used = run.level - run.graphs + run.graphs * (tau - 0.8 * d) / (0.2 * d)
        return used
    used = run.level + bg.at(tau - d)
    for s, size in run.steps:
        if s > t:
            break
        used += size
    return used


def _gaps(rng: random.Random, length: float) -> list[tuple[float, float]]:
    """Stretches where nvidia-smi was not running (a reboot of the logger, a full disk)."""
    if rng.random() >= 0.3:
        return []
    gaps = []
    for _ in range(rng.randint(1, 3)):
        a = rng.uniform(0.1, 0.9) * length
        gaps.append((a, min(length, a + rng.uniform(600, 3 * 3600))))
    return sorted(gaps)


def _render(
    rng: random.Random,
    interval: float,
    length: float,
    cards: list[tuple[GpuTruth, list[_Run], _Background]],
    gaps: list[tuple[float, float]],
) -> tuple[str, int, bool]:
    header = rng.random() < 0.7
    units = rng.random() < 0.7
    drift = 1 + rng.uniform(0, 0.003)  # nvidia-smi -l sleeps interval after the query: the period is a bit longer
    noise = rng.gauss
    head = "timestamp, index, memory.used [MiB], memory.total [MiB]"
    lines = [head] if header else []
    cursors = [0] * len(cards)
    t = 0.0
    in_gap = False
    while t < length:
        gap = any(a <= t < b for a, b in gaps)
        if gap:
            in_gap = True
            t += interval * drift
            continue
        if in_gap and header:
            lines.append(head)
        in_gap = False
        stamp = datetime.fromtimestamp(T0 + t, timezone.utc).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        for g, (truth, runs, bg) in enumerate(cards):
            while cursors[g] + 1 < len(runs) and runs[cursors[g]].end <= t:
                cursors[g] += 1
            used = _memory(runs[cursors[g]], bg, t)
            if used > 0:
                used += noise(0.0, truth.noise)
            mib = min(int(truth.total / MiB), max(0, round(used / MiB)))
            total = int(truth.total / MiB)
            lines.append(f"{stamp}, {truth.index}, {mib} MiB, {total} MiB" if units else f"{stamp}, {truth.index}, {mib}, {total}")
        t += interval * drift + rng.uniform(0, 0.01)
    rows = sum(1 for line in lines if not line.startswith("timestamp"))
    cut = rng.random() < 0.3
    text = "\n".join(lines) + "\n"
    if cut:  # nvidia-smi killed while writing its last line
        last = lines[-1]
        text = "\n".join(lines[:-1]) + "\n" + last[: rng.randint(1, len(last) - 2)]
    return text, rows, cut
