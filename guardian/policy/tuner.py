"""The tuner: an engine's batch, speculation and long-prefill cap, steered against P99 and GPU utilisation.

Two speeds. The fast loop moves the *effective batch*: the ceiling of the
admission gateway's concurrency cap for the engine (the cap itself follows
the KV pool under it, ``policy/concurrency.py``), changed at once and
without a restart. The slow loop changes what vLLM fixes at start (``--max-num-seqs``,
``--speculative-config``, ``--long-prefill-token-threshold``) by a drained
restart, and only when it must: the fast loop is pinned at the engine's own
limit for ``pinned_seconds``, speculation should change, or long prompts'
prefill keeps others waiting in vLLM. Slow moves need an open window (cron), room in the
daily restart budget, and are counted against the breaker's hourly budget
too. Without a gateway there is no fast loop, and batch moves become slow
ones on ``--max-num-seqs``.

Rules, per poll, for one engine (P99 is the SLO's metric over the engine's
latency window):

| condition over the whole stabilisation window | move |
| --- | --- |
| breaker above L1, or a restart under way | none (and the window starts over) |
| ``--max-num-seqs`` unknown, and vLLM runs the same N requests with others waiting and KV to spare (the short window) | the batch to N: that is the engine's limit (learnt, short cooldown) |
| inside the cooldown after any move | none |
| vLLM's P99 queue time over ``blocked_queue_seconds`` with KV to spare and nothing preempted, a long prompt and others in flight at most polls (the long window), no cap on long prefills yet | ``--long-prefill-token-threshold`` to ``long_prefill_tokens`` (slow, once) |
| no SLO yet: none configured and the engine's unloaded P99 not learnt | only the preemption rule (and the one above) |
| the first full window after a smaller batch shows P99 (or the preemptions it was for) not lower by ``improve_ratio`` | the batch back up; no smaller batch for ``blocked_seconds``, doubled per undo in a row |
| preemptions above ``preemption_rate_limit`` throughout | batch down one step; the old batch is a ceiling for ``blocked_seconds`` (undone, like any smaller batch, when the preemptions did not drop) |
| P99 above the band and requests queued in front of the engine | none: overloaded, a smaller batch would grow the queue (more replicas help) |
| P99 above the band, nothing queued, speculation on | speculation off (slow) |
| P99 above the band, nothing queued | batch down one step, floored at ``min_batch`` |
| requests held back by the batch (in the gateway's queue; without a gateway, in vLLM's with KV to spare) and P99 not above the band | batch up one step, up to the hardware cap |
| P99 below the band, the GPU idle (< 60%) and a queue | batch up one step, up to the hardware cap |
| P99 well inside (≤ ``headroom_ratio`` × target) for ``speculation_after_seconds`` with a batch ≤ ``speculation_max_batch`` | speculation on (slow), where allowed |

The SLO is the configured one, or ``unloaded_factor`` times the engine's
P99 over a full window with nothing waiting inside vLLM (the lowest such
window seen), and the same derived one when the configured target is below
that P99: no batch can meet it, and steering by it would hold "overloaded"
for ever (``policy/slo.py``'s ``objective``; the refusal is the hold).

An engine started by someone else with an unknown ``--max-num-seqs`` would
otherwise be assumed to take the hardware cap: when it is smaller, vLLM's
own queue fills while the gateway sees nothing to hold back, and the tuner
never learns the engine is pinned. vLLM running the same number of requests
poll after poll while others wait in it, with KV to spare, is that limit.

"Over the whole window" is the HPA's stabilisation: every poll recommends,
and the batch goes down only when each recommendation in the window says
down (the max over the window), up only when each says up. A P99 that
wanders across the target therefore never moves anything, and after a move
the cooldown lets the engine settle before the next.

The P99 is vLLM's own (from the engine's histograms): time spent in the
gateway's queue is not in it. That is on purpose. A P99 over the objective
means the engine itself is slow per request, and a smaller batch helps; a
queue in front of an engine whose P99 is inside means clients wait for the
batch, not for the GPU, and a larger batch helps. Steering by what clients
see (queue included) would lower the batch exactly when the queue grows, and
the queue would grow further.

NVML's utilisation is the share of time *a* kernel ran, which a vLLM engine
with any request running keeps near 100% at every batch size; measured on
the simulator and documented for real GPUs alike. As a sign of room to grow
it only says something while the engine idles, so it is one of the two
reasons to raise, not a condition of both.

Pure: time, readings and limits come in as arguments; the move comes out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping

from guardian.analysis.engine_stats import EngineSignals
from guardian.policy.slo import Slo, objective

DAY_SECONDS = 86400.0
MoveKind = Literal["batch", "max_num_seqs", "speculation", "long_prefill"]


@dataclass(frozen=True)
class TunerParams:
    slo: Slo = field(default_factory=Slo)
    window_seconds: float = 60.0  # stabilisation window for a smaller batch: every poll in it must agree
    min_samples: int = 6  # polls with a P99 in that window before the batch goes down
    cooldown_seconds: float = 120.0  # after a smaller batch or a restart: nothing moves
    up_window_seconds: float = 15.0  # a queue is answered quickly (the HPA scales up without a long window)
    up_min_samples: int = 3
    up_cooldown_seconds: float = 30.0  # after a larger batch, before the next larger one
    up_step_ratio: float = 0.5  # a larger batch: this share more, at least 1
    raise_below_utilization: float = 0.6
    kv_spare_below: float = 0.9  # vLLM's own queue with KV usage under this: held back by --max-num-seqs, not memory
    headroom_ratio: float = 0.5  # P99 at most this share of the target: "well inside", for speculation
    step_ratio: float = 0.25  # a smaller batch: this share less, at least 1
    min_batch: int = 1
    pinned_seconds: float = 300.0  # the fast loop at the engine's limit this long: raise the limit
    speculation_after_seconds: float = 600.0
    speculation_max_batch: int = 4
    restarts_per_day: int = 3
    improve_ratio: float = 0.1  # a smaller batch must lower P99 by this share (worst after vs best before), or it is undone
    blocked_seconds: float = 900.0  # after an undone move the batch is not lowered for this long, doubled per undo in a row
    preemption_rate_limit: float = 0.05  # preemptions/s (3 a minute) throughout the window: the batch is too large
    unloaded_factor: float = 3.0  # a derived SLO: this many times the engine's P99 with nothing waiting in it
    long_prefill_tokens: int = 1024  # --long-prefill-token-threshold when long prompts' prefill holds short ones back
    blocked_queue_seconds: float = 0.5  # vLLM's P99 queue time over the window that says requests wait for the token budget
    long_share: float = 0.8  # share of the window's polls with a long prompt in flight


@dataclass(frozen=True)
class Limits:
    """What bounds one engine's tuning; fixed between config reloads."""

    hardware_cap: int
    fast: bool  # a gateway sets the effective batch without restarts
    speculation_allowed: bool  # every class the engine serves allows it
    speculative_config: Mapping[str, Any] | None  # what speculation on means for this engine; None: never on


