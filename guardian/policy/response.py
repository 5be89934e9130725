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
| L3 by OOM or the free reserve | drained restart with a lower ``--gpu-memory-utilization`` so the reserve stays free |
| L3 with the engine dead or unresponsive | restart it (again after each failed try: a crash loop) |
| L2's evidence held for ``degrade_after_seconds`` | drained restart with the degraded profile |
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

PRESSURE_RULES = ("kv_usage", "over_budget")  # L2's rules: what the degraded profile answers
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
    state = replace(state, restarts=tuple(r for r in state.restarts if t - r < rp.restart_budget_window_seconds))
    seen = e if state.restarting is None else replace(e, telemetry_lost=True, phase="starting")  # paused, then down: on purpose
    b, transition = breaker.step(state.breaker, seen, t, bp)
    state = replace(state, breaker=b)
    if transition is not None:
        transitions.append(transition)
        actions += on_transition(name, transition)
    want = _wanted_restart(state, e, transition, t, bp, rp)
    if want is not None and not b.forced and state.restarting is None:
        if len(state.restarts) < rp.restart_budget:
            why, degraded, util = want
            state = replace(state, restarts=state.restarts + (t,), restarting=t, degraded=degraded, gpu_memory_utilization=util)
            restart = Action("restart", name, int(b.level), why, restart_details(state, e))
            taken = f"; action: {restart_text(restart)}"
            actions = [_with_text(a, taken) if a.details.get("severity") == "page" else a for a in actions]
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
    return Response(state, (transition,), tuple(on_transition(cmd.engine, transition)))


def on_transition(name: str, tr: Transition) -> list[Action]:
    actions = [_gates(name, tr.target, tr.rule)]
    if tr.target > tr.source:
        if tr.source == Level.L0:
            actions.append(Action("reset_prefix_cache", name, int(tr.target), tr.rule))
        severity: Severity = "page" if tr.target == Level.L3 else "warning"
        actions.append(_notify(name, tr.target, severity, tr.rule, *numbers_text(tr.rule, tr.numbers)))
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
        if tr is not None and tr.target == Level.L3 and tr.rule in ("oom", "free_reserve"):
            return tr.rule, s.degraded, lowered_utilization(s, e, bp, rp)
        if e.phase in DOWN:
            return f"engine_{e.phase}", s.degraded, s.gpu_memory_utilization
    pressure = [b.pending[r] for r in PRESSURE_RULES if r in b.pending]  # since when L2's evidence holds
    if b.level >= Level.L2 and not s.degraded and pressure and t - min(pressure) >= rp.degrade_after_seconds:
        return "degrade", True, s.gpu_memory_utilization
    if b.level == Level.L0 and s.degraded and b.since is not None and t - b.since >= rp.restore_after_seconds:
        return "restore", False, s.gpu_memory_utilization
    return None


def lowered_utilization(s: EngineState, e: Evidence, bp: BreakerParams, rp: ResponseParams) -> float | None:
    """A ``--gpu-memory-utilization`` that leaves the reserve free if the memory outside the pool comes back."""
    current = s.gpu_memory_utilization or e.gpu_memory_utilization
    if current is None:
        return None
    shortfall = rp.utilization_step
    if e.free_ratio is not None:
        shortfall = max(0.01, bp.l3_free_reserve_ratio - e.free_ratio)
    return max(rp.min_gpu_memory_utilization, math.floor((current - shortfall) * 100 + 1e-9) / 100)


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


def _gates(name: str, level: Level, reason: str) -> Action:
    return Action("gates", name, int(level), reason)


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
        return f"{label} {value * 100:.1f}%"
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
        tuned=dict(doc.get("tuned") or {}),  # absent in state files from before the tuner
    )
