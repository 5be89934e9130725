"""A tooth sampled slower than it repeats: its phase, found from the readings, and taken off them.

A 9.3 s allocation sawtooth read every 60 s is no sawtooth in the log: the readings alternate and drift,
and come round only after half an hour, so the floor over any shorter window rises and falls by most of
the tooth, and a 1% step hides in that (the floor dates it wherever the drift lifted it). Yet every
reading is the level plus the tooth at its phase, and the phase is exact: a timer's tooth keeps its
frequency. Sorted by the phase of the right frequency (any alias of it: only the phases at the sampling
times matter), the readings are one tooth again; that frequency is the one that makes their differences
smoothest in phase order (the string-length method of folding unevenly sampled series). The tooth's shape and height
then come from the differences between readings, which a level moved by steps leaves alone (a step is
one outlying difference, weighted out), and a reading less the tooth at its phase is the level a leak
moves.

``fold`` is pure: arrays in, a ``Fold`` out, or None where the readings do not fold (no tooth, or one not
regular). ``Unfolder`` keeps one life's readings and takes the tooth off each as it comes, time an argument.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

import numpy as np

_SHAPES = ("rise", "fall", "triangle")


@dataclass(frozen=True)
class Fold:
    """A regular tooth: ``height(t)`` above its bottom at any time, from its frequency and phase."""

    nu: float  # cycles per second (an alias: the phases at the sampling times are the tooth's)
    span: float  # seconds of readings it was fitted on: the frequency is known to about 1/20 cycle over them
    t0: float  # when the tooth was at its bottom
    amplitude: float
    shape: str

    def height(self, t: float, near: float | None = None) -> float:
        """The tooth's height at ``t``; within 0.15 of a cycle of its wrap (where a phase a little off puts a
        reading on the wrong side), of the two sides of the wrap the one nearer ``near``."""
        phase = (t - self.t0) * self.nu % 1.0
        h = self.amplitude * float(_tooth(np.asarray(phase), self.shape))
        if near is not None and self.shape != "triangle" and min(phase, 1.0 - phase) < 0.15:
            other = h + self.amplitude if (phase < 0.5) == (self.shape == "rise") else h - self.amplitude
            return min((h, other), key=lambda x: abs(near - x))
        return h


class Unfolder:
    """The tooth taken off each reading as it comes: found on the newest readings where they repeat, and
    refitted as they come near the frequency it had, at its phase or else at any (a tooth that stops, or
    changes, is no longer taken off; extrapolated for long, a phase a little off would put readings on the
    wrong side of its wrap)."""

    def __init__(self, size: int = 60, every: int = 30, keep: int = 480) -> None:
        self.size, self.every = size, every
        self.fold: Fold | None = None
        self._known: Fold | None = None  # the last life's tooth: a restart keeps its frequency, not its phase
        self._times: deque[float] = deque(maxlen=keep)
        self._values: deque[float] = deque(maxlen=keep)
        self._due = size
        self._wait = every
        self._tried = False  # this life's tooth was looked for
        self._last: float | None = None
        # the readings kept, read again as the tooth is known now, where the newest reading changed it; else None
        self.read_again: dict[float, float] | None = None

    def reset(self) -> None:
        """A new life of the process: its tooth starts at a new phase (found on fewer readings, where the
        last life had one: only the phase is new)."""
        self._known = self.fold or self._known
        self.fold, self._last, self._wait, self._tried = None, None, self.every, False
        self._due = self.size if self._known is None else self.size // 3
        self._times.clear()
        self._values.clear()

    @property
    def refinding(self) -> bool:
        """A tooth the last life had is not yet looked for in this one: until it is, the readings still carry it at
        a phase no one knows (a step read from them is dated by where the tooth happened to be)."""
        return self._known is not None and not self._tried

    @property
    def hidden(self) -> float:
        """How tall a tooth the readings may carry that is not taken off them: the last life's, until this life's
        is looked for (0 otherwise)."""
        if not self.refinding:
            return 0.0
        assert self._known is not None  # refinding: the last life had one
        return self._known.amplitude

    def correct(self, t: float, value: float, repeats: bool) -> float:
        """``value`` less the tooth at ``t``; ``repeats``: the readings were seen to repeat (only then is a
        tooth looked for: the search is the costly part)."""
        self._times.append(t)
        self._values.append(value)
        self._due -= 1
        self.read_again = None
        if self._due <= 0 and (repeats or self.fold is not None or self._known is not None):
            was = self.fold
            anew = was is None
            self._tried = True
            # a tooth is looked for on the newest readings, and refitted on all of them since the process
            # started: a frequency is only as exact as the time it is measured over
            n = min(self.size, len(self._values)) if anew else len(self._values)
            times = np.fromiter(itertools.islice(self._times, len(self._times) - n, None), float)
            values = np.fromiter(itertools.islice(self._values, len(self._values) - n, None), float)
            self.fold = fold(times, values, was or self._known, phased=not anew)
            # each refit waits longer (the frequency is known better each time), as does each search that
            # found nothing (readings that repeat, but not as a tooth)
            self._wait = self.every if anew == (self.fold is not None) else min(2 * self._wait, 8 * self.every)
            self._due = self._wait
            if self.fold is not was:
                # a tooth found, refitted or lost changes what the readings before it were, not only what comes:
                # all are read again, the side of each wrap from the oldest reading kept on
                self._last = None
                self.read_again = {s: self._take_off(s, v) for s, v in zip(self._times, self._values)}
                return self.read_again[t]
        return self._take_off(t, value)

    def _take_off(self, t: float, value: float) -> float:
        if self.fold is None:
            self._last = None
            return value
        self._last = value - self.fold.height(t, None if self._last is None else value - self._last)
        return self._last


def fold(times: np.ndarray, values: np.ndarray, was: Fold | None = None, phased: bool = True) -> Fold | None:
    """The tooth that folds these readings (near the one they had, ``was``, if given: at its phase where it
    still fits there, unless ``phased`` is false, else at any), or None: the tooth must take away most of the
    jumps between readings (what is left is their noise), and one looked for anew must make their differences
    in phase order at most a third as rough as in time order (a flat series, a ramp or spikes fold no smoother:
    a bound too strict for a tooth aliased to a slow one, a wrap every ten readings, once found)."""
    span = float(times[-1] - times[0])
    n = len(values)
    if n < (10 if was is not None else 30) or span <= 0:
        return None
    # phase order changes when the last reading's phase moves by about the phases' spacing: trials 1/20 of a
    # cycle apart over the readings find the smoothest order; the tooth's own fit then places the frequency
    # within a tenth of that (the smoothest order is one of several alike where the tooth wraps seldom)
    step = 0.05 / span
    if was is not None:
        near = 0.1 / was.span
        nus = np.linspace(was.nu - near, was.nu + near, 21)
        if phased:
            start = (was.t0 - times[0]) * was.nu % 1.0
            held = _tooth_fit(nus, times, values, (was.shape,), (start + np.arange(-2, 3) / 64) % 1.0, found=True)
            if held is not None:
                return held
            # near a rational alias (readings that come round to a few phases, drifting slowly) the frequency a
            # first fit finds is off by more than its span says, and a refit held at its phase fails though the
            # tooth is plainly there: refitted at any phase, the refits walk to the frequency
        return _tooth_fit(nus, times, values, (was.shape,), np.arange(64) / 64)
    trials = np.arange(2.0 / span, 0.5 * (n - 1) / span, step)  # two cycles at least: slower is drift; the rest mirror these
    # the differences between readings, not the readings: a step moves the level of every reading after it
    # (in phase order, readings from either side of it alternate) but is one difference
    rel, diffs = times[1:] - times[0], np.diff(values)
    rough = _roughness(trials, rel, diffs)
    best = int(np.argmin(rough))
    if not rough[best] < float(np.abs(np.diff(diffs)).sum()) / 3:
        return None
    nu = float(trials[best])
    return _tooth_fit(np.linspace(nu - 2 * step, nu + 2 * step, 21), times, values, _SHAPES, np.arange(32) / 32)


def _roughness(trials: np.ndarray, rel: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The string length of ``values`` in phase order, for each trial frequency."""
    order = np.argsort(np.outer(trials, rel) % 1.0, axis=1)
    folded = values[order]
    return np.abs(np.diff(folded, axis=1)).sum(axis=1) + np.abs(folded[:, 0] - folded[:, -1])