@dataclass(frozen=True)
class Reading:
    """One poll of one engine, as the tuner sees it."""

    latency: float | None  # the SLO metric's P99, seconds
    utilization: float | None  # the engine's GPU, 0..1
    gateway_queued: float  # requests the gateway holds for this engine
    waiting: float = 0.0  # requests vLLM holds (vllm:num_requests_waiting)
    running: float | None = None  # requests vLLM runs (vllm:num_requests_running)
    kv_usage: float | None = None
    preemptions_per_second: float | None = None  # vLLM recomputing sequences: the batch overflows the KV cache
    breaker_level: int = 0
    restarting: bool = False
    degraded: bool = False  # the breaker's degraded profile is on: speculation stays off
    window_open: bool = True  # a restart for tuning may begin now
    queue_p99: float | None = None  # vLLM's own P99 time in its waiting queue, seconds (vllm:request_queue_time_seconds)
    long_in_flight: bool = False  # the gateway has a long prompt in flight to this engine
    short_in_flight: bool = True  # and others beside it (no gateway: not known, so not ruled out)
    restart_budget_ok: bool = True  # the breaker's hourly budget has room beyond its own reserve


def reading_from(sig: EngineSignals, slo: Slo, utilization: float | None, gateway_queued: float, **context: Any) -> Reading:
    """One poll's signals as the tuner reads them: the daemon's path and the benchmark's."""
    q = sig.latency.get(slo.metric)
    return Reading(
        latency=q.p99 if q is not None and q.count > 0 else None,
        utilization=utilization,
        gateway_queued=gateway_queued,
        waiting=sig.waiting or 0.0,
        running=sig.running,
        kv_usage=sig.kv_cache_usage,
        preemptions_per_second=sig.preemptions_per_second,
        queue_p99=queue.p99 if (queue := sig.latency.get("queue")) is not None and queue.count > 0 else None,
        **context,
    )


