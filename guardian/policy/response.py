"""What the breaker's levels do: from evidence to transitions and actions, per engine, per poll.

This is the whole policy, pure, so that ``guardian run``, ``--dry-run`` and
``guardian replay`` make the same decisions from the same inputs. Its inputs
are the poll's evidence, the poll's time, and what happened since the last
poll that the policy cannot see in a sample: which restarts it asked for have
finished (and whether they worked), and the operator's force/clear commands.
Its outputs are ``Action`` values; carrying them out is the executor's job.

| on | actions |
| --- | --- |
| any level change | the gateway's gates follow the level (L1 refuse long contexts, L2 pause low priority, L3 high priority only) |
| leaving L0 upwards | free cached KV blocks (vLLM's /reset_prefix_cache) |
| entering L1 or L2 | warn |
| entering L3 | page |
| L3 by the free reserve, the engine's own memory | drained restart at the same ``--gpu-memory-utilization`` (the leak dies with its process) once the next leak step would not fit; a warning, not a page |
| L3 by the free reserve or an OOM, other processes' memory | page naming them; drained restart with ``--gpu-memory-utilization`` lowered by their share, restored when they are gone |
| L3 by an OOM of unknown cause | drained restart with a lower ``--gpu-memory-utilization`` |
| L3 with the engine dead or unresponsive | restart it (again after each failed try: a crash loop) |
| L2's KV pressure held for ``degrade_after_seconds`` | drained restart with the degraded profile |
| L0 for ``restore_after_seconds`` with the utilisation lowered, and room for the old one | drained restart at the old utilisation |
| L0 for ``restore_after_seconds`` while degraded | drained restart with the normal profile |
| back to L0 | resolved message |

Every restart counts against a budget (``restart_budget`` per
``restart_budget_window_seconds``, like systemd's StartLimitBurst). One that
would exceed it is not made: the level is pinned at L3 (``forced_by`` the
restart budget) and on-call is paged; ``clear`` releases it. While a restart
runs, its engine is expected to be paused and then down, so the breaker
holds its level (as on lost telemetry) until the outcome is in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping

from guardian.policy import breaker
from guardian.policy.breaker import BreakerParams, BreakerState, Evidence, Level, Transition
from guardian.policy.lifecycle import DOWN

PRESSURE_RULES = ("kv_usage",)  # what the degraded profile answers (memory outside the pool is a restart's, a storm a burst's)
FOREIGN_NOISE_RATIO = 0.005  # other processes' memory below this share of the GPU is not worth a restart (an agent's context)
NEXT_STEP_MARGIN = 1.5  # an own leak's restart waits while free memory holds this many of its steps
UTILIZATION_MARGIN = 0.01  # lowered a point more than other processes hold, so the next poll's rounding does not re-enter L3
ActionKind = Literal["gates", "reset_prefix_cache", "notify", "restart", "tune"]
Severity = Literal["info", "warning", "page"]


@dataclass(frozen=True)
class ResponseParams:
    restart_budget: int = 3
    restart_budget_window_seconds: float = 3600.0
    degrade_after_seconds: float = 600.0
    restore_after_seconds: float = 1800.0
    min_gpu_memory_utilization: float = 0.5
    utilization_step: float = 0.05  # lowered by this when the shortfall is not known (an OOM)


@dataclass(frozen=True)
class EngineState:
    breaker: BreakerState = BreakerState()
    restarts: tuple[float, ...] = ()  # when guardian began restarts, inside the budget window
    restarting: float | None = None  # a restart began then; its outcome is not in yet
    degraded: bool = False  # the degraded profile is (to be) applied
    gpu_memory_utilization: float | None = None  # lowered to keep the reserve; None: the engine's own value
    lowered_from: float | None = None  # the utilisation before guardian lowered it: restored when there is room again
    tuned: Mapping[str, Any] = field(default_factory=dict)  # the tuner's engine arguments (--max-num-seqs, --speculative-config)


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    engine: str
    level: int  # the breaker level the action serves
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "engine": self.engine, "level": self.level, "reason": self.reason, "details": self.details}


@dataclass(frozen=True)
class Command:
    """An operator's force or clear, from the CLI or the HTTP API."""

    kind: Literal["force", "clear"]
    engine: str
    who: str
    level: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "engine": self.engine, "who": self.who, "level": self.level}


