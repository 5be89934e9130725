"""The tuner: an engine's batch and speculation, steered against P99 and GPU utilisation.

Two speeds. The fast loop moves the *effective batch*: the admission
gateway's concurrency cap for the engine, changed at once and without a
restart. The slow loop changes what vLLM fixes at start (``--max-num-seqs``,
``--speculative-config``) by a drained restart, and only when it must: the
fast loop is pinned at the engine's own limit for ``pinned_seconds``, or
speculation should change. Slow moves need an open window (cron), room in the
daily restart budget, and are counted against the breaker's hourly budget
too. Without a gateway there is no fast loop, and batch moves become slow
ones on ``--max-num-seqs``.

Rules, per poll, for one engine (P99 is the SLO's metric over the engine's
latency window):

| condition over the whole stabilisation window | move |
| --- | --- |
| breaker above L1, or a restart under way | none (and the window starts over) |
| inside the cooldown after any move | none |
| P99 above the band, speculation on | speculation off (slow) |
| P99 above the band | batch down one step, floored at ``min_batch`` |
| P99 below the band, a queue, and the GPU idle (< 60%) or P99 well inside (≤ ``headroom_ratio`` × target) | batch up one step, up to the hardware cap |
| P99 well inside for ``speculation_after_seconds`` with a batch ≤ ``speculation_max_batch`` | speculation on (slow), where allowed |

"Over the whole window" is the HPA's stabilisation: every poll recommends,
and the batch goes down only when each recommendation in the window says
down (the max over the window), up only when each says up. A P99 that
wanders across the target therefore never moves anything, and after a move
the cooldown lets the engine settle before the next.

NVML's utilisation is the share of time *a* kernel ran, which a vLLM engine
with any request running keeps near 100% at every batch size; as a sign of
room to grow it only says something while the engine idles. So a P99 well
inside the target counts as room too.

Pure: time, readings and limits come in as arguments; the move comes out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping

from guardian.policy.slo import Slo

DAY_SECONDS = 86400.0
MoveKind = Literal["batch", "max_num_seqs", "speculation"]


@dataclass(frozen=True)
class TunerParams:
    slo: Slo = field(default_factory=Slo)
    window_seconds: float = 60.0  # stabilisation window: every poll in it must agree
    min_samples: int = 6  # polls with a P99 in the window before any move
    cooldown_seconds: float = 120.0  # after every move
    raise_below_utilization: float = 0.6
    headroom_ratio: float = 0.5  # P99 at most this share of the target: room to grow
    step_ratio: float = 0.25  # a batch step: this share of the batch, at least 1
    min_batch: int = 1
    pinned_seconds: float = 300.0  # the fast loop at the engine's limit this long: raise the limit
    speculation_after_seconds: float = 600.0
    speculation_max_batch: int = 4
    restarts_per_day: int = 3


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
    queued: float  # requests waiting: in the gateway and in vLLM
    breaker_level: int = 0
    restarting: bool = False
    degraded: bool = False  # the breaker's degraded profile is on: speculation stays off
    window_open: bool = True  # a restart for tuning may begin now
    restart_budget_ok: bool = True  # the breaker's hourly budget has room beyond its own reserve


@dataclass(frozen=True)
class TunerState:
    batch: int
    max_num_seqs: int | None  # None: vLLM's default, above any hardware cap
    speculation: bool
    recent: tuple[tuple[float, Reading], ...] = ()
    last_move: float | None = None
    pinned_since: float | None = None
    well_inside_since: float | None = None
    restarts: tuple[float, ...] = ()  # slow moves inside the last day

    def engine_args(self, limits: Limits) -> dict[str, Any]:
        """The layer a restart applies over the engine's base arguments (``None`` removes a flag)."""
        layer: dict[str, Any] = {"speculative-config": dict(limits.speculative_config) if self.speculation and limits.speculative_config else None}
        if self.max_num_seqs is not None:
            layer["max-num-seqs"] = self.max_num_seqs
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


def initial(max_num_seqs: int | None, speculation: bool, limits: Limits) -> TunerState:
    """Start where the engine is: at its own limit, or the hardware cap if that is lower."""
    batch = min(limits.hardware_cap, max_num_seqs or limits.hardware_cap)
    return TunerState(batch=batch, max_num_seqs=max_num_seqs, speculation=speculation)


def step_size(batch: int, p: TunerParams) -> int:
    return max(1, math.ceil(batch * p.step_ratio - 1e-9))


