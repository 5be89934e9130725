"""How long a background stays off its floor, from its troughs: the time scale a floor must be taken over.

``leak.py`` measures time off the floor as the time between returns to the
hour's lowest reading. A staircase whose steps come about once per period
never returns there, so the window stayed at its shortest and a sawtooth's
flank was read as the floor (on the generator's slow sawtooths a whole leak
went unseen). Troughs found with hysteresis do not depend on the floor: an
excursion is the time from leaving one trough to reaching the next, however
high each is. A step (a rise never given back by the hysteresis) makes no
trough; a spike's excursion is its length; a sawtooth's is its period.

Pure: readings and time in, excursion lengths out.
"""

from __future__ import annotations

import math


class Excursions:
    """A zigzag over the readings: peaks and troughs at least ``m`` apart (``m`` above the noise)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """A load, a restart, a gap: what comes next is a new series."""
        self._rising = True  # after a trough (or at the start): looking for a peak
        self._peak = -math.inf
        self._low = math.inf
        self._anchor = math.inf  # the reading that last lowered the trough by m/2: when it was reached, in effect
        self._low_t = 0.0
        self._left: float | None = None  # when the series rose out of the last trough
        self.span = (math.nan, math.nan)  # the last excursion: from leaving a trough to reaching the next

    def update(self, t: float, value: float, m: float) -> float | None:
        """The length of an excursion that ended in a trough now behind, or None."""
        if self._rising:
            if value > self._peak:
                self._peak = value
            elif value < self._peak - m:  # the peak is behind: down to a trough
                self._rising = False
                self._low = self._anchor = value
                self._low_t = t
            return None
        self._low = min(self._low, value)
        if value < self._anchor - m / 2:
            self._anchor, self._low_t = value, t
        if value <= self._low + m:
            return None
        # out of the trough: it was reached at low_t; the excursion ran from the last one's end to it
        length = None if self._left is None else self._low_t - self._left
        if self._left is not None:
            self.span = (self._left, self._low_t)
        self._left, self._rising, self._peak = t, True, value
        return length
