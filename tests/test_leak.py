from __future__ import annotations

import math
import random

import pytest

from guardian.analysis.leak import LeakDetector, LeakParams
from guardian.sim import traces

GiB = 2**30


def _run(values, budget=traces.UTILIZATION * traces.TOTAL, capacity=traces.TOTAL, params=None):  # type: ignore[no-untyped-def]
    det = LeakDetector(budget, capacity, params)
    reports = [det.update(float(t), v) for t, v in enumerate(values)]
    return det, reports


def test_flat_noisy_memory_has_no_steps_and_no_leak() -> None:
    trace = traces.flat(6 * 3600, seed=1)
    _, reports = _run(trace.values)
    assert reports[-1].steps == () and not any(r.leak for r in reports)


def test_staircase_steps_are_found_at_their_times_and_make_a_leak() -> None:
    trace = traces.staircase(6 * 3600, seed=3, step_ratio=0.01)
    _, reports = _run(trace.values)
    found = reports[-1].held_steps
    assert len(found) == len(trace.steps) == 6
    assert all(s.given_back_at is not None for s in reports[-1].steps if s not in found)  # the spikes
    for (t, size), step in zip(trace.steps, found):
        assert abs(step.t - t) <= 10  # the change point, not when it was noticed
        assert step.found_at - t <= 40
        assert step.size == pytest.approx(size, rel=0.2)
    first_leak = next(i for i, r in enumerate(reports) if r.leak)
    # the third held step makes it a leak, once it has outlived the regret window
    assert first_leak == found[2].found_at + LeakParams().regret_seconds
    final = reports[-1]
    assert final.overhang == pytest.approx(sum(s for _, s in trace.steps), rel=0.1)


def test_time_to_exhaustion_follows_the_step_rate() -> None:
    budget = 100 * GiB
    values = [50 * GiB] * 400 + [51 * GiB] * 600 + [52 * GiB] * 600 + [53 * GiB] * 300
    _, reports = _run(values, budget=budget, capacity=60 * GiB, params=LeakParams(warmup_seconds=60, regret_seconds=60))
    final = reports[-1]
    assert len(final.held_steps) == 3 and final.leak
    span = len(values) - 1 - final.held_steps[0].t
    assert final.slope == pytest.approx(3 * GiB / span, rel=0.05)
    assert final.time_to_exhaustion == pytest.approx((60 - 53) * GiB / final.slope, rel=0.05)


def test_spike_given_back_is_not_a_leak() -> None:
    budget = 100 * GiB
    values = [50 * GiB] * 600 + [55 * GiB] * 10 + [50 * GiB] * 600
    _, reports = _run(values, budget=budget, params=LeakParams(warmup_seconds=60))
    assert reports[-1].held_steps == () and not any(r.leak for r in reports)


def test_long_spike_is_a_step_that_is_given_back() -> None:
    budget = 100 * GiB
    values = [50 * GiB] * 600 + [55 * GiB] * 90 + [50 * GiB] * 600
    _, reports = _run(values, budget=budget, params=LeakParams(warmup_seconds=60))
    (step,) = reports[-1].steps
    assert step.given_back_at is not None and reports[-1].held_steps == ()
    assert reports[-1].overhang < 0.1 * GiB


def test_allocation_sawtooth_is_not_a_leak() -> None:
    budget = 100 * GiB
    values = [50 * GiB + (t % period) / period * 3 * GiB for period in (10, 25) for t in range(3600)]
    _, reports = _run(values, budget=budget, params=LeakParams(warmup_seconds=60))
    assert reports[-1].held_steps == () and not any(r.leak for r in reports)


def test_warm_up_and_restart_do_not_count() -> None:
    ramp = [2 * GiB + i * (70 * GiB) / 150 for i in range(150)]
    values = ramp + [72 * GiB] * 900 + [0.0] * 20 + ramp + [72.5 * GiB] * 900
    _, reports = _run(values)
    assert reports[-1].steps == ()
    assert reports[len(ramp) + 900 + 30].warming_up  # the restart started a new warm-up


def test_memory_freed_gives_steps_back() -> None:
    budget = 100 * GiB
    values = [50 * GiB] * 400 + [52 * GiB] * 600 + [50 * GiB] * 300
    _, reports = _run(values, budget=budget, params=LeakParams(warmup_seconds=60, regret_seconds=60))
    (step,) = reports[-1].steps
    assert step.given_back_at is not None


def test_unknown_readings_are_skipped() -> None:
    det = LeakDetector(100 * GiB)
    det.update(0.0, 50 * GiB)
    report = det.update(1.0, None)
    assert report.steps == () and report.level == 50 * GiB
    assert det.update(2.0, math.nan).level == 50 * GiB


def test_same_input_same_answer() -> None:
    trace = traces.healthy_day(20000, seed=9)
    a = _run(trace.values)[1][-1]
    b = _run(trace.values)[1][-1]
    assert a == b


def test_noisier_series_raise_the_step_threshold() -> None:
    rng = random.Random(4)
    budget = 100 * GiB
    noisy = [50 * GiB + rng.gauss(0, 0.5 * GiB) for _ in range(4000)]
    _, reports = _run(noisy, budget=budget, params=LeakParams(warmup_seconds=60))
    assert reports[-1].held_steps == ()


def test_a_restart_gives_the_old_processes_steps_back() -> None:
    budget = 100 * GiB
    params = LeakParams(warmup_seconds=60, regret_seconds=30, leak_steps=2)
    det = LeakDetector(budget, params=params)
    values = [50 * GiB] * 300 + [51 * GiB] * 300 + [52 * GiB] * 300
    reports = [det.update(float(t), v) for t, v in enumerate(values)]
    assert reports[-1].leak and len(reports[-1].held_steps) == 2
    det.restart(900.0)
    after = det.update(901.0, 50 * GiB)
    assert not after.leak and after.held_steps == ()
    assert len(after.given_back) == 2 and after.warming_up
