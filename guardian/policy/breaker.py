"""The three-level breaker: one pure state machine per engine.

Levels: L0 normal; L1 fragmentation (refuse long contexts, free cached KV);
L2 memory pressure (pause batch work, degrade); L3 emergency (admit only
high priority, keep the reserve, restart a wedged engine, page).

Rules, each with an enter threshold, a lower stay threshold (hysteresis) and
a time the evidence must be sustained before it counts:

| level | enters when | stays while |
| --- | --- | --- |
| L1 | fragmentation_ratio > l1_enter | fragmentation_ratio >= l1_exit |
| L2 | kv_usage > l2_enter, the engine's memory past its budget + margin, or a preemption storm | kv_usage >= l2_exit, still past the budget, or the storm above the calm rate |
| L3 | NVML free < the reserve, engine dead or unresponsive, OOM, a preemption storm lasting ``l3_storm_sustain_seconds`` | free < the exit share, not up, storm above the calm rate |

A preemption storm is first L2 (the low lane waits, which is what relieves
it: fewer sequences compete for KV blocks); a burst the gateway absorbs
ends there. Only a storm that outlasts ``l3_storm_sustain_seconds`` is L3,
and pages.

Gates (``shut``): a level shuts the gateway's gates of the level its
request-path rules reached (fragmentation, a storm, a dead engine, KV
usage while the engine preempts: a full pool that preempts nothing is vLLM
doing its job, and the gateway's cap keeps it so, see
``policy/concurrency.py``). The memory rules (memory past the budget, the free reserve, an
OOM) leave the gates as they were: memory outside vLLM's pool does not
shrink when requests wait, so refusing them would only turn a leak into
refused requests; a restart is the remedy there. Going down, the gates
open again once the request-path evidence has been below its stay
thresholds for ``gates_open_hold_seconds``, however slowly the level
itself comes down; force shuts the forced level's gates.

The reserve is ``l3_free_reserve_ratio`` of the GPU, but never more than half
of what the engine's own configuration leaves free (``expected_free_ratio``:
1 - gpu_memory_utilization - the driver's reservation). vLLM 0.33 takes 92%
by default, so a healthy default host has about 7% free: a flat 10% rule
would put every such host in L3 the moment guardian starts. Measured against
what the configuration leaves, the reserve still catches memory outside the
pool eating the headroom, and L2's smaller budget margin fires first.

- Escalation goes straight to the highest level whose evidence is
  sustained; an OOM is hard evidence and needs no sustain.
- De-escalation is one level at a time, after the current level's stay
  conditions have all been clear for that level's exit hold.
- Unknown data never escalates: a reading that is None neither starts nor
  sustains evidence. A level whose stay conditions are partly unknown (NVML
  gone, say) decays on those that are known, once at least one is known and
  none holds; where none of its own is known, on what the engine reports
  itself (KV usage, its phase, preemptions). The transition's rule names
  what was unknown ("recovered (free_ratio unknown)"), so nobody reads it
  as a full recovery. With nothing known at all, the level holds.
- Lost telemetry of a live engine holds the level (it is its own alert); an
  engine whose process is dead or hung (``phase``, from
  ``policy/lifecycle.py``) is L3 whether or not its telemetry is lost, since
  a dead vLLM answers nothing at all.
- ``force`` pins a level until ``clear``; every change is one ``Transition``
  with the rule and the numbers behind it.

Pure: ``step(state, evidence, t)`` returns the new state and the transition,
if any. No clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from guardian.policy.frozen import updated


class Level(IntEnum):
    L0 = 0
    L1 = 1
    L2 = 2
    L3 = 3


@dataclass(frozen=True)
class BreakerParams:
    l1_enter_fragmentation_ratio: float = 0.35
    l1_exit_fragmentation_ratio: float = 0.30
    l2_enter_kv_usage_ratio: float = 0.90
    l2_exit_kv_usage_ratio: float = 0.85
    l2_budget_margin_ratio: float = 0.02  # of the engine's GPU memory, above vLLM's budget
    l3_free_reserve_ratio: float = 0.10
    l3_exit_free_ratio: float = 0.15
    l3_storm_preemptions_per_second: float = 2.0
    l3_calm_preemptions_per_second: float = 0.5
    l3_storm_sustain_seconds: float = 300.0  # a preemption storm this long is L3 (a page), not a burst
    gates_open_hold_seconds: float = 30.0  # the request path calm this long opens the gates, whatever the level
    l3_dead_after_polls: int = 3  # answers failing this many polls in a row (process alive: a hang; unknown: dead)
    l1_sustain_seconds: float = 10.0
    l2_sustain_seconds: float = 30.0
    l3_sustain_seconds: float = 5.0
    l1_exit_hold_seconds: float = 60.0
    l2_exit_hold_seconds: float = 120.0
    l3_exit_hold_seconds: float = 300.0

    def sustain(self, level: Level) -> float:
        return float(getattr(self, f"l{int(level)}_sustain_seconds"))

    def exit_hold(self, level: Level) -> float:
        return float(getattr(self, f"l{int(level)}_exit_hold_seconds"))


@dataclass(frozen=True)
class Evidence:
    """One engine's readings at one poll; None means unknown."""

    fragmentation_ratio: float | None = None
    kv_usage: float | None = None
    over_budget_ratio: float | None = None  # (engine memory - budget) / engine capacity
    free_ratio: float | None = None  # lowest NVML free / total over the engine's GPUs
    expected_free_ratio: float | None = None  # what the engine's configuration leaves free (see module doc)
    gpu_memory_utilization: float | None = None  # the engine's vLLM setting, from cache_config_info
    health_failures: int | None = None  # polls in a row without an answer
    phase: str | None = None  # the engine's lifecycle phase (starting, up, unresponsive, dead); None: unknown
    oom: bool | None = None  # the engine died with its GPU memory exhausted
    preemptions_per_second: float | None = None
    telemetry_lost: bool = False
    foreign_ratio: float | None = None  # memory of other processes on the engine's GPUs / their capacity
    foreign: tuple[tuple[int, int], ...] = ()  # those processes: (pid, bytes), largest first
    leak_step_ratio: float | None = None  # the largest step the engine's own memory leaked in lately / its GPUs' memory


