"""What serving costs: GPU memory held per generated token, tokens per joule, and whether a larger batch paid.

Two running figures per engine, over a sliding window:

- ``memory_gb_seconds_per_1k_tokens``: GB of GPU memory the engine holds
  (NVML, its processes), integrated over the window, per 1000 tokens it
  generated in it. vLLM holds its whole pool whether it is used or not, so
  this falls as throughput rises: an idle engine is expensive.
- ``tokens_per_joule``: tokens generated per joule its GPUs used (NVML's
  total-energy counter). A GPU shared by two engines is counted whole for
  each (per-process energy does not exist in NVML).

And the marginal check from the field, made whenever the batch grows (a
tuner move, or any change of the engine's batch): comparing the stretch at
the new batch with the stretch before it, the growth in KV cache in use
should stay under 70% of the throughput gain, and P99 within 2× the earlier
P99. A larger batch that fails it bought throughput with more memory (or
latency) than it was worth.

Pure: readings and times in, figures out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

GB = 1e9
MEMORY_GROWTH_LIMIT = 0.7  # of the throughput gain
P99_SWING_LIMIT = 2.0  # times the P99 before


@dataclass(frozen=True, slots=True)
class Cost:
    memory_gb_seconds_per_1k_tokens: float | None
    tokens_per_joule: float | None


@dataclass(frozen=True, slots=True)
class Marginal:
    """One batch increase, judged."""

    t: float
    batch_before: int
    batch_after: int
    memory_growth_ratio: float  # KV cache in use, after / before - 1
    throughput_gain_ratio: float  # tokens/s, after / before - 1
    p99_swing_ratio: float | None  # P99 after / before
    ok: bool


class CostWindow:
    """Counter deltas per poll, summed over a sliding window; counter resets (an engine restart) are skipped."""

    def __init__(self, window_seconds: float) -> None:
        self.window = window_seconds
        self._rows: deque[tuple[float, float, float, float | None]] = deque()  # t, GB·s, tokens, joules
        self._last: tuple[float, float | None, float | None] | None = None  # t, tokens total, energy total

    def update(self, t: float, memory_bytes: float | None, tokens_total: float | None, energy_joules: float | None) -> Cost:
        last, self._last = self._last, (t, tokens_total, energy_joules)
        if last is not None and memory_bytes is not None and tokens_total is not None and last[1] is not None:
            dt = t - last[0]
            tokens = tokens_total - last[1]
            energy = None if energy_joules is None or last[2] is None else energy_joules - last[2]
            if dt > 0 and tokens >= 0:
                self._rows.append((t, memory_bytes / GB * dt, tokens, energy if energy is None or energy >= 0 else None))
        while self._rows and t - self._rows[0][0] > self.window:
            self._rows.popleft()
        gbs = sum(r[1] for r in self._rows)
        tokens = sum(r[2] for r in self._rows)
        energies = [r[3] for r in self._rows]
        joules = sum(e for e in energies if e is not None) if energies and None not in energies else None
        return Cost(
            memory_gb_seconds_per_1k_tokens=gbs / tokens * 1000 if tokens > 0 else None,
            tokens_per_joule=tokens / joules if joules else None,
        )


@dataclass
class _Stretch:
    batch: int
    since: float
    n: int = 0
    kv: float = 0.0
    tokens_per_second: float = 0.0
    p99s: list[float] = field(default_factory=list)

    def add(self, kv: float, tps: float, p99: float | None) -> None:
        self.n += 1
        self.kv += kv
        self.tokens_per_second += tps
        if p99 is not None:
            self.p99s.append(p99)

    def mean(self) -> tuple[float, float, float | None]:
        p99 = sorted(self.p99s)[len(self.p99s) // 2] if self.p99s else None  # the median P99 of the stretch
        return self.kv / self.n, self.tokens_per_second / self.n, p99


class MarginalWatch:
    """Stretches of constant batch; a larger batch is judged once it has run ``settle_seconds``."""

    def __init__(self, settle_seconds: float = 60.0, min_polls: int = 5) -> None:
        self.settle = settle_seconds
        self.min_polls = min_polls
        self._before: _Stretch | None = None
        self._now: _Stretch | None = None
        self.last: Marginal | None = None

    def update(self, t: float, batch: int, kv_usage: float | None, tokens_per_second: float | None, p99: float | None) -> Marginal | None:
        """The judgement made at this poll, if one was."""
        if self._now is None or batch != self._now.batch:
            self._before = self._now if self._now is not None and self._now.n >= self.min_polls else None
            self._now = _Stretch(batch, t)
        if kv_usage is None or tokens_per_second is None:
            return None
        self._now.add(kv_usage, tokens_per_second, p99)
        before, now = self._before, self._now
        if before is None or now.batch <= before.batch or t - now.since < self.settle or now.n < self.min_polls:
            return None
        self._before = None  # judged once
        self.last = judge(t, before.batch, before.mean(), now.batch, now.mean())
        return self.last


def judge(t: float, b0: int, before: tuple[float, float, float | None], b1: int, after: tuple[float, float, float | None]) -> Marginal:
    kv0, tps0, p0 = before
    kv1, tps1, p1 = after
    memory = kv1 / kv0 - 1 if kv0 > 0 else 0.0
    gain = tps1 / tps0 - 1 if tps0 > 0 else 0.0
    swing = p1 / p0 if p0 and p1 is not None else None
    ok = memory <= MEMORY_GROWTH_LIMIT * max(gain, 0.0) and (swing is None or swing <= P99_SWING_LIMIT)
    return Marginal(t, b0, b1, round(memory, 4), round(gain, 4), None if swing is None else round(swing, 3), ok)
