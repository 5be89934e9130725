"""The breaker's response on a fake clock: which actions each level brings, the restart budget, degrade/restore."""

from __future__ import annotations

from dataclasses import replace

import pytest

from guardian.policy.breaker import BreakerParams, Evidence, Level
from guardian.policy.response import (
    Action,
    Command,
    EngineState,
    ResponseParams,
    command,
    from_disk,
    respond,
    to_disk,
)

BP = BreakerParams()
RP = ResponseParams(restart_budget=3, restart_budget_window_seconds=3600, degrade_after_seconds=600,
                    restore_after_seconds=1800)  # fmt: skip
CALM = Evidence(fragmentation_ratio=0.1, kv_usage=0.5, over_budget_ratio=0.0, free_ratio=0.3, expected_free_ratio=0.3,
                gpu_memory_utilization=0.7, health_failures=0, phase="up", oom=False, preemptions_per_second=0.0)  # fmt: skip


def ev(**changes: object) -> Evidence:
    return replace(CALM, **changes)  # type: ignore[arg-type]


class Run:
    """Feeds evidence one poll a second and keeps every transition and action."""

    def __init__(self, state: EngineState | None = None, rp: ResponseParams = RP) -> None:
        self.state = state or EngineState()
        self.rp = rp
        self.t = 0.0
        self.actions: list[tuple[float, Action]] = []
        self.transitions: list[tuple[float, Level, Level, str]] = []

    def feed(self, seconds: float, e: Evidence, finished: dict[float, bool] | None = None) -> Run:
        end = self.t + seconds
        while self.t < end:
            out = respond("e", self.state, e, self.t, BP, self.rp, (finished or {}).get(self.t))
            self.state = out.state
            self.actions += [(self.t, a) for a in out.actions]
            self.transitions += [(self.t, tr.source, tr.target, tr.rule) for tr in out.transitions]
            self.t += 1
        return self

    def kinds(self) -> list[str]:
        return [a.kind if a.kind != "notify" else f"notify:{a.details['severity']}" for _, a in self.actions]

    def restarts(self) -> list[Action]:
        return [a for _, a in self.actions if a.kind == "restart"]


def test_entering_l1_shuts_the_long_context_gate_frees_cached_kv_and_warns_in_that_order() -> None:
    run = Run().feed(BP.l1_sustain_seconds + 1, ev(fragmentation_ratio=0.4))
    assert run.transitions == [(BP.l1_sustain_seconds, Level.L0, Level.L1, "fragmentation")]
    assert run.kinds() == ["gates", "reset_prefix_cache", "notify:warning"]
    gates, _, warn = (a for _, a in run.actions)
    assert gates.level == 1 and warn.details["text"] == "fragmentation 40.0%"  # the rule's own number first
    assert warn.details["more"].startswith("kv 50.0%, over budget 0.0%, free 30.0%")


def test_going_back_to_l0_opens_the_gates_and_says_resolved() -> None:
    run = Run().feed(11, ev(fragmentation_ratio=0.4)).feed(BP.l1_exit_hold_seconds + 1, CALM)
    assert run.transitions[-1][1:] == (Level.L1, Level.L0, "recovered")
    assert run.kinds()[-2:] == ["gates", "notify:info"] and run.actions[-2][1].level == 0


def test_l3_by_the_free_reserve_pages_and_restarts_with_less_memory() -> None:
    run = Run().feed(BP.l3_sustain_seconds + 1, ev(free_ratio=0.05, over_budget_ratio=0.2))
    assert run.kinds() == ["gates", "reset_prefix_cache", "notify:page", "restart"]
    page, restart = run.actions[2][1], run.actions[3][1]
    # the shortfall (10% reserve - 5% free) comes off the utilisation, rounded down to the percent: 0.7 -> 0.65
    assert restart.reason == "free_reserve" and restart.details["gpu_memory_utilization"] == 0.65
    assert "action: drained restart (free_reserve, base profile, --gpu-memory-utilization 0.65)" in page.details["text"]
    assert run.state.restarting == BP.l3_sustain_seconds and len(run.state.restarts) == 1


