"""Stepwise memory leaks: the staircase in nvidia-smi, found one step at a time.

vLLM pre-allocates its pool, so a healthy server's memory is flat once
loaded; what is not flat is noise, the model load (weights, then the KV
pool's jump to most of the card, then CUDA graphs), a background that rises
and falls back to the same floor (allocation sawtooth of any period, spikes
given back), a slow creep that stops, and restarts. A leak is a rise of the
*floor* that stays, in steps.

Method, all in seconds so that one setting holds from ``-l 1`` to ``-l 60``:

1. **Load by behaviour.** After a start nothing counts until memory has
   not risen by 1% of the budget for ``settle_seconds`` nor by the smallest
   step for ``envelope_seconds`` (and ``warmup_seconds`` passed); a jump of
   ``load_jump_ratio`` of the budget between two readings later on (a long
   compile ended and the KV pool arrived) is more of the load, not a step,
   and steps found just before it go with it. Live, the daemon says when the
   engine turned healthy (``ready``).
2. **The floor on the background's own time scale.** The level is the lower
   envelope: the minimum (of a median of three readings) over a window
   ``W``, 1.5× the longest time the memory recently stayed off its floor
   (the background's period: a sawtooth's tooth, a spike), at least
   ``envelope_seconds``. A rising flank is then not a staircase, and a step
   under a tall tooth still lifts the floor.
3. **A step** is the envelope above the floor by ``k`` for ``hold_seconds``
   (or ``W / 2`` if longer), reached *abruptly*: a floor that took more than
   half a window to rise, or rose where the readings are smooth enough to
   show a jump and show none, crept — drift, absorbed into the floor (and
   counted by the creep rule), not a step. ``k`` is half the smallest step
   of interest or ``noise_factor`` sigmas of the envelope's own jitter,
   whichever is larger. Steps closer than a window are told apart by their
   jumps.
   Sooner: a jump between two readings that holds for a window is a step
   at once (on a slow sawtooth a period before the floor shows it), unless
   jumps like it were given back lately (spikes, an aliased sawtooth).
4. **When.** The jump where the readings show one; else the first reading
   that proves the step (above the old readings' top), else the first on
   the new floor; never the start of the flank it may sit on.
5. **Given back.** The envelope below the floor for a hold gives the newest
   steps back: ``transient`` if that happens within ``regret_seconds`` of
   their finding (a long spike, a tooth), ``freed`` otherwise; a fall of
   ``restart_drop_ratio`` is a restart and gives back everything (``restart``).

Why an envelope rather than a CUSUM on a median, or a regression
(``predict_linear``): both see a sawtooth's flank as a rise and a spike as
a step; the floor of a background is what a leak moves. ``bench/detector.py``
measures it on seeded realistic logs.

Pure: ``update(t, value)`` with time as an argument; no clock, no I/O.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, replace
from statistics import median


@dataclass(frozen=True)
class LeakParams:
    min_step_ratio: float = 0.003  # smallest step of interest, as a fraction of the budget
    noise_factor: float = 3.0  # k is at least this many sigmas of the floor's jitter
    envelope_seconds: float = 120.0  # the shortest window of the floor (the minimum over it)
    max_envelope_seconds: float = 3600.0  # the longest: backgrounds with longer periods look like steps
    hold_seconds: float = 180.0  # a raised floor must stay this long (or one window, if longer)
    warmup_seconds: float = 60.0  # after a start, at least this long is the load
    settle_seconds: float = 180.0  # the load is over when memory has not risen for this long
    load_jump_ratio: float = 0.1  # a rise of this much of the budget is a model load, not a step
    restart_drop_ratio: float = 0.2  # a fall by this much of the budget is a restart
    leak_steps: int = 3  # this many held steps inside leak_window_seconds is a leak...
    leak_window_seconds: float = 6 * 3600.0
    leak_rise_ratio: float = 0.05  # ...or the floor rising by this fraction of the budget
    regret_seconds: float = 1800.0  # a step given back this soon after it was found was a transient


@dataclass(frozen=True)
class Step:
    t: float  # the change point
    size: float  # bytes
    found_at: float  # when the hold completed
    given_back_at: float | None = None
    before: float = 0.0  # the floor the step rose from
    ended_by: str | None = None  # "restart", "freed" (memory given back), "transient" (taken back: not a step)


@dataclass(frozen=True)
class LeakReport:
    level: float | None  # the floor
    overhang: float  # rise of the floor since the load ended; 0 while loading
    steps: tuple[Step, ...]  # held and given back, oldest first (the latest thousand)
    new_steps: tuple[Step, ...]  # found by this update
    given_back: tuple[Step, ...]  # given back by this update
    slope: float  # bytes per second of held rise since the first held step in the window
    time_to_exhaustion: float | None  # seconds until capacity at that slope; None: not rising
    confidence: float  # 0..1: how far along the leak rule is
    leak: bool
    warming_up: bool  # the model load is not over

    @property
    def held_steps(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.given_back_at is None)


@dataclass
class _Candidate:
    """The floor above the level: since when, and the plateau it has held since plateau_since."""

    since: float
    plateau: float
    plateau_since: float


class _Envelope:
    """Minimum over a sliding time window whose length may change: a monotonic queue searched by time."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.values: list[float] = []
        self.head = 0

    def push(self, t: float, v: float, keep: float) -> None:
        times, values = self.times, self.values
        while len(values) > self.head and values[-1] >= v:
            times.pop()
            values.pop()
        times.append(t)
        values.append(v)
        while times[self.head] < t - keep:
            self.head += 1
        if self.head > 4096:
            del times[: self.head], values[: self.head]
            self.head = 0

    def min_since(self, since: float) -> float:
        i = bisect_left(self.times, since, self.head)
        return self.values[min(i, len(self.values) - 1)]