@dataclass(frozen=True)
class Transition:
    t: float
    source: Level
    target: Level
    rule: str
    numbers: dict[str, float | int | None]
    forced: bool = False


@dataclass(frozen=True)
class BreakerState:
    level: Level = Level.L0
    since: float | None = None  # when the current level was entered
    pending: dict[str, float] = field(default_factory=dict)  # rule -> since when its evidence holds
    clear_since: float | None = None  # since when the current level's stay conditions are all clear
    forced: bool = False
    forced_by: str | None = None  # who pinned the level: an operator, or the restart budget
    shut: Level = Level.L0  # the level whose gates are shut (see the module doc: memory rules shut none)
    open_since: float | None = None  # since when the request path has been calmer than the shut gates
    rule: str = ""  # why the level is what it is: the rule of the transition into it


# memory outside vLLM's pool: requests waiting at the gateway do not relieve it, so these rules shut no gates
MEMORY_RULES = frozenset({"over_budget", "free_reserve", "oom"})


def reserve(e: Evidence, p: BreakerParams) -> tuple[float, float]:
    """The free share below which L3 enters, and the share free must reach again to leave it."""
    if e.expected_free_ratio is None:
        return p.l3_free_reserve_ratio, p.l3_exit_free_ratio
    return (
        min(p.l3_free_reserve_ratio, e.expected_free_ratio * 0.5),
        min(p.l3_exit_free_ratio, e.expected_free_ratio * 0.75),
    )