def test_utilisation_is_never_lowered_below_the_configured_floor() -> None:
    rp = replace(RP, min_gpu_memory_utilization=0.68)
    run = Run(rp=rp).feed(BP.l3_sustain_seconds + 1, ev(free_ratio=0.01))
    assert run.restarts()[0].details["gpu_memory_utilization"] == 0.68


def test_a_default_vllm_host_with_its_usual_seven_percent_free_is_not_an_emergency() -> None:
    # vLLM 0.33 takes 92% by default: 7.4% free is what the configuration leaves, not a shortage
    default = ev(free_ratio=0.074, expected_free_ratio=0.074, gpu_memory_utilization=0.92)
    assert Run().feed(600, default).transitions == []
    short = Run().feed(BP.l3_sustain_seconds + 1, replace(default, free_ratio=0.03))  # something ate half of it
    assert short.transitions[-1][2:] == (Level.L3, "free_reserve")


def test_the_restart_in_progress_holds_the_level_until_its_outcome_is_in() -> None:
    run = Run().feed(BP.l3_sustain_seconds + 1, ev(free_ratio=0.05))
    started = run.state.restarting
    run.feed(60, ev(health_failures=10, phase="dead", free_ratio=None))  # paused, then down: on purpose
    assert run.state.breaker.level == Level.L3 and len(run.restarts()) == 1 and len(run.transitions) == 1
    run.feed(1, CALM, finished={run.t: True})
    assert run.state.restarting is None and started is not None
    run.feed(BP.l3_exit_hold_seconds + 1, CALM)
    assert run.transitions[-1][1:] == (Level.L3, Level.L2, "recovered")


def test_a_crash_loop_stops_at_the_restart_budget_pins_l3_and_pages() -> None:
    run = Run().feed(BP.l3_sustain_seconds + 1, ev(health_failures=5, phase="dead"))
    assert [a.reason for a in run.restarts()] == ["engine_dead"]
    for _ in range(5):  # each restart fails: the engine never comes back
        run.feed(1, ev(health_failures=5, phase="dead"), finished={run.t: False})
        run.feed(3, ev(health_failures=5, phase="dead"))
    assert len(run.restarts()) == RP.restart_budget
    assert run.state.breaker.forced and run.state.breaker.forced_by == "restart budget"
    pages = [a.details["text"] for _, a in run.actions if a.details.get("severity") == "page"]
    assert any("3 restarts in 3600s" in text and "guardian breaker clear e" in text for text in pages)
    assert sum(1 for _, a in run.actions if a.reason == "restart_failed") == RP.restart_budget
    run.feed(3600, ev(health_failures=5, phase="dead"))  # the window passes: still pinned, still no restart
    assert len(run.restarts()) == RP.restart_budget and run.state.breaker.level == Level.L3


def test_clear_hands_a_pinned_engine_back_to_the_rules() -> None:
    run = Run().feed(BP.l3_sustain_seconds + 1, ev(health_failures=5, phase="dead"))
    for _ in range(3):
        run.feed(1, ev(health_failures=5, phase="dead"), finished={run.t: False})
    assert run.state.breaker.forced
    out = command(run.state, Command("clear", "e", "alice"), run.t)
    assert out.state.breaker.level == Level.L0 and not out.state.breaker.forced
    assert [a.kind for a in out.actions] == ["gates", "notify"] and out.transitions[0].rule == "cleared by alice"


def test_force_pins_a_level_and_the_rules_do_not_move_it() -> None:
    out = command(EngineState(), Command("force", "e", "bob", 2), 0.0)
    assert out.state.breaker.level == Level.L2 and out.state.breaker.forced_by == "bob"
    assert [a.kind for a in out.actions] == ["gates", "reset_prefix_cache", "notify"]
    run = Run(out.state).feed(600, ev(free_ratio=0.01, health_failures=9, phase="dead"))
    assert run.transitions == [] and run.restarts() == []