@dataclass(frozen=True)
class TunerState:
    batch: int
    max_num_seqs: int | None  # None: vLLM's default, above any hardware cap
    speculation: bool
    recent: tuple[tuple[float, Reading], ...] = ()
    last_move: float | None = None
    last_move_up: bool = False  # the last move was a larger batch (the short cooldown applies)
    pinned_since: float | None = None
    well_inside_since: float | None = None
    restarts: tuple[float, ...] = ()  # slow moves inside the last day
    # a smaller batch on trial: (what it should lower: "p99" or "preemptions", its best value before, the batch before)
    trial: tuple[str, float, int] | None = None
    blocked_down_until: float | None = None  # after an undone smaller batch for P99
    blocked_preemption_until: float | None = None  # after an undone smaller batch for preemptions: another cause
    undone: int = 0  # smaller batches undone in a row: P99 here does not answer to the batch (long prompts' prefill)
    ceiling: tuple[int, float] | None = None  # (batch, until): it overflowed the KV cache; stay below it until then
    unloaded: float | None = None  # the lowest P99 over a full window with nothing waiting in vLLM: what a derived SLO is made of
    long_prefill: int | None = None  # --long-prefill-token-threshold the engine runs with; None: vLLM's default (no cap)

    def engine_args(self, limits: Limits) -> dict[str, Any]:
        """The layer a restart applies over the engine's base arguments (``None`` removes a flag)."""
        layer: dict[str, Any] = {"speculative-config": dict(limits.speculative_config) if self.speculation and limits.speculative_config else None}
        if self.max_num_seqs is not None:
            layer["max-num-seqs"] = self.max_num_seqs
        if self.long_prefill is not None:
            layer["long-prefill-token-threshold"] = self.long_prefill
        return layer


@dataclass(frozen=True)
class Move:
    kind: MoveKind
    old: int | bool | None
    new: int | bool
    reason: str
    restart: bool  # a slow move: applied by a drained restart
    numbers: Mapping[str, float | int | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "old": self.old, "new": self.new, "reason": self.reason, "restart": self.restart,
                "numbers": dict(self.numbers)}  # fmt: skip


@dataclass(frozen=True)
class Step:
    state: TunerState
    move: Move | None = None
    hold: str | None = None  # why nothing moved, when something wanted to


def initial(max_num_seqs: int | None, speculation: bool, limits: Limits, gateway_cap: int | None = None,
            long_prefill: int | None = None) -> TunerState:
    """Start where the engine is: at its own limit, or the gateway's cap if that is lower.

    The GPU's batch cap bounds raises only: an engine already serving more than it does keeps
    its batch until its P99 says otherwise (the tuner is on by default, and must not cut a
    well-sized engine to a table's number). With neither known, the hardware cap.
    """
    known = [n for n in (max_num_seqs, gateway_cap) if n is not None]
    batch = min(known) if known else limits.hardware_cap
    return TunerState(batch=batch, max_num_seqs=max_num_seqs, speculation=speculation, long_prefill=long_prefill)


def step_size(batch: int, ratio: float) -> int:
    return max(1, math.ceil(batch * ratio - 1e-9))


