"""The tuner's rules on a fake clock: polls every 5 s, a 60 s window, 6 samples, 120 s cooldown."""

from __future__ import annotations

import random
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from guardian.policy import tuner
from guardian.policy.profiles import hardware_profile
from guardian.policy.slo import Slo, lanes_served
from guardian.policy.tuner import Limits, Reading, TunerParams, TunerState
from guardian.policy.windows import Window, open_for_restarts

P = TunerParams()
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
    return [Reading(latency=latency, utilization=util, queued=queued, **kw) for _ in range(n)]


def test_p99_over_the_slo_lowers_the_batch_one_step_through_the_gateway() -> None:
    state, moves, _ = run(TunerState(batch=16, max_num_seqs=24, speculation=False), steady(0.30, 6))
    assert [(m.kind, m.old, m.new, m.restart) for _, m in moves] == [("batch", 16, 12, False)]
    assert moves[0][1].reason == "p99_over_slo" and moves[0][1].numbers["p99_min_seconds"] == 0.3
    assert state.batch == 12 and state.max_num_seqs == 24  # no restart: only the gateway's cap moved


def test_speculation_goes_off_before_the_batch_is_lowered() -> None:
    state, moves, _ = run(TunerState(batch=8, max_num_seqs=24, speculation=True), steady(0.30, 6 + 24 + 12))
    kinds = [(m.kind, m.new, m.restart) for _, m in moves]
    assert kinds[0] == ("speculation", False, True)  # a drained restart
    assert kinds[1] == ("batch", 6, False)  # next, after the cooldown
    assert moves[1][0] - moves[0][0] >= P.cooldown_seconds
    assert state.engine_args(FAST) == {"speculative-config": None, "max-num-seqs": 24}


def test_idle_gpu_with_a_queue_raises_the_batch_up_to_the_hardware_cap() -> None:
    state, moves, _ = run(TunerState(batch=4, max_num_seqs=None, speculation=False), steady(0.1, 400, util=0.4))
    assert [m.new for _, m in moves] == [5, 7, 9, 12, 15, 19, 24]
    assert all(m.reason == "gpu_idle_with_queue" for _, m in moves)
    assert state.batch == 24  # the H100 cap, and no further


def test_no_raise_without_a_queue_or_with_a_busy_gpu_and_p99_near_the_target() -> None:
    _, moves, _ = run(TunerState(batch=4, max_num_seqs=None, speculation=False), steady(0.1, 60, util=0.4, queued=0))
    assert moves == []
    _, moves, _ = run(TunerState(batch=4, max_num_seqs=None, speculation=False), steady(0.17, 60, util=0.99))
    assert moves == []  # inside the band's lower edge (180 ms) but not well inside, and the GPU is busy


def test_p99_well_inside_the_target_counts_as_room_on_a_busy_gpu() -> None:
    _, moves, _ = run(TunerState(batch=4, max_num_seqs=None, speculation=False), steady(0.05, 20, util=1.0))
    assert [(m.new, m.reason) for _, m in moves] == [(5, "p99_headroom_with_queue")]


def test_inside_the_tolerance_band_nothing_moves() -> None:
    for latency in (0.181, 0.2, 0.219):
        _, moves, _ = run(TunerState(batch=8, max_num_seqs=24, speculation=False), steady(latency, 200, util=0.3))
        assert moves == [], latency


def test_one_poll_that_disagrees_keeps_the_batch_stabilised() -> None:
    readings = steady(0.3, 20)
    readings[3] = Reading(latency=0.15, utilization=1.0, queued=5)  # one poll under the band
    _, moves, _ = run(TunerState(batch=16, max_num_seqs=24, speculation=False), readings)
    assert moves and moves[0][0] == 3 * POLL + P.window_seconds  # only once that poll left the window


def test_min_samples_before_the_first_move() -> None:
    _, moves, _ = run(TunerState(batch=16, max_num_seqs=24, speculation=False), steady(0.3, 5))
    assert moves == []
    readings = [Reading(latency=None, utilization=1.0, queued=5)] * 10 + steady(0.3, 5)
    _, moves, _ = run(TunerState(batch=16, max_num_seqs=24, speculation=False), readings)
    assert moves == []  # polls without a P99 (no requests finished) do not count


def test_cooldown_separates_moves() -> None:
    _, moves, holds = run(TunerState(batch=24, max_num_seqs=24, speculation=False), steady(0.5, 200))
    times = [t for t, _ in moves]
    assert len(times) >= 3
    assert all(b - a >= P.cooldown_seconds for a, b in zip(times, times[1:]))
    assert "cooldown" in holds


def test_noisy_p99_around_the_target_moves_at_most_once_per_cooldown() -> None:
    rng = random.Random(7)
    readings = [Reading(latency=0.2 * (1 + rng.uniform(-0.35, 0.35)), utilization=0.95, queued=rng.choice([0, 3]))
                for _ in range(720)]  # one hour  # fmt: skip
    _, moves, _ = run(TunerState(batch=12, max_num_seqs=24, speculation=False), readings)
    times = [t for t, _ in moves]
    assert all(b - a >= P.cooldown_seconds for a, b in zip(times, times[1:]))
    assert len(moves) <= 720 * POLL / P.cooldown_seconds
    assert len(moves) <= 1  # in fact: the window never agrees, so nothing moves at all


def test_no_tuning_above_l1_and_the_window_starts_over() -> None:
    state = TunerState(batch=16, max_num_seqs=24, speculation=False)
    _, moves, holds = run(state, steady(0.3, 30, breaker_level=2))
    assert moves == [] and set(holds) == {"breaker at L2"}
    _, moves, _ = run(state, steady(0.3, 30, breaker_level=1))
    assert moves  # L1 (fragmentation) still tunes
    readings = steady(0.3, 5) + steady(0.3, 1, breaker_level=3) + steady(0.3, 5)
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
    state, moves, _ = run(TunerState(batch=16, max_num_seqs=16, speculation=False), steady(0.3, 12), limits=slow)
    assert [(m.kind, m.new, m.restart) for _, m in moves] == [("max_num_seqs", 12, True)]
    assert state.batch == 12 and state.max_num_seqs == 12


def test_initial_state_starts_at_the_engine_limit_or_the_hardware_cap() -> None:
    assert tuner.initial(None, False, FAST).batch == 24
    assert tuner.initial(8, True, FAST).batch == 8
    assert tuner.initial(256, False, FAST).batch == 24


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