class LeakDetector:
    """One memory series: per-process GPU memory, device used, or host RSS."""

    def __init__(self, budget: float, capacity: float | None = None, params: LeakParams | None = None) -> None:
        self.p = params or LeakParams()
        self.budget = budget
        self.capacity = capacity
        self._env = _Envelope()
        self._raw: deque[tuple[float, float]] = deque()
        self._trace: deque[tuple[float, float]] = deque()  # (t, floor): how fast a floor rose
        self._prev2: tuple[float | None, float | None] = (None, None)
        self._diffs: deque[float] = deque(maxlen=301)
        self._floors: deque[float] = deque(maxlen=12)  # the envelope once per window: its own jitter
        self._floor_t = -math.inf
        self._sigma = 0.0
        self._spread = 0.0
        self._sigma_floor: float | None = None
        self._updates = 0
        self._last: tuple[float, float] | None = None
        self._dts: deque[float] = deque(maxlen=31)
        self._dt = 1.0
        self._loading_since: float | None = None  # None: loaded
        self._loaded_at = -math.inf  # when the last load ended
        self._load_top = self._load_creep = 0.0  # the highest reading in the load, for big and small rises
        self._load_rise_t = self._load_creep_t = 0.0
        self._level: float | None = None
        self._base: float | None = None
        self._touch = -math.inf
        self._creep_since: float | None = None  # the floor has risen by leak_rise_ratio without steps since
        self._touch_floor = math.inf  # the hour's floor at the last touch
        self._gaps: deque[tuple[float, float]] = deque()  # (when closed, length): time off the floor, longest first
        self._quiet_since = -math.inf  # when the level was last set: a load, a step, memory given back
        self._candidate: _Candidate | None = None
        self._jump: tuple[float, float] | None = None  # a jump the size of a load: (when, the reading before)
        self._pending: list[tuple[float, float, float]] = []  # jumps not yet held a window: (when, before, rise)
        self._jump_back_t, self._jump_back = -math.inf, 0.0  # when a jump was last given back, and its size
        self._below_since: float | None = None
        self._steps: list[Step] = []
        self._ended: list[Step] = []  # given back since the last report
        self._history_limit = 1000

    # -- what the caller knows ------------------------------------------------------------

    def restart(self, t: float) -> None:
        """The process restarted: what it held is given back, and a load begins."""
        self._flush(t)
        self._end_held(t, "restart")
        self._base = None
        self._begin_load(t)

    def ready(self, t: float) -> None:
        """The engine turned healthy: its load is over, whatever the memory says."""
        if self._loading_since is not None and self._raw:
            self._end_load(t)

    # -- the stream -------------------------------------------------------------------------

    def update(self, t: float, value: float | None) -> LeakReport:
        if value is None or math.isnan(value):
            return self._report(t)
        p = self.p
        self._updates += 1
        last = self._last
        if last is not None:
            self._dts.append(t - last[0])
            if self._updates < 32 or self._updates % 16 == 0:
                self._dt = max(1e-3, median(self._dts))
            self._diffs.append(abs(value - last[1]))
        self._last = (t, value)
        if last is None:
            self._begin_load(t)
        elif self._level is not None and value < self._level - p.restart_drop_ratio * self.budget:
            self.restart(t)
        elif t - last[0] > max(10 * self._dt, 300.0):
            self._flush(t)
            self._begin_load(t)  # nothing seen for a while: what rose meanwhile is not a step we can place
        elif self._loading_since is None and self._level is not None:
            # a jump of a KV pool's size from one reading to the next, that stays: a load (steps
            # add up to as much only over many readings)
            if value - last[1] >= p.load_jump_ratio * self.budget:
                self._jump = (t, last[1])
            elif self._jump is not None and t - self._jump[0] >= p.envelope_seconds:
                at, before = self._jump
                self._jump = None
                if min(v for s, v in self._raw if s >= at) > before + 0.5 * p.load_jump_ratio * self.budget:
                    self._reload(at)
        keep = p.max_envelope_seconds * 2 + p.hold_seconds
        self._raw.append((t, value))
        while self._raw[0][0] < t - keep:
            self._raw.popleft()
        # the floor of the median of three: one low reading (a sampling glitch, a noise
        # outlier) would otherwise hold the floor down for a whole window
        a, b = self._prev2
        self._prev2 = (b, value)
        self._env.push(t, sorted((a, b, value))[1] if a is not None and b is not None else value, keep)
        if self._updates % 32 == 1:
            self._noise()
        if self._loading_since is not None:
            self._load(t, value)
            return self._report(t, warming_up=self._loading_since is not None)
        return self._track(t, value)

    # -- the load ---------------------------------------------------------------------------

    def _begin_load(self, t: float) -> None:
        self._loading_since = t
        self._load_top = self._load_creep = -math.inf
        self._load_rise_t = self._load_creep_t = t
        self._level = None
        self._candidate, self._below_since, self._jump, self._pending = None, None, None, []
        self._trace.clear()
        self._prev2 = (None, None)

    def _flush(self, t: float) -> None:
        """The series ends here (a restart, a gap): steps still in their hold count if the readings
        show their jumps, each held to the end (a spike's jump is given back).

        A leak is often ended by the out-of-memory its last steps caused, before they could hold.
        """
        if self._level is None or self._loading_since is not None:
            return
        tau = self._jump_threshold(self._k())
        raw = [(s, v) for s, v in self._raw if s >= self._quiet_since]
        aged = max(self.p.hold_seconds / 2, 2 * self._dt)  # a spike that is still up is no step
        rises = [(b[0], b[1] - a[1]) for a, b in zip(raw, raw[1:]) if b[1] - a[1] > tau and t - b[0] >= aged]
        floor = self._level
        for when, rise in self._held(rises, raw, self._level):
            self._add(Step(t=when, size=rise, found_at=t, before=floor))
            floor += rise
        self._candidate = None

    def _reload(self, t: float) -> None:
        """A jump the size of a KV pool: a load (another engine's, or this one's after a long compile).

        Soon after a load seemed over, it was not: the steps found since were the load too.
        """
        if t - self._loaded_at <= 10 * self.p.settle_seconds:
            self._steps = [s for s in self._steps if s.t < self._loaded_at - self.p.settle_seconds]
        self._base = None  # a new allocation: the floor after it is the new baseline
        self._begin_load(t)

    def _load(self, t: float, value: float) -> None:
        """Over when memory has not risen by 1% of the budget for settle_seconds, nor by k for one window.

        The big rises are the load's phases (weights, KV pool) with pauses for profiling and
        compiling between them; the small ones its CUDA graphs, captured last.
        """
        p = self.p
        if value > self._load_top + max(self._k(), 0.01 * self.budget):
            self._load_top = value
            self._load_rise_t = t
        if value > self._load_creep + self._k():
            self._load_creep = value
            self._load_creep_t = t
        assert self._loading_since is not None
        if (
            t - self._load_rise_t >= p.settle_seconds
            and t - self._load_creep_t >= p.envelope_seconds
            and t - self._loading_since >= p.warmup_seconds
        ):
            self._end_load(t)

    def _end_load(self, t: float) -> None:
        self._loading_since = None
        self._loaded_at = t
        self._level = self._env.min_since(t - self.p.envelope_seconds)
        if self._base is None:
            self._base = self._level
        self._touch, self._touch_floor = t, -math.inf  # the first return to the floor starts the count
        self._quiet_since = t
        self._floor_t = -math.inf

    # -- the floor and its steps ---------------------------------------------------------------

    def _window(self, t: float) -> float:
        """1.5 × the longest recent stretch off the floor: the background's period."""
        p = self.p
        gaps = self._gaps  # a sliding maximum: lengths decrease from the front
        while gaps and gaps[0][0] < t - p.leak_window_seconds:
            gaps.popleft()
        longest = gaps[0][1] if gaps else 0.0
        return min(p.max_envelope_seconds, max(p.envelope_seconds, 1.5 * longest, 4 * self._dt))

    def _track(self, t: float, value: float) -> LeakReport:
        p = self.p
        assert self._level is not None
        k = self._k()
        # time off the floor of the last hour is the background's period; stretches that held a
        # step, a load or memory given back say nothing about it
        hour_floor = self._env.min_since(max(t - p.max_envelope_seconds, self._loaded_at))
        near = max(p.min_step_ratio * self.budget / 2, 0.1 * self._spread)  # the floor's tenth of the background
        if value <= hour_floor + near:
            # the memory came back down to its floor: that long off it is the background's period
            # (not when the floor came up to the memory: a creep, or a step an hour old)
            if hour_floor <= self._touch_floor + near and t - self._touch > 2 * self._dt:
                gap = t - self._touch
                while self._gaps and self._gaps[-1][1] <= gap:
                    self._gaps.pop()
                self._gaps.append((t, gap))
            self._touch, self._touch_floor = t, hour_floor
        window = self._window(t)
        floor = self._env.min_since(max(t - window, self._loaded_at))  # the load's readings are no floor
        if t - self._floor_t >= window and self._candidate is None:
            self._floors.append(floor)
            self._floor_t = t
        self._trace.append((t, floor))
        while self._trace[0][0] < t - 2 * (window + p.hold_seconds):
            self._trace.popleft()
        new = self._held_jump(t, value, k, window)
        if new:
            return self._report(t, new)
        hold = max(p.hold_seconds, window / 2)
        c = self._candidate
        if floor > self._level + k:
            self._below_since = None
            if c is None:
                c = self._candidate = _Candidate(t, floor, t)
            elif floor > c.plateau + k or floor < c.plateau - k:
                quick = self._abrupt(window)
                held = t - c.plateau_since >= min(hold, max(p.hold_seconds / 2, 4 * self._dt, window / 2))
                if floor > c.plateau and held and self._rose_within(c.plateau, quick):
                    new = self._confirm(t, c.plateau, window)  # a plateau, and another step on it: not a spike
                    self._candidate = _Candidate(t, floor, t)
                else:
                    c.plateau, c.plateau_since = floor, t
            elif t - c.plateau_since >= hold:
                new = self._confirm(t, floor, window)
                self._candidate = None
            elif t - c.since > 2 * hold:  # still rising: a dense staircase (its jumps show) or a creep
                new = self._confirm(t, floor, window)
                self._candidate = None
        else:
            self._candidate = None  # fell back, if it had risen: a spike or a tooth
            if floor < self._level - k:
                self._below_since = self._below_since if self._below_since is not None else t
                if t - self._below_since >= hold:
                    self._give_back(t, floor)
            else:
                self._below_since = None
        return self._report(t, new)

    def _held_jump(self, t: float, value: float, k: float, window: float) -> tuple[Step, ...]:
        """A jump between two readings, held for a window: a step, known before the floor shows it.

        Where the readings are smooth enough to show it (a slow sawtooth's flank, noise well under
        the step) this is a period or more sooner than the floor; a spike or a tooth given back
        within the window is none.
        """
        assert self._level is not None
        tau = self._jump_threshold(k)
        if len(self._raw) >= 2:
            before = self._raw[-2][1]
            if value - before > tau:
                self._pending.append((t, before, value - before))
        if not self._pending:
            return ()
        kept = [(s, b, r) for s, b, r in self._pending if value >= b + 0.5 * r]
        if len(kept) < len(self._pending):  # given back: jumps like it belong to the background here
            self._jump_back_t = t
            self._jump_back = max(r for s, b, r in self._pending if (s, b, r) not in kept)
        self._pending = kept
        if not kept or t - kept[0][0] < max(window, self.p.hold_seconds / 2):
            return ()
        when, _, rise = self._pending.pop(0)
        if t - self._jump_back_t < self.p.max_envelope_seconds and self._jump_back >= 0.5 * rise:
            return ()  # spikes, an aliased sawtooth: the floor will tell
        # less what the background rises by between two readings anyway (a sawtooth's flank)
        earlier = [v for s, v in self._raw if when - window <= s < when]
        drift = median(b - a for a, b in zip(earlier, earlier[1:])) if len(earlier) > 2 else 0.0
        rise -= max(0.0, drift)
        step = Step(t=when, size=rise, found_at=t, before=self._level)
        self._level += rise
        self._candidate = None
        self._quiet_since = t
        self._floors.clear()
        self._add(step)
        return (step,)

    def _confirm(self, t: float, plateau: float, window: float) -> tuple[Step, ...]:
        """A raised floor that held: a step if it rose abruptly, drift if it crept."""
        assert self._level is not None
        level = self._level
        size = plateau - level
        self._level = plateau
        if size < 1.5 * self._k() or not self._rose_within(plateau, self._abrupt(window), level):
            return ()  # the floor crept up: drift, not a step
        jumps, visible = self._jumps(plateau, size, window, level)
        if not jumps and visible:
            return ()  # the readings would show a jump this big, and show none: the floor crept
        self._quiet_since = t
        self._floors.clear()  # the floor's jitter is measured between steps, not across them
        if len(jumps) > 1:  # steps closer than the background's period: the readings show each one
            steps, floor = [], level
            for when, rise in jumps:
                steps.append(Step(t=when, size=rise, found_at=t, before=floor))
                floor += rise
            for step in steps:
                self._add(step)
            return tuple(steps)
        when = jumps[0][0] if jumps else self._change_point(plateau, size, window)
        size = self._size(when, t, window, size) or size
        step = Step(t=when, size=size, found_at=t, before=level)
        last = self._steps[-1] if self._steps else None
        recent = last is not None and last.given_back_at is None and t - last.found_at <= 2 * window
        if last is not None and recent and (step.t - last.t < window / 2 or size < 0.5 * last.size):
            # the floor of a sawtooth rises in stages as the old troughs leave the window: one step
            step = replace(last, size=last.size + size, found_at=t)
            self._steps[-1] = step
            return (step,)
        self._add(step)
        return (step,)

    def _jumps(self, plateau: float, size: float, window: float, level: float) -> tuple[list[tuple[float, float]], bool]:
        """The rises between two readings that made this step, (when, how much), and whether
        the readings are smooth enough that no such rise means a creep (not noise or a sawtooth
        faster than the sampling).

        Rises that do not add up to the floor's (a spike's among them) are not used; the sizes
        are scaled to the floor's.
        """
        low = next((s for s, v in reversed(self._trace) if v <= level + 0.25 * size), self._trace[0][0])
        since = max(low - 1.5 * window, self._loaded_at)  # the floor lags the readings by a window
        if self._steps and self._steps[-1].given_back_at is None:
            since = max(since, self._steps[-1].t + self._dt / 2)  # not the last step's own jump
        raw = [(s, v) for s, v in self._raw if s >= since]
        tau = self._jump_threshold(self._k())
        found: list[tuple[float, float]] = []
        last = -2
        for i in range(1, len(raw)):
            rise = raw[i][1] - raw[i - 1][1]
            if last == i - 1 and rise > tau / 3:  # one step sampled mid-rise: two readings
                found[-1] = (found[-1][0], found[-1][1] + rise)
                last = i
            elif rise > tau:
                found.append((raw[i][0], rise))
                last = i
        found = self._held(found, raw, level)
        visible = tau < 0.6 * size
        total = sum(r for _, r in found)
        if not 0.6 * size <= total <= 1.5 * size:
            # spikes or sawtooth teeth among them: not these, but a jump seen is still a jump
            return [], visible and not any(r >= 0.5 * size for _, r in found)
        return [(when, rise * size / total) for when, rise in found], visible

    def _jump_threshold(self, k: float) -> float:
        """A rise between two readings that noise does not make: a step's jump."""
        return max(1.5 * k, 6 * self._sigma)

    @staticmethod
    def _held(rises: list[tuple[float, float]], raw: list[tuple[float, float]], level: float) -> list[tuple[float, float]]:
        """The rises the readings kept (never falling back below half of one, over the floor so far);
        a spike's jump is given back."""
        held, floor = [], level
        for when, rise in rises:
            if min(v for s, v in raw if s >= when) >= floor + 0.5 * rise:
                held.append((when, rise))
                floor += rise
        return held

    def _size(self, when: float, t: float, window: float, floors: float) -> float | None:
        """The step's size as the readings' median after it less their median before it.

        Unbiased where the floors are not (a minimum over noise sits lower the more
        readings it sees), for readings tight around their level; a background's
        readings (a sawtooth) are left to the floors.
        """
        span = min(t - when, window)
        before = sorted(v for s, v in self._raw if when - span <= s < when)
        after = sorted(v for s, v in self._raw if when <= s <= t)
        if len(before) < 4 or len(after) < 4:
            return None
        for side in (before, after):  # the lower half's spread: upward spikes leave it alone
            n = len(side)
            if side[n // 2] - side[n // 10] > floors / 2:
                return None
        size = after[len(after) // 2] - before[len(before) // 2]
        return size if size > 0 else None

    def _abrupt(self, window: float) -> float:
        """How fast a step lifts the floor: within half a window (the last low readings of the
        old floor leave it; a sawtooth's troughs leave it one by one), where a creep takes longer."""
        return max(0.5 * window, self.p.hold_seconds / 6, 6 * self._dt)

    def _rose_within(self, plateau: float, seconds: float, level: float | None = None) -> bool:
        """The floor went from a quarter to three quarters of the way to the plateau within ``seconds``."""
        level = self._level if level is None else level
        assert level is not None
        size = plateau - level
        low = next((s for s, v in reversed(self._trace) if v <= level + 0.25 * size), self._trace[0][0])
        high = next((s for s, v in self._trace if s >= low and v >= level + 0.75 * size), self._trace[-1][0])
        return high - low <= seconds

    def _change_point(self, new_floor: float, size: float, window: float) -> float:
        """When the step happened, erring late: never on the flank of the tooth it sits on.

        After the last reading under the new floor the step may have happened at any
        time; the first reading above the old readings' top proves it had (on a flat
        series that is the step's first reading, on a sawtooth the first tooth that
        peaks higher). Without such a reading, the first one on the new floor.
        """
        margin = min(0.5 * size, max(0.25 * size, 2 * self._sigma))
        start = None
        for s, v in reversed(self._raw):
            if v < new_floor - margin:
                break
            start = s
        if start is None:
            return self._raw[-1][0]
        before = sorted(v for s, v in self._raw if start - window <= s < start)
        if before:
            top = before[int(0.98 * (len(before) - 1))] + margin
            proof = next((s for s, v in self._raw if s >= start and v > top), None)
            if proof is not None:
                return proof
        return next((s for s, v in self._raw if s >= start and v <= new_floor + margin), start)

    def _give_back(self, t: float, floor: float) -> None:
        assert self._level is not None
        drop = self._level - floor
        for i in range(len(self._steps) - 1, -1, -1):  # the newest held steps are given back first
            step = self._steps[i]
            if step.given_back_at is not None:
                continue
            if drop < step.size / 2:
                break
            why = "transient" if t - step.found_at <= self.p.regret_seconds else "freed"
            self._steps[i] = replace(step, given_back_at=t, ended_by=why)
            self._ended.append(self._steps[i])
            drop -= step.size
        self._level = floor
        self._below_since = None
        self._quiet_since = t

    def _add(self, step: Step) -> None:
        self._steps.append(step)
        del self._steps[: -self._history_limit]

    def _end_held(self, t: float, why: str) -> None:
        for i, step in enumerate(self._steps):
            if step.given_back_at is None:
                self._steps[i] = replace(step, given_back_at=t, ended_by=why)
                self._ended.append(self._steps[i])

    # -- noise ----------------------------------------------------------------------------------

    def _noise(self) -> None:
        recent = sorted(v for _, v in itertools.islice(reversed(self._raw), 300))
        if len(recent) >= 10:  # how far the background spreads above its floor: p10 to p90
            self._spread = recent[9 * len(recent) // 10] - recent[len(recent) // 10]
        if len(self._diffs) >= 10:
            # MAD of first differences: sigma of the readings, robust to the steps themselves
            self._sigma = 1.4826 * median(self._diffs) / math.sqrt(2)
        if len(self._floors) >= 6:
            diffs = [abs(b - a) for a, b in zip(self._floors, list(self._floors)[1:])]
            self._sigma_floor = 1.4826 * median(diffs) / math.sqrt(2)

    def _k(self) -> float:
        """Half the smallest step worth finding, or the floor's jitter, whichever is larger."""
        k = self.p.min_step_ratio * self.budget / 2
        jitter = self._sigma if self._sigma_floor is None else min(self._sigma, self._sigma_floor)
        return max(k, self.p.noise_factor * jitter)

    # -- the report ---------------------------------------------------------------------------------

    def _report(self, t: float, new: tuple[Step, ...] = (), warming_up: bool = False) -> LeakReport:
        p = self.p
        ended, self._ended = tuple(self._ended), []
        held = [s for s in self._steps if s.given_back_at is None and t - s.t <= p.leak_window_seconds]
        # a step counts towards a leak once it has outlived the regret window: until then it
        # may still be a long spike, and three spikes at once are not a leak
        settled = [s for s in held if t - s.found_at >= p.regret_seconds]
        overhang = 0.0
        if self._base is not None and self._level is not None and not warming_up:
            overhang = max(0.0, self._level - self._base)
        rise_needed = p.leak_rise_ratio * self.budget
        # the floor's rise that no step explains, held for an hour: a creep (one big step is a
        # step, not a leak; a floor that rises and falls back over hours is a slow background)
        rise = overhang - sum(s.size for s in self._steps if s.given_back_at is None)
        if rise < rise_needed:
            self._creep_since = None
        elif self._creep_since is None:
            self._creep_since = t
        crept = self._creep_since is not None and t - self._creep_since >= p.max_envelope_seconds
        leak = len(settled) >= p.leak_steps or crept
        confidence = min(1.0, max(len(settled) / p.leak_steps, max(0.0, rise) / rise_needed))
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
            given_back=ended,
            slope=slope,
            time_to_exhaustion=tte,
            confidence=confidence,
            leak=leak,
            warming_up=warming_up,
        )


@dataclass(frozen=True)
class Episode:
    """A leak that was present: from its first step to the restart (or freeing) that ended it."""

    start: float
    end: float | None  # None: still present at the end
    steps: tuple[Step, ...]
    ended_by: str | None  # "restart", "freed"

    @property
    def rise(self) -> float:
        return sum(s.size for s in self.steps)


def episodes(steps: tuple[Step, ...] | list[Step], params: LeakParams) -> list[Episode]:
    """The leaks over a whole log, in hindsight: the steps each life held (transients left out),
    where ``leak_steps`` of them fell inside ``leak_window_seconds``.

    The live verdict describes the present; a log's reader wants to know that the
    engine leaked three steps and was then restarted by its out-of-memory.
    """
    lives: dict[tuple[float | None, str | None], list[Step]] = {}  # by the restart that ended them
    for step in steps:
        if step.ended_by != "transient":
            lives.setdefault((step.given_back_at, step.ended_by), []).append(step)
    found = []
    for (end, why), held in lives.items():
        times = [s.t for s in held]
        if any(sum(1 for u in times if t <= u <= t + params.leak_window_seconds) >= params.leak_steps for t in times):
            found.append(Episode(held[0].t, end, tuple(held), why))
    return sorted(found, key=lambda e: e.start)