def step(s: TunerState, r: Reading, t: float, p: TunerParams, limits: Limits) -> Step:
    s = replace(s, restarts=tuple(x for x in s.restarts if t - x < DAY_SECONDS))
    if r.restarting or r.breaker_level > 1:
        why = "a restart is under way" if r.restarting else f"breaker at L{r.breaker_level}"
        return Step(replace(s, recent=(), pinned_since=None, well_inside_since=None, trial=None), hold=why)
    keep = max(p.window_seconds, p.up_window_seconds)
    recent = tuple((at, x) for at, x in s.recent if t - at < keep) + ((t, r),)
    s = replace(s, recent=recent, unloaded=_unloaded(s.unloaded, recent, t, p))
    slo, refused = slo_in_force(s, p, limits)
    out = _rules(s, r, t, p, limits, slo)
    if refused and out.move is None and out.hold is None:
        return replace(out, hold=refused)
    return out


def _held_back(xs: list[Reading], p: TunerParams, limits: Limits) -> bool:
    """Requests kept from the engine by the batch: the gateway's queue, or without one vLLM's with KV to spare."""
    if limits.fast:
        return all(x.gateway_queued > 0 for x in xs)
    return all(x.waiting > 0 and x.kv_usage is not None and x.kv_usage < p.kv_spare_below for x in xs)


def _cannot_lower(s: TunerState, t: float, p: TunerParams, limits: Limits) -> bool:
    """No smaller batch can bring P99 down: at the floor, tried and undone, or the load needs this batch (a queue)."""
    window = [x for at, x in s.recent if t - at < p.window_seconds]
    blocked = s.blocked_down_until is not None and t < s.blocked_down_until
    return s.batch <= p.min_batch or blocked or (len(window) >= p.min_samples and _held_back(window, p, limits))


def slo_in_force(s: TunerState, p: TunerParams, limits: Limits) -> tuple[Slo | None, str | None]:
    """The SLO this engine is steered by (None: derived and not learnt yet), and why the configured one was refused.

    A configured target below the engine's unloaded P99 is kept while a smaller batch may still reach it.
    """
    slo, refused = objective(p.slo, s.unloaded, p.unloaded_factor)
    if refused and s.recent and not _cannot_lower(s, s.recent[-1][0], p, limits):
        return p.slo, None
    return slo, refused


def _full_window(recent: tuple[tuple[float, Reading], ...], t: float, p: TunerParams) -> list[Reading] | None:
    """The readings of the last ``window_seconds``, once they span nearly all of it (None: not yet)."""
    window = [(at, x) for at, x in recent if t - at < p.window_seconds]
    if len(window) < p.min_samples or t - window[0][0] < 0.9 * p.window_seconds:
        return None
    return [x for _, x in window]


def _unloaded(known: float | None, recent: tuple[tuple[float, Reading], ...], t: float, p: TunerParams) -> float | None:
    """The lowest P99 over a full window in which nothing waited inside vLLM (the gateway's queue is not in its P99)."""
    window = _full_window(recent, t, p)
    if window is None or any(x.latency is None or x.waiting > 0 for x in window):
        return known
    worst = max(x.latency for x in window if x.latency is not None)
    return worst if known is None else min(known, worst)


def _blocked_by_long_prefill(s: TunerState, t: float, p: TunerParams) -> bool:
    """Requests wait inside vLLM for its token budget, which long prompts' prefill takes whole.

    vLLM's scheduler gives each running prefill as much of the step's token budget as it
    needs: a 30k-token prompt takes every step for a second or more, and a short request
    that arrives meanwhile waits in vLLM's queue with seats and KV to spare. Over a full
    window: vLLM's P99 queue time past ``blocked_queue_seconds`` at every poll, its KV pool
    never full, nothing preempted (a wait for memory is the cap's to answer, not this), and
    a long prompt in flight at most polls with others beside it (long prompts waiting behind
    each other gain nothing from a cap). ``--long-prefill-token-threshold`` caps each
    prefill's share of a step while others wait (vLLM's V1 scheduler; alone, a prompt still
    takes the whole budget).
    """
    window = _full_window(s.recent, t, p)
    if window is None:
        return False
    waited = all(x.queue_p99 is not None and x.queue_p99 > p.blocked_queue_seconds for x in window)
    roomy = all(x.kv_usage is not None and x.kv_usage < p.kv_spare_below
                and (x.preemptions_per_second or 0.0) <= p.preemption_rate_limit for x in window)  # fmt: skip
    long = sum(x.long_in_flight for x in window) >= p.long_share * len(window)
    others = sum(x.short_in_flight for x in window) >= p.long_share * len(window)  # long ones behind long ones: no cap helps
    return waited and roomy and long and others