def test_restarts_leave_the_budget_when_they_leave_the_window() -> None:
    state = EngineState(restarts=(0.0, 10.0, 20.0))
    run = Run(state)
    run.t = 3000.0
    run.feed(BP.l3_sustain_seconds + 1, ev(health_failures=5, phase="dead"))
    assert run.state.breaker.forced  # all three still inside the hour
    state = EngineState(restarts=(0.0, 10.0, 20.0))
    run = Run(state)
    run.t = 3605.0
    run.feed(BP.l3_sustain_seconds + 1, ev(health_failures=5, phase="dead"))
    assert not run.state.breaker.forced and len(run.restarts()) == 1 and len(run.state.restarts) == 2


def test_lasting_l2_pressure_brings_the_degraded_profile_and_calm_brings_the_normal_one_back() -> None:
    run = Run().feed(RP.degrade_after_seconds - 1, ev(kv_usage=0.95))
    assert run.state.breaker.level == Level.L2 and run.restarts() == []
    run.feed(2, ev(kv_usage=0.95))
    (degrade,) = run.restarts()
    assert degrade.reason == "degrade" and degrade.details["profile"] == "degraded" and run.state.degraded
    run.feed(1, ev(kv_usage=0.95), finished={run.t: True})
    run.feed(BP.l2_exit_hold_seconds + 1, CALM)  # L2 -> L1 after its hold, L1 -> L0 after its own
    run.feed(BP.l1_exit_hold_seconds + 1, CALM)
    assert run.state.breaker.level == Level.L0 and len(run.restarts()) == 1
    run.feed(RP.restore_after_seconds + 1, CALM)
    restore = run.restarts()[-1]
    assert restore.reason == "restore" and restore.details["profile"] == "base" and not run.state.degraded


def test_l2_entered_on_short_pressure_does_not_degrade_once_the_pressure_is_gone() -> None:
    run = Run().feed(BP.l2_sustain_seconds + 1, ev(kv_usage=0.95)).feed(RP.degrade_after_seconds + 10, ev(kv_usage=0.87))
    assert run.state.breaker.level == Level.L2 and run.restarts() == []  # stays (above the exit), not sustained


def test_state_survives_the_disk_with_times_as_unix_seconds() -> None:
    run = Run().feed(BP.l3_sustain_seconds + 1, ev(free_ratio=0.05))
    doc = to_disk(run.state, wall_offset=1_700_000_000.0)
    assert doc["level"] == 3 and doc["restarts"] == [1_700_000_000.0 + BP.l3_sustain_seconds]
    # after a reboot the monotonic clock starts again: the same wall times, another offset
    back = from_disk(doc, wall_offset=1_700_000_000.0 - 500.0)
    assert back.breaker.level == Level.L3 and back.restarts == (BP.l3_sustain_seconds + 500.0,)
    assert back.restarting is None  # its outcome died with the old process; it stays counted
    assert back.gpu_memory_utilization == 0.65


@pytest.mark.parametrize("broken", [{}, {"level": 9}, {"level": "x"}])
def test_a_state_document_of_the_wrong_shape_is_refused(broken: dict[str, object]) -> None:
    doc = {**to_disk(EngineState(), 0.0), **broken} if broken else {}
    with pytest.raises((KeyError, TypeError, ValueError)):
        from_disk(doc, 0.0)


def test_the_engine_s_own_memory_eating_the_reserve_restarts_it_at_the_same_utilisation_with_a_warning() -> None:
    run = Run().feed(BP.l3_sustain_seconds + 1, ev(free_ratio=0.05, over_budget_ratio=0.2, foreign_ratio=0.0))
    assert run.kinds() == ["gates", "reset_prefix_cache", "notify:warning", "restart"]
    gates, warning, restart = run.actions[0][1], run.actions[2][1], run.actions[3][1]
    assert gates.details["shut"] == 0  # memory outside the pool: no request is refused for it
    assert restart.details["gpu_memory_utilization"] is None and run.state.lowered_from is None  # the leak dies with it
    assert "vLLM's own memory" in warning.details["text"]


