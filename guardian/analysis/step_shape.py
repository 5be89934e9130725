"""Where and how big a step was, read from the readings around it (pure functions over ``(t, value)`` lists).

The floor says *that* memory rose; the readings say *when* and *by how
much*, better than the floor can (a minimum over noise sits lower the more
readings it sees, and lags them by a window).
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate, pairwise
from math import inf, sqrt
from statistics import median
from typing import Callable, Iterable, NamedTuple, Sequence

Readings = Sequence[tuple[float, float]]


Shown = Callable[[float, float, Sequence[tuple[float, float]]], bool]


def held_rises(
    rises: Iterable[tuple[float, float]], raw: Readings, level: float, shown: Shown | None = None
) -> list[tuple[float, float]]:
    """The rises the readings kept (never falling back below half of one, over the floor so far);
    a spike's jump is given back. ``shown``, where given, must also take each rise, given those held before it
    (a rise a tooth's period after one of them is measured from over it)."""
    held: list[tuple[float, float]] = []
    floor = level
    for when, rise in rises:
        if (shown is None or shown(when, rise, held)) and min(v for s, v in raw if s >= when) >= floor + 0.5 * rise:
            held.append((when, rise))
            floor += rise
    return held


def step_size(raw: Readings, when: float, t: float, window: float, floors: float) -> float | None:
    """The step's size as the readings' median after it less their median before it.

    Unbiased where the floors are not (a minimum over noise sits lower the more
    readings it sees), for readings tight around their level; a background's
    readings (a sawtooth) are left to the floors, and so are readings whose
    middles moved by half as much again or less than half of what the floors did
    (the readings before were a spike's, holding the step inside it: the floors
    rose from under the spike).
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
    return size if abs(size - floors) <= floors / 2 else None


class Doubt(NamedTuple):
    """A step's date that no reading has proved yet: the readings after ``start`` may prove it, by rising
    above the old readings' ``top`` (by no more than the step could lift it)."""

    start: float
    top: float
    size: float


def change_point(
    raw: Readings, new_floor: float, size: float, window: float, sigma: float, season: Season | None = None
) -> tuple[float, Doubt | None]:
    """When the step happened, erring late: never on the flank of the tooth it sits on; and, where no
    reading proves it yet, what a later reading must show to prove it (``proof``).

    After the last reading under the new floor the step may have happened at any
    time; the first reading above the old readings' top proves it had (on a flat
    series that is the step's first reading, on a sawtooth the first tooth that
    peaks higher), if it is no higher than the step could lift that top (one
    higher sits on an excursion the old readings may not have shown: a spike that
    held the step inside it) and, where the readings repeat themselves, the next
    one is above the top too (one alone may be noise: the top's margin is at most
    half the step). Without a period read, the top is at least where noise on the old level reaches, and a top
    that spikes set proves nothing (a reading over it is the next spike's). Without such a reading, the first of
    two on the new level, in doubt:
    on a tooth aliased by slow sampling the new floor is often a reading from before
    the step, and the proof comes with the tooth's next high phase.
    Without a period read, a run on the new level that began with a spike begins at the spike's fall
    (``_after_a_spike``), its old readings still those before the spike.
    Where the background has a period, the period dates it first (``seasonal_change``). Where the readings
    between the run's start and the proof stood on a level of their own (two small steps in noise that the floor
    took in at once), the proof is the second's and the step is dated as if none had come.
    """
    margin = min(0.5 * size, max(0.25 * size, 2 * sigma))
    # the newest readings may dip under the new floor (noise the floor's median of three hides): the run on the new
    # level is the one before them, not none (which dated the step at the dip)
    newest = len(raw)
    while newest > 0 and raw[newest - 1][1] < new_floor - margin:
        newest -= 1
    # without a period read, one reading under it between two on the new level (on the floor, and over it by no more
    # than the step and the noise: not a spike's) is noise, not the old level (a run of minutes at -l 5 holds a few);
    # the old level's readings noise lifted reach the floor far more seldom than its margin. Not one under it by more
    # than two sigmas besides: the trough of a tooth read slower than it repeats, before its period is read (a ramp of
    # a few readings, whose top is on the new level too). A tooth's readings alternate between its phases: there a low
    # one is the old level's as much as any
    values = [v for _, v in raw][:newest]
    first = None
    for i in range(newest - 1, -1, -1):
        neighbours = (values[i - 1], values[i + 1]) if season is None and 0 < i < newest - 1 else ()
        if values[i] < new_floor - margin and not (
            neighbours
            and values[i] >= new_floor - margin - 2 * sigma
            and all(new_floor <= v <= new_floor + size + 3 * sigma for v in neighbours)
        ):
            break
        first = i
    if first is None:
        return raw[-1][0], None
    began = raw[first][0]  # the old readings are those before the run (before a spike it began with: not the spike's)
    if season is None:
        first = _after_a_spike(raw, first, newest, new_floor + size + 3 * sigma, size)
    start = raw[first][0]
    seasonal = seasonal_change(raw, start, size, season)
    if seasonal is not None:
        return seasonal, None
    old = [v for s, v in raw if began - window <= s < began]
    doubt = None
    if old:
        before = sorted(old)
        # the top: above all but a few outliers, and at least as high as two of three readings in a row reached (a slow
        # tooth's peak is a few readings: a percentile of them would sit under it); of the readings' body, not of the
        # spikes the window caught, however many (far out above their quartiles: a tooth's readings never are)
        q1, q3 = before[len(before) // 4], before[3 * len(before) // 4]
        fence = q3 + 3 * (q3 - q1)
        n = bisect_right(before, fence)  # the body: before[:n], sorted
        body = [v for v in old if v <= fence]
        held = max((sorted(three)[1] for three in zip(body, body[1:], body[2:])), default=before[n - 1])
        high = before[int(0.98 * (n - 1))]
        old_middle = median(body)
        # in noise, at least where noise on the old level does not reach, whatever the few readings a window holds
        # at slow sampling reached (four at -l 60: a reading 2.3 standard deviations up proved a step before it); no
        # higher than the step lifts the old middle (a step that small is proven by a pair of readings over it)
        reach = old_middle + min(3 * sigma, size) if season is None else -inf
        # a slow tooth no period was read for (readings far over their middle: farther than noise or a step among them
        # lifts them): its top is a few readings at its peak, which noise lifts the next peak over by more than the
        # margin (a step on the flank after it was dated at that peak); half the step over it, a peak has the step in it
        over = max(margin, 0.5 * size) if season is None and high - old_middle > max(3 * sigma, 2 * size) else margin
        doubt = Doubt(start, max(high + over, reach, held), size)
        # a top that spikes set (readings far over their middle, and far fewer than under it: a tooth spreads both
        # ways alike) proves nothing: a reading over it is the next spike's, of about one height
        spike_top = season is None and high - old_middle > 3 * max(old_middle - before[(n - 1) // 50], sigma)
        proved = None if spike_top else proof(raw, doubt)
        if proved is not None:
            # only where the old readings are noise: a tooth's readings before its proof are its phases, not a level
            noise = season is None and high - old_middle <= 3 * sigma
            if not (noise and _stood_between(raw, doubt, proved, old_middle, sigma)):
                return proved, None
    # else erring late: the first of two readings in a row above halfway between the readings' middles either side,
    # and as far at most above the new middle (not on a spike: one twice the step's size has readings a step over it)
    # (the floor, a minimum, sits under the new readings' middle: a run above it less the margin can begin with old
    # readings that noise lifted)
    after = [(s, v) for s, v in raw if s >= start]
    middle = median(v for _, v in after)
    below = [v for v in old if v <= middle + size]  # the old readings' middle, not a spike's they caught
    mid = (median(below) + middle) / 2 if below else new_floor - margin
    on = [(s, mid <= v <= 2 * middle - mid) for s, v in after]
    return next((a[0] for a, b in pairwise(on) if a[1] and b[1]), start), doubt


def _after_a_spike(raw: Readings, i: int, newest: int, top: float, size: float) -> int:
    """Where the run on the new level began with a spike (readings that jumped from the old level at once to over
    ``top``, where no step lifts the floor, stayed there and fell back at once onto the new level), the first reading
    after its fall: the step came inside the spike, which the readings cannot date closer than its fall (erring late;
    a spike longer than the readings on the new level after it made their middle the spike's, and dated the step at
    the spike's start). Else ``i``, where the run began (indices into ``raw``)."""
    j = i
    while j < newest and raw[j][1] > top:
        j += 1
    rose = 0 < i < j < newest and raw[i][1] - raw[i - 1][1] > size
    fell = rose and raw[j - 1][1] - raw[j][1] > size
    return j if fell else i


def _stood_between(raw: Readings, doubt: Doubt, proved: float, old: float, sigma: float) -> bool:
    """The readings from the run's start to the proof stood on a level of their own: clear of the old readings'
    middle ``old`` and of the readings' from the proof on, and under the old top (not a spike's readings). Two steps
    the floor took in at once: the proof is the second's (or noise's, between them), the run's start the first's.
    Clear by a quarter of the floor's rise and by four standard errors of the middles (a few readings noise lifted
    before a step are no level)."""
    between = [v for s, v in raw if doubt.start <= s < proved]
    if len(between) < 3:
        return False
    clear = max(doubt.size / 4, 4 * sigma / sqrt(len(between)))
    level = median(between)
    return old + clear <= level < doubt.top and level <= median(v for s, v in raw if s >= proved) - clear


def proof(raw: Readings, doubt: Doubt) -> float | None:
    """The first reading after ``doubt.start`` above the old top (no higher than the step lifts it) with the
    next one above it too; where no two in a row are (a fast background sampled slowly), the first alone.
    The newest reading, with no next one to confirm it, proves nothing yet."""
    proofs = [(a[0], doubt.top < b[1]) for a, b in pairwise(raw) if proves(doubt, a)]
    return next((s for s, paired in proofs if paired), proofs[0][0] if proofs else None)


def proves(doubt: Doubt, reading: tuple[float, float]) -> bool:
    """The reading is after the step's last possible moment and above the old top, by no more than the step."""
    return reading[0] >= doubt.start and doubt.top < reading[1] <= doubt.top + doubt.size


def moved_within(trace: Readings, level: float, plateau: float, seconds: float) -> bool:
    """The floor (``trace``: (t, floor)) went from a quarter to three quarters of the way from ``level``
    to ``plateau`` within ``seconds``: abruptly, as a step lifts it or freed memory drops it, not as a
    creep or a background's slow return does. Either way up or down."""
    sign = 1.0 if plateau >= level else -1.0
    size = sign * (plateau - level)
    low = next((s for s, v in reversed(trace) if sign * (v - level) <= 0.25 * size), trace[0][0])
    high = next((s for s, v in trace if s >= low and sign * (v - level) >= 0.75 * size), trace[-1][0])
    return high - low <= seconds


class Jumps(NamedTuple):
    """What the readings show of a floor's rise (``jumps``)."""

    found: list[tuple[float, float]]  # the rises that made it: (when, how much)
    visible: bool  # smooth enough readings that no such rise means a creep (not noise, or a sawtooth too fast)
    spiked: bool  # a rise of its size that a fall gave back: the floor stands on a spike's readings


def jumps(
    raw: Readings, level: float, size: float, tau: float, wrap: Callable[[float, float], bool] | None = None
) -> Jumps:
    """The rises between two readings that made a step of ``size`` over ``level``, whether the readings
    are smooth enough to show one, and whether they show a spike of its size given back.

    A rise is above ``tau`` (what noise does not make); one step sampled mid-rise shows as two
    readings and counts once; a fall like an earlier rise gives it back (a spike with a step inside
    it shows both of its jumps and the step's). Where they add up to more than the floor's rise,
    the oldest that make it up are the ones the floor shows yet; rises that do not add up to it
    (a spike's among them) are not used; the sizes are scaled to the floor's. A rise that ``wrap`` says
    the background's period explains (a tooth's wrap, held up by a step just after it) is none; with no period
    read, so is one the readings made twice more from where it rose from (``_made_again``). With no period read
    either, a fall that gives a rise back to the noise (a quarter of ``tau``) ends a spike, though falls of about its
    size repeat (``unmatched_rises``); with one, such falls are the tooth's. With no period read, which rise a fall
    gives back is told by the levels either side of each (``_level_moves``), not by the two readings either side.
    """
    exact = tau / 4 if wrap is None else None
    found: list[tuple[float, float]] = []
    spans: list[tuple[int, int]] = []  # the readings each of them moved from and into
    last, sign = -2, 0.0
    for i in range(1, len(raw)):
        move = raw[i][1] - raw[i - 1][1]
        # the reading after the last jump, or a few readings on where no period was read (with one, a fall that soon
        # after a step's jump is a tooth's wrap)
        soon = last == i - 1 or (wrap is None and i - last <= 4)
        if last == i - 1 and sign * move > tau / 3:
            found[-1] = (found[-1][0], found[-1][1] + move)
            last, spans[-1] = i, (spans[-1][0], i)
        elif soon and sign > 0 and tau < -move < 0.67 * found[-1][1] and not any(
            gives_back(move, r) for _, r in unmatched_rises(found[:-1], exact=exact)
        ):
            # up and partly down soon after: a spike read once or a few times that held a step inside it, sampled too
            # slowly to show the step's own jump; the step is what stays, seen from the lower reading. Unless an
            # earlier rise no fall gave back is of the fall's size: that spike ended just after the step
            found[-1] = (raw[i][0], found[-1][1] + move)
            last, spans[-1] = i, (spans[-1][0], i)
        elif abs(move) > tau:
            found.append((raw[i][0], move))
            spans.append((i - 1, i))
            last, sign = i, (1.0 if move > 0 else -1.0)
    rises = unmatched_rises(found, exact=exact, measured=_level_moves(raw, found, spans) if wrap is None else None)
    # a spike: a rise of the floor's size, given back by a fall of its own size (not one it merely matched best)
    spiked = any(
        r > 0 and alike(r, size) and (when, r) not in rises and any(w > when and gives_back(m, r) for w, m in found)
        for when, r in found
    )
    if wrap is not None:
        rises = [(when, rise) for when, rise in rises if not wrap(when, rise)]
    else:
        moved = [(jump, raw[a][1]) for jump, (a, _) in zip(found, spans)]
        rises = [r for r in rises if not _made_again(r, moved, tau / 2)]
    found = held_rises(rises, raw, level)
    # a jump this big would stand out of noise, or of readings that nowhere rose by a third of it at once (a ramp:
    # a tall sawtooth's noise, its wraps, can hide a jump from ``tau`` but not from readings that climb evenly)
    visible = tau < 0.6 * size or all(b[1] - a[1] < size / 3 for a, b in pairwise(raw))
    total = sum(r for _, r in found)
    if total > 1.5 * size:
        # a staircase denser than the floor's window: the floor has risen by its oldest steps so far
        sums = list(accumulate(r for _, r in found))
        n = min(range(len(sums)), key=lambda i: abs(sums[i] - size)) + 1
        found, total = found[:n], sums[n - 1]
    if not 0.6 * size <= total <= 1.5 * size:
        # spikes or sawtooth teeth among them: not these, but a jump seen is still a jump
        return Jumps([], visible and not any(r >= 0.5 * size for _, r in found), spiked)
    return Jumps([(when, rise * size / total) for when, rise in found], visible, spiked)


def _level_moves(raw: Readings, found: list[tuple[float, float]], spans: list[tuple[int, int]]) -> dict[float, float]:
    """Each jump (by when it came) measured between the middles of the readings either side of it, as far as the jumps
    next to it: the two readings a jump came between carry their noise into it, the levels little of it. A spike's fall
    gives back its own rise, not a step's of about its size, by what the levels say (a spike with a step inside it,
    or a step with a spike on it, which two readings either side may tell the other way round)."""
    values = [v for _, v in raw]
    moved: dict[float, float] = {}
    for k, ((when, _), (a, b)) in enumerate(zip(found, spans)):
        lo = spans[k - 1][1] if k else 0
        hi = spans[k + 1][0] if k + 1 < len(spans) else len(values) - 1
        moved[when] = median(values[b : hi + 1]) - median(values[lo : a + 1])
    return moved


def _made_again(rise: tuple[float, float], moves: list[tuple[tuple[float, float], float]], within: float) -> bool:
    """The readings made this rise twice more, from where it rose from (each to ``within``; ``moves``: (when, how
    much) and the reading it moved from): the wrap of a background no period was read for yet (a fast tooth aliased
    by slow sampling: its period is read over hundreds of readings), which a step just after it holds up, so that it
    looks like the step's jump. A staircase's rises each start a step higher, and spikes seldom repeat to within noise."""
    when, size = rise
    start = next(f for (w, _), f in moves if w == when)
    return sum(1 for (w, m), f in moves if w != when and abs(m - size) <= within and abs(f - start) <= within) >= 2


def came_down(raw: Readings, when: float, rise: float) -> bool:
    """The readings after a jump fell by half of it and rose again: a trough of the background came and
    went on top of it (``held_rises`` checks it stayed up), where a spike still up would not have."""
    after = [v for s, v in raw if s >= when]
    low = min(range(len(after)), key=after.__getitem__)
    return max(after[: low + 1]) - after[low] >= 0.5 * rise and max(after[low:]) - after[low] >= 0.5 * rise


def unmatched_rises(
    moves: list[tuple[float, float]],
    within: float | None = None,
    exact: float | None = None,
    measured: dict[float, float] | None = None,
) -> list[tuple[float, float]]:
    """The rises no later fall of about their size gave back, oldest first.

    Only a fall of its own: where falls alike repeat (a sawtooth's teeth), one of them says
    nothing of the rise before it. With ``within``, falls alike repeat only where they
    outnumber the rises of their size (a tooth rises slowly and falls at once; spikes of one
    size that came and went rose as often as they fell). With ``exact``, a fall that gives a
    rise back to within it ends a spike all the same where rises of its size came as often,
    unless falls repeat to within it too (a spike frees what it took, to the noise, and
    spikes' heights vary; a tooth's falls are its height, to the noise). A fall gives back the
    rise closest to it in size (as ``measured`` has each, by when, where given); with ``within``,
    the newest within that of its size (a spike frees what it took, and the spike's own rise is
    the newest: a step of about its size taken before it is not).
    """
    falls = [-m for _, m in moves if m < 0]
    ups = [m for _, m in moves if m > 0]
    size = (measured or {}).get
    rises: list[tuple[float, float]] = []
    for when, move in moves:
        if move > 0:
            rises.append((when, move))
            continue
        repeats = sum(1 for f in falls if alike(-move, f))
        if repeats >= 3:  # (the rises are counted only here: this runs for every fall of every reading's jumps)
            outnumber = repeats > sum(1 for u in ups if alike(-move, u))
            spike = (  # a tooth's falls outnumber its rises, and repeat to the noise
                exact is not None
                and not outnumber
                and any(abs(r + move) <= exact for _, r in rises)
                and sum(1 for f in falls if abs(f + move) <= exact) < 3
            )
            if (within is None or outnumber) and not spike:
                continue
        if within is not None:
            same = [i for i, (_, r) in enumerate(rises) if abs(r + move) <= within]
            if same:
                del rises[same[-1]]
            continue
        sized = [i for i, (_, r) in enumerate(rises) if alike(-move, r)]
        if sized:
            fall = size(when, move)
            del rises[min(sized, key=lambda i: abs(size(*rises[i]) + fall))]
    return rises


def alike(a: float, b: float) -> bool:
    """Two moves of about one size: one could be the other given back."""
    return 0.67 * b <= a <= 1.5 * b


def gives_back(fall: float, rise: float) -> bool:
    """A fall (negative) of a rise's size, within a quarter of it: the end of that rise's spike."""
    return abs(rise + fall) <= 0.25 * rise


class Season(NamedTuple):
    """A background's period, in readings (``period_lag``)."""

    lag: int  # readings a period spans
    noise: float  # what readings a lag apart differ by: a median's worth
    repeats: bool  # the readings repeat (teeth read at a phase that comes round); else a slow ramp that wraps


def period_lag(values: Sequence[float]) -> Season | None:
    """The lag, in readings, at which the readings repeat, and their noise read that far apart;
    None where they do not (flat: noise is alike at every lag; spikes) or too few are seen.

    A periodic background sampled at a fixed interval repeats itself every ``lag`` readings, however
    it aliases (a 63 s tooth read every 60 s is a slow ramp that wraps every 20 readings). The lag
    is the one of at least 3 readings (so that 3 in a row confirm) with the smallest differences over
    the newest 300 readings (at least 60; lags up to a third of them, and none where the longest of those
    is the best: the period may lie beyond), read at their lower quartile (a step spoils a lag of them;
    steps a few periods apart most of them): a whole number of teeth, or nearly (a 9.3 s tooth read
    every 60.1 s alternates, and repeats best 29 readings on, where its phase has come round). Two
    readings where they alternate and that is quieter still (a 24.2 s tooth read every 60.1 s: its
    phase comes round only 82 readings on, where steps every 20 readings spoil every difference).
    Readings that do not move (a flat series, to the MiB) have no period. A slow ramp that wraps (a tooth
    aliased by the sampling) has one however shallow, even under noise a reading larger than its drift: read
    half a period apart its readings differ by half a tooth, as far as the drift over a period takes them.
    Steps closer together than the period (a leak that steps every half hour under a 63 s tooth read every
    minute) hold up most readings a lag apart at every lag, the period's too; the period still lines the
    teeth's wraps up, so there the change from one difference a lag apart to the next is quietest.
    """
    fit = values[-300:]
    if len(fit) < 60:
        return None

    top = min(len(fit) // 3, 100)
    # the lower quartile, scaled to what a median of noise would read
    residual = {lag: 2.12 * sorted(abs(b - a) for a, b in zip(fit, fit[lag:]))[(len(fit) - lag) // 4]
                for lag in range(1, top + 1)}  # fmt: skip
    lag = min((lag for lag in residual if lag >= 3), key=residual.__getitem__)
    if residual[2] < min(residual[lag], 0.5 * residual[1]):
        lag = 2
    noise = residual[lag]
    # steps closer together than the period: a step moves the difference a lag apart only twice (in, and a lag
    # later out), where each wrap a lag that is no period leaves unmatched moves it twice
    moves = [b - a for a, b in pairwise(fit)]
    rough = {k: sum(abs(b - a) for a, b in zip(moves, moves[k:])) / (len(moves) - k) for k in residual if k >= 2}
    wraps = min((k for k in rough if k >= 3), key=rough.__getitem__)
    if rough[lag] > 1.3 * rough[wraps] and _dips(rough, wraps):
        # the change of a difference is two differences' noise: 1/√2 of it is one's
        lag, noise = wraps, min(residual[wraps], 0.707 * median(abs(b - a) for a, b in zip(moves, moves[wraps:])))
    if lag == top:  # the readings may repeat further on: a period read short reads another phase of the tooth
        return None
    drift = abs(median(moves))
    repeats = noise < 0.5 * residual[1]  # the best of a hundred lags of noise is not
    # an aliased tooth: a slow ramp that wraps (steeper than its noise, or read half a period apart, by half a
    # tooth, that the ramp's drift over the period makes)
    half = residual[lag // 2]  # the lag is 2 or more
    ramp = drift >= 0.5 * residual[1] > 0 or noise < 0.25 * half <= drift * lag
    return Season(lag, noise, repeats) if repeats or ramp else None


def _dips(rough: dict[int, float], lag: int) -> bool:
    """The changes a lag apart (``rough``, per lag) are quieter at ``lag`` than three readings either side of it, by a
    fifth: the lag lines the background's turns up, as a period does. A lag that is no period can read quieter too,
    where the readings hold under two periods and the window's ends cut each wrap's pairs short, but then so do the
    lags next to it (a 59 s tooth read every minute wraps every 66 readings: two hours of them read about as quiet
    at every lag from 33 to 41, a fifth quieter than at 3)."""
    side = [rough[k] for k in (lag - 3, lag + 3) if k in rough]
    return bool(side) and min(side) > 1.2 * rough[lag]


def seasonal_change(raw: Readings, start: float, size: float, season: Season | None) -> float | None:
    """When a step of ``size`` happened after ``start``, read against the background's own period; None
    where the readings have no period to read against (flat, spikes) or it does not explain them.

    Read a period apart (``period_lag``), a reading less the one before it is noise, and a step
    lifts a period of them in a row. That dates the step to its reading where the top of a tooth
    (the readings' top, a jump between two readings) cannot: a tooth's wrap is a jump, and an
    aliased tooth's top is not seen until its phase comes round. The readings after the step must
    stay above the lowest of the period before it, by half the step, in every period of them (a
    spike comes back down), as far as the period's own drift alone could not take them there
    (``_held_until``).
    """
    if season is None or season.noise > 0.25 * size:
        return None  # no period, or one that does not explain the readings to a quarter of the step
    values = [v for _, v in raw]
    i0 = next((i for i, (s, _) in enumerate(raw) if s >= start), None)
    if i0 is None:
        return None
    lag = season.lag
    first = max(i0, lag + 1)
    # up by about the step (the period's noise is a quarter of it at most): a reading many times higher is a spike's,
    # and a step inside a spike came any time before it fell; such a reading dates nothing
    up = [0.5 * size < values[j] - values[j - lag] < 4 * size for j in range(first - 1, len(values))]
    for n in range(1, len(up) - 2):
        if up[n] and not up[n - 1] and sum(up[n : n + lag]) >= 0.8 * len(up[n : n + lag]):
            # a noisy start of the run: where most of a lag's differences after it are up and most before it are not
            # (the newest readings cut a later start's lag short: ups after it alone favour an early start), the latest
            n = max(
                (m for m in range(n, min(n + lag, len(up))) if up[m]),
                key=lambda m: (sum(up[m : m + lag]) + up[n:m].count(False), m),
            )
            i = first - 1 + n
            floor = min(values[i - lag : i]) + 0.5 * size
            if all(min(values[j : j + lag]) > floor for j in range(i, _held_until(values, i, size, season), lag)):
                return raw[i][0]
    return None


def _held_until(values: Sequence[float], i: int, size: float, season: Season) -> int:
    """Where the readings after a step at ``i`` are still checked to stay up: the last lag-block start, or
    sooner where the teeth's phase creeps.

    Readings whose lag is a near period drift a lag apart by as much every lag (the phase creeps: a
    24.2 s tooth read every 60.1 s alternates, each half sliding down the tooth), and after enough of
    them they are half a step lower with no step given back; held up until then, the step stays (a
    spike comes back down sooner). A slow ramp that wraps is checked to the end: its wrap is a jump
    as big as a step that the ramp takes back.
    """
    lag = season.lag
    end = len(values) - lag + 1
    if not season.repeats:
        return end
    drift = abs(median(values[m] - values[m - lag] for m in range(max(lag, i - 10 * lag), i)))
    return end if drift == 0 else min(end, i + lag * max(1, int(0.5 * size / drift)))
