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
   engine turned healthy (``ready``). After a gap in the readings a load is
   waited out only where the memory came back lower than the level it left;
   came back no lower, steps are looked for from the first reading after the
   gap, and the level is read again a window later (no lower than it was).
2. **A tooth read slower than it repeats, taken off.** Where readings come
   ``unfold_interval_seconds`` apart or more, a tooth whose phase the readings
   fold by (``alias.py``) is taken off each reading, and the readings kept are
   read again when one is found or lost (the jumps waiting to hold measured
   again on them): the rest of the method sees the level. A fold a little off
   in phase can take a whole tooth too much off a step's first reading, at the
   tooth's wrap: a jump of the tooth's height a reading or two later, before
   the step held, is the rest of that step.
3. **The floor on the background's own time scale.** The level is the lower
   envelope: the minimum (of a median of three readings) over a window
   ``W``, 1.5× the longest time the memory recently stayed off its floor
   (the background's period: a sawtooth's tooth, a spike), at least
   ``envelope_seconds``: from returns to the hour's floor (to the floor the
   memory left, as near as was asked when it left: one a step higher is no
   return), and from two excursions alike between troughs (``period.py``),
   since a staircase
   with a step about once per period never returns to an old floor. A
   rising flank is then not a staircase, and a step under a tall tooth
   still lifts the floor.
4. **A step** is the envelope above the floor by ``k`` for ``hold_seconds``
   (or ``W / 2`` if longer), reached *abruptly*: a floor that took more than
   half a window to rise, or rose where the readings are smooth enough to
   show a jump and show none, crept — drift, absorbed into the floor (and
   counted by the creep rule), not a step; so, where the floor crept within
   the hour, is one whose window still holds the readings before a jump more
   than twice its rise (it rose by what the creep added since the level was
   set; the jump is the step, found by itself: a spike's jump, on a
   background that does not creep, leaves a real small step alone). ``k`` is half the smallest step
   of interest or ``noise_factor`` sigmas of the envelope's own jitter,
   whichever is larger. Steps closer than a window are told apart by their
   jumps (not a tooth's wrap that a step just after it held up: the wrap a
   period before explains it).
   Sooner: a jump between two readings that holds for a window is a step
   at once (on a slow sawtooth a period before the floor shows it), unless
   jumps like it were given back lately (spikes, an aliased sawtooth) or
   the background's period places the step elsewhere (a tooth's wrap that
   a step held up) or has found it already (below); a jump back from a dip
   (the readings fell under the level at once and came back to where they
   fell from) is a step only by what it rose above the level, one from a
   trough the readings sank to by degrees by all of it. Where the readings
   repeat with a period (in readings, however the sampling aliases it:
   ``step_shape.period_lag``, refitted every 300 readings or half an
   hour; two readings where a tooth read every two and a half periods
   alternates), a period of readings each above the one a period before
   by more than 4× the noise there, held for two periods and a window, is
   a step whatever ``k`` is: an aliased tooth makes the floor jitter by
   more than a 1% step.
5. **When.** Where the readings repeat with a period (however the sampling
   aliases it), the first reading that the one a period before it does not
   explain, nor any after it back down (as far as the period's own drift
   alone could not take them there: ``step_shape.seasonal_change``): a
   tooth's wrap is a jump, and an aliased tooth's top comes round only
   with its phase, so neither dates a step there (a step the floor or a
   jump found first, up to a period before that reading, takes its date,
   unless it is of that size and its own reading is up a period apart
   too: its jump, not a wrap). Else the jump where the
   readings show one (a spike sampled once that came down less than it went
   up: the lower reading); else the first reading that proves the step (above the
   old readings' top, no higher than the step lifts it, and with the next
   one above it too where the readings repeat: ``step_shape.change_point``),
   else the first on the new floor; never the start of the flank it may
   sit on, nor of a spike it came inside (its fall: erring late). Where
   the readings have a period, the first on the new floor is
   often a trough from before the step (an aliased tooth's floor), so a
   reading that proves the step within a window after it was found (and
   before the next step) dates it instead.
6. **Given back.** The envelope below the floor for a hold gives the newest
   steps back, each once it is under the step's middle (so a floor sinking
   by degrees gives it back too), or the one recent step the fall is the
   size of (a spike that held a step inside it leaves the step; one held
   with the step inside it leaves the step its readings show):
   ``transient`` if that happens within ``regret_seconds`` of their finding
   (a long spike, a tooth) or the floor sank back slowly rather than fell
   (an aliased sawtooth: up at once, down for hours), ``freed`` otherwise
   (always for a step held until a gap in the log: it held as long as the
   log showed it); a fall of ``restart_drop_ratio`` is a restart and gives
   back everything (``restart``); memory that resumes after a gap under a
   step's middle gives it back (``freed``: a restart nobody logged). A step
   given back and found again at its own reading was never given back: it is
   held again, not reported twice.

Why an envelope rather than a CUSUM on a median, or a regression
(``predict_linear``): both see a sawtooth's flank as a rise and a spike as
a step; the floor of a background is what a leak moves. ``bench/detector.py``
measures it on seeded realistic logs.

Pure: ``update(t, value)`` with time as an argument; no clock, no I/O.
``finish(t)`` is hindsight at a log's end (``guardian analyze``).
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import median, median_high

from guardian.analysis.alias import Unfolder
from guardian.analysis.envelope import Envelope
from guardian.analysis.leak_rule import LeakParams, LeakReport, Step, judge
from guardian.analysis.model_load import Load
from guardian.analysis.noise import Noise
from guardian.analysis.period import Excursions
from guardian.analysis.step_shape import (
    Doubt,
    Jumps,
    Season,
    alike,
    came_down,
    change_point,
    gives_back,
    held_rises,
    jumps,
    moved_within,
    period_lag,
    proves,
    seasonal_change,
    step_size,
    unmatched_rises,
)


@dataclass
class _Unproven:
    """A step dated where no reading proved it yet: a reading above the old top before ``until`` dates it."""

    step: Step
    doubt: Doubt
    until: float
    single: float | None = None  # the first reading above the top alone, taken if no two in a row come


@dataclass
class _Candidate:
    """The floor above the level: since when, and the plateau it has held since plateau_since."""

    since: float
    plateau: float
    plateau_since: float