def _tooth(phase: np.ndarray, shape: str) -> np.ndarray:
    if shape == "rise":
        return phase
    if shape == "fall":
        return 1.0 - phase
    return 1.0 - np.abs(2.0 * phase - 1.0)


def _tooth_fit(
    nus: np.ndarray, times: np.ndarray, values: np.ndarray, shapes: tuple[str, ...], starts: np.ndarray,
    found: bool = False,
) -> Fold | None:
    """The frequency, shape, phase and height whose differences between readings match the readings' own,
    a step's jump (one difference far off the fit) weighted out; held to less once ``found`` (readings that
    switch between taking a tooth off and not jump by it each time). Where a tooth is looked for (not yet
    ``found``), a difference larger than the tooth could make (by misplacing a whole wrap) is left out of what it
    must explain as well: on the 20-60 readings a search has, one step's jump can be a third of their roughness,
    and after a restart a step among the twenty readings kept the last life's tooth from being found again for good
    (and drew the fit to put a wrap on it). Differences the tooth could have made all count, as they did."""
    diffs = np.diff(values)
    nu = np.repeat(nus, len(starts))
    start = np.tile(starts, len(nus))
    phase = ((times - times[0])[None, :] * nu[:, None] - start[:, None]) % 1.0  # one row per (frequency, start)
    best: tuple[float, int, float, str] | None = None
    for shape in shapes:
        tooth = np.diff(_tooth(phase, shape), axis=1)
        weights = np.ones_like(tooth)
        amplitude = np.zeros(len(nu))
        for _ in range(3):  # jumps the tooth does not explain (a step's) stop counting
            wt = weights * tooth
            amplitude = (wt * diffs).sum(axis=1) / np.maximum((wt * tooth).sum(axis=1), 1e-12)
            residual = np.abs(diffs - amplitude[:, None] * tooth)
            scale = np.maximum(1.4826 * np.median(residual, axis=1), 1e-9)
            weights = np.minimum(1.0, 2.0 * scale[:, None] / np.maximum(residual, 1e-12))
        residual = np.abs(diffs - amplitude[:, None] * tooth)
        # the sum, not the median: most differences are the tooth's slope, and only the sum sees its wraps (less a
        # step's, where the tooth is looked for: the worst, where it is larger than the tooth)
        worst = residual.max(axis=1)
        stepped = np.zeros(len(nu), bool) if found else worst > np.abs(amplitude)
        lefts = residual.sum(axis=1) - np.where(stepped, worst, 0.0)
        lefts[amplitude <= 0] = np.inf
        i = int(np.argmin(lefts))
        if best is None or lefts[i] < best[0]:
            best = (float(lefts[i]), i, float(amplitude[i]), shape)
            misfit = float(np.median(residual[i]))
            step_at = int(np.argmax(residual[i])) if stepped[i] else None
    assert best is not None
    left, i, height, shape = best
    # the tooth must explain the readings' jumps: what is left is about their noise, far under the tooth, and
    # the readings less the tooth at most a third as rough as they are
    rough = np.abs(diffs).sum() - (0.0 if step_at is None else abs(float(diffs[step_at])))
    if not (height > (3 if found else 6) * misfit and left < rough / (2 if found else 3)):
        return None
    at = float(times[0]) + float(start[i]) / float(nu[i])
    return Fold(nu=float(nu[i]), span=float(times[-1] - times[0]), t0=at, amplitude=height, shape=shape)