def step(s: TunerState, r: Reading, t: float, p: TunerParams, limits: Limits) -> Step:
    s = replace(s, restarts=tuple(x for x in s.restarts if t - x < DAY_SECONDS))
    if r.restarting or r.breaker_level > 1:
        why = "a restart is under way" if r.restarting else f"breaker at L{r.breaker_level}"
        return Step(replace(s, recent=(), pinned_since=None, well_inside_since=None), hold=why)
    recent = tuple((at, x) for at, x in s.recent if t - at < p.window_seconds) + ((t, r),)
    s = replace(s, recent=recent)
    seen = [x for _, x in recent if x.latency is not None]
    if len(seen) < p.min_samples:
        return Step(s)
    if s.last_move is not None and t - s.last_move < p.cooldown_seconds:
        return Step(s, hold="cooldown")
    slo = p.slo
    latencies = [x.latency for x in seen if x.latency is not None]
    worst, best = max(latencies), min(latencies)
    numbers = {"p99_min_seconds": round(best, 4), "p99_max_seconds": round(worst, 4), "slo_seconds": slo.target_seconds,
               "utilization": r.utilization, "queued": r.queued, "batch": s.batch}  # fmt: skip
    can_restart = r.window_open and r.restart_budget_ok and len(s.restarts) < p.restarts_per_day

    def moved(kind: MoveKind, old: Any, new: Any, reason: str, restart: bool, **changes: Any) -> Step:
        out = replace(s, last_move=t, pinned_since=None, well_inside_since=None, recent=(), **changes)
        if restart:
            out = replace(out, restarts=out.restarts + (t,))
        return Step(out, Move(kind, old, new, reason, restart, numbers))

    def slow_hold(what: str) -> str:
        if not r.window_open:
            return f"{what} waits for an allowed window"
        if len(s.restarts) >= p.restarts_per_day:
            return f"{what} waits: {len(s.restarts)} tuning restarts in the last day"
        return f"{what} waits: the breaker's restart budget is kept for emergencies"

    if best > slo.above:  # every poll of the window over the objective
        if s.speculation:
            if can_restart:
                return moved("speculation", True, False, "p99_over_slo", True, speculation=False)
            if not limits.fast:
                return Step(s, hold=slow_hold("speculation off"))
        if s.batch <= p.min_batch:
            return Step(s, hold="p99 over the objective at the smallest batch")
        lower = max(p.min_batch, s.batch - step_size(s.batch, p))
        if limits.fast:
            return moved("batch", s.batch, lower, "p99_over_slo", False, batch=lower)
        if can_restart:
            return moved("max_num_seqs", s.max_num_seqs, lower, "p99_over_slo", True, batch=lower, max_num_seqs=lower)
        return Step(s, hold=slow_hold("a smaller batch"))

    well_inside = worst <= slo.target_seconds * p.headroom_ratio
    idle = all(x.utilization is not None and x.utilization < p.raise_below_utilization for x in seen)
    queued = all(x.queued > 0 for x in seen)
    if worst < slo.below and queued and (idle or well_inside) and s.batch < limits.hardware_cap:
        why = "gpu_idle_with_queue" if idle else "p99_headroom_with_queue"
        higher = min(limits.hardware_cap, s.batch + step_size(s.batch, p))
        engine_limit = s.max_num_seqs if s.max_num_seqs is not None else limits.hardware_cap
        if limits.fast and s.batch < engine_limit:
            return moved("batch", s.batch, min(higher, engine_limit), why, False, batch=min(higher, engine_limit))
        # pinned at what vLLM was started with: only a restart raises it
        pinned = s.pinned_since if s.pinned_since is not None else t
        if t - pinned < p.pinned_seconds:
            return Step(replace(s, pinned_since=pinned), hold="pinned at --max-num-seqs")
        if not can_restart:
            return Step(replace(s, pinned_since=pinned), hold=slow_hold("a larger --max-num-seqs"))
        # raised once to the hardware cap: the fast loop then finds the batch below it without more restarts
        target = limits.hardware_cap if limits.fast else higher
        return moved("max_num_seqs", s.max_num_seqs, target, f"pinned_{why}", True, batch=higher, max_num_seqs=target)

    s = replace(s, pinned_since=None)
    if s.speculation or not limits.speculation_allowed or limits.speculative_config is None or r.degraded:
        return Step(replace(s, well_inside_since=None))
    if not (well_inside and s.batch <= p.speculation_max_batch):
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
    )