class LeakDetector:
    """One memory series: per-process GPU memory, device used, or host RSS."""

    def __init__(self, budget: float, capacity: float | None = None, params: LeakParams | None = None) -> None:
        self.p = params or LeakParams()
        self.budget = budget
        self.capacity = capacity
        self._env = Envelope()
        self._raw: deque[tuple[float, float]] = deque()
        self._trace: deque[tuple[float, float]] = deque()  # (t, floor): how fast a floor rose
        self._prev2: tuple[float | None, float | None] = (None, None)
        self._noise = Noise()
        self._floor_t = -math.inf  # when the floor was last sampled for its own jitter
        self._updates = 0
        self._last: tuple[float, float] | None = None
        self._dts: deque[float] = deque(maxlen=31)
        self._dt = 1.0
        self._loading: Load | None = None  # None: loaded
        self._loaded_at = -math.inf  # when the last load ended (or readings resumed after a gap)
        self._reread_at: float | None = None  # when the level is read again after a gap
        self._level: float | None = None
        self._base: float | None = None
        self._touch = -math.inf
        self._creep_since: float | None = None  # the floor has risen by leak_rise_ratio without steps since
        self._touch_floor = math.inf  # the hour's floor at the last touch
        self._touch_near = math.inf  # and how near to it the memory was to come to count as back on it, then
        self._gaps: deque[tuple[float, float]] = deque()  # (when closed, length): time off the floor, longest first
        self._excursions = Excursions()  # time off the floor from troughs, however high the floor has risen
        self._last_excursion: float | None = None
        self._last_stepped = False  # the last excursion held a step
        self._quiet_since = -math.inf  # when the level was last set: a load, a step, memory given back
        self._candidate: _Candidate | None = None
        self._jump: tuple[float, float] | None = None  # a jump the size of a load: (when, the reading before)
        self._pending: list[tuple[float, float, float]] = []  # jumps not yet held a window: (when, before, rise)
        self._doubted: set[float] = set()  # pending jumps an alike one given back came on (``_held_jump``): when
        self._given_back: deque[tuple[float, float]] = deque()  # jumps given back (spikes, wraps): (when, size)
        self._below_since: float | None = None
        self._steps: list[Step] = []
        self._ended: list[Step] = []  # given back since the last report
        self._history_limit = 1000
        self._season: Season | None = None  # the readings' period
        self._season_at = 0  # the update it was fitted at
        self._periodic_seen = -math.inf  # the newest reading ``_periodic_step`` has looked at
        self._unproven: list[_Unproven] = []
        self._crept_at = -math.inf  # when the floor last rose by a creep
        self._unfold = Unfolder()  # a tooth sampled slower than it repeats, taken off the readings

    # -- what the caller knows ------------------------------------------------------------

    def restart(self, t: float) -> None:
        """The process restarted: what it held is given back, and a load begins."""
        self._flush(t)
        self._end_held(t, "restart")
        self._base = None
        self._begin_load(t)

    def ready(self, t: float) -> None:
        """The engine turned healthy: its load is over, whatever the memory says."""
        if self._loading is not None and self._raw:
            self._end_load(t)

    def finish(self, t: float) -> LeakReport:
        """The log ends here (hindsight only): steps still in their hold count where the readings show their jumps.

        A log cut within a window and a hold of a step (on a slow sawtooth, most of an hour) would
        otherwise leave it out, though the readings show it.
        """
        before = len(self._steps)
        self._flush(t)
        for u in list(self._unproven):
            self._prove(u, t, ended=True)
        return self._report(t, tuple(self._steps[before:]), warming_up=self._loading is not None)

    # -- the stream -------------------------------------------------------------------------

    def update(self, t: float, value: float | None) -> LeakReport:
        if value is None or math.isnan(value):
            return self._report(t)
        p = self.p
        self._updates += 1
        if self._loading is None and self._dt >= p.unfold_interval_seconds:
            was, refinding = self._unfold.fold, self._unfold.refinding
            value = self._unfold.correct(t, value, self._season is not None)
            if self._unfold.read_again is not None:
                self._refold(self._unfold.read_again, anew=(was is None) != (self._unfold.fold is None))
            if refinding and not self._unfold.refinding:
                self._relevel(t)
        last = self._last
        if last is not None:
            self._dts.append(t - last[0])
            if self._updates < 32 or self._updates % 16 == 0:
                self._dt = max(1e-3, median(self._dts))
            self._noise.diffs.append(abs(value - last[1]))
        self._last = (t, value)
        if last is None:
            self._begin_load(t)
        elif self._level is not None and value < self._level - p.restart_drop_ratio * self.budget:
            self.restart(t)
        elif t - last[0] > max(10 * self._dt, 300.0):
            # nothing seen for a while: what rose meanwhile is not a step we can place
            resumed = self._level is not None and value >= self._level - self._noise.jump_threshold(self._k())
            self._flush(last[0])  # as of the last reading: a jump up then had held only until it, not through the gap
            if resumed:
                self._resume(t)
            else:
                self._begin_load(t)
        elif self._loading is None and self._level is not None:
            # a jump of a KV pool's size from one reading to the next, that stays: a load (steps
            # add up to as much only over many readings)
            if value - last[1] >= p.load_jump_ratio * self.budget:
                self._jump = (t, last[1])
            elif self._jump is not None and t - self._jump[0] >= p.envelope_seconds:
                at, before = self._jump
                self._jump = None
                if min(v for s, v in self._raw if s >= at) > before + 0.5 * p.load_jump_ratio * self.budget:
                    self._reload(at)
        self._raw.append((t, value))
        while self._raw[0][0] < t - self._keep():
            self._raw.popleft()
        self._push_floor(t, value)
        if self._updates % 32 == 1:
            self._noise.estimate(reversed(self._raw))
        if self._updates - self._season_at >= min(300, max(32, 1800 / self._dt)):
            self._season_at = self._updates
            if self._loading is None:  # the load's readings have no period, and nothing reads one while it lasts
                newest = itertools.islice(reversed(self._raw), 300)
                loaded = [v for s, v in itertools.takewhile(lambda r: r[0] >= self._loaded_at, newest)]
                self._season = period_lag(loaded[::-1])
        if self._loading is not None:
            p = self.p
            if self._loading.over(t, value, self._k(), self.budget, p.settle_seconds, p.envelope_seconds, p.warmup_seconds):
                self._end_load(t)
            return self._report(t, warming_up=self._loading is not None)
        if self._dt >= p.unfold_interval_seconds and self._unfold.refinding:
            # after a restart no step is looked for until the last life's tooth is looked for again (20 readings): the
            # readings carry it at a phase no one knows yet. Found, it is taken off the readings kept (``_refold``) and
            # the level (``_relevel``), and a step among them is found on readings without it
            return self._report(t)
        return self._track(t, value)

    def _refold(self, history: dict[float, float], anew: bool) -> None:
        """A tooth was found, refitted or lost: the readings kept are read again (``history``) with it taken off
        as it is known now (or left on), so that the floor does not move by the change (a floor of readings with the
        tooth is higher; a refit's phase a little off moves every reading by part of the tooth); found or lost
        (``anew``), their jitter and period are read again too."""
        if len(self._raw) < 3:
            return
        t = self._raw[-1][0]
        window = self._window(t)
        was = self._floor(t, window)
        self._raw = deque((s, history.get(s, v)) for s, v in self._raw)
        self._env, self._prev2 = Envelope(), (None, None)
        for s, v in self._raw:
            self._push_floor(s, v)
        self._last = self._raw[-1]
        if anew:
            self._noise.diffs.clear()
            self._noise.diffs.extend(abs(b - a) for (_, a), (_, b) in itertools.pairwise(self._raw))
            self._season = None
            # and the time they spent off their floor was the tooth's: the background's period is read again
            self._gaps.clear()
            self._excursions.reset()
            self._last_excursion, self._last_stepped = None, False
        # the floor of readings with the tooth on stood above the level by part of it: all that was measured
        # from that floor moves with it
        shift = self._floor(t, window) - was
        if self._level is not None:
            self._level += shift
        if self._base is not None:
            self._base += shift
        if self._candidate is not None:
            self._candidate.plateau += shift
        moved = {id(s): replace(s, before=s.before + shift) for s in self._steps if s.given_back_at is None}
        self._steps = [moved.get(id(s), s) for s in self._steps]
        for u in self._unproven:
            u.step = moved.get(id(u.step), u.step)
        self._rejump()

    def _rejump(self) -> None:
        """The jumps pending, measured again on the readings as they are read now: a reading the tooth's old fit
        put a whole tooth off (at its wrap) made a jump back that the tooth, taken off as it is known now, does not."""
        tau = self._noise.jump_threshold(self._k())
        at = {s: i for i, (s, _) in enumerate(self._raw)}
        pending = []
        for when, _, _ in self._pending:
            i = at.get(when, 0)
            if i > 0 and (rise := self._raw[i][1] - self._raw[i - 1][1]) > tau:
                pending.append((when, self._raw[i - 1][1], rise))
        self._pending = pending

    def _relevel(self, t: float) -> None:
        """The tooth was looked for again after a restart: the level the load left is read again, as the floor of the
        readings since the load as they are now (it was read with the tooth on them, at a phase no one knew), and the
        base with it if the load set it. The floor's course since the load is traced too: none was while the tooth was
        looked for, and a step among those readings is dated from where the floor left the level (``_left``)."""
        assert self._level is not None
        start = self._loaded_at
        since = [(s, v) for s, v in self._raw if s >= start]
        values = [v for _, v in since]
        medians = [(s, sorted(three)[1]) for (s, _), three in zip(since[2:], zip(values, values[1:], values[2:]))]
        window = self._window(t)
        self._trace = deque((s, min(m for r, m in medians if s - window <= r <= s)) for s, _ in medians)
        first = [m for s, m in medians if s <= start + self._window(start)]
        if not first:
            return
        level = min(first)
        if self._base == self._level:
            self._base = level
        self._level = level

    # -- the load ---------------------------------------------------------------------------

    def _begin_load(self, t: float) -> None:
        self._loading = Load.begin(t)
        self._level, self._reread_at = None, None
        self._start_over()
        self._unfold.reset()

    def _start_over(self) -> None:
        """What was read from the readings before a restart or a gap proves nothing of what comes after it."""
        self._candidate, self._below_since, self._jump, self._pending = None, None, None, []
        self._doubted.clear()
        self._unproven.clear()
        self._trace.clear()
        self._prev2 = (None, None)
        self._excursions.reset()
        self._last_excursion, self._last_stepped = None, False
        self._season = None  # read a number of readings apart, which a gap breaks

    def _resume(self, t: float) -> None:
        """Readings resumed after a gap no lower than the level they left: no restart, or one whose load was over
        before they came back. There is no load to wait out (waiting for memory to stop rising took a step minutes
        after the gap for part of a load): steps are looked for from the first reading, and the level is read again
        once a window has passed (``_reread``). The tooth a fold takes off keeps its phase: no restart moved it."""
        self._start_over()
        self._floor_from(t)
        self._reread_at = t + self._window(t)

    def _reread(self, t: float) -> None:
        """A window after readings resumed from a gap: the level is where they left off, or higher where they came
        back higher (a rise during the gap, which nothing can place). Not lower: one window's floor on a background
        sampled near its period is as low as its beat takes it."""
        assert self._level is not None
        self._reread_at = None
        self._level = max(self._level, self._env.min_since(self._loaded_at))
        # steps held to the gap (``_flush``) stand above the level: the memory back under their middle freed them
        self._end_held(t, "freed", under=self._level)

    def _flush(self, t: float) -> None:
        """The series ends here (a restart, a gap): steps still in their hold count if the readings
        show their jumps, each held to the end (a spike's jump is given back; a tooth's wrap, no higher
        than the one a period before, is none).

        A leak is often ended by the out-of-memory its last steps caused, before they could hold.
        """
        if self._level is None or self._loading is not None:
            return
        tau = self._noise.jump_threshold(self._k())
        raw = [(s, v) for s, v in self._raw if s >= self._quiet_since]
        aged = max(self.p.hold_seconds / 2, 2 * self._dt)  # a spike that is still up is no step
        # where jumps like it were given back lately (spikes), one still up when the series ends must have
        # held as long as a step must
        spiky = self._spiky(t)
        long_aged = max(self.p.hold_seconds, self._window(t))
        moves = [(b[0], move) for a, b in zip(raw, raw[1:]) if abs(move := b[1] - a[1]) > tau]
        # where spikes come and go, a fall of a rise's size (within noise) gave it back, though a step since
        # holds the readings above where it rose from (elsewhere a fall is a tooth's, and gives back nothing)
        kept = unmatched_rises(moves, 3 * self._noise.sigma) if spiky else moves
        rises = [(when, rise) for when, rise in kept
                 if rise > 0 and t - when >= (long_aged if self._spiky(t, rise)
                                              and not came_down(raw, when, rise) else aged)]  # fmt: skip
        # the readings after a restart carry the last life's tooth until it is looked for again: a rise no taller
        # than it may be its flank or wrap
        rises = [(when, rise) for when, rise in rises if rise > self._unfold.hidden]
        # a tooth's wrap is a jump that the wrap a period before explains
        shown = self._shows if self._season is not None else None
        for step in _staircase(held_rises(rises, raw, self._level, shown), self._level, t):
            self._add(step)
        self._candidate = None

    def _reload(self, t: float) -> None:
        """A jump the size of a KV pool: a load (another engine's, or this one's after a long compile).

        Soon after a load seemed over, it was not: the steps found since were the load too.
        """
        if t - self._loaded_at <= 10 * self.p.settle_seconds:
            self._steps = [s for s in self._steps if s.t < self._loaded_at - self.p.settle_seconds]
        self._base = None  # a new allocation: the floor after it is the new baseline
        self._begin_load(t)

    def _end_load(self, t: float) -> None:
        self._loading = None
        self._floor_from(t)
        self._level = self._env.min_since(t - self.p.envelope_seconds)
        if self._base is None:
            self._base = self._level
        # after a gap in the log the memory may be back under steps held before it (a restart unseen)
        self._end_held(t, "freed", under=self._level)

    def _floor_from(self, t: float) -> None:
        """The readings from ``t`` are the floor's (a load ended, or readings resumed after a gap): what they show is
        looked for from there, and their first return to the floor starts the count of the background's period."""
        self._loaded_at = self._quiet_since = self._touch = t
        self._touch_floor, self._floor_t = -math.inf, -math.inf

    # -- the floor and its steps ---------------------------------------------------------------

    def _window(self, t: float) -> float:
        """1.5 × the longest recent stretch off the floor: the background's period."""
        p = self.p
        gaps = self._gaps  # a sliding maximum: lengths decrease from the front
        while gaps and gaps[0][0] < t - p.leak_window_seconds:
            gaps.popleft()
        longest = gaps[0][1] if gaps else 0.0
        return min(p.max_envelope_seconds, max(p.envelope_seconds, 1.5 * longest, 4 * self._dt))

    def _keep(self) -> float:
        """How long readings are kept: two of the longest windows and a hold."""
        return self.p.max_envelope_seconds * 2 + self.p.hold_seconds

    def _push_floor(self, t: float, value: float) -> None:
        """The floor takes the median of three readings: one low reading (a sampling glitch, a noise outlier)
        would otherwise hold it down for a whole window."""
        a, b = self._prev2
        self._prev2 = (b, value)
        self._env.push(t, sorted((a, b, value))[1] if a is not None and b is not None else value, self._keep())

    def _floor(self, t: float, window: float) -> float:
        """The lowest of the medians of three over the window, since the load (its readings are no floor)."""
        return self._env.min_since(max(t - window, self._loaded_at))

    def _off_floor(self, t: float, gap: float) -> None:
        while self._gaps and self._gaps[-1][1] <= gap:
            self._gaps.pop()
        self._gaps.append((t, gap))

    def _track(self, t: float, value: float) -> LeakReport:
        p = self.p
        assert self._level is not None
        k = self._k()
        if self._unproven:
            for u in list(self._unproven):
                self._prove(u, t)
        # time off the floor of the last hour is the background's period; stretches that held a
        # step, a load or memory given back say nothing about it
        hour_floor = self._env.min_since(max(t - p.max_envelope_seconds, self._loaded_at))
        near = max(p.min_step_ratio * self.budget / 2, 0.1 * self._noise.spread)  # the floor's tenth of the background
        if value <= hour_floor + near:
            # the memory came back down to its floor: that long off it is the background's period (not when the floor
            # came up to the memory: a creep, or a step an hour old). Back to the floor it left, not only to the hour's,
            # and as near to it as was asked when it left: spikes spread the readings, and ``near`` with them, as they
            # come and go, to more than a small step; a reading that noise took down after one came back within it of
            # the hour's floor, which still held the readings from before the step, and the hour the memory stood a
            # step higher was taken for the background's period
            reach = min(near, self._touch_near)
            back = value <= self._touch_floor + reach
            if back and hour_floor <= self._touch_floor + reach and t - self._touch > 2 * self._dt:
                self._off_floor(t, t - self._touch)
            self._touch, self._touch_floor, self._touch_near = t, hour_floor, near
        excursion = self._excursions.update(t, value, 2 * k)
        if excursion is not None:
            # a period repeats: two excursions in a row alike (spikes and noise come in any lengths), not both
            # holding a step (steps an hour apart, each ended by a spike's fall, make hour-long excursions alike:
            # the floor taken over the hour gave the steps back and missed the next; a sawtooth's period, a step
            # or two per period, has excursions without one)
            start, end = self._excursions.span
            stepped = any(start <= s.t <= end for s in self._steps[-3:])
            last, self._last_excursion = self._last_excursion, excursion
            last_stepped, self._last_stepped = self._last_stepped, stepped
            if (last is not None and min(last, excursion) > 2 * self._dt and max(last, excursion) <= 1.5 * min(last, excursion)
                    and not (stepped and last_stepped)):
                self._off_floor(t, min(last, excursion))
        window = self._window(t)
        floor = self._floor(t, window)
        if t - self._floor_t >= window and self._candidate is None:
            self._noise.floors.append(floor)
            self._floor_t = t
        self._trace.append((t, floor))
        while self._trace[0][0] < t - 2 * (window + p.hold_seconds):
            self._trace.popleft()
        if self._reread_at is not None and t >= self._reread_at:
            self._reread(t)
        new = self._held_jump(t, value, k, window) or self._periodic_step(t, window)
        if new or self._reread_at is not None:  # until the level is read again, a floor off it may be a rise in the gap
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
                if floor > c.plateau and held and moved_within(self._trace, self._level, c.plateau, quick):
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
                    self._give_back(t, floor, window)
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
        tau = self._noise.jump_threshold(k)
        # (a move across a gap is none: what rose meanwhile is not a step we can place)
        move = value - self._raw[-2][1] if len(self._raw) >= 2 and self._raw[-2][0] >= self._loaded_at else 0.0
        if self._one_noisy_reading(value):
            self._pending.pop()
            move = 0.0  # and its fall is no spike's
        if move > tau:
            self._pending.append((t, value - move, move))
        # a fall where spikes come and go (as jumps were given back lately, before this reading), or of the size of
        # a jump with a later one still pending, or of the newest step's (a recent one) and no pending jump's (a
        # spike, and a step taken while it was up: erring late, the step is the later jump, not a spike on the
        # earlier; where the fall gives back the newest jump, that was a spike on a step of its size)
        newest = self._newest_held()
        spike_fell = -move > tau and self._season is None and (
            self._spiky(t)
            or any(
                self._within_noise_gives_back(move, r) and not self._fell_since(s, r) for s, _, r in self._pending[:-1]
            )
            or (
                newest is not None
                and t - newest.t <= 2 * max(window, self.p.hold_seconds)  # a spike, not a step's half hour
                and self._within_noise_gives_back(move, newest.size)
                and not any(gives_back(move, r) for _, _, r in self._pending)
            )
        )
        if not self._pending and not spike_fell:
            return ()
        # given back: under half the jump above where it rose from, or above the floor if that is lower (a
        # step on a tooth's high phase stays above the trough it came from when the tooth falls)
        kept = [(s, b, r) for s, b, r in self._pending if value >= min(b, self._level) + 0.5 * r]
        if len(kept) < len(self._pending):  # given back: jumps like it belong to the background here
            self._given_back.append((t, max(r for s, b, r in self._pending if (s, b, r) not in kept)))
        if spike_fell:
            # a fall of a jump's size (within noise) gave it back, though a step taken while it was up holds the
            # readings over half of it (a step inside a spike; the step's own jump is left to be found); a
            # tooth's fall is only about a step's size. The jump closest in size to the fall, of those that did not
            # hold through a fall of their size already (``_fell_since``)
            fits = [j for j in kept if self._within_noise_gives_back(move, j[2]) and not self._fell_since(j[0], j[2])]
            if fits:
                kept.remove(min(fits, key=lambda j: abs(j[2] + move)))
            # no jump since the step explains the fall: the step may be the spike (a jump that came before the step
            # was found may be the step's own, which the floor took for a second step on it and so confirmed it)
            found = newest.found_at if newest is not None else -math.inf
            if not any(gives_back(move, r) for s, _, r in self._pending if s > found):
                self._spike_fell(t, -move, tau)
        # given back while an older jump of its size held: a spike on a step, or the step inside a spike that the older
        # jump was (a jump, and a fall of about its size, read a reading apart); the floor's levels tell which
        gone = [j for j in self._pending if j not in kept]
        self._doubted.update(k[0] for k in kept for j in gone if k[0] < j[0] and alike(k[2], j[2]))
        self._doubted.intersection_update(s for s, _, _ in kept)
        self._pending = kept
        if not kept or t - kept[0][0] < max(window, self.p.hold_seconds / 2):
            return ()
        if kept[0][0] in self._doubted:
            self._pending.pop(0)
            return ()  # a spike and a step, one on the other: the floor will tell which (``step_shape.jumps``)
        when, before, rise = self._later_of_alike(self._pending.pop(0))
        if self._spiky(t, rise):
            return ()  # spikes, an aliased sawtooth: the floor will tell
        if self._held_near(when, 1.5 * self._dt):
            return ()  # found already, read a period apart (``_periodic_step``)
        # less what the background rises by between two readings anyway (a sawtooth's flank)
        earlier = [v for s, v in self._raw if when - window <= s < when]
        drift = median(b - a for a, b in zip(earlier, earlier[1:])) if len(earlier) > 2 else 0.0
        rise -= max(0.0, drift)
        if before < self._level - k and self._dipped(earlier, before + rise, k, tau):
            rise = before + rise - self._level  # only what it rose above the level is a step
        if rise < tau:
            return ()  # the background's own rise, read a reading at a time (a flank sampled slowly)
        if self._season is None and before <= self._level + k:  # rose from the level (not from a spike's top)
            when, rise = self._kept_after_fall(when, before, rise, tau)
        if self._season is not None and self._wrap(when, rise):
            return ()  # a tooth's wrap, held up by the steps since: the floor will tell
        seasonal = self._period_date(when, rise, window)
        if seasonal is not None and abs(seasonal - when) > 1.5 * self._dt:
            return ()  # a tooth's wrap held up by a step the period places elsewhere: the floor will tell
        last = self._newest_held()
        fold = self._unfold.fold
        # the height of the tooth taken off, a reading or two after the newest step's jump, before it held: the fold,
        # a little off in phase, took a whole tooth off the step's first reading (at its wrap), and the step's rise
        # came short: the rest of that step
        rest = (
            last is not None
            and last.t < when < min(last.found_at, last.t + 3 * self._dt)
            and fold is not None
            and abs(rise - fold.amplitude) <= 0.25 * fold.amplitude
        )
        drifted = last is not None and last.t < when and last.found_at >= when - window and last.size < 0.5 * rise
        if drifted and not rest:
            # the floor rose by under half the jump, seen within a window before it: the readings' drift into the jump
            # (a ramp's creep, a tooth's), not a step of its own
            self._end(len(self._steps) - 1, t, "transient")
        before = self._level
        # the floor has had a window since the jump: it is the level now, if the rise (less the background's) fell short
        self._level = max(self._level + rise, self._floor(t, window))
        self._candidate = None
        self._quiet_since = when + self._dt / 2  # the readings after its jump may show more steps
        self._noise.floors.clear()
        if rest:
            assert last is not None
            return self._grow_newest(t, rise, last.t)
        step = Step(t=when, size=rise, found_at=t, before=before)
        self._add(step)
        return (step,)

    def _fell_since(self, when: float, rise: float) -> bool:
        """The readings fell by about ``rise`` after the jump at ``when``, before the newest: a spike ends at its first
        fall of its size, so a later one is another's (a slow tooth's wrap, a period after the last, where the tooth is
        about the step's height), and the jump held through it."""
        fall = self._first_fall(when, rise)
        return fall is not None and fall < self._raw[-1][0]

    def _first_fall(self, when: float, rise: float) -> float | None:
        """When the readings from ``when`` on first fell by about ``rise`` between two of them (``gives_back``): the
        reading the fall came into; None where they have not."""
        after = itertools.islice(self._raw, self._first_at(when), None)
        return next((b[0] for a, b in itertools.pairwise(after) if gives_back(b[1] - a[1], rise)), None)

    def _one_noisy_reading(self, value: float) -> bool:
        """The newest jump, into the reading before ``value``, was given back by it (to under half of the jump over
        where it rose from): noise on one reading, where readings come seconds apart. A step's memory stays
        allocated, and such readings see a background's wrap once a period, not at every jump."""
        if not self._pending or self._season is not None or self._dt >= self.p.unfold_interval_seconds:
            return False
        when, before, rise = self._pending[-1]
        return when == self._raw[-2][0] and value < before + 0.5 * rise

    def _later_of_alike(self, jump: tuple[float, float, float]) -> tuple[float, float, float]:
        """The jump held a window (when, before, rise), or where a second of its size came within a hold of it,
        while the first was up, and a fall of that size since gave one of the two back at once, that second one, from
        where the first rose, by what the readings kept. A spike and a step taken while it was up, or a step and a
        spike on it: the readings cannot tell which; erring late (by a hold at most), the step is the second, and is
        taken off the pending jumps here. (A tooth gives back by degrees.)"""
        when, before, rise = jump
        if self._season is not None:
            return jump  # jumps where the readings repeat are teeth
        later = next((j for j in self._pending if j[0] - when <= self.p.hold_seconds and alike(j[2], rise)), None)
        if later is None:
            return jump
        second, _, size = later
        if min(v for s, v in self._raw if when <= s < second) < before + 0.5 * rise:
            return jump  # the first was not up all along until the second came: a tooth that fell between them
        fall = self._first_fall(second, size)
        if fall is None:
            return jump
        kept = median(v for s, v in itertools.islice(self._raw, self._first_at(fall), None)) - before
        if not 0.5 * size <= kept < rise + 0.5 * size:
            return jump
        self._pending.remove(later)
        return second, before, kept

    def _dipped(self, earlier: list[float], top: float, k: float, tau: float) -> bool:
        """The readings of the window before a jump (``earlier``, oldest first; the jump rose to ``top``) were a dip
        under the level: they fell into it at once from the level, stayed under it, and the jump came back to where
        they fell from. Not a trough the background sank to (a sawtooth's, under a level a step's jump raised): that
        the readings reached by degrees, or by a tooth's wrap from far above where the jump rises to."""
        assert self._level is not None
        under = self._level - k
        for a, b in itertools.pairwise(reversed(earlier)):  # newest first: b is the older reading
            if b >= under:
                return b - a > tau and top >= b - k
        return False

    def _kept_after_fall(self, when: float, before: float, rise: float, tau: float) -> tuple[float, float]:
        """The jump at ``when`` (from the level at ``before``, by ``rise``) and where the readings stand since: where
        they fell by a jump since, to a level they held that is clearly under the jump's top and clearly over where it
        rose from, the jump was a spike's and the step came inside its fall (the readings cannot tell when between the
        two it came: erring late, at the fall), and is what the readings kept. Else the jump as it was."""
        after = [(s, v) for s, v in self._raw if s >= when]
        falls = [b[0] for a, b in itertools.pairwise(after) if a[1] - b[1] > tau]
        if not falls:
            return when, rise
        since = [v for s, v in after if s >= falls[-1]]
        kept = median(since) - before
        if len(since) >= 2 and tau <= kept <= rise - tau:
            return falls[-1], kept
        return when, rise

    def _spike_fell(self, t: float, fall: float, tau: float) -> None:
        """A fall of the newest step's size (within noise) and of no jump pending since it was found, with the
        readings still up by a jump since the step: the step was a spike the floor took for one (it outlasted a
        window and a hold, or a jump of its size on it looked like a second step), and the jump inside it is the
        step. The step takes that jump's date and size. With no jump inside it and the readings back where it rose
        from, the step was the spike alone, and is given back: one reading says so (the floor's median of three hides
        it, and a step taken as the spike falls again kept the spike's date)."""
        step = self._newest_held()
        if step is None or t - step.found_at > self.p.max_envelope_seconds:
            return
        if not self._within_noise_gives_back(-fall, step.size):
            return
        inside = [(b[0], b[1] - a[1]) for a, b in itertools.pairwise(r for r in self._raw if r[0] > step.t)]
        rises = [(when, rise) for when, rise in inside[:-1] if rise > tau]  # the newest move is the fall
        # where it rose from, as the readings before its jump stood (a reading, set against the level, a minimum, would
        # stand a noise's width over it)
        ahead = [v for s, v in self._raw if step.t - self._window(t) <= s < step.t]
        base = median(ahead) if ahead else step.before
        if rises:
            when, rise = max(rises, key=lambda r: r[1])
            # the readings fell to where that jump alone lifts them from the step's floor
            if abs(self._raw[-1][1] - base - rise) <= max(3 * self._noise.sigma, 0.25 * rise):
                self._steps[-1] = replace(step, t=when, size=rise)
        elif abs(self._raw[-1][1] - base) <= max(3 * self._noise.sigma, 0.25 * step.size):
            self._end(len(self._steps) - 1, t, "transient")
            self._level, self._candidate, self._quiet_since = step.before, None, t
            drift = self._steps[-2] if len(self._steps) > 1 else None
            if drift is not None and drift.ended_by == "transient" and drift.given_back_at == step.found_at:
                # the step taken back when the spike's jump was, as the readings' drift into it, stands: it was
                # a step of its own under a spike
                self._steps[-2] = replace(drift, given_back_at=None, ended_by=None)

    def _within_noise_gives_back(self, fall: float, rise: float) -> bool:
        """A fall (negative, as ``step_shape.gives_back`` takes it) of a rise's size to within the readings' noise (3
        sigma): the end of that rise's spike, told from a tooth's fall, which is only about a step's size
        (``step_shape.gives_back`` is looser: a quarter of the rise)."""
        return abs(rise + fall) <= 3 * self._noise.sigma

    def _spiky(self, t: float, rise: float = 0.0) -> bool:
        """Jumps were given back within the hour (spikes come and go here, or an aliased tooth's wraps), one at
        least half as tall as ``rise`` among them: a jump that tall may be one more, and must hold as a step must.
        Every one of the hour counts, not the last alone: a short small spike after a tall one does not make the
        next tall jump a step."""
        while self._given_back and t - self._given_back[0][0] >= self.p.max_envelope_seconds:
            self._given_back.popleft()
        return any(size >= 0.5 * rise for _, size in self._given_back)

    def _periodic_step(self, t: float, window: float) -> tuple[Step, ...]:
        """A period of readings each above the one a period before them, that held two periods (and a
        window and a hold): a step, where the readings repeat with a period.

        On a tall sawtooth that the sampling aliases, the floor's own jitter (the teeth's phases it
        happens to catch) is larger than a 1% step, and ``k`` with it; read a period apart the
        readings are as quiet as their noise, and the step stands out of them. Each reading is
        looked at once, when it has held that long (every one since the last looked at: a window that
        shrinks, as the longest time off the floor leaves the hour, must not skip the readings it
        passed over); ``seasonal_change`` dates and checks it.
        """
        if self._season is None or self._level is None:
            return ()
        raw = self._raw
        # held as long as the floor takes to show it too (else the floor, not up yet, gives it back)
        held = max(2 * self._season.lag, math.ceil(max(self.p.hold_seconds, window) / self._dt))
        newest = len(raw) - 1 - held
        if newest < 0:
            return ()
        first = newest  # the oldest reading not looked at yet
        while first > 0 and raw[first - 1][0] > self._periodic_seen:
            first -= 1
        for j in range(first, newest + 1):
            self._periodic_seen = raw[j][0]
            step = self._periodic_at(j, t, window)
            if step is not None:
                return (step,)
        return ()

    def _periodic_at(self, j: int, t: float, window: float) -> Step | None:
        """A new step whose first reading a period above the one before it is ``raw[j]`` (the level raised to it),
        or None: no step there, or one found already (which takes the period's date unless it is its jump, or the
        date is earlier and the move a period apart under half of it: a tooth's wrap that the step held up)."""
        assert self._season is not None and self._level is not None
        lag, noise, _ = self._season
        raw = self._raw
        if j - lag - 1 < 0 or raw[j - lag - 1][0] < self._loaded_at:
            return None
        threshold = max(self.p.min_step_ratio * self.budget / 2, 4 * noise)
        if not raw[j][1] - raw[j - lag][1] > threshold >= raw[j - 1][1] - raw[j - 1 - lag][1]:
            return None
        moves = [raw[i][1] - raw[i - lag][1] for i in range(j, j + lag)]
        if sum(m > threshold for m in moves) < 0.8 * lag:
            return None
        size = median(moves)
        when = seasonal_change(raw, raw[j][0] - self._dt / 2, size, self._season)
        if when is None or abs(when - raw[j][0]) > 1.5 * self._dt:
            return None
        found = [i for i, s in enumerate(self._steps) if s.t > raw[j][0] - lag * self._dt and s.given_back_at is None]
        if found:  # the floor or a jump found it first, dated it by a tooth: the period dates it better
            first = self._steps[found[0]]
            # one found before it, of its size and shown there a period apart too, is its jump (else a tooth's wrap)
            if first.t > raw[j][0] and size < 0.5 * first.size:
                return None  # not dated earlier by a move under half its size: a wrap that the steps since held up
            if first.t > raw[j][0] or not (alike(first.size, size) and self._shows(first.t, size)):
                self._steps[found[0]] = replace(first, t=when)
                self._steps.sort(key=lambda s: s.t)
            return None
        # the floor has had a window to show it: it is the level now, unless it took the step in already (as a
        # creep: no step then) and stands above it
        floor = self._floor(t, window)
        step = Step(t=when, size=size, found_at=t, before=min(self._level, floor - size))
        self._level = max(self._level, floor)
        self._candidate = None
        self._quiet_since = when + self._dt / 2
        self._noise.floors.clear()
        self._add(step)
        return step

    def _confirm(self, t: float, plateau: float, window: float) -> tuple[Step, ...]:
        """A raised floor that held: a step if it rose abruptly, drift if it crept."""
        assert self._level is not None
        level = self._level
        size = plateau - level
        self._level = plateau
        if size < 1.5 * self._k():
            return ()
        left = self._left(level, size)
        found, visible, spiked = self._jumps(size, window, level, left)
        if not found and spiked:
            # the floor rose onto the readings of a spike of its size that fell since (one still up may hold a step
            # taken inside it, which the floor shows once the spike's readings leave it): no step yet
            self._level = level
            return ()
        # jumps the readings show are steps however slowly the floor followed (steps closer than
        # its window lift it in stages); without them, a floor that rose slowly crept
        if not found and not moved_within(self._trace, level, plateau, self._abrupt(window)):
            self._crept_at = t
            return ()  # drift, not a step
        if not found and visible:
            self._crept_at = t
            return ()  # the readings would show a jump this big, and show none: the floor crept
        if not found and t - self._crept_at <= self.p.max_envelope_seconds and self._rising_into_a_jump(t, size, window):
            return ()  # a creeping floor whose window still holds the readings before a bigger jump: the jump is the step
        # what the readings showed up to here is accounted for: the last jump found, else all of it
        self._quiet_since = found[-1][0] + self._dt / 2 if found else t
        self._noise.floors.clear()  # the floor's jitter is measured between steps, not across them
        last = self._newest_held()
        if not found and last is not None and abs(left - (last.t + window)) <= 1.5 * self._dt:
            # the floor rose as the last readings from before the newest step's jump left its window: that step's own
            # rise, which the floor took in late (it was sized by the floor's rise when its jump was found), at its date
            return self._grow_newest(t, size, last.t)
        if len(found) > 1:  # steps closer than the background's period: the readings show each one
            steps = _staircase(found, level, t)
            for step in steps:
                self._add(step)
            return tuple(steps)
        doubt: Doubt | None = None
        if found:  # a tooth's return a step held up (no higher than the one a period before): the period dates it
            seasonal = self._period_date(found[0][0], size, window)
            when = found[0][0] if seasonal is None or self._shows(found[0][0], size) else seasonal
        else:
            since_load = self._raw[0][0] <= self._loaded_at  # the load's end is among the readings kept
            if since_load and min(v for s, v in self._raw if s >= self._loaded_at) >= level + size / 2:
                # no reading since the load was down at the level: it was read from readings before the load was seen
                # to end, which the floor since does not take in (a slow tooth's trough, and its rise after)
                return ()
            when, doubt = change_point(self._raw, plateau, size, window, self._noise.sigma, self._season)
        size = step_size(self._raw, when, t, window, size) or size
        before_next = self._rose_before_next(when, level, size)
        if before_next < size:  # the next step's share of the floor's rise is the next step's
            size = before_next
            self._level = level + size
        step = Step(t=when, size=size, found_at=t, before=level)
        stages = 2 * max(window, self._abrupt(window))  # (a window of a few readings rises in stages a few apart)
        if last is not None and t - last.found_at <= stages and (step.t - last.t < window / 2 or size < 0.5 * last.size):
            # the floor of a sawtooth rises in stages as the old troughs leave the window, and a ramp's as it creeps
            # on after a jump: one step, dated where most of it rose (a first stage smaller than the rest was the
            # troughs' drift before it)
            return self._grow_newest(t, size, step.t if size > last.size else last.t)
        self._add(step)
        if doubt is not None and self._season is not None:
            self._unproven.append(_Unproven(step, doubt, until=t + window))
        return (step,)

    def _rose_before_next(self, when: float, level: float, size: float) -> float:
        """What the readings rose by from ``when`` to the next jump still pending, where there is one: a floor taken
        as late as a long window confirms (a whole aliased tooth) rose onto that next step too, and a level raised by
        both would give the next step back at its first trough. Otherwise ``size``: nothing came after."""
        later = [s for s, _, _ in self._pending if s > when + self._dt / 2]
        between = [v for s, v in self._raw if when <= s < later[0]] if later else []
        if len(between) < 3:
            return size
        return min(sorted(three)[1] for three in zip(between, between[1:], between[2:])) - level

    def _grow_newest(self, t: float, size: float, when: float) -> tuple[Step, ...]:
        """The newest step, grown by a later stage of the floor's rise that was its own, dated ``when``."""
        self._steps[-1] = replace(self._steps[-1], t=when, size=self._steps[-1].size + size, found_at=t)
        return (self._steps[-1],)

    def _prove(self, u: _Unproven, t: float, ended: bool = False) -> None:
        """A step dated without proof takes the date of the first reading that proves it (above the old top,
        and the next one too; else the first alone, once the window of doubt closes or the log ends).

        Checked as each reading comes: the reading before the newest is the one its next can pair.
        """
        if u.step not in self._steps:  # given back, or grown by the floor's next stage: its date stands
            self._unproven.remove(u)
            return
        when = None
        if not ended and proves(u.doubt, self._raw[-2]):
            if u.doubt.top < self._raw[-1][1]:
                when = self._raw[-2][0]
            elif u.single is None:
                u.single = self._raw[-2][0]
        if when is None:
            if not ended and t < u.until:
                return
            when = u.single
        self._unproven.remove(u)
        i = self._steps.index(u.step)
        # a reading lifted by the next step proves nothing of this one
        if when is not None and (i + 1 == len(self._steps) or when < self._steps[i + 1].t):
            self._steps[i] = replace(u.step, t=when)

    def _rising_into_a_jump(self, t: float, size: float, window: float) -> bool:
        """A jump of more than twice ``size`` inside the floor's window that held: the floor, still taken over
        the readings before it, rose by what they did (a ramp's creep), not by a step of its own.

        Asked only where the floor crept within the hour: elsewhere a spike still up inside the window is
        such a jump too, and the floor's rise under it a real small step."""
        raw = [(s, v) for s, v in self._raw if s > t - window]
        tau = self._noise.jump_threshold(self._k())
        for (_, a), (s, b) in itertools.pairwise(raw):
            if b - a > max(tau, 2 * size) and min(v for w, v in raw if w >= s) >= a + 0.5 * (b - a):
                return True
        return False

    def _shows(self, t: float, size: float, also: Sequence[tuple[float, float]] = ()) -> bool:
        """The reading at ``t`` is above the one a period before it by half of ``size``: a step's jump, not a
        tooth's wrap (which the wrap a period before explains). ``also``: rises (when, size) held besides the
        steps found (found with this one)."""
        assert self._season is not None
        raw, lag = self._raw, self._season.lag
        i = self._first_at(t)
        # a ramp that wraps, or smooth readings, read at a lag that is no whole period: the wrap before may be a
        # reading either side
        near = (0,) if self._season.repeats and not self._smooth(i - lag, size) else (-1, 0, 1)
        return lag - near[0] <= i < len(raw) and all(
            raw[i][1] - raw[i - lag + d][1] - self._held_between(raw[i - lag + d][0], t, also) > 0.5 * size
            for d in near
        )

    def _smooth(self, i: int, size: float) -> bool:
        """The readings over the period before the reading ``i`` move from one to the next by under a quarter of
        ``size`` (as most do): its neighbours read the same phase of the background as it, give or take a wrap. Not
        so where the readings alternate, a neighbour half a tooth from it."""
        assert self._season is not None
        raw = self._raw
        moves = [abs(raw[j][1] - raw[j - 1][1]) for j in range(max(1, i - self._season.lag), i)]
        return bool(moves) and median_high(moves) < 0.25 * size

    def _held_between(self, start: float, end: float, also: Sequence[tuple[float, float]] = ()) -> float:
        """What the steps held (and the rises ``also``), dated after ``start`` and before ``end``, lifted the
        readings by: a reading a period before a step, lifted by the steps between, is the one the step rose from."""
        steps, when = self._steps, lambda s: s.t
        between = steps[bisect_right(steps, start, key=when) : bisect_left(steps, end, key=when)]
        return sum(s.size for s in between if s.given_back_at is None) + sum(r for w, r in also if start < w < end)

    def _wrap(self, t: float, size: float) -> bool:
        """The jump into the reading at ``t`` is a tooth's wrap: the period reaches back from it, and the wrap a
        period before explains it."""
        assert self._season is not None
        return self._first_at(t) > self._season.lag and not self._shows(t, size)

    def _first_at(self, t: float) -> int:
        """The index of the first reading kept at or after ``t`` (their number where none is)."""
        return bisect_left(self._raw, t, key=lambda r: r[0])

    def _newest_held(self) -> Step | None:
        """The newest step, if it is still held."""
        return self._steps[-1] if self._steps and self._steps[-1].given_back_at is None else None

    def _held_near(self, t: float, within: float) -> bool:
        """One of the newest held steps is dated within ``within`` of ``t``: a step found already."""
        return any(abs(s.t - t) <= within for s in self._steps[-3:] if s.given_back_at is None)

    def _period_date(self, jump: float, size: float, window: float) -> float | None:
        """The background's period's date for a step of ``size`` whose jump the readings show at ``jump``:
        looked for from a window before it (not before the last step held); None without a period."""
        return seasonal_change(self._raw, self._since_last_step(jump - window), size, self._season)

    def _since_last_step(self, t: float) -> float:
        """``t``, or later: not before the load ended nor before the last step held."""
        last = self._newest_held()
        if last is not None:
            t = max(t, last.t + self._dt / 2)
        return max(t, self._loaded_at)

    def _jumps(self, size: float, window: float, level: float, left: float) -> Jumps:
        """The rises between two readings that made this step (``step_shape.jumps``), looked for
        from a window and a half before the floor left ``level`` (at ``left``: the floor lags the readings)."""
        since = self._since_last_step(left - 1.5 * window)  # not the last step's own jump
        # from the reading before (since the load): a jump into the first reading is a jump since
        i = self._first_at(since) - 1
        if i >= 0 and self._raw[i][0] < self._loaded_at:
            i += 1
        raw = list(itertools.islice(self._raw, max(i, 0), None))
        return jumps(raw, level, size, self._noise.jump_threshold(self._k()), self._wrap if self._season else None)

    def _left(self, level: float, size: float) -> float:
        """When the floor last left ``level`` (was within a quarter of ``size`` of it)."""
        return next((s for s, v in reversed(self._trace) if v <= level + 0.25 * size), self._trace[0][0])

    def _abrupt(self, window: float) -> float:
        """How fast a step lifts the floor: within half a window (the last low readings of the
        old floor leave it; a sawtooth's troughs leave it one by one), where a creep takes longer."""
        return max(0.5 * window, self.p.hold_seconds / 6, 6 * self._dt)

    def _give_back(self, t: float, floor: float, window: float) -> None:
        """The floor fell below the held steps: those whose middle it is under are given back.

        Measured from where each step rose, not from the last level, so that a floor sinking by
        degrees gives a step back once it has sunk by half of it in all.
        """
        assert self._level is not None
        # freed memory drops the floor at once; a floor that sank back over longer was the background
        # (a sawtooth sampled slower than its period aliases into a slow one: up at once, down slowly)
        sank = not moved_within(self._trace, self._level, floor, max(self._abrupt(window), window))
        held = [i for i, step in enumerate(self._steps) if step.given_back_at is None]
        drop = self._level - floor
        # a fall the size of one recent step gives that one back (a spike that held a step inside it);
        # otherwise the newest are given back first, each once the floor is under its middle
        alike = [i for i in held[-4:] if abs(self._steps[i].size - drop) <= 0.25 * drop]
        if alike:
            chosen = [min(alike, key=lambda i: abs(self._steps[i].size - drop))]
        else:
            chosen = list(itertools.takewhile(
                lambda i: floor <= self._steps[i].before + self._steps[i].size / 2, reversed(held)))  # fmt: skip
        chosen = [i for i in chosen if not self._on_a_flank(self._steps[i], floor)]
        for i in chosen:
            step = self._steps[i]
            # a step held until a gap in the log is no transient, however soon after the gap the floor fell
            fleeting = sank or t - step.found_at <= self.p.regret_seconds
            why = "transient" if fleeting and step.found_at >= self._loaded_at else "freed"
            self._end(i, t, why)
        self._level = floor
        self._below_since = None
        if chosen:  # a floor that only sank to a trough accounts for no jump before it
            self._quiet_since = t
            oldest = self._steps[chosen[-1]]
            if not sank and oldest.ended_by == "transient":  # a spike's fall, not memory freed later
                for step in self._left_up(t, oldest, floor, window):
                    self._add(step)

    def _on_a_flank(self, step: Step, floor: float) -> bool:
        """The step's level was taken on a slow tooth's rising flank, and the tooth's fall took the floor under it,
        but not to the trough the tooth rose from: no period read yet, readings seconds apart, the readings sank since
        the step's jump by degrees (never by half of it from one reading to the next: a spike ends at once) to a floor
        still over the lowest reading of the hour before the jump (since the load and the step held before it) by half
        the step. Read seldom, a fast tooth folds into one that sinks by degrees: there the floor's fall stands."""
        if self._season is not None or self._dt >= self.p.unfold_interval_seconds:
            return False
        since = max([step.t - self.p.max_envelope_seconds, self._loaded_at]
                    + [s.t + self._dt / 2 for s in self._steps if s.given_back_at is None and s.t < step.t])
        trough = min((v for s, v in self._raw if since <= s < step.t), default=step.before)
        after = [v for s, v in self._raw if s >= step.t]
        return floor > trough + step.size / 2 and all(a - b < step.size / 2 for a, b in itertools.pairwise(after))

    def _left_up(self, t: float, step: Step, floor: float, window: float) -> list[Step]:
        """What a fall left standing of a step it gave back: a leak's step taken while a spike was up.

        Found together with the spike (both inside one hold), the two are one step; the spike's fall
        gives back only its own part, and the readings show the leak's jump inside it.
        """
        # less what steps still held since its jump account for (one found twice, by its jump and the floor)
        since = step.t - 1.5 * self._dt  # from the reading before its jump
        rest = floor - step.before - sum(s.size for s in self._steps if s.given_back_at is None and s.t >= since)
        k = self._k()
        if rest < 1.5 * k:
            return []
        raw = [(s, v) for s, v in self._raw if s >= since]
        found = jumps(raw, step.before, rest, self._noise.jump_threshold(k)).found
        if not found:
            found = [(max(step.t, change_point(raw, floor, rest, window, self._noise.sigma, self._season)[0]), rest)]
        return _staircase(found, step.before, t)

    def _add(self, step: Step) -> None:
        """In the order of the steps' times: one read from its period is found after later ones. A step given back
        that is found again at its own reading was never given back (the floor sank under it by a tooth's refit, a
        trough): it is held again, as the step now found, not reported twice."""
        steps, when, half = self._steps, lambda s: s.t, self._dt / 2
        near = range(bisect_left(steps, step.t - half, key=when), bisect_right(steps, step.t + half, key=when))
        again = [i for i in near if steps[i].given_back_at is not None]
        if again:
            steps[again[-1]] = step
            return
        insort(steps, step, key=when)
        del self._steps[: -self._history_limit]

    def _end_held(self, t: float, why: str, under: float = -math.inf) -> None:
        """Give back the held steps, or those whose middle the floor ``under`` is below."""
        for i, step in enumerate(self._steps):
            if step.given_back_at is None and under <= step.before + step.size / 2:
                self._end(i, t, why)

    def _end(self, i: int, t: float, why: str) -> None:
        """The step ``i`` is given back at ``t`` (``why``: restart, freed, transient), and reported so."""
        self._steps[i] = replace(self._steps[i], given_back_at=t, ended_by=why)
        self._ended.append(self._steps[i])

    def _k(self) -> float:
        k = self._noise.k(self.p.min_step_ratio * self.budget / 2, self.p.noise_factor)
        fold = self._unfold.fold
        # a tooth taken off is known to a few percent of its height: what it leaves is no step
        return k if fold is None else max(k, 0.05 * fold.amplitude)

    # -- the report ---------------------------------------------------------------------------------

    def _report(self, t: float, new: tuple[Step, ...] = (), warming_up: bool = False) -> LeakReport:
        ended, self._ended = tuple(self._ended), []
        overhang = 0.0
        if self._base is not None and self._level is not None and not warming_up:
            overhang = max(0.0, self._level - self._base)
        # the floor's rise that no step explains, held for an hour: a creep (one big step is a
        # step, not a leak; a floor that rises and falls back over hours is a slow background)
        rise = overhang - sum(s.size for s in self._steps if s.given_back_at is None)
        if rise < self.p.leak_rise_ratio * self.budget:
            self._creep_since = None
        elif self._creep_since is None:
            self._creep_since = t
        return judge(t, tuple(self._steps), self._level, overhang, rise, self._creep_since, self.capacity, self.budget,
                     self.p, new, ended, warming_up)  # fmt: skip


def _staircase(rises: list[tuple[float, float]], level: float, found_at: float) -> list[Step]:
    """Steps from (when, rise) pairs, oldest first, each rising from where the one before it left the floor."""
    steps = []
    for when, rise in rises:
        steps.append(Step(t=when, size=rise, found_at=found_at, before=level))
        level += rise
    return steps