def _engine_limit(up: list[Reading], batch: int, p: TunerParams) -> int | None:
    """The ``--max-num-seqs`` an engine runs with, when its running count shows it: the same N, others waiting, KV to spare."""
    if len(up) < p.up_min_samples:
        return None
    running = {x.running for x in up}
    if len(running) != 1 or None in running:
        return None
    n = round(up[0].running or 0)
    # a long prompt in flight can hold the others waiting for the token budget with seats free: not the limit
    calm = all(x.waiting > 0 and x.kv_usage is not None and x.kv_usage < p.kv_spare_below and not x.long_in_flight
               and (x.preemptions_per_second or 0.0) <= p.preemption_rate_limit for x in up)  # fmt: skip
    return max(p.min_batch, n) if calm and 0 < n < batch else None


def _rules(s: TunerState, r: Reading, t: float, p: TunerParams, limits: Limits, slo: Slo | None) -> Step:
    recent = s.recent
    down = [x for at, x in recent if t - at < p.window_seconds and x.latency is not None]
    up = [x for at, x in recent if t - at < p.up_window_seconds and x.latency is not None]
    since_move = math.inf if s.last_move is None else t - s.last_move
    latest = [x.latency for x in (down or up) if x.latency is not None]
    numbers = {"p99_min_seconds": round(min(latest), 4) if latest else None,
               "p99_max_seconds": round(max(latest), 4) if latest else None,
               "slo_seconds": slo.target_seconds if slo else None, "utilization": r.utilization,
               "gateway_queued": r.gateway_queued, "waiting": r.waiting, "running": r.running, "batch": s.batch}  # fmt: skip
    can_restart = r.window_open and r.restart_budget_ok and len(s.restarts) < p.restarts_per_day

    def moved(kind: MoveKind, old: Any, new: Any, reason: str, restart: bool, quick: bool = False, **changes: Any) -> Step:
        grew = quick or (kind == "batch" and new > old)  # the short cooldown follows
        out = replace(s, last_move=t, last_move_up=grew, pinned_since=None, well_inside_since=None, recent=(), **changes)
        if restart:
            out = replace(out, restarts=out.restarts + (t,))
        return Step(out, Move(kind, old, new, reason, restart, numbers))

    if s.max_num_seqs is None:  # started by someone else: its limit shows in what it runs
        found = _engine_limit([x for at, x in recent if t - at < p.up_window_seconds], s.batch, p)
        if found is not None and limits.fast:
            return moved("batch", s.batch, found, "engine_limit_found", False, quick=True, batch=found, max_num_seqs=found)
        if found is not None:
            s = replace(s, batch=found, max_num_seqs=found)
    if since_move < (p.up_cooldown_seconds if s.last_move_up else p.cooldown_seconds):
        return Step(s, hold="cooldown")

    def slow_hold(what: str) -> str:
        if not r.window_open:
            return f"{what} waits for an allowed window"
        if len(s.restarts) >= p.restarts_per_day:
            return f"{what} waits: {len(s.restarts)} tuning restarts in the last day"
        return f"{what} waits: the breaker's restart budget is kept for emergencies"

    # -- long prompts' prefill holding the others back: no SLO needed, the engine's own queue says it --------
    if s.long_prefill is None and p.long_prefill_tokens > 0 and limits.fast and _blocked_by_long_prefill(s, t, p):
        numbers["queue_p99_seconds"] = r.queue_p99
        if can_restart:
            return moved("long_prefill", None, p.long_prefill_tokens, "long_prefill_blocks_others", True,
                         long_prefill=p.long_prefill_tokens)  # fmt: skip
        return Step(s, hold=slow_hold("a cap on long prefills (--long-prefill-token-threshold)"))

    # -- a smaller batch: the long window must agree ------------------------------------------
    if len(down) >= p.min_samples and since_move >= p.cooldown_seconds:
        best = min(x.latency for x in down if x.latency is not None)
        preempting = [x.preemptions_per_second or 0.0 for x in down]
        if s.trial is not None:  # the first full window after a smaller batch: did it lower what it was for, clearly?
            signal, before, old_batch = s.trial
            s = replace(s, trial=None)
            after = max(preempting) if signal == "preemptions" else max(x.latency for x in down if x.latency is not None)
            if after > before * (1 - p.improve_ratio):  # every poll after below every poll before, by a margin
                numbers[f"{signal}_before"] = round(before, 4)
                until = t + p.blocked_seconds * 2 ** min(s.undone, 4)
                block = {"blocked_preemption_until": until} if signal == "preemptions" else {"blocked_down_until": until}
                return moved("batch", s.batch, old_batch, "lowering_did_not_help", False, batch=old_batch, ceiling=None,
                             undone=s.undone + 1, **block)  # fmt: skip
            s = replace(s, undone=0)
        blocked_down = s.blocked_down_until is not None and t < s.blocked_down_until
        blocked_preemption = s.blocked_preemption_until is not None and t < s.blocked_preemption_until
        if s.batch > p.min_batch and min(preempting) > p.preemption_rate_limit and limits.fast and not blocked_preemption:
            lower = max(p.min_batch, s.batch - step_size(s.batch, p.step_ratio))
            numbers["preemptions_per_second"] = r.preemptions_per_second
            return moved("batch", s.batch, lower, "preemptions", False, batch=lower, ceiling=(s.batch, t + p.blocked_seconds),
                         trial=("preemptions", min(preempting), s.batch))  # fmt: skip
        if slo is not None and best > slo.above and _held_back(down, p, limits):
            return Step(s, hold="overloaded: P99 over the objective with requests queued (more replicas needed)")
        if slo is not None and best > slo.above:  # every poll of the window over the objective, nothing queued: the engine is slow
            if s.speculation:
                if can_restart:
                    return moved("speculation", True, False, "p99_over_slo", True, speculation=False)
                if not limits.fast:
                    return Step(s, hold=slow_hold("speculation off"))
            if s.batch <= p.min_batch:
                return Step(s, hold="p99 over the objective at the smallest batch")
            if blocked_down:
                return Step(s, hold="p99 over the objective, but a smaller batch did not lower it last time")
            lower = max(p.min_batch, s.batch - step_size(s.batch, p.step_ratio))
            if limits.fast:
                return moved("batch", s.batch, lower, "p99_over_slo", False, batch=lower, trial=("p99", best, s.batch))
            if s.max_num_seqs is None:
                # what the engine runs is not known (vLLM's default may be 256): a restart at a smaller
                # guess could cut it tenfold
                return Step(s, hold="p99 over the objective; --max-num-seqs unknown, so not lowered by a restart")
            if can_restart:
                return moved("max_num_seqs", s.max_num_seqs, lower, "p99_over_slo", True, batch=lower, max_num_seqs=lower)
            return Step(s, hold=slow_hold("a smaller batch"))

    # -- a larger batch: the short window must agree ------------------------------------------
    if len(up) < p.up_min_samples or s.trial is not None:
        return Step(s)
    engine_limit = s.max_num_seqs if s.max_num_seqs is not None else limits.hardware_cap
    if slo is None:
        if not _held_back(up, p, limits):
            return Step(replace(s, pinned_since=None))
        # held at the engine's own limit is a fact without an SLO: its clock runs while the SLO is learnt
        at_limit = not limits.fast or s.batch >= engine_limit
        pinned = (s.pinned_since if s.pinned_since is not None else t) if at_limit else None
        learning = "learning the engine's P99 with nothing waiting in it (no SLO is configured: it is derived from that)"
        return Step(replace(s, pinned_since=pinned), hold=learning)
    worst = max(x.latency for x in up if x.latency is not None)
    idle = worst < slo.below and all(
        x.utilization is not None and x.utilization < p.raise_below_utilization and x.gateway_queued + x.waiting > 0
        for x in up
    )
    queue = _held_back(up, p, limits) and worst <= slo.above
    cap = limits.hardware_cap
    if s.ceiling is not None and t < s.ceiling[1]:
        cap = min(cap, s.ceiling[0] - 1)
    overflowing = any((x.preemptions_per_second or 0.0) > p.preemption_rate_limit for x in up)
    if (queue or idle) and not overflowing and s.batch < cap:
        why = "queue_held_by_batch" if queue else "gpu_idle_with_queue"
        higher = min(cap, s.batch + step_size(s.batch, p.up_step_ratio))
        if limits.fast and s.batch < engine_limit:
            return moved("batch", s.batch, min(higher, engine_limit), why, False, batch=min(higher, engine_limit))
        # pinned at what vLLM was started with: only a restart raises it
        pinned = s.pinned_since if s.pinned_since is not None else t
        if t - pinned < p.pinned_seconds:
            return Step(replace(s, pinned_since=pinned), hold="pinned at --max-num-seqs")
        if not can_restart:
            return Step(replace(s, pinned_since=pinned), hold=slow_hold("a larger --max-num-seqs"))
        if any(x.kv_usage is not None and x.kv_usage >= p.kv_spare_below for x in up):
            return Step(replace(s, pinned_since=pinned), hold="pinned at --max-num-seqs, but the KV cache is full: more sequences would not fit")
        # raised once to the hardware cap, and the batch with it (the queue held by the batch is what this is for): the
        # fast loop then finds the batch below it without more restarts
        target = limits.hardware_cap if limits.fast else higher
        return moved("max_num_seqs", s.max_num_seqs, target, f"pinned_{why}", True, batch=target, max_num_seqs=target)

    # -- speculation back on: well inside for a long time, with a small batch ----------------
    s = replace(s, pinned_since=None)
    if s.speculation or not limits.speculation_allowed or limits.speculative_config is None or r.degraded:
        return Step(replace(s, well_inside_since=None))
    if not (worst <= slo.target * p.headroom_ratio and s.batch <= p.speculation_max_batch):
        return Step(replace(s, well_inside_since=None))
    since = s.well_inside_since if s.well_inside_since is not None else min(at for at, _ in recent)
    s = replace(s, well_inside_since=since)
    if t - since < p.speculation_after_seconds:
        return Step(s)
    if not can_restart:
        return Step(s, hold=slow_hold("speculation on"))
    return moved("speculation", False, True, "p99_well_inside_slo", True, speculation=True)


# -- persistence: what must survive a restart of guardian (times as unix seconds on disk) ------


def to_disk(s: TunerState, wall_offset: float) -> dict[str, Any]:
    return {
        "batch": s.batch,
        "max_num_seqs": s.max_num_seqs,
        "speculation": s.speculation,
        "last_move": None if s.last_move is None else round(s.last_move + wall_offset, 3),
        "restarts": [round(x + wall_offset, 3) for x in s.restarts],
        "long_prefill": s.long_prefill,
    }


def from_disk(doc: Mapping[str, Any], wall_offset: float) -> TunerState:
    """Raises KeyError/TypeError/ValueError on a document of the wrong shape."""
    seqs = doc["max_num_seqs"]
    last = doc["last_move"]
    return TunerState(
        batch=int(doc["batch"]),
        max_num_seqs=None if seqs is None else int(seqs),
        speculation=bool(doc["speculation"]),
        last_move=None if last is None else float(last) - wall_offset,
        restarts=tuple(float(x) - wall_offset for x in doc["restarts"]),
        long_prefill=None if (chunk := doc.get("long_prefill")) is None else int(chunk),  # absent before it existed
    )
