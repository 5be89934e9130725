"""The breaker on a fake clock: every rule, every hysteresis edge, the holds."""

from __future__ import annotations

import pytest

from guardian.policy.breaker import BreakerParams, BreakerState, Evidence, Level, Transition, clear, force, step

P = BreakerParams()
CALM = Evidence(fragmentation_ratio=0.1, kv_usage=0.5, over_budget_ratio=0.0, free_ratio=0.3, health_failures=0,
                phase="up", oom=False, preemptions_per_second=0.0)  # fmt: skip


def run(timeline: list[tuple[float, Evidence]], state: BreakerState | None = None, dt: float = 1.0):  # type: ignore[no-untyped-def]
    """Feed each evidence for its duration, one poll per dt; returns the final state and transitions."""
    state = state or BreakerState()
    t = 0.0
    transitions: list[Transition] = []
    for duration, seen in timeline:
        end = t + duration
        while t < end:
            state, transition = step(state, seen, t, P)
            if transition:
                transitions.append(transition)
            t += dt
    return state, transitions


def ev(**changes: object) -> Evidence:
    return Evidence(**{**CALM.__dict__, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "evidence", "sustain", "level", "rule"),
    [
        ("fragmentation", ev(fragmentation_ratio=0.36), P.l1_sustain_seconds, Level.L1, "fragmentation"),
        ("kv usage skips L1", ev(kv_usage=0.95), P.l2_sustain_seconds, Level.L2, "kv_usage"),
        ("past the budget", ev(over_budget_ratio=0.05), P.l2_sustain_seconds, Level.L2, "over_budget"),
        ("free below reserve", ev(free_ratio=0.05), P.l3_sustain_seconds, Level.L3, "free_reserve"),
        ("dead engine", ev(phase="dead"), P.l3_sustain_seconds, Level.L3, "engine_dead"),
        ("hung engine", ev(phase="unresponsive"), P.l3_sustain_seconds, Level.L3, "engine_unresponsive"),
        ("preemption storm", ev(preemptions_per_second=5.0), P.l2_sustain_seconds, Level.L2, "preemption_storm"),
    ],
)
def test_each_rule_enters_its_level_only_after_its_sustain(name, evidence, sustain, level, rule) -> None:  # type: ignore[no-untyped-def]
    state, transitions = run([(sustain, evidence)])  # polls at 0 .. sustain-1: not yet
    assert state.level == Level.L0 and transitions == []
    state, transitions = run([(sustain + 1, evidence)])
    (transition,) = transitions
    assert (transition.source, transition.target, transition.rule) == (Level.L0, level, rule)
    assert transition.t == sustain


def test_oom_is_hard_evidence_and_skips_to_l3_at_once() -> None:
    state, (transition,) = run([(1, ev(oom=True))])
    assert state.level == Level.L3 and transition.rule == "oom" and transition.t == 0


def test_transition_carries_the_numbers_behind_it() -> None:
    _, (transition,) = run([(11, ev(fragmentation_ratio=0.4))])
    assert transition.numbers["fragmentation_ratio"] == 0.4 and transition.numbers["kv_usage"] == 0.5


@pytest.mark.parametrize(
    ("value", "stays"),
    [(0.34, True), (0.30, True), (0.299, False)],
    ids=["below enter, above exit", "exactly exit", "below exit"],
)
def test_l1_hysteresis_edges(value: float, stays: bool) -> None:
    state, _ = run([(11, ev(fragmentation_ratio=0.4)), (P.l1_exit_hold_seconds + 5, ev(fragmentation_ratio=value))])
    assert state.level == (Level.L1 if stays else Level.L0)


def test_exit_needs_the_whole_hold_clear() -> None:
    entered = [(11, ev(fragmentation_ratio=0.4))]
    almost = entered + [(P.l1_exit_hold_seconds - 1, ev(fragmentation_ratio=0.2)), (1, ev(fragmentation_ratio=0.31))]
    state, _ = run(almost + [(P.l1_exit_hold_seconds - 1, ev(fragmentation_ratio=0.2))])
    assert state.level == Level.L1  # the clear timer started over at the 0.31 reading
    state, transitions = run(almost + [(P.l1_exit_hold_seconds + 1, ev(fragmentation_ratio=0.2))])
    assert state.level == Level.L0 and transitions[-1].rule == "recovered"


def test_de_escalation_is_one_level_per_hold() -> None:
    timeline = [(1, ev(oom=True)), (2000, CALM)]
    state, transitions = run(timeline)
    assert [(x.source, x.target) for x in transitions] == [
        (Level.L0, Level.L3), (Level.L3, Level.L2), (Level.L2, Level.L1), (Level.L1, Level.L0)
    ]  # fmt: skip
    gaps = [b.t - a.t for a, b in zip(transitions, transitions[1:])]
    assert gaps[0] >= P.l3_exit_hold_seconds and gaps[1] >= P.l2_exit_hold_seconds and gaps[2] >= P.l1_exit_hold_seconds


