"""The tuner's objective when none is configured or the configured one cannot be met, and an engine limit it learns.

Polls every 5 s on a fake clock, the default windows (60 s down, 15 s up).
"""

from __future__ import annotations

from guardian.policy import tuner
from guardian.policy.slo import Slo
from guardian.policy.tuner import Limits, Reading, TunerParams, TunerState
from tests.test_tuner import POLL, run as tuner_run

FAST = Limits(hardware_cap=24, fast=True, speculation_allowed=False, speculative_config=None)
DERIVED = TunerParams()  # no target: 3x the engine's P99 with nothing waiting in it
CONFIGURED = TunerParams(slo=Slo(target_seconds=0.2))


def run(state: TunerState, readings: list[Reading], p: TunerParams, limits: Limits = FAST, start: float = 0.0):  # type: ignore[no-untyped-def]
    return tuner_run(state, readings, limits, start, p)


def polls(n: int, latency: float, queued: float = 0, waiting: float = 0, running: float | None = None,
          kv: float | None = 0.2) -> list[Reading]:  # fmt: skip
    return [Reading(latency=latency, utilization=1.0, gateway_queued=queued, waiting=waiting, running=running, kv_usage=kv)
            for _ in range(n)]  # fmt: skip


def test_without_a_target_the_slo_is_three_times_the_p99_of_a_window_with_nothing_waiting() -> None:
    s, moves, holds = run(TunerState(batch=8, max_num_seqs=24, speculation=False), polls(10, 0.12, queued=3), DERIVED)
    assert moves == [] and s.unloaded is None  # under a full window: nothing learnt, nothing moved
    assert any("learning the engine's P99" in h for h in holds)
    s, moves, _ = run(s, polls(6, 0.12, queued=3), DERIVED, start=50.0)
    assert s.unloaded == 0.12
    assert tuner.slo_in_force(s, DERIVED, FAST)[0] == Slo(target_seconds=0.36)
    assert [(m.reason, m.new) for _, m in moves] == [("queue_held_by_batch", 12)]  # a queue with P99 inside 360 ms


def test_windows_with_requests_waiting_inside_vllm_teach_nothing() -> None:
    s, _, _ = run(TunerState(batch=8, max_num_seqs=24, speculation=False), polls(40, 2.0, waiting=5), DERIVED)
    assert s.unloaded is None  # its P99 is vLLM's queue, not the engine
    s, _, _ = run(s, polls(20, 0.3) + polls(20, 0.1), DERIVED, start=200.0)
    assert s.unloaded == 0.1  # the lowest full window


def test_a_configured_target_below_the_unloaded_p99_is_refused_with_the_reason_when_the_queue_needs_the_batch() -> None:
    # 0.4 s with nothing waiting in vLLM and a queue at the gateway: the old rules held "overloaded" for ever
    s, moves, holds = run(TunerState(batch=16, max_num_seqs=24, speculation=False), polls(60, 0.4, queued=5), CONFIGURED)
    slo, why = tuner.slo_in_force(s, CONFIGURED, FAST)
    assert slo == Slo(target_seconds=1.2) and why is not None
    assert "200 ms is below this engine's P99 ttft with nothing waiting (400 ms)" in why
    assert "target_seconds above 0.4" in why
    assert [(m.reason, m.new) for _, m in moves][0] == ("queue_held_by_batch", 24)  # steered by 1.2 s: the queue is served
    assert not any(h.startswith("overloaded") for h in holds[holds.index(why):])  # until learnt it was "overloaded"


def test_a_configured_target_a_smaller_batch_may_reach_is_kept_and_the_batch_lowered() -> None:
    s, moves, holds = run(TunerState(batch=16, max_num_seqs=24, speculation=False), polls(20, 0.4), CONFIGURED)
    assert [(m.reason, m.new, m.numbers["slo_seconds"]) for _, m in moves] == [("p99_over_slo", 12, 0.2)]
    assert not any(h.startswith("SLO refused") for h in holds)
    assert tuner.slo_in_force(s, CONFIGURED, FAST) == (CONFIGURED.slo, None)  # what /status shows is what it steers by


def test_an_unknown_max_num_seqs_is_learnt_from_vllm_running_the_same_n_with_others_waiting() -> None:
    s = tuner.initial(None, False, FAST)
    assert s.batch == 24
    s, moves, _ = run(s, polls(3, 5.0, waiting=20, running=4), DERIVED)
    assert [(m.kind, m.old, m.new, m.reason, m.restart) for _, m in moves] == [("batch", 24, 4, "engine_limit_found", False)]
    assert s.max_num_seqs == 4 and s.batch == 4
    assert s.last_move_up  # the short cooldown: this corrects what the tuner knew, it tries nothing


def test_no_limit_is_learnt_from_a_full_kv_cache_preemptions_or_a_running_count_that_moves() -> None:
    start = tuner.initial(None, False, FAST)
    for readings in (
        polls(6, 5.0, waiting=20, running=10, kv=0.95),  # memory holds it back, not --max-num-seqs
        [Reading(latency=5.0, utilization=1.0, gateway_queued=0, waiting=20, running=10, kv_usage=0.5,
                 preemptions_per_second=1.0)] * 6,  # fmt: skip
        [r for n in (9, 10, 11) for r in polls(2, 5.0, waiting=20, running=n)],
        polls(6, 5.0, waiting=0, running=10),  # nothing waits in vLLM
    ):
        s, moves, _ = run(start, readings, DERIVED)
        assert s.max_num_seqs is None and not any(m.reason == "engine_limit_found" for _, m in moves)


def test_an_engine_started_too_small_is_restarted_once_with_the_hardware_cap_and_the_batch_follows() -> None:
    s = tuner.initial(None, False, FAST)
    # vLLM runs 4 with 20 waiting; after the limit is found the gateway holds the queue and vLLM's P99 is its own
    readings = polls(3, 5.0, waiting=20, running=4) + polls(150, 0.15, queued=30, running=4)
    s, moves, holds = run(s, readings, DERIVED)
    slow = [(t, m) for t, m in moves if m.restart]
    assert [(m.kind, m.old, m.new, m.reason) for _, m in slow] == [("max_num_seqs", 4, 24, "pinned_queue_held_by_batch")]
    assert s.batch == 24 and s.max_num_seqs == 24  # the batch goes with it: no climb through fast steps after a restart
    assert "pinned at --max-num-seqs" in holds
    assert slow[0][0] <= 60 + DERIVED.pinned_seconds + 2 * POLL  # one window to learn the SLO, then the pinned time


def test_a_pinned_engine_whose_kv_cache_is_full_is_not_restarted_for_more_sequences() -> None:
    s = TunerState(batch=8, max_num_seqs=8, speculation=False)
    _, moves, holds = run(s, polls(120, 0.05, queued=10, kv=0.95), CONFIGURED)
    assert moves == [] and any("KV cache is full" in h for h in holds)
