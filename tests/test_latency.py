from __future__ import annotations

import math

import pytest

from guardian.analysis.latency import histogram_quantile
from guardian.analysis.window import CounterWindow, HistogramWindow
from guardian.sample import Histogram

INF = math.inf
BUCKETS = [(0.1, 10.0), (0.5, 60.0), (1.0, 90.0), (INF, 100.0)]


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.5, 0.1 + 0.4 * (50 - 10) / 50),  # 0.42: inside (0.1, 0.5]
        (0.05, 0.1 * 5 / 10),  # lowest bucket interpolates from 0
        (0.9, 1.0),  # exactly the top of (0.5, 1]
        (0.75, 0.5 + 0.5 * (75 - 60) / 30),
        (0.99, 1.0),  # in the +Inf bucket: the highest finite bound
    ],
)
def test_quantile_matches_promql_hand_computed(q: float, expected: float) -> None:
    assert histogram_quantile(q, BUCKETS) == pytest.approx(expected)


def test_quantile_of_the_real_page_single_observation_between_2_5_and_5() -> None:
    buckets = [(0.3, 0), (2.5, 0), (5.0, 1), (10.0, 1), (INF, 1)]
    assert histogram_quantile(0.99, buckets) == pytest.approx(2.5 + 2.5 * 0.99)


def test_no_observations_or_no_inf_bucket_is_unknown() -> None:
    assert histogram_quantile(0.99, [(0.1, 0), (INF, 0)]) is None
    assert histogram_quantile(0.99, [(0.1, 3), (0.5, 5)]) is None


def test_non_monotonic_buckets_are_flattened_like_promql() -> None:
    assert histogram_quantile(0.5, [(1.0, 10), (2.0, 8), (INF, 10)]) == pytest.approx(0.5)


def _h(counts: list[float]) -> Histogram:
    bounds = [0.1, 0.5, 1.0, INF]
    return Histogram(buckets=tuple(zip(bounds, counts)), count=counts[-1], sum=None)


def test_window_quantile_uses_only_observations_inside_the_window() -> None:
    w = HistogramWindow(horizon=100)
    w.add(0, _h([0, 0, 0, 0]))
    w.add(10, _h([0, 0, 100, 100]))  # 100 slow requests (0.5..1 s)
    w.add(20, _h([100, 100, 200, 200]))  # then 100 fast ones (< 0.1 s)
    assert w.quantiles(20, 10).p99 == pytest.approx(0.1 * 99 / 100)  # only the fast ones
    assert w.quantiles(20, 20).p99 == pytest.approx(0.5 + 0.5 * (198 - 100) / 100)  # both


def test_window_quantile_from_bucket_deltas() -> None:
    w = HistogramWindow(horizon=100)
    w.add(0, _h([50, 50, 50, 50]))  # history before the window: 50 fast requests
    w.add(10, _h([50, 60, 90, 100]))  # in the window: 10 in (0.1,0.5], 30 in (0.5,1], 10 above
    q = w.quantiles(10, 10)
    assert q.count == 50
    # deltas cumulative: [0, 10, 40, 50]; p50 rank 25 -> (0.5,1]: 0.5 + 0.5*(25-10)/30
    assert q.p50 == pytest.approx(0.75)
    assert q.p99 == pytest.approx(1.0)


def test_counter_reset_in_histogram_counts_the_new_observations() -> None:
    w = HistogramWindow(horizon=100)
    w.add(0, _h([10, 20, 30, 40]))
    w.add(10, _h([10, 20, 30, 50]))  # +10 above 1 s
    w.add(20, _h([5, 5, 5, 5]))  # engine restarted: 5 fast requests since
    q = w.quantiles(20, 20)
    assert w.resets == 1
    # window deltas: [0, 0, 0, 10] before the reset + [5, 5, 5, 5] after = [5, 5, 5, 15]
    assert q.count == 15
    assert q.p50 == 1.0  # rank 7.5 falls in +Inf: the highest finite bound
    assert q.p90 == 1.0


def test_counter_rate_survives_a_reset() -> None:
    c = CounterWindow(horizon=100)
    c.add(0, 1000)
    c.add(10, 1100)
    c.add(20, 50)  # restart: 50 since
    assert c.resets == 1
    assert c.increase(20, 30) == pytest.approx(150)
    assert c.rate(20, 30) == pytest.approx(150 / 20)


def test_counter_with_one_point_has_no_rate() -> None:
    c = CounterWindow(horizon=100)
    c.add(0, 5)
    assert c.rate(0, 10) is None
    c.add(1, None)  # unknown reading: skipped, not a zero
    assert c.rate(1, 10) is None


def test_prefill_seconds_per_token_is_vllms_prefill_time_over_the_prompt_tokens_of_the_same_requests() -> None:
    from guardian.analysis.engine_stats import EngineTracker
    from guardian.sample import CoreReading, EngineReading

    tracker = EngineTracker("e", 60.0, 3)

    def poll(t: float, prompt: float | None, prefill: float | None, computed: float = 0.0):  # type: ignore[no-untyped-def]
        core = CoreReading("0", prompt_tokens_total=computed, prefill_seconds_total=prefill, finished_prompt_tokens_total=prompt)
        return tracker.update(t, EngineReading("e", up=True, healthy=True, cores=(core,)), {})

    assert poll(0.0, 1000, 0.5).prefill_seconds_per_token is None  # one point: no window yet
    assert poll(5.0, 31_000, 1.7).prefill_seconds_per_token == pytest.approx(1.2 / 30_000)  # 40 us a token
    # polls that do not read the per-request histograms (4 of 5) leave the ratio as it was, whatever vLLM
    # computed meanwhile (vllm:prompt_tokens_total counts at scheduling, not the requests that were timed)
    assert poll(6.0, None, None, computed=90_000).prefill_seconds_per_token == pytest.approx(1.2 / 30_000)
    assert poll(10.0, 31_000, 1.7).prefill_seconds_per_token == pytest.approx(1.2 / 30_000)  # idle poll: the window's
    assert poll(100.0, 31_000, 1.7).prefill_seconds_per_token is None  # nothing prefilled in the window: not known
