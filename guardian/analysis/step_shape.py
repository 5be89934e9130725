"""Where and how big a step was, read from the readings around it (pure functions over ``(t, value)`` lists).

The floor says *that* memory rose; the readings say *when* and *by how
much*, better than the floor can (a minimum over noise sits lower the more
readings it sees, and lags them by a window).
"""

from __future__ import annotations

from typing import Iterable, Sequence

Readings = Sequence[tuple[float, float]]


def held_rises(rises: Iterable[tuple[float, float]], raw: Readings, level: float) -> list[tuple[float, float]]:
    """The rises the readings kept (never falling back below half of one, over the floor so far);
    a spike's jump is given back."""
    held, floor = [], level
    for when, rise in rises:
        if min(v for s, v in raw if s >= when) >= floor + 0.5 * rise:
            held.append((when, rise))
            floor += rise
    return held


def step_size(raw: Readings, when: float, t: float, window: float, floors: float) -> float | None:
    """The step's size as the readings' median after it less their median before it.

    Unbiased where the floors are not (a minimum over noise sits lower the more
    readings it sees), for readings tight around their level; a background's
    readings (a sawtooth) are left to the floors.
    """
    span = min(t - when, window)
    before = sorted(v for s, v in raw if when - span <= s < when)
    after = sorted(v for s, v in raw if when <= s <= t)
    if len(before) < 4 or len(after) < 4:
        return None
    for side in (before, after):  # the lower half's spread: upward spikes leave it alone
        n = len(side)
        if side[n // 2] - side[n // 10] > floors / 2:
            return None
    size = after[len(after) // 2] - before[len(before) // 2]
    return size if size > 0 else None


def change_point(raw: Readings, new_floor: float, size: float, window: float, sigma: float) -> float:
    """When the step happened, erring late: never on the flank of the tooth it sits on.

    After the last reading under the new floor the step may have happened at any
    time; the first reading above the old readings' top proves it had (on a flat
    series that is the step's first reading, on a sawtooth the first tooth that
    peaks higher). Without such a reading, the first one on the new floor.
    """
    margin = min(0.5 * size, max(0.25 * size, 2 * sigma))
    start = None
    for s, v in reversed(raw):
        if v < new_floor - margin:
            break
        start = s
    if start is None:
        return raw[-1][0]
    before = sorted(v for s, v in raw if start - window <= s < start)
    if before:
        top = before[int(0.98 * (len(before) - 1))] + margin
        proof = next((s for s, v in raw if s >= start and v > top), None)
        if proof is not None:
            return proof
    return next((s for s, v in raw if s >= start and v <= new_floor + margin), start)


def rose_within(trace: Readings, level: float, plateau: float, seconds: float) -> bool:
    """The floor (``trace``: (t, floor)) went from a quarter to three quarters of the way from ``level``
    to ``plateau`` within ``seconds``: abruptly, as a step lifts it, not as a creep does."""
    size = plateau - level
    low = next((s for s, v in reversed(trace) if v <= level + 0.25 * size), trace[0][0])
    high = next((s for s, v in trace if s >= low and v >= level + 0.75 * size), trace[-1][0])
    return high - low <= seconds


def jumps(raw: Readings, level: float, size: float, tau: float) -> tuple[list[tuple[float, float]], bool]:
    """The rises between two readings that made a step of ``size`` over ``level``, (when, how much), and
    whether the readings are smooth enough that no such rise means a creep (not noise or a sawtooth
    faster than the sampling).

    A rise is above ``tau`` (what noise does not make); one step sampled mid-rise shows as two
    readings and counts once. Rises that do not add up to the floor's (a spike's among them) are
    not used; the sizes are scaled to the floor's.
    """
    found: list[tuple[float, float]] = []
    last = -2
    for i in range(1, len(raw)):
        rise = raw[i][1] - raw[i - 1][1]
        if last == i - 1 and rise > tau / 3:
            found[-1] = (found[-1][0], found[-1][1] + rise)
            last = i
        elif rise > tau:
            found.append((raw[i][0], rise))
            last = i
    found = held_rises(found, raw, level)
    visible = tau < 0.6 * size
    total = sum(r for _, r in found)
    if not 0.6 * size <= total <= 1.5 * size:
        # spikes or sawtooth teeth among them: not these, but a jump seen is still a jump
        return [], visible and not any(r >= 0.5 * size for _, r in found)
    return [(when, rise * size / total) for when, rise in found], visible
