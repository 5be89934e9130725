"""Stepwise memory leaks: the staircase in nvidia-smi, found one step at a time.

vLLM pre-allocates its pool, so a healthy server's memory is flat; what is
not flat is noise (sampling jitter), allocation sawtooth (rises and falls
back to the same floor), warm-up after a (re)start (CUDA graph capture), and
one-off spikes that are given back. A leak is a rise of the *floor* that
stays.

Method: a one-sided Page CUSUM on a robust level, with a hold test.

1. The level is the median of the last ``median_samples`` readings, which
   removes single-sample outliers without smearing a step.
2. CUSUM ``S = max(0, S + m - L - k)`` against the accepted level ``L``
   with ``k`` half the smallest step of interest; when ``S`` passes ``h`` a
   candidate step starts where ``S`` last left zero (the change point).
3. The candidate becomes a step only if the level stays above ``L + k``
   for every one of the next ``hold_samples`` readings: the *minimum* is
   tested, not the mean, because sawtooth and spikes are defined by falling
   back to the floor. A fall-back during the hold discards the candidate; a
   fall-back after it marks the step as given back.
4. ``k`` and ``h`` scale with the larger of ``min_step_ratio × budget`` and a
   robust noise estimate (MAD of first differences, insensitive to the steps
   themselves), so one setting works for quiet and noisy series.

Why CUSUM on a median rather than a rolling regression (``predict_linear``):
a regression smears a step over its window, reacts to every spike and
warm-up ramp, and says nothing about *when* the step happened; the CUSUM's
change point gives the step's time, which operators match against deploys
and traffic. ``bench/detector.py`` measures both on the same traces.

Pure: ``update(t, value)`` with time as an argument; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from statistics import median


@dataclass(frozen=True)
class LeakParams:
    min_step_ratio: float = 0.003  # smallest step of interest, as a fraction of the budget
    noise_factor: float = 1.5  # k is at least this many noise sigmas of the median level
    cusum_threshold: float = 2.0  # h, in units of k
    median_samples: int = 5
    hold_samples: int = 20  # a step must persist this long; longer spikes are steps given back
    settle_samples: int = 2  # readings after the change point that belong to the transition
    warmup_seconds: float = 300.0  # after a (re)start nothing counts: CUDA graphs, caches
    restart_drop_ratio: float = 0.2  # a fall by this much of the budget is a restart
    leak_steps: int = 3  # this many held steps inside leak_window_seconds is a leak
    leak_window_seconds: float = 6 * 3600.0
    leak_rise_ratio: float = 0.05  # or a rise of the floor by this fraction of the budget
    noise_window: int = 300  # readings the noise estimate looks at
    regret_seconds: float = 300.0  # a step whose old floor comes back this soon was a spike or sawtooth
    floor_seconds: float = 300.0  # the floor (overhang, rise rule) is the lowest level over this long


@dataclass(frozen=True)
class Step:
    t: float  # the change point
    size: float  # bytes
    found_at: float  # when the hold completed
    given_back_at: float | None = None
    before: float = 0.0  # the level the step rose from


@dataclass(frozen=True)
class LeakReport:
    level: float | None  # the accepted (robust) level
    overhang: float  # rise of the level since the end of warm-up; 0 while warming up
    steps: tuple[Step, ...]  # held and given back, oldest first
    new_steps: tuple[Step, ...]  # found by this update
    given_back: tuple[Step, ...]  # marked given back by this update
    slope: float  # bytes per second of held rise since the first held step in the window
    time_to_exhaustion: float | None  # seconds until capacity at that slope; None: not rising
    confidence: float  # 0..1: how far along the leak rule is
    leak: bool
    warming_up: bool

    @property
    def held_steps(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.given_back_at is None)


@dataclass
class _Candidate:
    t: float  # change point
    samples: int = 0
    levels: list[float] = field(default_factory=list)


class LeakDetector:
    """One memory series: per-process GPU memory, device used, or host RSS."""

    def __init__(self, budget: float, capacity: float | None = None, params: LeakParams | None = None) -> None:
        self.p = params or LeakParams()
        self.budget = budget
        self.capacity = capacity
        self._recent: deque[float] = deque(maxlen=self.p.median_samples)
        self._raw: deque[tuple[float, float]] = deque(maxlen=3 * self.p.hold_samples + self.p.settle_samples + 10)
        self._diffs: deque[float] = deque(maxlen=self.p.noise_window)
        self._k_cache: tuple[int, float] = (-1, 0.0)
        self._sigma = 0.0  # noise of the raw readings
        self._updates = 0
        self._last: float | None = None
        self._warm_until: float | None = None
        self._level: float | None = None
        self._base: float | None = None  # level at the end of warm-up
        self._floor: deque[tuple[float, float]] = deque()  # (t, level), increasing levels: a sliding minimum
        self._cusum = 0.0
        self._zero_t = 0.0
        self._candidate: _Candidate | None = None
        self._below = 0  # readings in a row under the level (memory given back)
        self._steps: list[Step] = []
        self._freed: list[Step] = []  # given back by a restart, not yet reported
        self._history_limit = 1000

    def restart(self, t: float) -> None:
        """The process restarted (told by the process source): start over with a warm-up.

        A restart frees whatever the old process leaked: its held steps are given back.
        """
        for i, step in enumerate(self._steps):
            if step.given_back_at is None:
                self._steps[i] = replace(step, given_back_at=t)
                self._freed.append(self._steps[i])
        self._recent.clear()
        self._floor.clear()
        self._warm_until = t + self.p.warmup_seconds
        self._level = self._base = None
        self._cusum, self._candidate, self._below = 0.0, None, 0

    def update(self, t: float, value: float | None) -> LeakReport:
        if value is None or math.isnan(value):
            return self._report(t)
        p = self.p
        self._updates += 1
        if self._last is not None:
            if self._level is not None and value < self._level - p.restart_drop_ratio * self.budget:
                self.restart(t)
            self._diffs.append(abs(value - self._last))
        self._last = value
        if self._warm_until is None:
            self._warm_until = t + p.warmup_seconds
        self._recent.append(value)
        self._raw.append((t, value))
        m = median(self._recent)
        if t < self._warm_until or len(self._recent) < p.median_samples:
            self._level = m
            return self._report(t, warming_up=True)
        if self._base is None:
            self._base = self._level = m
            self._zero_t = t
        self._push_floor(t, m)
        given_back = self._regret(t, m)
        return self._report(t, self._track(t, m), given_back)

    # -- the floor and second thoughts ------------------------------------------

    def _push_floor(self, t: float, m: float) -> None:
        floor = self._floor
        while floor and floor[-1][1] >= m:
            floor.pop()
        floor.append((t, m))
        while floor[0][0] < t - self.p.floor_seconds:
            floor.popleft()

    def _regret(self, t: float, m: float) -> tuple[Step, ...]:
        """Recent steps whose old floor came back were spikes or sawtooth: mark them given back."""
        k = self._k()
        undone = []
        for i in range(len(self._steps) - 1, -1, -1):
            step = self._steps[i]
            if t - step.found_at > self.p.regret_seconds:
                break
            if step.given_back_at is None and m <= step.before + k:
                self._steps[i] = replace(step, given_back_at=t)
                undone.append(self._steps[i])
                self._level = min(self._level if self._level is not None else m, step.before)
        if undone:
            self._candidate, self._cusum, self._zero_t = None, 0.0, t
        return tuple(undone)

    # -- steps --------------------------------------------------------------------

    def _track(self, t: float, m: float) -> tuple[Step, ...]:
        p = self.p
        assert self._level is not None
        k = self._k()
        if self._candidate is not None:
            c = self._candidate
            c.samples += 1
            if c.samples > p.settle_samples:
                if m <= self._level + k:  # fell back: a spike or a tooth of the sawtooth
                    self._drop_candidate(t)
                    return ()
                c.levels.append(m)
            if c.samples < p.settle_samples + p.hold_samples:
                return ()
            new_level = median(c.levels)
            size = new_level - self._level
            third = max(1, len(c.levels) // 3)
            if median(c.levels[-third:]) - median(c.levels[:third]) > size / 2:
                self._drop_candidate(t)  # still climbing: a ramp, not a step
                return ()
            if not self._floor_rose(c, size):
                self._drop_candidate(t)  # the readings still touch the old floor: fast sawtooth
                return ()
            step = Step(t=c.t, size=size, found_at=t, before=self._level)
            self._steps.append(step)
            del self._steps[: -self._history_limit]
            self._level = new_level
            self._drop_candidate(t)
            return (step,)
        if m < self._level - k:  # memory given back: the level moved down for a hold
            self._below += 1
            if self._below >= p.hold_samples:
                self._give_back(t, m)
        else:
            self._below = 0
        self._cusum = max(0.0, self._cusum + m - self._level - k)
        if self._cusum == 0.0:
            self._zero_t = t
        elif self._cusum > p.cusum_threshold * k:
            self._candidate = _Candidate(t=self._zero_t)
        return ()

    def _floor_rose(self, c: _Candidate, size: float) -> bool:
        """The raw readings after the change point stay clear of the old level.

        The median filter turns a fast sawtooth into a raised level; its
        troughs still reach the old level, a step's readings do not. The
        lowest of ~20 noisy readings sits about two sigmas under their
        level, hence the allowance.
        """
        assert self._level is not None
        after = [v for t, v in self._raw if t >= c.t + self.p.settle_samples]
        if not after:
            return True
        return min(after) - self._level > size / 2 - 2 * self._sigma

    def _drop_candidate(self, t: float) -> None:
        self._candidate = None
        self._cusum = 0.0
        self._zero_t = t

    def _give_back(self, t: float, m: float) -> None:
        assert self._level is not None
        drop = self._level - m
        for i in range(len(self._steps) - 1, -1, -1):  # newest held steps are given back first
            step = self._steps[i]
            if step.given_back_at is not None:
                continue
            if drop < step.size / 2:
                break
            self._steps[i] = replace(step, given_back_at=t)
            drop -= step.size
        self._level = m
        self._below = 0
        self._cusum = 0.0

    def _k(self) -> float:
        """Half the smallest step worth finding: the configured one or the noise, whichever is larger."""
        if self._k_cache[0] == self._updates:
            return self._k_cache[1]
        k = self.p.min_step_ratio * self.budget / 2
        if len(self._diffs) >= 10:
            # MAD of first differences: sigma of the readings, robust to the steps themselves
            sigma = self._sigma = 1.4826 * median(self._diffs) / math.sqrt(2)
            sigma_level = sigma * 1.25 / math.sqrt(self.p.median_samples)  # the median's noise
            k = max(k, self.p.noise_factor * sigma_level)
        self._k_cache = (self._updates, k)
        return k

    def _report(
        self, t: float, new: tuple[Step, ...] = (), given_back: tuple[Step, ...] = (), warming_up: bool = False
    ) -> LeakReport:
        p = self.p
        if self._freed:
            given_back, self._freed = (*self._freed, *given_back), []
        held = [s for s in self._steps if s.given_back_at is None and t - s.t <= p.leak_window_seconds]
        # a step counts towards a leak once it has outlived the regret window: until then it
        # may still be a long spike, and three spikes at once are not a leak
        settled = [s for s in held if t - s.found_at >= p.regret_seconds]
        floor_rise = overhang = 0.0
        if self._base is not None and self._level is not None and self._floor:
            # the floor (lowest level over floor_seconds) also sees a slow creep that has no steps
            floor_rise = max(0.0, self._floor[0][1] - self._base)
            overhang = max(floor_rise, self._level - self._base)
        rise_needed = p.leak_rise_ratio * self.budget
        leak = len(settled) >= p.leak_steps or floor_rise >= rise_needed
        confidence = min(1.0, max(len(settled) / p.leak_steps, floor_rise / rise_needed))
        slope = 0.0
        if held:
            span = t - held[0].t
            slope = sum(s.size for s in held) / span if span > 0 else 0.0
        tte = None
        if slope > 0 and self.capacity is not None and self._level is not None:
            tte = max(0.0, (self.capacity - self._level) / slope)
        return LeakReport(
            level=self._level,
            overhang=overhang,
            steps=tuple(self._steps),
            new_steps=new,
            given_back=given_back,
            slope=slope,
            time_to_exhaustion=tte,
            confidence=confidence,
            leak=leak,
            warming_up=warming_up,
        )