def test_l2_stays_while_kv_is_above_its_exit_threshold() -> None:
    state, _ = run([(31, ev(kv_usage=0.95)), (600, ev(kv_usage=0.87))])
    assert state.level == Level.L2
    state, _ = run([(31, ev(kv_usage=0.95)), (600, ev(kv_usage=0.80))])
    assert state.level < Level.L2


def test_unknown_data_never_escalates() -> None:
    unknown = Evidence()  # every reading None
    state, transitions = run([(1000, unknown)])
    assert state.level == Level.L0 and transitions == []


def test_a_level_with_nothing_known_never_de_escalates() -> None:
    state, _ = run([(31, ev(kv_usage=0.95)), (1000, Evidence())])
    assert state.level == Level.L2


def test_unknown_interrupts_sustained_evidence() -> None:
    timeline = [(6, ev(fragmentation_ratio=0.4)), (1, ev(fragmentation_ratio=None)), (6, ev(fragmentation_ratio=0.4))]
    state, _ = run(timeline)
    assert state.level == Level.L0  # two stretches of 6 s are not 10 s sustained


def test_lost_telemetry_holds_the_level() -> None:
    state, transitions = run([(31, ev(kv_usage=0.95)), (1000, ev(kv_usage=0.1, telemetry_lost=True))])
    assert state.level == Level.L2 and len(transitions) == 1


def test_a_dead_or_hung_engine_is_l3_even_with_its_telemetry_lost() -> None:
    for phase in ("dead", "unresponsive"):
        blind = ev(kv_usage=None, fragmentation_ratio=None, preemptions_per_second=None, telemetry_lost=True, phase=phase)
        state, transitions = run([(P.l3_sustain_seconds + 1, blind)])
        assert state.level == Level.L3 and transitions[0].rule == f"engine_{phase}"
    loading = ev(kv_usage=None, telemetry_lost=True, phase="starting")
    state, transitions = run([(1000, loading)])
    assert state.level == Level.L0 and transitions == []  # a loading engine is never called dead


def test_a_level_entered_on_evidence_now_unknown_decays_on_what_is_known() -> None:
    # L3 for the free reserve, then NVML is gone: free unknown, the engine up and calm
    state, _ = run([(P.l3_sustain_seconds + 1, ev(free_ratio=0.02))])
    assert state.level == Level.L3
    no_nvml = ev(free_ratio=None, over_budget_ratio=None)
    no_nvml = ev(free_ratio=None, over_budget_ratio=None, fragmentation_ratio=None)
    holds = P.l3_exit_hold_seconds + P.l2_exit_hold_seconds + P.l1_exit_hold_seconds
    state, transitions = run([(holds + 30, no_nvml)], state)
    assert state.level == Level.L0
    assert [tr.rule for tr in transitions] == ["recovered (free_ratio unknown)", "recovered (over_budget_ratio unknown)",
                                               "recovered (fragmentation_ratio unknown)"]  # fmt: skip
    # L1 with nothing known at all stays
    state, _ = run([(P.l1_sustain_seconds + 1, ev(fragmentation_ratio=0.5))])
    state, _ = run([(1000, Evidence())], state)
    assert state.level == Level.L1
    # a level with any stay condition still holding does not decay, known or not
    state, _ = run([(P.l3_sustain_seconds + 1, ev(free_ratio=0.02))])
    state, _ = run([(1000, ev(free_ratio=None, phase="unresponsive"))], state)
    assert state.level == Level.L3


def test_flapping_around_35_percent_makes_at_most_one_transition_per_hold() -> None:
    flapping = [(1, ev(fragmentation_ratio=0.36 if i % 2 else 0.34)) for i in range(600)]
    _, transitions = run(flapping)
    assert transitions == []  # never above 35% for 10 s in a row
    slow = [(15, ev(fragmentation_ratio=0.37 if i % 2 else 0.33)) for i in range(40)]
    _, transitions = run(slow)
    assert len(transitions) == 1  # in at the first sustained stretch; 0.33 never leaves (exit is 0.30)


def test_force_pins_a_level_until_clear() -> None:
    state, transition = force(BreakerState(), Level.L2, 5.0, "ops@host")
    assert transition.forced and transition.rule == "forced by ops@host"
    state, transitions = run([(2000, CALM)], state)
    assert state.level == Level.L2 and transitions == []
    state, transition = clear(state, 2000.0, "ops@host")
    assert state.level == Level.L0 and not state.forced and transition.target == Level.L0
    state, transitions = run([(6, ev(free_ratio=0.01))], state)
    assert state.level == Level.L3  # the rules decide again


# -- evidence from readings ------------------------------------------------------------

from guardian.analysis.engine_stats import EngineSignals  # noqa: E402
from guardian.analysis.memory import EnginePlacement, MemoryReport  # noqa: E402
from guardian.policy.evidence import EvidenceMemory, evidence  # noqa: E402
from guardian.sample import EngineReading, GpuReading, NvmlReading, Sample  # noqa: E402

GiB = 2**30


