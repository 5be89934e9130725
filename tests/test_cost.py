"""The cost model: memory per token, tokens per joule, and the marginal check of a larger batch."""

from __future__ import annotations

from guardian.analysis.cost import CostWindow, MarginalWatch, judge

GiB = 2**30


def test_memory_per_token_and_tokens_per_joule_over_the_window() -> None:
    w = CostWindow(300)
    # 40 GB held, 1000 tokens/s, 400 W: 40 GB·s per 1000 tokens, 2.5 tokens per joule
    cost = None
    for i in range(11):
        cost = w.update(float(i), 40e9, 1000.0 * i, 400.0 * i)
    assert cost is not None
    assert abs(cost.memory_gb_seconds_per_1k_tokens - 40.0) < 1e-9  # type: ignore[operator]
    assert abs(cost.tokens_per_joule - 2.5) < 1e-9  # type: ignore[operator]


def test_an_idle_engine_is_expensive_and_a_restart_does_not_count_as_negative_tokens() -> None:
    w = CostWindow(300)
    for i in range(5):
        cost = w.update(float(i), 40e9, 0.0, None)
    assert cost.memory_gb_seconds_per_1k_tokens is None and cost.tokens_per_joule is None  # nothing generated
    w.update(5.0, 40e9, 500.0, None)
    after_reset = w.update(6.0, 40e9, 10.0, None)  # the counter started again at a new process
    assert after_reset.memory_gb_seconds_per_1k_tokens == 5 * 40 / 500 * 1000  # five polls held, 500 tokens; the reset poll skipped


def test_old_polls_leave_the_window() -> None:
    w = CostWindow(10)
    for i in range(5):
        w.update(float(i), 80e9, 100.0 * i, None)  # expensive start
    for i in range(5, 30):
        cost = w.update(float(i), 40e9, 400 + 1000.0 * (i - 4), None)
    assert abs(cost.memory_gb_seconds_per_1k_tokens - 40.0) < 1e-9  # type: ignore[operator]


def test_a_larger_batch_that_gained_throughput_for_less_memory_passes() -> None:
    m = judge(0, 8, (0.40, 1000.0, 0.10), 12, (0.48, 1400.0, 0.13))
    assert m.ok and m.memory_growth_ratio == 0.2 and m.throughput_gain_ratio == 0.4  # 20% <= 70% of 40%
    assert not judge(0, 8, (0.40, 1000.0, 0.10), 12, (0.52, 1400.0, 0.13)).ok  # 30% > 28%


def test_a_larger_batch_that_bought_little_throughput_with_much_memory_or_latency_fails() -> None:
    assert not judge(0, 8, (0.40, 1000.0, 0.10), 12, (0.60, 1100.0, 0.11)).ok  # +50% memory for +10% tokens
    assert not judge(0, 8, (0.40, 1000.0, 0.10), 12, (0.44, 1500.0, 0.25)).ok  # P99 2.5x


def test_the_watch_judges_each_larger_batch_once_after_it_settled() -> None:
    w = MarginalWatch(settle_seconds=30, min_polls=5)
    made = []
    for t in range(0, 60):
        made.append(w.update(float(t), 8, 0.4, 1000.0, 0.1))
    for t in range(60, 120):
        made.append(w.update(float(t), 12, 0.5, 1500.0, 0.12))
    for t in range(120, 180):
        made.append(w.update(float(t), 9, 0.45, 1200.0, 0.1))  # smaller: not judged
    judged = [m for m in made if m is not None]
    assert len(judged) == 1 and judged[0].t == 90.0 and judged[0].ok
    assert (judged[0].batch_before, judged[0].batch_after) == (8, 12) and w.last is judged[0]
