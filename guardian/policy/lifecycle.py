"""Where an engine is in its life: starting, up, unresponsive or dead. Pure: one reading and the time in, the phase out.

Built from what a real ``vllm serve`` does, not from what a healthy one answers:

- While it loads (50 s to minutes) nothing listens at all: connection refused.
  A loading engine looks exactly like a dead one from the outside, so the
  process decides: alive and started recently (by guardian, or seen with a new
  start time) is ``starting``, and it is never called dead or hung before its
  start timeout.
- When its engine core dies, ``/health`` answers 503 for about 3 s while
  ``/metrics`` still answers, then the whole server exits: not-healthy with
  the process alive counts towards ``unresponsive``; the process gone is
  ``dead`` at once.
- A hang (the process alive, ``/health`` or ``/metrics`` failing or timing
  out for ``unresponsive_after_polls``) is ``unresponsive``.
- Without any process information (no launcher, no ``[engines.process]``),
  refused for ``dead_after_polls`` is ``dead`` and any other failure that
  long is ``unresponsive``: guardian cannot tell loading from dead then, and
  says so in the README.

Lost telemetry is not a phase: an engine whose answers guardian cannot read
but whose process lives and answers ``/health`` is ``up``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from guardian.policy.frozen import updated

Phase = Literal["starting", "up", "unresponsive", "dead"]
DOWN: tuple[Phase, ...] = ("unresponsive", "dead")  # phases that call for a restart and a page

NEW_PROCESS_SLACK_SECONDS = 1.0  # start times are read to about a clock tick


@dataclass(frozen=True)
class LifecycleParams:
    dead_after_polls: int = 3
    start_timeout_seconds: float = 900.0


@dataclass(frozen=True)
class Observation:
    """One poll of one engine, as far as the lifecycle needs it."""

    answered: bool  # /health 200 (or, when /health was not asked, /metrics scraped)
    refused: bool  # nothing listening
    process_alive: bool | None  # the engine's main process; None: guardian cannot tell
    process_started: float | None  # its start time (unix seconds); a new value is a new process
    wall: float  # unix seconds of the poll, to age a process start


@dataclass(frozen=True)
class Lifecycle:
    phase: Phase | None = None  # None until the first poll
    since: float | None = None  # monotonic time the phase began
    failures: int = 0  # polls in a row without an answer
    started: float | None = None  # the process start time last seen (unix)
    starting_since: float | None = None  # monotonic time the current start began


def step(state: Lifecycle, obs: Observation, t: float, p: LifecycleParams) -> Lifecycle:
    failures = 0 if obs.answered else state.failures + 1
    starting_since = state.starting_since
    new_process = obs.process_started is not None and (
        state.started is None or obs.process_started > state.started + NEW_PROCESS_SLACK_SECONDS
    )
    if new_process and obs.process_alive is not False and not obs.answered:
        assert obs.process_started is not None
        # seen for the first time, or a new start: it is loading if it started inside the start timeout
        age = max(0.0, obs.wall - obs.process_started)
        starting_since = t - age if age < p.start_timeout_seconds else None
    started = obs.process_started if obs.process_started is not None else state.started
    phase = _phase(state, obs, t, p, failures, starting_since)
    if phase != "starting":
        starting_since = None
    since = t if phase != state.phase or state.since is None else state.since
    return updated(state, phase=phase, since=since, failures=failures, started=started, starting_since=starting_since)


def _phase(state: Lifecycle, obs: Observation, t: float, p: LifecycleParams, failures: int, starting_since: float | None) -> Phase:
    if obs.answered:
        return "up"
    if obs.process_alive is False:
        return "dead"  # the process is gone: no waiting for a count
    if starting_since is not None and t - starting_since < p.start_timeout_seconds:
        return "starting"  # loading: never called dead or hung before its start timeout
    if failures < p.dead_after_polls:
        return state.phase or "up"  # a blip, or the first polls of a run: keep what it was
    if obs.process_alive is None and obs.refused:
        return "dead"
    return "unresponsive"