@dataclass(frozen=True)
class Response:
    state: EngineState
    transitions: tuple[Transition, ...] = ()
    actions: tuple[Action, ...] = ()


def respond(
    name: str,
    state: EngineState,
    e: Evidence,
    t: float,
    bp: BreakerParams,
    rp: ResponseParams,
    restart_finished: bool | None = None,
) -> Response:
    """One engine, one poll. ``restart_finished``: None, or whether the restart in progress worked."""
    actions: list[Action] = []
    transitions: list[Transition] = []
    if restart_finished is not None and state.restarting is not None:
        state = replace(state, restarting=None)
        if not restart_finished:
            actions.append(_notify(name, state.breaker.level, "page", "restart_failed", "the restart did not bring the engine back"))
    kept = tuple(r for r in state.restarts if t - r < rp.restart_budget_window_seconds)
    if kept != state.restarts:
        state = replace(state, restarts=kept)
    e = configured_headroom(state, e)
    seen = e if state.restarting is None else replace(e, telemetry_lost=True, phase="starting")  # paused, then down: on purpose
    shut = state.breaker.shut
    b, transition = breaker.step(state.breaker, seen, t, bp)
    if b is not state.breaker:  # most polls change nothing: the same state (``frozen.updated``)
        state = replace(state, breaker=b)
    if transition is not None:
        transitions.append(transition)
        actions += [_memory_page(a, e) for a in on_transition(name, transition, b.shut)]
    elif b.shut != shut:
        actions.append(_gates(name, b.level, "request path", b.shut))
    want = _wanted_restart(state, e, transition, t, bp, rp)
    if want is not None and not b.forced and state.restarting is None:
        if len(state.restarts) < rp.restart_budget:
            why, degraded, util = want
            current = _in_use(state, e)
            lowered_from = None if util is None else state.lowered_from or (current if current is not None and util < current else None)
            state = replace(state, restarts=state.restarts + (t,), restarting=t, degraded=degraded, gpu_memory_utilization=util,
                            lowered_from=lowered_from)  # fmt: skip
            restart = Action("restart", name, int(b.level), why, restart_details(state, e))
            taken = f"; action: {restart_text(restart)}"
            if transition is None and why == "free_reserve":  # deferred, or back after a restart: tell it with the action
                actions.append(_memory_page(_notify(name, b.level, "page", why, *numbers_text(why, breaker.evidence_numbers(e))), e))
            told = [a.kind == "notify" and (a.details["severity"] == "page" or a.reason == why) for a in actions]
            actions = [_with_text(a, taken) if tell else a for a, tell in zip(actions, told)]
            actions.append(restart)
        else:
            b, pinned = breaker.force(b, Level.L3, t, "restart budget")
            state = replace(state, breaker=b)
            transitions.append(pinned)
            actions.append(_gates(name, Level.L3, pinned.rule))
            actions.append(
                _notify(
                    name, Level.L3, "page", "restart_budget_exhausted",
                    f"{len(state.restarts)} restarts in {rp.restart_budget_window_seconds:g}s and it needs another "
                    f"({want[0]}); holding L3 until `guardian breaker clear {name}`",
                )  # fmt: skip
            )
    return Response(state, tuple(transitions), tuple(actions))


def command(state: EngineState, cmd: Command, t: float) -> Response:
    """An operator's decision wins over the rules: pin a level, or hand the engine back to them."""
    if cmd.kind == "force":
        assert cmd.level is not None
        b, transition = breaker.force(state.breaker, Level(cmd.level), t, cmd.who)
    else:
        b, transition = breaker.clear(state.breaker, t, cmd.who)
    state = replace(state, breaker=b)
    return Response(state, (transition,), tuple(on_transition(cmd.engine, transition, b.shut)))


