"""How much memory readings jitter: the rise a step must beat, and the jump between two readings noise does not make.

Robust estimates only (MAD of first differences, percentiles), because the
series being measured contains the very steps and spikes the estimate must
not be inflated by.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from statistics import median
from typing import Iterable


class Noise:
    def __init__(self) -> None:
        self.diffs: deque[float] = deque(maxlen=301)  # |reading - previous reading|
        self.floors: deque[float] = deque(maxlen=12)  # the envelope once per window: its own jitter
        self.sigma = 0.0  # of the readings
        self.spread = 0.0  # how far the background spreads above its floor: p10 to p90
        self.sigma_floor: float | None = None  # of the floor, once six windows are seen
        self.measured = False  # sigma is read from ten differences or more

    def estimate(self, raw: Iterable[tuple[float, float]]) -> None:
        """From the newest 300 readings (``raw`` newest first), the differences and the floors seen so far."""
        recent = sorted(v for _, v in itertools.islice(raw, 300))
        if len(recent) >= 10:
            self.spread = recent[9 * len(recent) // 10] - recent[len(recent) // 10]
        if len(self.diffs) >= 10:
            # MAD of first differences: sigma of the readings, robust to the steps themselves
            self.sigma = 1.4826 * median(self.diffs) / math.sqrt(2)
            self.measured = True
        if len(self.floors) >= 6:
            diffs = [abs(b - a) for a, b in zip(self.floors, list(self.floors)[1:])]
            self.sigma_floor = 1.4826 * median(diffs) / math.sqrt(2)

    def k(self, half_smallest_step: float, factor: float) -> float:
        """Half the smallest step worth finding, or ``factor`` sigmas of the floor's jitter, whichever is larger;
        the whole smallest step until the jitter is measured (a log's first readings: any jitter passes half)."""
        if not self.measured:
            return 2 * half_smallest_step
        jitter = self.sigma if self.sigma_floor is None else min(self.sigma, self.sigma_floor)
        return max(half_smallest_step, factor * jitter)

    def jump_threshold(self, k: float) -> float:
        """A rise between two readings that noise does not make: a step's jump."""
        return max(1.5 * k, 6 * self.sigma)
