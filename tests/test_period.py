"""Troughs with hysteresis: a background's time off its floor, however high its floor has risen."""

from __future__ import annotations

from guardian.analysis.period import Excursions


def _excursions(values: list[float], m: float) -> list[float]:
    ex = Excursions()
    return [e for t, v in enumerate(values) if (e := ex.update(float(t), v, m)) is not None]


def test_a_triangle_sawtooth_on_a_staircase_gives_its_period() -> None:
    period = 600
    values = [abs((t % period) / period * 2 - 1) * 10 + (t // 900) * 4 for t in range(6000)]  # a step every 1.5 periods
    found = _excursions(values, 1.0)
    assert len(found) >= 7 and all(abs(e - period) <= 0.1 * period for e in found)


def test_steps_and_noise_inside_the_hysteresis_make_no_excursion() -> None:
    values = [(t // 500) * 5 + (0.4 if t % 2 else -0.4) for t in range(5000)]
    assert _excursions(values, 1.0) == []


def test_a_spike_is_as_long_as_it_lasts() -> None:
    values = [10.0 if 1000 <= t % 3000 < 1120 else 0.0 for t in range(12000)]
    assert _excursions(values, 1.0) == [120.0, 120.0]  # a trough is known once the next rise leaves it