def on_transition(name: str, tr: Transition, shut: Level | None = None) -> list[Action]:
    actions = [_gates(name, tr.target, tr.rule, shut)]
    if tr.target > tr.source:
        if tr.source == Level.L0:
            actions.append(Action("reset_prefix_cache", name, int(tr.target), tr.rule))
        severity: Severity = "page" if tr.target == Level.L3 else "warning"
        text, more = numbers_text(tr.rule, tr.numbers)
        actions.append(_notify(name, tr.target, severity, tr.rule, text or f"L{int(tr.source)} -> L{int(tr.target)}", more))
    elif tr.target == Level.L0:
        actions.append(_notify(name, tr.target, "info", tr.rule, f"back to L0 from L{int(tr.source)}"))
    elif tr.forced:
        actions.append(_notify(name, tr.target, "warning", tr.rule, f"L{int(tr.source)} -> L{int(tr.target)}"))
    return actions


def _wanted_restart(
    s: EngineState, e: Evidence, tr: Transition | None, t: float, bp: BreakerParams, rp: ResponseParams
) -> tuple[str, bool, float | None] | None:
    """(why, degraded, gpu_memory_utilization) of the restart the situation calls for, if any."""
    b = s.breaker
    if b.level == Level.L3:
        if tr is not None and tr.target == Level.L3 and tr.rule == "oom":
            return tr.rule, s.degraded, memory_utilization(s, e, tr.rule, bp, rp)
        reserve = b.pending.get("free_reserve")  # at L3's entry, or later (a leak back after a restart, L3 never left)
        if reserve is not None and t - reserve >= bp.l3_sustain_seconds and not _next_step_fits(e):
            return "free_reserve", s.degraded, memory_utilization(s, e, "free_reserve", bp, rp)
        if e.phase in DOWN:
            return f"engine_{e.phase}", s.degraded, s.gpu_memory_utilization
    pressure = [b.pending[r] for r in PRESSURE_RULES if r in b.pending]  # since when L2's evidence holds
    if b.level >= Level.L2 and not s.degraded and pressure and t - min(pressure) >= rp.degrade_after_seconds:
        return "degrade", True, s.gpu_memory_utilization
    calm = b.level == Level.L0 and b.since is not None and t - b.since >= rp.restore_after_seconds
    if calm and s.degraded:
        return "restore", False, s.gpu_memory_utilization
    if calm and s.lowered_from is not None and _others(e) is False and _room_for(s.lowered_from, s, e, bp):  # they left
        return "restore_utilization", s.degraded, None
    return None


def _next_step_fits(e: Evidence) -> bool:
    """The engine's own leak, in steps of a known size, with room for the next one and half again: its restart can wait.

    A restart costs a model load, so the one that clears a leak comes as
    late as is safe: when the next step would leave less than half a step
    free (a step is seen at once in the free memory; the drain takes the
    time between two steps at most).
    """
    if _others(e) is not False or e.leak_step_ratio is None or e.free_ratio is None:
        return False
    return e.free_ratio > NEXT_STEP_MARGIN * e.leak_step_ratio


def configured_headroom(s: EngineState, e: Evidence) -> Evidence:
    """Evidence whose expected free share is the one the engine was configured with, not the lowered one.

    Lowering ``--gpu-memory-utilization`` to make room for other processes
    leaves more of the GPU free by design; measured against the lowered
    setting, the reserve would grow with every lowering and ask for the next.
    """
    if s.lowered_from is None or e.expected_free_ratio is None or e.gpu_memory_utilization is None:
        return e
    return replace(e, expected_free_ratio=max(0.0, e.expected_free_ratio - (s.lowered_from - e.gpu_memory_utilization)))


def memory_utilization(s: EngineState, e: Evidence, rule: str, bp: BreakerParams, rp: ResponseParams) -> float | None:
    """The ``--gpu-memory-utilization`` of a restart for memory outside the pool (None: the engine's own setting).

    Other processes' memory (NVML lists them) survives the restart: the pool
    shrinks by their share, as far as they need and no further. Without
    them, the memory outside the pool was the engine's own: it dies with its
    process, so the restart keeps the utilisation. An OOM whose cause cannot
    be told (nothing listed) steps the utilisation down.
    """
    current = _in_use(s, e)
    if current is None:
        return None
    others = _others(e)
    if others:
        assert e.foreign_ratio is not None
        return _rounded_down((s.lowered_from or current) - e.foreign_ratio - UTILIZATION_MARGIN, rp)
    if others is False and rule == "free_reserve":
        return s.gpu_memory_utilization
    return lowered_utilization(s, e, bp, rp)