def _enter_rules(e: Evidence, p: BreakerParams) -> dict[str, tuple[Level, bool | None]]:
    """Each rule's level and whether its enter condition holds (None: cannot tell)."""

    def above(value: float | None, limit: float) -> bool | None:
        return None if value is None else value > limit

    def below(value: float | None, limit: float) -> bool | None:
        return None if value is None else value < limit

    down = None if e.phase is None else e.phase
    return {
        "fragmentation": (Level.L1, above(e.fragmentation_ratio, p.l1_enter_fragmentation_ratio)),
        "kv_usage": (Level.L2, above(e.kv_usage, p.l2_enter_kv_usage_ratio)),
        "over_budget": (Level.L2, above(e.over_budget_ratio, p.l2_budget_margin_ratio)),
        "free_reserve": (Level.L3, below(e.free_ratio, reserve(e, p)[0])),
        "engine_dead": (Level.L3, None if down is None else down == "dead"),
        "engine_unresponsive": (Level.L3, None if down is None else down == "unresponsive"),
        "oom": (Level.L3, e.oom),
        "preemption_storm": (Level.L2, above(e.preemptions_per_second, p.l3_storm_preemptions_per_second)),
        "preemption_storm_lasting": (Level.L3, above(e.preemptions_per_second, p.l3_storm_preemptions_per_second)),
    }


def _sustain(rule: str, level: Level, p: BreakerParams) -> float:
    if rule == "oom":
        return 0.0  # hard evidence
    if rule == "preemption_storm_lasting":
        return p.l3_storm_sustain_seconds
    return p.sustain(level)


def _stays(level: Level, e: Evidence, p: BreakerParams) -> tuple[bool | None, list[str]]:
    """Whether the level's stay conditions still hold (None: none can be evaluated), and the ones that are unknown."""
    if level == Level.L1:
        checks = {"fragmentation_ratio": None if e.fragmentation_ratio is None else e.fragmentation_ratio >= p.l1_exit_fragmentation_ratio}
    elif level == Level.L2:
        checks = {
            "kv_usage": None if e.kv_usage is None else e.kv_usage >= p.l2_exit_kv_usage_ratio,
            "over_budget_ratio": None if e.over_budget_ratio is None else e.over_budget_ratio > p.l2_budget_margin_ratio,
            "preemptions_per_second": _preempting(e, p),
        }
    elif level == Level.L3:
        checks = {
            "free_ratio": None if e.free_ratio is None else e.free_ratio < reserve(e, p)[1],
            "phase": None if e.phase is None else e.phase != "up",
            "preemptions_per_second": _preempting(e, p),
        }
    else:
        return False, []
    unknown = [name for name, c in checks.items() if c is None]
    if any(c is True for c in checks.values()):
        return True, unknown
    if len(unknown) < len(checks):
        return False, unknown
    # none of the level's own evidence is known (L1's fragmentation needs NVML): the engine's own signals decide
    known = [c for c in _engine_checks(e, p) if c is not None]
    return (None if not known else any(known)), unknown


def _engine_checks(e: Evidence, p: BreakerParams) -> list[bool | None]:
    """Pressure the engine itself reports, known without NVML: KV usage, its lifecycle, preemptions."""
    return [
        None if e.kv_usage is None else e.kv_usage >= p.l2_exit_kv_usage_ratio,
        None if e.phase is None else e.phase != "up",
        _preempting(e, p),
    ]


def _preempting(e: Evidence, p: BreakerParams) -> bool | None:
    """Preemptions above the calm rate: what keeps a storm's levels and gates (None: unknown)."""
    return None if e.preemptions_per_second is None else e.preemptions_per_second > p.l3_calm_preemptions_per_second


def evidence_numbers(e: Evidence) -> dict[str, float | int | None]:
    return {
        "fragmentation_ratio": e.fragmentation_ratio,
        "kv_usage": e.kv_usage,
        "over_budget_ratio": e.over_budget_ratio,
        "free_ratio": e.free_ratio,
        "health_failures": e.health_failures,
        "preemptions_per_second": e.preemptions_per_second,
    }


