from __future__ import annotations

from guardian.analysis.step_shape import change_point


def test_a_step_confirmed_on_a_reading_that_dips_under_its_level_is_dated_where_its_level_began() -> None:
    # readings every minute: ten on the old level, eight a step higher from 600 s, and the newest (1080 s) dipping
    # under the new level by noise the floor hid: the step began at 600 s, not at the dip
    old = [0.0, 0.02, -0.01, 0.01, -0.02, 0.0, 0.01, -0.01, 0.02, 0.0]
    new = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99]
    raw = [(60.0 * i, v) for i, v in enumerate(old + new + [0.6])]
    when, _ = change_point(raw, new_floor=0.98, size=1.0, window=600.0, sigma=0.02)
    assert when == 600.0
