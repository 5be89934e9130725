"""The gateway's cap following the KV pool (policy/concurrency.py), on a fake clock."""

from __future__ import annotations

from guardian.policy.concurrency import CapParams, CapState, Pressure, step

P = CapParams(ceiling=64)


def test_a_full_pool_with_requests_waiting_in_the_engine_brings_the_cap_down_to_what_it_runs() -> None:
    state, why = step(CapState(64), Pressure(running=31, waiting=33, kv_usage=0.99, preemptions_per_second=0.0, in_flight=64), 10.0, P)
    assert (state.cap, why) == (31, "kv_full")
    state, why = step(state, Pressure(running=12, waiting=5, kv_usage=0.7, preemptions_per_second=3.0, in_flight=31), 11.0, P)
    assert (state.cap, why) == (12, "preempting")
    state, why = step(state, Pressure(running=1, waiting=9, kv_usage=0.99, preemptions_per_second=3.0, in_flight=12), 12.0, P)
    assert state.cap == P.floor


def test_the_cap_grows_back_a_tenth_at_a_time_only_while_the_engine_is_kept_at_it_with_room() -> None:
    state = CapState(20, changed_at=0.0)
    calm_at_cap = Pressure(running=20, waiting=0, kv_usage=0.6, preemptions_per_second=0.0, in_flight=20)
    assert step(state, calm_at_cap, 4.0, P) == (state, None)  # not yet: one move per grow_every_seconds
    state, why = step(state, calm_at_cap, 5.0, P)
    assert (state.cap, why) == (22, "room")
    idle = Pressure(running=3, waiting=0, kv_usage=0.1, preemptions_per_second=0.0, in_flight=3)
    assert step(state, idle, 60.0, P)[1] is None  # an idle engine says nothing about a larger cap
    full = Pressure(running=22, waiting=0, kv_usage=0.95, preemptions_per_second=0.0, in_flight=22)
    assert step(state, full, 60.0, P)[1] is None  # a full pool that keeps up: the cap is right
    queueing = Pressure(running=22, waiting=3, kv_usage=0.8, preemptions_per_second=0.0, in_flight=25)
    assert step(state, queueing, 60.0, P)[1] is None  # the engine queues some itself: no more
    for t in range(100, 400, 5):
        state, _ = step(state, Pressure(running=state.cap, waiting=0, kv_usage=0.5, preemptions_per_second=0.0, in_flight=state.cap), t, P)
    assert state.cap == P.ceiling


def test_unknown_engine_readings_move_nothing() -> None:
    state = CapState(30, changed_at=0.0)
    assert step(state, Pressure(None, None, None, None, in_flight=30), 100.0, P) == (state, None)
