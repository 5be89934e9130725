"""What a leak is: the detector's parameters, a step, and the rules that turn held steps into a leak.

Two verdicts. The live one (``judge``) describes the present and is what
pages: ``leak_steps`` held steps inside ``leak_window_seconds``, each past
its regret time, or a floor that crept up with no steps for an hour. The
hindsight one (``episodes``) describes a whole log: someone reading last
night's log wants "leaked 3 × 1% then restarted at 04:35", though the
restart gave the steps back and the log's end shows no leak.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    unfold_interval_seconds: float = 20.0  # read this seldom, a tooth that folds is taken off the readings


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


def judge(t: float, steps: tuple[Step, ...], level: float | None, overhang: float, unexplained_rise: float,
          creep_since: float | None, capacity: float | None, budget: float, p: LeakParams,
          new: tuple[Step, ...], ended: tuple[Step, ...], warming_up: bool) -> LeakReport:  # fmt: skip
    """The live verdict at ``t`` from the steps found so far and the floor's rise no step explains."""
    held = [s for s in steps if s.given_back_at is None and t - s.t <= p.leak_window_seconds]
    # a step counts towards a leak once it has outlived the regret window: until then it
    # may still be a long spike, and three spikes at once are not a leak
    settled = [s for s in held if t - s.found_at >= p.regret_seconds]
    crept = creep_since is not None and t - creep_since >= p.max_envelope_seconds
    confidence = min(1.0, max(len(settled) / p.leak_steps, max(0.0, unexplained_rise) / (p.leak_rise_ratio * budget)))
    slope = 0.0
    if held:
        span = t - held[0].t
        slope = sum(s.size for s in held) / span if span > 0 else 0.0
    tte = None
    if slope > 0 and capacity is not None and level is not None:
        tte = max(0.0, (capacity - level) / slope)
    return LeakReport(
        level=level,
        overhang=overhang,
        steps=steps,
        new_steps=new,
        given_back=ended,
        slope=slope,
        time_to_exhaustion=tte,
        confidence=confidence,
        leak=len(settled) >= p.leak_steps or crept,
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