def _others(e: Evidence) -> bool | None:
    """Whether other processes hold memory worth a restart on the engine's GPUs; None when NVML did not list them."""
    return None if e.foreign_ratio is None else e.foreign_ratio > FOREIGN_NOISE_RATIO


def _in_use(s: EngineState, e: Evidence) -> float | None:
    """The engine's ``--gpu-memory-utilization`` now: guardian's lowered one, else what the engine reports."""
    return s.gpu_memory_utilization or e.gpu_memory_utilization


def _rounded_down(util: float, rp: ResponseParams) -> float:
    """Down to the percent, never below ``min_gpu_memory_utilization``."""
    return max(rp.min_gpu_memory_utilization, math.floor(util * 100 + 1e-9) / 100)


def _room_for(util: float, s: EngineState, e: Evidence, bp: BreakerParams) -> bool:
    """Whether the engine at ``util`` would leave the reserve's exit share free, with the memory outside its pool now."""
    current = _in_use(s, e)
    if e.free_ratio is None or current is None:
        return False
    return e.free_ratio - (util - current) >= breaker.reserve(e, bp)[1]


def _memory_page(a: Action, e: Evidence) -> Action:
    """A page for memory outside the pool: other processes named; the engine's own leak, cured by the restart, a warning."""
    if a.kind != "notify" or a.details.get("severity") != "page" or a.reason not in ("free_reserve", "oom") or e.foreign_ratio is None:
        return a
    if not _others(e) and a.reason == "free_reserve":
        text = a.details["text"] + " (vLLM's own memory: the leak goes with its process)"
        return replace(a, details={**a.details, "severity": "warning", "text": text})
    named = ", ".join(f"pid {pid} {b / 2**30:.1f} GiB" for pid, b in e.foreign[:3])
    text = a.details["text"] + f"; other processes hold {e.foreign_ratio * 100:.1f}% of the GPU ({named})"
    return replace(a, details={**a.details, "text": text})


def lowered_utilization(s: EngineState, e: Evidence, bp: BreakerParams, rp: ResponseParams) -> float | None:
    """A ``--gpu-memory-utilization`` that leaves the reserve free if the memory outside the pool comes back."""
    current = _in_use(s, e)
    if current is None:
        return None
    shortfall = rp.utilization_step
    if e.free_ratio is not None:
        shortfall = max(0.01, bp.l3_free_reserve_ratio - e.free_ratio)
    return _rounded_down(current - shortfall, rp)


def tuner_restart(name: str, s: EngineState, e: Evidence, t: float, tuned: Mapping[str, Any], why: str) -> tuple[EngineState, Action]:
    """A restart the tuner asked for: counted in the budget and held for like the breaker's own."""
    s = replace(s, restarts=s.restarts + (t,), restarting=t, tuned=dict(tuned))
    return s, Action("restart", name, int(s.breaker.level), why, restart_details(s, e))


def restart_details(s: EngineState, e: Evidence) -> dict[str, Any]:
    return {
        "tuned": dict(s.tuned),
        "profile": "degraded" if s.degraded else "base",
        "gpu_memory_utilization": s.gpu_memory_utilization,
        "was_gpu_memory_utilization": e.gpu_memory_utilization,
        "free_ratio": e.free_ratio,
        "health_failures": e.health_failures,
    }


def _gates(name: str, level: Level, reason: str, shut: Level | None = None) -> Action:
    return Action("gates", name, int(level), reason, {} if shut is None else {"shut": int(shut)})


def _notify(name: str, level: Level, severity: Severity, rule: str, text: str, more: str | None = None) -> Action:
    details = {"severity": severity, "text": text} | ({"more": more} if more is not None else {})
    return Action("notify", name, int(level), rule, details)


