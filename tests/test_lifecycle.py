"""The engine lifecycle on a fake clock, from what a real vllm serve does while loading, dying and hanging."""

from __future__ import annotations

from guardian.policy.lifecycle import Lifecycle, LifecycleParams, Observation, step

P = LifecycleParams(dead_after_polls=3, start_timeout_seconds=300)
WALL = 1_800_000_000.0


def run(polls: list[Observation], state: Lifecycle | None = None, t0: float = 0.0) -> list[str | None]:
    state = state or Lifecycle()
    phases = []
    for i, obs in enumerate(polls):
        state = step(state, obs, t0 + i, P)
        phases.append(state.phase)
    return phases


def obs(answered: bool = True, refused: bool = False, alive: bool | None = True, started: float | None = WALL - 3600,
        at: float = 0.0) -> Observation:  # fmt: skip
    return Observation(answered, refused, alive, started, WALL + at)


def test_a_loading_engine_is_starting_until_healthy_however_long_it_refuses_inside_its_start_timeout() -> None:
    launched = WALL  # guardian started it now; vLLM refuses connections while it loads (120 s here)
    loading = [obs(False, True, True, launched, at=i) for i in range(120)]
    phases = run(loading + [obs(True, started=launched, at=120)])
    assert set(phases[:-1]) == {"starting"} and phases[-1] == "up"


def test_an_engine_still_loading_past_its_start_timeout_is_unresponsive() -> None:
    phases = run([obs(False, True, True, WALL, at=i) for i in range(310)])
    assert phases[299] == "starting" and phases[300] == "unresponsive"


def test_a_new_start_time_is_a_restart_seen_from_outside_and_it_loads_in_peace() -> None:
    state = Lifecycle()
    state = step(state, obs(), 0.0, P)
    assert state.phase == "up"
    phases = run([obs(False, True, True, started=WALL + 10, at=10 + i) for i in range(60)], state, t0=10)
    assert set(phases) == {"starting"}  # systemd restarted it: loading, never dead


def test_the_process_gone_is_dead_at_once_and_a_hang_is_unresponsive_after_three_polls() -> None:
    up = [obs() for _ in range(3)]
    dying = [obs(False, alive=True), obs(False, alive=True), obs(False, refused=True, alive=False)]
    assert run(up + dying)[-3:] == ["up", "up", "dead"]  # /health 503 for ~3 s, then the server exits
    hang = [obs(False, alive=True) for _ in range(4)]
    assert run(up + hang)[-4:] == ["up", "up", "unresponsive", "unresponsive"]


def test_without_process_information_refusals_are_dead_and_timeouts_a_hang() -> None:
    assert run([obs()] + [obs(False, True, alive=None, started=None)] * 3)[-1] == "dead"
    assert run([obs()] + [obs(False, False, alive=None, started=None)] * 3)[-1] == "unresponsive"