def step(state: BreakerState, e: Evidence, t: float, p: BreakerParams) -> tuple[BreakerState, Transition | None]:
    since = t if state.since is None else state.since
    blind = e.telemetry_lost and e.phase not in ("dead", "unresponsive")  # a dead engine answers nothing: not blindness
    if state.forced or blind:
        return updated(state, since=since, pending={}, clear_since=None), None  # pinned, or blind: hold the level
    rules = _enter_rules(e, p)
    pending = {name: state.pending.get(name, t) for name, (_, holds) in rules.items() if holds}
    sustained = [(level, name) for name, (level, _) in rules.items() if name in pending and t - pending[name] >= _sustain(name, level, p)]
    target, rule = max(sustained, default=(Level.L0, ""), key=lambda lr: (lr[0], lr[1] not in MEMORY_RULES, lr[1]))
    preempting = _preempting(e, p) is True
    lanes = [level for level, name in sustained
             if name not in MEMORY_RULES and (name != "kv_usage" or preempting) and level <= max(target, state.level)]  # fmt: skip
    shut, open_since = _gates(state, Level(max([state.shut, *lanes])), e, t, p)
    if target > state.level:
        transition = Transition(t, state.level, target, rule, evidence_numbers(e))
        return BreakerState(level=target, since=t, pending=pending, shut=shut, open_since=open_since, rule=rule), transition
    stays, unknown = _stays(state.level, e, p)
    if state.level == Level.L0 or stays is not False:
        return updated(state, since=since, shut=shut, open_since=open_since, pending=pending, clear_since=None), None
    clear_since = state.clear_since if state.clear_since is not None else t
    if t - clear_since >= p.exit_hold(state.level) and t - since >= p.exit_hold(state.level):
        lower = Level(state.level - 1)
        rule = f"recovered ({', '.join(unknown)} unknown)" if unknown else "recovered"
        transition = Transition(t, state.level, lower, rule, evidence_numbers(e))
        return BreakerState(level=lower, since=t, pending=pending, shut=min(shut, lower), rule=rule), transition
    return updated(state, since=since, shut=shut, open_since=open_since, pending=pending, clear_since=clear_since), None


def _gates(state: BreakerState, shut: Level, e: Evidence, t: float, p: BreakerParams) -> tuple[Level, float | None]:
    """The gates to keep shut, and since when the request path has been calm enough to open them further.

    Gates follow the request-path evidence, not the level: the level leaves
    slowly (its exit holds are for people reading alerts), while a gate
    left shut on an engine that has gone idle only refuses requests. They
    open to what still holds once it has held for ``gates_open_hold_seconds``.
    """
    holding = _request_path_holding(e, p, shut)
    if holding >= shut:
        return shut, None
    open_since = state.open_since if state.open_since is not None else t
    if t - open_since >= p.gates_open_hold_seconds:
        return holding, None
    return shut, open_since


def _request_path_holding(e: Evidence, p: BreakerParams, shut: Level) -> Level:
    """The highest gate level whose evidence is still above its stay threshold (unknown evidence holds nothing)."""
    if e.phase in ("dead", "unresponsive"):
        return Level.L3
    if _preempting(e, p):
        return shut if shut == Level.L3 else Level.L2  # a lasting storm keeps what it shut
    if e.fragmentation_ratio is not None and e.fragmentation_ratio >= p.l1_exit_fragmentation_ratio:
        return Level.L1
    return Level.L0


def force(state: BreakerState, level: Level, t: float, who: str) -> tuple[BreakerState, Transition]:
    """Pin ``level`` until ``clear``: an operator's decision wins over the rules."""
    transition = Transition(t, state.level, level, f"forced by {who}", {}, forced=True)
    return BreakerState(level=level, since=t, forced=True, forced_by=who, shut=level, rule=transition.rule), transition


def clear(state: BreakerState, t: float, who: str) -> tuple[BreakerState, Transition]:
    """Release a forced level: back to L0, and the rules decide again from fresh evidence."""
    transition = Transition(t, state.level, Level.L0, f"cleared by {who}", {}, forced=True)
    return BreakerState(level=Level.L0, since=t, rule=transition.rule), transition
