"""A model load told by what memory does, not by a clock: weights, a pause to profile, the KV pool, CUDA graphs.

Loads take 30 s to 10 minutes and more (a long ``torch.compile``); a fixed
warm-up either cuts a long one short, so its KV pool becomes a "step", or
blinds the detector for minutes after every short one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Load:
    """A load in progress: since when, its highest readings (big rises and small ones) and when each last rose."""

    since: float
    top: float = -math.inf
    creep: float = -math.inf
    rise_t: float = -math.inf
    creep_t: float = -math.inf

    @classmethod
    def begin(cls, t: float) -> Load:
        return cls(since=t, rise_t=t, creep_t=t)

    def over(self, t: float, value: float, k: float, budget: float,
             settle_seconds: float, envelope_seconds: float, warmup_seconds: float) -> bool:  # fmt: skip
        """Over when memory has not risen by 1% of the budget for ``settle_seconds``, nor by ``k`` for one window.

        The big rises are the load's phases (weights, KV pool) with pauses for profiling and
        compiling between them; the small ones its CUDA graphs, captured last.
        """
        if value > self.top + max(k, 0.01 * budget):
            self.top, self.rise_t = value, t
        if value > self.creep + k:
            self.creep, self.creep_t = value, t
        return t - self.rise_t >= settle_seconds and t - self.creep_t >= envelope_seconds and t - self.since >= warmup_seconds
