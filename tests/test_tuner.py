"""The tuner's rules on a fake clock: polls every 5 s, a 60 s window, 6 samples, 120 s cooldown."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from guardian.policy import tuner
from guardian.policy.profiles import hardware_profile
from guardian.policy.slo import Slo, lanes_served
from guardian.policy.tuner import Limits, Reading, TunerParams, TunerState
from guardian.policy.windows import Window, open_for_restarts

P = TunerParams(slo=Slo(target_seconds=0.2))  # a configured objective (the derived one: test_tuner_slo.py)
FAST = Limits(hardware_cap=24, fast=True, speculation_allowed=True, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
POLL = 5.0


def run(state: TunerState, readings: list[Reading], limits: Limits = FAST, start: float = 0.0, p: TunerParams = P):
    """Feed one reading per poll; returns the final state and every (t, move)."""
    moves = []
    holds = []
    for i, r in enumerate(readings):
        t = start + i * POLL
        out = tuner.step(state, r, t, p, limits)
        state = out.state
        if out.move:
            moves.append((t, out.move))
        if out.hold:
            holds.append(out.hold)
    return state, moves, holds


def steady(latency: float, n: int, util: float = 1.0, queued: float = 5, **kw) -> list[Reading]:
    return [Reading(latency=latency, utilization=util, gateway_queued=queued, **kw) for _ in range(n)]


def test_p99_over_the_slo_lowers_the_batch_one_step_through_the_gateway() -> None:
    state, moves, _ = run(TunerState(batch=16, max_num_seqs=24, speculation=False), steady(0.30, 6, queued=0))
    assert [(m.kind, m.old, m.new, m.restart) for _, m in moves] == [("batch", 16, 12, False)]
    assert moves[0][1].reason == "p99_over_slo" and moves[0][1].numbers["p99_min_seconds"] == 0.3
    assert state.batch == 12 and state.max_num_seqs == 24  # no restart: only the gateway's cap moved


def test_speculation_goes_off_before_the_batch_is_lowered() -> None:
    state, moves, _ = run(TunerState(batch=8, max_num_seqs=24, speculation=True), steady(0.30, 6 + 24 + 12, queued=0))
    kinds = [(m.kind, m.new, m.restart) for _, m in moves]
    assert kinds[0] == ("speculation", False, True)  # a drained restart
    assert kinds[1] == ("batch", 6, False)  # next, after the cooldown
    assert moves[1][0] - moves[0][0] >= P.cooldown_seconds
    assert state.engine_args(FAST) == {"speculative-config": None, "max-num-seqs": 24}


def test_a_queue_held_back_by_the_cap_with_p99_inside_raises_the_batch_up_to_the_hardware_cap() -> None:
    state, moves, _ = run(TunerState(batch=4, max_num_seqs=None, speculation=False), steady(0.15, 400, util=1.0))
    assert [m.new for _, m in moves] == [6, 9, 14, 21, 24]  # half again each step
    assert all(m.reason == "queue_held_by_batch" for _, m in moves)
    assert all(b[0] - a[0] >= P.up_cooldown_seconds for a, b in zip(moves, moves[1:]))
    assert state.batch == 24  # the H100 cap, and no further


def test_idle_gpu_with_a_queue_in_vllm_raises_the_batch() -> None:
    readings = [Reading(latency=0.1, utilization=0.4, gateway_queued=0, waiting=3, kv_usage=0.95)] * 20
    _, moves, _ = run(TunerState(batch=4, max_num_seqs=None, speculation=False), readings)
    assert [(m.new, m.reason) for _, m in moves][0] == (6, "gpu_idle_with_queue")


def test_no_raise_without_a_queue_or_over_the_band_or_a_busy_gpu_and_vllms_own_queue() -> None:
    _, moves, _ = run(TunerState(batch=4, max_num_seqs=None, speculation=False), steady(0.1, 60, util=0.4, queued=0))
    assert moves == []
    _, moves, _ = run(TunerState(batch=4, max_num_seqs=None, speculation=False), steady(0.185, 60, util=0.3, queued=0))
    assert moves == []  # idle, but nothing queued
    busy = [Reading(latency=0.1, utilization=1.0, gateway_queued=0, waiting=3, kv_usage=0.95)] * 60
    _, moves, _ = run(TunerState(batch=4, max_num_seqs=None, speculation=False), busy)
    assert moves == []  # vLLM holds requests for lack of KV, not for the gateway's cap


def test_inside_the_tolerance_band_nothing_moves() -> None:
    for latency in (0.181, 0.2, 0.219):  # an idle GPU with vLLM's own queue, and nothing queued in the gateway
        readings = steady(latency, 200, util=0.3, queued=0, waiting=2, kv_usage=0.95)
        _, moves, _ = run(TunerState(batch=8, max_num_seqs=24, speculation=False), readings)
        assert moves == [], latency


def test_one_poll_that_disagrees_keeps_the_batch_stabilised() -> None:
    readings = steady(0.3, 20, queued=0)
    readings[3] = Reading(latency=0.15, utilization=1.0, gateway_queued=0)  # one poll under the band
    _, moves, _ = run(TunerState(batch=16, max_num_seqs=24, speculation=False), readings)
    assert moves and moves[0][0] == 3 * POLL + P.window_seconds  # only once that poll left the window


def test_min_samples_before_the_first_move() -> None:
    _, moves, _ = run(TunerState(batch=16, max_num_seqs=24, speculation=False), steady(0.3, 5, queued=0))
    assert moves == []
    readings = [Reading(latency=None, utilization=1.0, gateway_queued=0)] * 10 + steady(0.3, 5, queued=0)
    _, moves, _ = run(TunerState(batch=16, max_num_seqs=24, speculation=False), readings)
    assert moves == []  # polls without a P99 (no requests finished) do not count


def test_cooldown_separates_moves() -> None:
    readings = [Reading(latency=0.9 * 0.8 ** (i // 12), utilization=1.0, gateway_queued=0) for i in range(200)]  # each step helps
    _, moves, holds = run(TunerState(batch=24, max_num_seqs=24, speculation=False), readings)
    times = [t for t, _ in moves]
    assert len(times) >= 3
    assert all(b - a >= P.cooldown_seconds for a, b in zip(times, times[1:]))
    assert "cooldown" in holds


def test_noisy_p99_around_the_target_moves_at_most_once_per_cooldown_and_never_back_and_forth() -> None:
    rng = random.Random(7)
    for queued in (0, 3):
        readings = [Reading(latency=0.2 * (1 + rng.uniform(-0.35, 0.35)), utilization=0.95, gateway_queued=queued)
                    for _ in range(720)]  # one hour at 5 s polls  # fmt: skip
        _, moves, _ = run(TunerState(batch=4, max_num_seqs=24, speculation=False), readings)
        times = [t for t, _ in moves]
        assert all(b - a >= P.up_cooldown_seconds for a, b in zip(times, times[1:]))
        assert not [m for _, m in moves if m.new < m.old]  # never down: the long window never agrees
        if queued == 0:
            assert moves == []
        else:  # clients wait for the batch: it grows to the cap, in steps, and stays
            assert [m.new for _, m in moves] == [6, 9, 14, 21, 24]


def test_no_tuning_above_l1_and_the_window_starts_over() -> None:
    state = TunerState(batch=16, max_num_seqs=24, speculation=False)
    _, moves, holds = run(state, steady(0.3, 30, queued=0, breaker_level=2))
    assert moves == [] and set(holds) == {"breaker at L2"}
    _, moves, _ = run(state, steady(0.3, 30, queued=0, breaker_level=1))
    assert moves  # L1 (fragmentation) still tunes
    readings = steady(0.3, 5, queued=0) + steady(0.3, 1, queued=0, breaker_level=3) + steady(0.3, 5, queued=0)
    _, moves, _ = run(state, readings)
    assert moves == []  # after L3 the window had only five polls again


def test_pinned_at_max_num_seqs_raises_it_to_the_cap_by_one_restart() -> None:
    state, moves, holds = run(TunerState(batch=8, max_num_seqs=8, speculation=False), steady(0.05, 120))
    assert "pinned at --max-num-seqs" in holds
    slow = [(t, m) for t, m in moves if m.restart]
    assert len(slow) == 1
    t, m = slow[0]
    assert (m.kind, m.old, m.new) == ("max_num_seqs", 8, 24)
    assert t >= P.pinned_seconds
    assert state.max_num_seqs == 24 and state.engine_args(FAST)["max-num-seqs"] == 24


def test_slow_moves_wait_for_an_allowed_window_and_the_daily_budget() -> None:
    state = TunerState(batch=8, max_num_seqs=8, speculation=False)
    _, moves, holds = run(state, steady(0.05, 120, window_open=False))
    assert moves == [] and "a larger --max-num-seqs waits for an allowed window" in holds
    spent = TunerState(batch=8, max_num_seqs=8, speculation=False, restarts=(-100.0, -200.0, -300.0))
    _, moves, holds = run(spent, steady(0.05, 120))
    assert moves == [] and any("3 tuning restarts in the last day" in h for h in holds)
    _, moves, _ = run(spent, steady(0.05, 120), start=tuner.DAY_SECONDS)  # a day later the budget is back
    assert [m.kind for _, m in moves][0] == "max_num_seqs"
    _, moves, holds = run(state, steady(0.05, 120, restart_budget_ok=False))
    assert moves == [] and any("kept for emergencies" in h for h in holds)


def test_speculation_back_on_only_after_p99_stayed_well_inside_with_a_small_batch() -> None:
    state = TunerState(batch=4, max_num_seqs=24, speculation=False)
    quiet = steady(0.05, 200, queued=0)  # no queue: no raise, just a calm engine
    _, moves, _ = run(state, quiet)
    assert [(m.kind, m.new, m.reason) for _, m in moves] == [("speculation", True, "p99_well_inside_slo")]
    assert moves[0][0] >= P.speculation_after_seconds
    _, moves, _ = run(TunerState(batch=12, max_num_seqs=24, speculation=False), quiet)
    assert moves == []  # batch too large for speculation to pay
    _, moves, _ = run(state, quiet, limits=Limits(24, True, False, FAST.speculative_config))
    assert moves == []  # a class it serves does not allow speculation
    _, moves, _ = run(state, steady(0.05, 200, queued=0, degraded=True))
    assert moves == []  # the breaker's degraded profile keeps it off
    readings = quiet[:100] + steady(0.15, 1, queued=0) + quiet[:100]
    _, moves, _ = run(state, readings)
    assert moves == []  # one poll not well inside starts the wait over


def test_without_a_gateway_batch_moves_are_restarts_on_max_num_seqs() -> None:
    slow = Limits(hardware_cap=24, fast=False, speculation_allowed=True, speculative_config=None)
    state, moves, _ = run(TunerState(batch=16, max_num_seqs=16, speculation=False), steady(0.3, 12, queued=0), limits=slow)
    assert [(m.kind, m.new, m.restart) for _, m in moves] == [("max_num_seqs", 12, True)]
    assert state.batch == 12 and state.max_num_seqs == 12
    waiting = [Reading(latency=0.1, utilization=1.0, gateway_queued=0, waiting=4, kv_usage=0.5)] * 120
    state, moves, _ = run(TunerState(batch=8, max_num_seqs=8, speculation=False), waiting, limits=slow)
    assert [(m.kind, m.new) for _, m in moves] == [("max_num_seqs", 12)]  # after pinned_seconds, one step


def test_without_a_gateway_an_engine_whose_max_num_seqs_is_unknown_is_not_restarted_smaller() -> None:
    slow = Limits(hardware_cap=24, fast=False, speculation_allowed=True, speculative_config=None)
    state, moves, holds = run(tuner.initial(None, False, slow), steady(0.3, 12, queued=0), limits=slow)
    assert moves == [] and state.max_num_seqs is None  # it may run vLLM's default 256: 18 would cut it
    assert "--max-num-seqs unknown, so not lowered by a restart" in holds[-1]


def test_initial_state_starts_where_the_engine_is_and_the_hardware_cap_never_cuts_it() -> None:
    assert tuner.initial(None, False, FAST).batch == 24  # nothing known: the GPU's cap
    assert tuner.initial(8, True, FAST).batch == 8
    assert tuner.initial(256, False, FAST).batch == 256  # an engine serving more than the table's 24 keeps it
    assert tuner.initial(256, False, FAST, gateway_cap=64).batch == 64  # the gateway's cap, where it is lower
    assert tuner.initial(None, False, FAST, gateway_cap=64).batch == 64


def test_a_batch_above_the_hardware_cap_is_not_raised_further() -> None:
    # a queue held by the batch with P99 inside raises a batch under the cap (the test below); not this one
    state, moves, _ = run(tuner.initial(256, False, FAST, gateway_cap=64), steady(0.15, 400, util=1.0))
    assert moves == [] and state.batch == 64


def test_state_survives_the_disk_round_trip() -> None:
    s = TunerState(batch=12, max_num_seqs=24, speculation=True, last_move=100.0, restarts=(50.0, 90.0))
    back = tuner.from_disk(tuner.to_disk(s, 1_000_000.0), 1_000_000.0)
    assert (back.batch, back.max_num_seqs, back.speculation, back.last_move, back.restarts) == (12, 24, True, 100.0, (50.0, 90.0))


@pytest.mark.parametrize(
    ("name", "cap"),
    [("NVIDIA A100-SXM4-80GB", 12), ("NVIDIA GeForce RTX 4090", 4), ("NVIDIA H100 80GB HBM3", 24), ("NVIDIA H200", 24),
     ("NVIDIA L4", 4), (None, 4)],
)  # fmt: skip
def test_hardware_caps_by_nvml_name(name: str | None, cap: int) -> None:
    assert hardware_profile(name).batch_cap == cap


def test_a_configured_cap_wins_over_the_default() -> None:
    assert hardware_profile("NVIDIA H100 80GB HBM3", {"H100": 32}).batch_cap == 32
    assert hardware_profile("NVIDIA L40S", {"L40S": 8}).matched == "L40S"


def test_speculation_is_allowed_only_where_every_class_served_allows_it() -> None:
    slo = Slo()
    assert not slo.speculation_allowed(lanes_served("a", [], gateway=True))  # serves high too
    assert slo.speculation_allowed(lanes_served("b", ["a"], gateway=True))  # a dedicated pool takes high away
    assert slo.priority("high") < slo.priority("low")


def test_windows_and_blackouts_by_cron() -> None:
    tz = ZoneInfo("Europe/Berlin")
    nightly = Window("0 2 * * *", 120)
    month_end = Window("0 0 28-31 * *", 24 * 60)

    def at(*args: int) -> float:
        return datetime(*args, tzinfo=tz).timestamp()

    assert open_for_restarts(at(2026, 12, 2, 2, 30), (nightly,), (), tz)
    assert not open_for_restarts(at(2026, 12, 2, 4, 30), (nightly,), (), tz)
    assert not open_for_restarts(at(2026, 12, 29, 3, 0), (nightly,), (month_end,), tz)
    assert open_for_restarts(at(2026, 12, 2, 13, 0), (), (month_end,), tz)  # no windows: always, but blackouts


def test_p99_over_the_band_with_a_queue_is_overload_and_the_batch_holds() -> None:
    # the engine met the objective before (0.1 s with nothing waiting): the target is reachable, the load is too high
    _, moves, holds = run(TunerState(batch=16, max_num_seqs=24, speculation=False, unloaded=0.1), steady(0.4, 60))
    assert moves == [] and any(h.startswith("overloaded") for h in holds)


def test_a_queue_with_p99_inside_the_band_still_raises() -> None:
    _, moves, _ = run(TunerState(batch=8, max_num_seqs=24, speculation=False), steady(0.21, 20))
    assert [(m.new, m.reason) for _, m in moves][0] == (12, "queue_held_by_batch")


def test_a_smaller_batch_that_did_not_lower_p99_is_undone_and_not_tried_again_for_a_while() -> None:
    readings = steady(0.3, 200, queued=0)  # P99 that does not respond to the batch (long prompts' prefill)
    state, moves, holds = run(TunerState(batch=16, max_num_seqs=24, speculation=False), readings)
    assert [(m.new, m.reason) for _, m in moves][:2] == [(12, "p99_over_slo"), (16, "lowering_did_not_help")]
    assert len(moves) == 2  # 1000 s: within blocked_seconds of the undo, nothing else
    # 0.3 s with nothing waiting, and a smaller batch did not lower it: the 200 ms objective is refused meanwhile
    assert any(h.startswith("SLO refused: its 200 ms") for h in holds)
    assert state.batch == 16


def test_preemptions_throughout_the_window_lower_the_batch_and_cap_it_below_for_a_while() -> None:
    storm = [Reading(latency=0.15, utilization=1.0, gateway_queued=5, preemptions_per_second=0.5)] * 12
    calm = [Reading(latency=0.15, utilization=1.0, gateway_queued=5, preemptions_per_second=0.0)] * 120
    state, moves, _ = run(TunerState(batch=24, max_num_seqs=24, speculation=False), storm + calm)
    assert [(m.new, m.reason) for _, m in moves] == [(18, "preemptions"), (23, "queue_held_by_batch")]
    assert state.batch == 23  # the queue pushes up again, but not back to where the KV cache overflowed
    _, moves, _ = run(TunerState(batch=24, max_num_seqs=24, speculation=False), storm + calm, start=0.0,
                      p=replace(P, blocked_seconds=100))  # fmt: skip
    assert moves[-1][1].new == 24  # once the ceiling expires


def test_each_undo_in_a_row_doubles_the_wait_before_the_next_smaller_batch() -> None:
    readings = steady(0.3, 2000, queued=0)  # P99 that never answers to the batch
    _, moves, _ = run(TunerState(batch=16, max_num_seqs=24, speculation=False), readings)
    undos = [t for t, m in moves if m.reason == "lowering_did_not_help"]
    tries = [t for t, m in moves if m.reason == "p99_over_slo"]
    assert len(tries) == len(undos) == 4  # at 25 s, then 15, 30 and 60 min after each undo (10000 s in all)
    assert [b - a for a, b in zip(undos, tries[1:])] == [P.blocked_seconds, 2 * P.blocked_seconds, 4 * P.blocked_seconds]


def test_a_smaller_batch_for_preemptions_that_continue_is_undone_and_the_ceiling_lifted() -> None:
    storm = [Reading(latency=0.15, utilization=1.0, gateway_queued=0, preemptions_per_second=0.5)] * 100
    state, moves, holds = run(TunerState(batch=24, max_num_seqs=24, speculation=False), storm)
    assert [(m.new, m.reason) for _, m in moves] == [(18, "preemptions"), (24, "lowering_did_not_help")]
    assert state.ceiling is None and state.blocked_preemption_until is not None
    assert state.blocked_down_until is None  # P99's own rule is not blocked by it


def _blocked(n: int, **kw) -> list[Reading]:
    """Short requests waiting ~1.5 s in vLLM's queue behind long prompts' prefill, with seats and KV to spare."""
    base = {"waiting": 2, "running": 4, "kv_usage": 0.4, "preemptions_per_second": 0.0, "queue_p99": 1.5, "long_in_flight": True}
    return steady(1.6, n, queued=20, **{**base, **kw})


def test_requests_waiting_in_vllm_behind_long_prefills_cap_them_by_one_restart_even_without_an_slo() -> None:
    learning = TunerParams()  # no configured objective, none derived yet: the rule needs none
    state, moves, _ = run(tuner.initial(None, False, FAST, 64), _blocked(40), p=learning)
    assert [(m.kind, m.old, m.new, m.restart, m.reason) for _, m in moves] == [
        ("long_prefill", None, 1024, True, "long_prefill_blocks_others")]
    assert moves[0][0] >= learning.window_seconds * 0.9  # a full window of it, not one poll
    assert moves[0][1].numbers["queue_p99_seconds"] == 1.5
    assert state.engine_args(FAST)["long-prefill-token-threshold"] == 1024
    assert state.batch == 64 and state.max_num_seqs is None  # 4 running with others waiting is not the engine's limit here
    _, again, _ = run(state, _blocked(200), p=learning, start=1000.0)
    assert [m.kind for _, m in again] == []  # once: the engine runs with the cap now


@pytest.mark.parametrize("why", [
    {"long_in_flight": False},  # the wait is not long prompts' doing (a burst of short ones)
    {"short_in_flight": False},  # long prompts wait behind each other: a cap would only slow each
    {"kv_usage": 0.95},  # the pool is full: requests wait for memory, the cap's to answer
    {"preemptions_per_second": 1.0},
    {"queue_p99": 0.2},  # they hardly wait
])
def test_a_wait_in_vllm_without_long_prefills_behind_it_sets_no_cap(why: dict[str, object]) -> None:
    _, moves, _ = run(tuner.initial(None, False, FAST, 64), _blocked(40, **why), p=TunerParams())
    assert [m for _, m in moves if m.kind == "long_prefill"] == []


def test_an_engine_already_capping_long_prefills_or_a_zero_setting_is_not_restarted_for_it() -> None:
    _, moves, _ = run(tuner.initial(None, False, FAST, 64, long_prefill=2048), _blocked(40), p=TunerParams())
    assert moves == []
    _, moves, _ = run(tuner.initial(None, False, FAST, 64), _blocked(40), p=TunerParams(long_prefill_tokens=0))
    assert moves == []


def test_the_long_prefill_cap_survives_a_restart_of_guardian() -> None:
    state = replace(tuner.initial(24, False, FAST), long_prefill=1024)
    assert tuner.from_disk(tuner.to_disk(state, 100.0), 100.0).long_prefill == 1024
    doc = tuner.to_disk(state, 100.0)
    del doc["long_prefill"]  # a state file written before the cap existed
    assert tuner.from_disk(doc, 100.0).long_prefill is None


def test_the_long_prefill_cap_is_exported_beside_max_num_seqs() -> None:
    from guardian.exporter import Metrics
    from guardian.sample import NvmlReading, Sample
    from guardian.snapshot import PolicyView, Snapshot

    tuners = {"capped": replace(tuner.initial(24, False, FAST), long_prefill=1024), "plain": tuner.initial(24, False, FAST)}
    policy = PolicyView(states={}, budget=3, budget_left={}, dry_run=False, restarting=[], tuners=tuners)
    page = Metrics(lambda: Snapshot(Sample(0.0, 0.0, NvmlReading(), ()), {}, False, 0.0, policy=policy)).render().decode()
    assert 'guardian_tuner_long_prefill_tokens{engine="capped"} 1024.0' in page
    assert 'guardian_tuner_long_prefill_tokens{engine="plain"}' not in page  # vLLM's default: no cap, no sample
