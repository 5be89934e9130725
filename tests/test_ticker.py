"""The poll's and the notifier's clock: monotonic, never overlapping, skips counted."""

from __future__ import annotations

import asyncio
import time

import pytest

from guardian.ticker import Ticker


async def test_a_run_that_outlasts_its_interval_is_never_overlapped_and_the_skipped_ticks_are_counted() -> None:
    running, most, runs, skipped = 0, 0, 0, []

    async def job() -> None:
        nonlocal running, most, runs
        running += 1
        runs += 1
        most = max(most, running)
        await asyncio.sleep(0.25)  # 2.5 intervals
        running -= 1

    ticker = Ticker(0.1, job, lambda: skipped.append(1))
    ticker.start()
    await asyncio.sleep(1.0)
    await ticker.stop()
    assert most == 1 and 3 <= runs <= 5 and len(skipped) >= 4


async def test_a_wall_clock_stepped_back_an_hour_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[float] = []

    async def job() -> None:
        runs.append(time.time())

    ticker = Ticker(0.05, job, lambda: None)
    ticker.start()
    await asyncio.sleep(0.3)
    before = len(runs)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)  # NTP steps the clock back an hour
    await asyncio.sleep(0.3)
    await ticker.stop()
    assert before >= 2 and len(runs) - before >= 2  # it kept ticking (6 each way on a quiet machine)
    assert runs[-1] < runs[0]  # the jobs did see the stepped clock


def test_the_notifiers_clock_does_not_follow_a_stepped_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    from guardian import clock
    from guardian.clock import steady_time

    before = steady_time()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)  # stepped forward an hour: pages must not expire
    after = steady_time()
    assert 0 <= after - before < 1.0
    # still unix seconds, as the outbox keeps them: the wall clock when guardian started plus the time since
    # (not compared with the wall clock now: this machine's own NTP may have stepped it since)
    assert before == pytest.approx(clock._BASE + time.clock_gettime(clock._BOOTTIME), abs=0.5) and before > 1.6e9
