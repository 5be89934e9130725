"""The gateway's concurrency cap, following what the engine can hold: pure, one engine, one poll.

A cap equal to vLLM's ``--max-num-seqs`` lets a burst through to the engine
whole: vLLM admits sequences until its KV pool is full, then preempts and
recomputes them, and every request in it slows down, the urgent ones too.
Past the number of sequences the pool holds, requests are better off in
the gateway's queue, where the high lane goes first and a deadline can be
told to the client. So, each poll (under the tuner's batch, when the tuner
is on: its batch is this cap's ceiling):

- the engine has requests waiting while its pool is full or it preempts:
  the cap comes down to the sequences it runs (the pool's measure of what
  fits), never below ``floor``;
- otherwise, when the gateway holds requests back (at the cap, or
  queued: the low lane stops short of it, see ``gateway/admission.py``), the pool has
  room, nothing waits inside the engine and nothing was preempted lately:
  the cap grows by a tenth (at least one) every ``grow_every_seconds``, up
  to the ceiling (the configured concurrency, or the tuner's batch).

Additive growth, a cut to what fits: the cap settles where the pool is full
without queueing or preempting, and follows it as prompts get longer or
shorter. (Measured on ``bench/efficacy.py``'s burst: a cut of a quarter at
most per poll, or growth while the engine still preempted, each left the
high lane's P99 TTFT 1.5-2x worse.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CapParams:
    ceiling: int  # [gateway] concurrency: the cap never goes above it
    floor: int = 4
    full_kv_usage_ratio: float = 0.9  # the pool counts as full from here (the breaker's L2 entry)
    calm_preemptions_per_second: float = 0.5
    grow_every_seconds: float = 5.0


@dataclass(frozen=True)
class CapState:
    cap: int
    changed_at: float | None = None


@dataclass(frozen=True)
class Pressure:
    """What one poll saw of the engine and the gateway in front of it; None: unknown."""

    running: float | None
    waiting: float | None
    kv_usage: float | None
    preemptions_per_second: float | None
    in_flight: int  # the gateway's, to this engine
    queued: int = 0  # waiting at the gateway for this engine


def step(state: CapState, p: Pressure, t: float, params: CapParams) -> tuple[CapState, str | None]:
    """The cap after this poll, and why it moved (None: it did not)."""
    preempting = p.preemptions_per_second is not None and p.preemptions_per_second > params.calm_preemptions_per_second
    full = p.kv_usage is not None and p.kv_usage >= params.full_kv_usage_ratio
    if p.waiting and p.running is not None and (full or preempting):
        fits = max(params.floor, min(state.cap, math.floor(p.running)))
        if fits < state.cap:
            return CapState(fits, t), "kv_full" if full else "preempting"
        return state, None
    grown = min(params.ceiling, state.cap + max(1, state.cap // 10))
    room = p.kv_usage is not None and p.kv_usage < params.full_kv_usage_ratio and not preempting and not p.waiting
    rested = state.changed_at is None or t - state.changed_at >= params.grow_every_seconds
    held_back = p.in_flight >= state.cap or p.queued > 0  # the cap is what keeps requests from the engine
    if room and rested and held_back and grown > state.cap:
        return CapState(grown, t), "room"
    return state, None
