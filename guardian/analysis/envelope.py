"""The lower envelope of a series: its minimum over a sliding time window whose length may change.

A leak moves the floor of memory, not its peaks; the floor over the
background's own period is the level a step must lift (``leak.py``).
"""

from __future__ import annotations

from bisect import bisect_left


class Envelope:
    """A monotonic queue searched by time: O(1) amortised per reading, any window up to ``keep``."""

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