def test_other_processes_memory_pages_naming_them_and_lowers_the_utilisation_by_their_share_only() -> None:
    gib = 2**30
    foreign = ev(free_ratio=0.05, foreign_ratio=0.15, foreign=((4242, 12 * gib), (77, 1 * gib)))
    run = Run().feed(BP.l3_sustain_seconds + 1, foreign)
    page, restart = run.actions[2][1], run.actions[3][1]
    assert page.details["severity"] == "page"
    assert "other processes hold 15.0% of the GPU (pid 4242 12.0 GiB, pid 77 1.0 GiB)" in page.details["text"]
    assert restart.details["gpu_memory_utilization"] == 0.54  # 0.70 - 15% - one point of margin
    assert run.state.lowered_from == 0.7


def test_a_lowered_utilisation_is_measured_against_the_configured_headroom_and_restored_when_the_memory_goes() -> None:
    state = EngineState(gpu_memory_utilization=0.54, lowered_from=0.7)
    # at 0.54 with the other process still there, the GPU has its configured 30% headroom: nothing to do
    settled = ev(gpu_memory_utilization=0.54, expected_free_ratio=0.46, free_ratio=0.31, foreign_ratio=0.15)
    run = Run(state).feed(RP.restore_after_seconds + 10, settled)
    assert run.restarts() == [] and run.transitions == []
    # the other process exits: there is room for 0.7 again, and after restore_after_seconds it is restored
    gone = ev(gpu_memory_utilization=0.54, expected_free_ratio=0.46, free_ratio=0.46, foreign_ratio=0.0)
    run.feed(2, gone)
    (restore,) = run.restarts()
    assert restore.reason == "restore_utilization" and restore.details["gpu_memory_utilization"] is None
    assert run.state.lowered_from is None


def test_memory_past_the_budget_that_never_reaches_the_reserve_warns_and_never_restarts() -> None:
    run = Run().feed(RP.degrade_after_seconds * 3, ev(over_budget_ratio=0.03, free_ratio=0.2, foreign_ratio=0.0))
    assert run.transitions == [(BP.l2_sustain_seconds, Level.L0, Level.L2, "over_budget")]
    assert run.kinds() == ["gates", "reset_prefix_cache", "notify:warning"] and run.restarts() == []
    assert run.actions[0][1].details["shut"] == 0


def test_an_own_leak_in_known_steps_is_restarted_only_when_the_next_step_would_not_fit() -> None:
    step = ev(free_ratio=0.05, over_budget_ratio=0.2, foreign_ratio=0.0, leak_step_ratio=0.015)
    run = Run().feed(60, step)  # 5% free holds three more steps of 1.5%: a restart now would only cost a load
    assert run.restarts() == [] and run.state.breaker.level == Level.L3
    assert run.kinds() == ["gates", "reset_prefix_cache", "notify:warning"]
    run.feed(BP.l3_sustain_seconds + 1, replace(step, free_ratio=0.02))  # the next step would leave 0.5%
    (restart,) = run.restarts()
    assert restart.details["gpu_memory_utilization"] is None
    assert run.kinds()[-2:] == ["notify:warning", "restart"] and "action: drained restart" in run.actions[-2][1].details["text"]


def test_messages_are_exact_no_negative_zero_and_a_forced_warning_says_what_changed() -> None:
    run = Run().feed(BP.l2_sustain_seconds + 1, ev(kv_usage=0.95, over_budget_ratio=-0.00004))
    warning = next(a for _, a in run.actions if a.kind == "notify")
    assert "over budget 0.0%" in warning.details["more"] and "-0.0" not in warning.details["more"]
    out = command(EngineState(), Command("force", "e", "alice", 2), 0.0)
    (forced,) = [a for a in out.actions if a.kind == "notify"]
    assert forced.details["severity"] == "warning" and forced.details["text"] == "L0 -> L2"