def _poll(healthy: bool | None, kind: str | None = None, free: float = 8.0, restarts: int = 0):  # type: ignore[no-untyped-def]
    gpu = GpuReading(index=0, memory_total_bytes=80 * GiB, memory_free_bytes=int(free * GiB), memory_used_bytes=int((80 - free) * GiB))
    reading = EngineReading(name="e", up=healthy is not None, healthy=healthy, error_kind=kind)
    sample = Sample(t=0, wall=0, nvml=NvmlReading(gpus=(gpu,)), engines=(reading,))
    sig = EngineSignals(name="e", up=True, healthy=healthy, telemetry_lost=False, failures_in_a_row=0,
                        kv_cache_usage=0.5, restarts_total=restarts, gpu_memory_bytes=int(74 * GiB))  # fmt: skip
    memory = MemoryReport({}, {}, {"e": EnginePlacement((0,), 80 * GiB, 0.92 * 80 * GiB)})
    return sample, sig, memory


def test_polls_without_an_answer_count_refusals_errors_and_timeouts() -> None:
    past = EvidenceMemory()
    counts, phases = [], []
    for healthy, kind in [(True, None), (False, None), (None, "refused"), (None, "timeout"), (False, None), (True, None)]:
        sample, sig, memory = _poll(healthy, kind)
        e = evidence("e", sample, sig, memory, past, 0.10)
        counts.append(e.health_failures)
        phases.append(e.phase)
    assert counts == [0, 1, 2, 3, 4, 0]
    # no process information: after three polls without an answer the engine is hung (timeouts) or dead (refused)
    assert phases == ["up", "up", "up", "unresponsive", "unresponsive", "up"]


def test_oom_is_an_engine_dying_while_its_gpu_was_out_of_memory() -> None:
    past = EvidenceMemory()
    evidence("e", *_poll(True, free=1.0), past, 0.10)  # 1.25% free
    e = evidence("e", *_poll(False, free=1.0), past, 0.10)
    assert e.oom is True
    past = EvidenceMemory()
    evidence("e", *_poll(True, free=20.0), past, 0.10)
    assert evidence("e", *_poll(True, free=20.0, restarts=1), past, 0.10).oom is False  # a restart with room: a crash


def test_over_budget_is_the_engines_memory_above_vllms_budget() -> None:
    e = evidence("e", *_poll(True), EvidenceMemory(), 0.10)
    assert e.over_budget_ratio == pytest.approx((74 - 0.92 * 80) / 80)
    assert e.free_ratio == pytest.approx(0.1)


def test_a_preemption_storm_is_l2_during_a_burst_and_l3_only_when_it_lasts() -> None:
    storm = ev(preemptions_per_second=5.0)
    state, transitions = run([(P.l3_storm_sustain_seconds, storm)])
    assert state.level == Level.L2 and [t.rule for t in transitions] == ["preemption_storm"]
    assert state.shut == Level.L2  # the low lane waits: fewer sequences compete for the KV blocks
    state, transitions = run([(P.l3_storm_sustain_seconds + 2, storm)])
    assert state.level == Level.L3 and [t.rule for t in transitions] == ["preemption_storm", "preemption_storm_lasting"]


def test_memory_rules_raise_the_level_but_shut_no_gates_and_going_down_never_shuts_more() -> None:
    leak = ev(over_budget_ratio=0.05)
    low = ev(over_budget_ratio=0.05, free_ratio=0.05)
    kv = ev(over_budget_ratio=0.05, free_ratio=0.05, kv_usage=0.95, preemptions_per_second=1.0)
    steps = [(P.l2_sustain_seconds + 1, leak)]
    state, _ = run(steps)
    assert state.level == Level.L2 and state.shut == Level.L0  # a leak outside the pool: refusing requests frees nothing
    steps.append((P.l3_sustain_seconds + 1, low))
    state, _ = run(steps)
    assert state.level == Level.L3 and state.shut == Level.L0
    steps.append((P.l2_sustain_seconds + 1, kv))
    state, _ = run(steps)
    assert state.level == Level.L3 and state.shut == Level.L2  # KV pressure under it shuts the low lane now
    steps.append((P.l3_exit_hold_seconds + 1, CALM))
    state, transitions = run(steps)
    assert [t.target for t in transitions][-1] == Level.L2 and state.shut == Level.L0  # calm opened them long before


def test_the_gates_open_once_the_request_path_is_calm_though_the_level_comes_down_slowly() -> None:
    steps = [(P.l2_sustain_seconds + 1, ev(kv_usage=0.95, preemptions_per_second=1.0))]
    state, _ = run(steps)
    assert state.level == Level.L2 and state.shut == Level.L2
    steps.append((P.gates_open_hold_seconds - 1, CALM))
    state, _ = run(steps)
    assert state.shut == Level.L2  # a dip is not calm
    steps.append((2, CALM))
    state, transitions = run(steps)
    assert state.shut == Level.L0 and state.level == Level.L2 and len(transitions) == 1  # the level waits its exit hold


def test_a_full_kv_pool_that_preempts_nothing_is_l2_for_the_record_but_refuses_nobody() -> None:
    state, transitions = run([(P.l2_sustain_seconds + 1, ev(kv_usage=0.97))])
    assert [t.rule for t in transitions] == ["kv_usage"] and state.shut == Level.L0
