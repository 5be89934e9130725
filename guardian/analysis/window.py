"""Time windows over counters, gauges and histograms, fed one poll at a time.

Counters are stored reset-adjusted: each new value adds ``value - previous``
when the counter grew and ``value`` when it went down (a restart starts from
zero, as PromQL's ``increase`` assumes). The increase over any window is then
one subtraction, so a poll costs O(1) per series however long the window.
Time is always an argument: these are pure data structures.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar
from guardian.analysis.latency import histogram_quantiles
from guardian.sample import Histogram

V = TypeVar("V")


class Ring(Generic[V]):
    """(t, value) points kept for ``horizon`` seconds and at most ``max_points``: what both windows share."""

    __slots__ = ("horizon", "points")

    def __init__(self, horizon: float, max_points: int = 100_000) -> None:
        self.horizon = horizon
        self.points: deque[tuple[float, V]] = deque(maxlen=max_points)

    def add(self, t: float, value: V) -> None:
        self.points.append((t, value))
        cutoff = t - self.horizon
        while len(self.points) > 1 and self.points[0][0] < cutoff:
            self.points.popleft()

    def clear(self) -> None:
        self.points.clear()

    def span(self, t0: float) -> tuple[tuple[float, V], tuple[float, V]] | None:
        """The first point at or after ``t0`` and the last point, when they are two different points."""
        points = self.points
        if len(points) < 2:
            return None
        for first in points:  # the window's start is a few points from the oldest (the horizon's slack)
            if first[0] >= t0:
                break
        else:
            return None
        last = points[-1]
        return None if first is last else (first, last)


class CounterWindow:
    """A monotonic counter as seen poll by poll; rates and increases survive resets."""

    __slots__ = ("_ring", "_last_raw", "_adjusted", "resets")

    def __init__(self, horizon: float) -> None:
        self._ring: Ring[float] = Ring(horizon)
        self._last_raw: float | None = None
        self._adjusted = 0.0
        self.resets = 0

    def add(self, t: float, value: float | None) -> None:
        if value is None or math.isnan(value):
            return
        if self._last_raw is not None:
            if value >= self._last_raw:
                self._adjusted += value - self._last_raw
            else:
                self._adjusted += value
                self.resets += 1
        self._last_raw = value
        self._ring.add(t, self._adjusted)

    def increase(self, now: float, window: float) -> float | None:
        """Increase over the last ``window`` seconds; None without two points inside it."""
        span = self._ring.span(now - window)
        return None if span is None else span[1][1] - span[0][1]

    def rate(self, now: float, window: float) -> float | None:
        """Per-second rate over the window, between the first and last points in it."""
        span = self._ring.span(now - window)
        if span is None or span[1][0] <= span[0][0]:
            return None
        return (span[1][1] - span[0][1]) / (span[1][0] - span[0][0])


@dataclass(frozen=True, slots=True)
class Quantiles:
    p50: float | None
    p90: float | None
    p99: float | None
    count: float  # observations inside the window


class HistogramWindow:
    """A cumulative histogram as seen poll by poll; quantiles over the observations of a window.

    The bucket layout is taken from the first snapshot; a different layout
    (vLLM upgraded with new buckets) starts the window over.
    """

    __slots__ = ("_bounds", "_ring", "_last_raw", "_adjusted", "resets")

    def __init__(self, horizon: float) -> None:
        self._bounds: tuple[float, ...] | None = None
        self._ring: Ring[tuple[float, ...]] = Ring(horizon)
        self._last_raw: tuple[float, ...] | None = None
        self._adjusted: list[float] = []
        self.resets = 0

    def add(self, t: float, hist: Histogram | None) -> None:
        if hist is None:
            return
        bounds, raw = zip(*hist.buckets)  # two tuples, built in C
        if bounds != self._bounds:
            self._bounds = bounds
            self._ring.clear()
            self._last_raw = None
            self._adjusted = [0.0] * len(bounds)
        last = self._last_raw
        if last is not None:
            # A reset shows as the total going down; any bucket going down also means one.
            if raw[-1] < last[-1] or any(map(operator.lt, raw, last)):
                self.resets += 1
                self._adjusted = [a + c for a, c in zip(self._adjusted, raw)]
            else:
                self._adjusted = [a + c - p for a, c, p in zip(self._adjusted, raw, last)]
        self._last_raw = raw
        self._ring.add(t, tuple(self._adjusted))

    def delta(self, now: float, window: float) -> list[tuple[float, float]] | None:
        """Cumulative bucket counts of the observations made in the window."""
        span = self._ring.span(now - window)
        if self._bounds is None or span is None:
            return None
        first, last = span
        return [(b, l - f) for b, l, f in zip(self._bounds, last[1], first[1])]

    def quantiles(self, now: float, window: float) -> Quantiles | None:
        buckets = self.delta(now, window)
        if buckets is None:
            return None
        p50, p90, p99 = histogram_quantiles((0.5, 0.9, 0.99), buckets)
        return Quantiles(p50=p50, p90=p90, p99=p99, count=buckets[-1][1])