def restart_text(a: Action) -> str:
    """A restart action in words, as the page and ``guardian replay`` tell it."""
    util = a.details.get("gpu_memory_utilization")
    flag = f", --gpu-memory-utilization {util:g}" if util is not None else ""
    tuned = a.details.get("tuned") or {}
    if tuned.get("max-num-seqs") is not None:
        flag += f", --max-num-seqs {tuned['max-num-seqs']}"
    if "speculative-config" in tuned:
        flag += ", speculation " + ("on" if tuned["speculative-config"] else "off")
    return f"drained restart ({a.reason}, {a.details.get('profile')} profile{flag})"


def _with_text(a: Action, more: str) -> Action:
    return replace(a, details={**a.details, "text": a.details["text"] + more})


# the number behind each rule: told first, before the action taken and the other numbers
RULE_NUMBER = {
    "fragmentation": "fragmentation_ratio",
    "kv_usage": "kv_usage",
    "over_budget": "over_budget_ratio",
    "free_reserve": "free_ratio",
    "oom": "free_ratio",
    "engine_dead": "health_failures",
    "engine_unresponsive": "health_failures",
    "preemption_storm": "preemptions_per_second",
}


def numbers_text(rule: str, numbers: Mapping[str, float | int | None]) -> tuple[str, str]:
    """("free 5.4%", "kv 31%, over budget 24%, …"): the rule's own number, then the rest, in words a person reads."""
    key = RULE_NUMBER.get(rule)
    value = numbers.get(key) if key else None
    first = _number(key, value) if key and value is not None else ""
    rest = ", ".join(_number(k, v) for k, v in numbers.items() if v is not None and k != key)
    return first or rest, rest if first else ""


def _number(key: str, value: float | int) -> str:
    label = {"kv_usage": "kv", "health_failures": "polls without an answer", "preemptions_per_second": "preemptions/s"}.get(
        key, key.removesuffix("_ratio").replace("_", " "))  # fmt: skip
    if key.endswith("_ratio") or key == "kv_usage":
        return f"{label} {round(value * 100, 1) + 0.0:.1f}%"  # + 0.0: no "-0.0%" for a hair below zero
    return f"{label} {value:.3g}" if isinstance(value, float) else f"{label} {value}"


# -- persistence ------------------------------------------------------------------------------
# Times are monotonic inside the policy; on disk they are unix times, so a
# restored state means the same after a reboot (the monotonic clock restarts).


def to_disk(s: EngineState, wall_offset: float) -> dict[str, Any]:
    def wall(t: float | None) -> float | None:
        return None if t is None else round(t + wall_offset, 3)

    return {
        "level": int(s.breaker.level),
        "since": wall(s.breaker.since),
        "forced_by": s.breaker.forced_by if s.breaker.forced else None,
        "restarts": [wall(r) for r in s.restarts],
        "restarting": wall(s.restarting),
        "degraded": s.degraded,
        "gpu_memory_utilization": s.gpu_memory_utilization,
        "lowered_from": s.lowered_from,
        "tuned": dict(s.tuned),
    }


def from_disk(doc: Mapping[str, Any], wall_offset: float) -> EngineState:
    """Raises KeyError/TypeError/ValueError on a document of the wrong shape (the caller quarantines it).

    A restart that was running when guardian died has an unknown outcome: it
    stays counted against the budget, and is no longer waited for.
    """

    def mono(t: Any) -> float | None:
        return None if t is None else float(t) - wall_offset

    forced_by = doc["forced_by"]
    util = doc["gpu_memory_utilization"]
    return EngineState(
        breaker=BreakerState(
            level=Level(int(doc["level"])), since=mono(doc["since"]), forced=forced_by is not None,
            forced_by=None if forced_by is None else str(forced_by),
        ),  # fmt: skip
        restarts=tuple(float(r) - wall_offset for r in doc["restarts"]),
        degraded=bool(doc["degraded"]),
        gpu_memory_utilization=None if util is None else float(util),
        lowered_from=None if doc.get("lowered_from") is None else float(doc["lowered_from"]),
        tuned=dict(doc.get("tuned") or {}),  # absent in state files from before the tuner
    )
