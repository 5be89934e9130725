from __future__ import annotations

from guardian.analysis.step_shape import change_point, jumps, unmatched_rises


def test_a_step_confirmed_on_a_reading_that_dips_under_its_level_is_dated_where_its_level_began() -> None:
    # readings every minute: ten on the old level, eight a step higher from 600 s, and the newest (1080 s) dipping
    # under the new level by noise the floor hid: the step began at 600 s, not at the dip
    old = [0.0, 0.02, -0.01, 0.01, -0.02, 0.0, 0.01, -0.01, 0.02, 0.0]
    new = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99]
    raw = [(60.0 * i, v) for i, v in enumerate(old + new + [0.6])]
    when, _ = change_point(raw, new_floor=0.98, size=1.0, window=600.0, sigma=0.02)
    assert when == 600.0


def test_an_aliased_tooths_trough_after_a_step_is_no_noise_dip_and_leaves_the_step_dated_after_it() -> None:
    # readings every minute of a fast tooth read as a five-reading ramp of 1.5 (noise 0.08), and a 0.57 step at the
    # 19th: its first reading, the tooth's trough, sits 0.41 under the new floor, between the old tooth's top and the
    # new ramp. A dip that deep is no noise on the new level (five sigmas): the step is not dated on the ramp before it
    tooth = [1.79, 2.15, 2.54, 2.95, 1.51, 1.80, 2.17, 2.48, 2.92, 1.53]
    tooth += [1.97, 2.30, 2.64, 2.99, 1.45, 1.84, 2.24, 2.53, 3.03]
    step = [1.99, 2.40, 2.66, 3.08, 3.33, 3.60]
    raw = [(60.08 * i, v) for i, v in enumerate(tooth + step)]
    when, _ = change_point(raw, new_floor=2.40, size=0.57, window=240.3, sigma=0.08)
    assert when >= raw[len(tooth)][0]


def test_two_small_steps_the_floor_took_in_at_once_are_dated_at_the_first_not_at_a_noisy_proof_between_them() -> None:
    # readings every minute in noise of 0.1: ten on the old level, eleven 0.3 higher from 600 s (a step no larger than
    # the old readings' top, so only a pair lifted by noise rises above it: at 1080 s), then six 0.6 higher from 1260 s.
    # The floor took in both steps at once; the 1080 s "proof" is neither step's date
    old = [0.0, 0.08, -0.06, 0.05, -0.1, 0.02, 0.1, -0.04, 0.03, -0.02]
    first = [0.22, 0.3, 0.25, 0.35, 0.2, 0.26, 0.33, 0.24, 0.31, 0.34, 0.27]
    second = [0.6, 0.55, 0.68, 0.62, 0.57, 0.64]
    raw = [(60.0 * i, v) for i, v in enumerate(old + first + second)]
    when, _ = change_point(raw, new_floor=0.3, size=0.35, window=600.0, sigma=0.1)
    assert when == 600.0


def test_a_step_at_the_end_of_a_spike_is_dated_at_its_proof_not_where_the_spike_began() -> None:
    # readings every minute: ten on the old level, six of a spike 1.4 higher, then 0.86 higher (the step came as the
    # spike fell) and later a second step to 1.86: the spike's readings are no level of the first step's
    old = [0.0, 0.08, -0.06, 0.05, -0.1, 0.02, 0.1, -0.04, 0.03, -0.02]
    spike = [1.4, 1.42, 1.38, 1.41, 1.39, 1.4]
    new = [0.86, 0.84, 0.88, 0.85, 0.87, 0.86, 0.85, 0.87]
    later = [1.86, 1.85, 1.87, 1.84, 1.86, 1.88, 1.85, 1.86, 1.87, 1.85]
    raw = [(60.0 * i, v) for i, v in enumerate(old + spike + new + later)]
    when, _ = change_point(raw, new_floor=0.8, size=0.86, window=600.0, sigma=0.1)
    assert when == 60.0 * (len(old) + len(spike))


def test_a_step_inside_a_spike_longer_than_the_new_level_run_after_it_is_dated_at_the_spikes_fall() -> None:
    # readings every 5 s in noise of 0.05: the old level with a 1.3 spike among them (its top is no proof, as dense
    # spikes make it), a 2.4 spike for fourteen readings with a 0.58 step inside it (the spike's readings rise by it
    # too), then ten on the new level. The spike's readings outnumber the new level's, so their middle was the spike's
    # and the step was dated where the spike began, before it happened; the readings date it no closer than its fall
    old = [0.0, 0.08, -0.06, 0.05, -0.1, 0.02, 0.1, -0.04, 0.03, -0.02, 0.01, -0.05]
    old += [1.3, 1.34, 1.27, 1.31, 1.29, 1.33, 0.02, -0.03, 0.06, 0.0]
    spike = [2.4, 2.46, 2.35, 2.42, 2.38, 2.44, 2.37, 2.98, 3.02, 2.95, 3.04, 2.97, 3.01, 2.99]
    new = [0.6, 0.55, 0.62, 0.57, 0.59, 0.61, 0.56, 0.58, 0.6, 0.57]
    raw = [(5.0 * i, v) for i, v in enumerate(old + spike + new)]
    when, _ = change_point(raw, new_floor=0.56, size=0.58, window=120.0, sigma=0.05)
    assert when == 5.0 * (len(old) + len(spike))


def test_a_spike_on_the_new_level_does_not_prove_a_step_dated_after_the_spike_it_came_inside() -> None:
    # readings every minute in noise of 0.06: the old level, a 5.1 spike with a 2.0 step inside it (7.1 once it came),
    # eight readings on the new level, a second spike (9.3) and the new level again. The run on the new level begins
    # at the first spike's fall; its old readings are those before the spike, not the spike's (whose top let the
    # second spike's first reading prove the step, ten minutes late)
    old = [0.0, 0.05, -0.04, 0.03, -0.06, 0.02, 0.06, -0.03, 0.02, -0.01, 0.01, -0.03]
    spike = [5.1, 5.12, 7.08, 7.1, 7.13, 7.09, 7.11]
    new = [2.0, 2.03, 1.98, 2.02, 1.99, 2.01, 1.97, 2.02]
    second = [9.3, 9.28, 9.33, 9.31, 9.29]
    raw = [(60.0 * i, v) for i, v in enumerate(old + spike + new + second + [2.01, 1.99, 2.0])]
    when, _ = change_point(raw, new_floor=1.95, size=2.0, window=720.0, sigma=0.06)
    assert when == 60.0 * (len(old) + len(spike))


def test_readings_noise_lifted_just_before_a_step_are_no_level_of_their_own_and_leave_the_date_at_its_proof() -> None:
    # readings every minute in noise: ten on the old level, three lifted by noise, the step (0.33, then a dip to 0.13),
    # and the new level: the first pair above the old top (at 900 s) dates it, not the lifted readings before it
    old = [0.0, 0.08, -0.06, 0.05, -0.1, 0.02, 0.1, -0.04, 0.03, -0.02]
    lifted = [0.18, 0.2, 0.17]
    new = [0.33, 0.13, 0.3, 0.25, 0.28, 0.36, 0.24]
    raw = [(60.0 * i, v) for i, v in enumerate(old + lifted + new)]
    when, _ = change_point(raw, new_floor=0.24, size=0.27, window=600.0, sigma=0.06)
    assert when == 900.0


def test_a_reading_over_a_top_that_spikes_set_does_not_prove_a_step_where_no_period_was_read() -> None:
    # readings every minute in noise of 0.1: ten on the old level, three of them a spike's at 4.0, so the old top is
    # the spike's (far over the readings' middle, and far fewer readings over it than under). The next spike's one
    # reading (4.3, at 660 s) sits just over it, two readings before the step (0.3 at 840 s): it proves nothing, and
    # the step is dated where its readings begin
    old = [0.0, 0.05, -0.05, 4.0, 4.02, 3.98, 0.02, -0.03, 0.04, 0.0]
    before = [-0.05, 4.3, 0.15, 0.12]
    new = [0.3, 0.32, 0.28, 0.31, 0.29, 0.33]
    raw = [(60.0 * i, v) for i, v in enumerate(old + before + new)]
    when, _ = change_point(raw, new_floor=0.25, size=0.3, window=600.0, sigma=0.1)
    assert when == 60.0 * (len(old) + len(before))


def test_a_spike_read_twice_that_falls_partly_leaves_a_step_dated_at_its_fall() -> None:
    # readings every minute: a 5.6 spike read on two readings, then 2.1 up and staying there: the step came inside the
    # spike, which the readings cannot date closer than its fall (erring late)
    values = [0.0, 0.01, -0.01, 0.0, 5.6, 5.62, 2.1, 2.12, 2.09, 2.11, 2.1, 2.08]
    raw = [(60.0 * i, v) for i, v in enumerate(values)]
    found = jumps(raw, level=0.0, size=2.1, tau=0.3).found
    assert [when for when, _ in found] == [360.0]


def test_a_step_just_after_the_wrap_of_a_tooth_no_period_was_read_for_is_dated_at_its_own_jump_not_at_the_wrap() -> None:
    # an 81 s tooth read every minute, before its period is known: readings fall by 0.5 three times and wrap up by 1.5
    # (drifting a little). A step of 1.7 comes a reading after a wrap; that wrap, held up by the step, is the fourth of
    # its kind from the same trough, so the step's own jump (a reading later, at 1560 s) dates it
    tooth = [0.45, -0.05, -0.55, -1.05]
    values = [v - 0.01 * i for i in range(6) for v in tooth] + [0.39, -0.11]
    values += [v + 1.64 for v in tooth[2:]] + [v + 1.63 for _ in range(3) for v in tooth]
    raw = [(60.0 * i, v) for i, v in enumerate(values)]
    found = jumps(raw, level=-1.1, size=1.7, tau=0.225).found
    assert [when for when, _ in found] == [1560.0]


def test_a_staircase_of_equal_steps_keeps_every_jump_each_rising_from_a_step_higher() -> None:
    # three steps of 1.0, ten minutes apart: rises alike in size, but none from where another rose from (no wrap)
    noise = [0.01, -0.02, 0.0, 0.02, -0.01, 0.01, 0.0, -0.01, 0.02, 0.0]
    raw = [(60.0 * i, v) for i, v in enumerate(n + level for level in (0.0, 1.0, 2.0, 3.0) for n in noise)]
    found = jumps(raw, level=0.0, size=3.0, tau=0.225).found
    assert [when for when, _ in found] == [600.0, 1200.0, 1800.0]


def test_a_fall_that_gives_a_rise_back_to_the_noise_ends_a_spike_where_falls_of_about_its_size_repeat() -> None:
    # spikes of 5.5-7.5 came and went; then a 6.6 spike, a 4.6 step while it is up, and the spike's fall of 6.6. Falls
    # of about its size repeat, as a tooth's do, but none to the noise, and the fall gives the spike's rise back to it
    moves = [(1.0, 5.6), (2.0, -5.6), (3.0, 7.4), (4.0, -7.4), (5.0, 6.1), (6.0, -6.1), (7.0, 6.6), (8.0, 4.6), (9.0, -6.6)]
    assert unmatched_rises(moves, exact=0.05) == [(8.0, 4.6)]
    # a tooth's falls are its height, to the noise: a step's rise of about that size is not given back by one
    teeth = [(1.0, -6.6), (2.0, -6.6), (3.0, -6.62), (4.0, 6.6), (5.0, -6.6)]
    assert unmatched_rises(teeth, exact=0.05) == [(4.0, 6.6)]
    # a slow tooth's wraps vary by more than the noise, but outnumber the rises of their size (a tooth rises slowly):
    # one that matches the step's rise to the noise is still the tooth's
    wraps = [(1.0, -2.16), (2.0, 1.96), (3.0, -2.04), (4.0, -2.15), (5.0, -1.92)]
    assert unmatched_rises(wraps, exact=0.1) == [(2.0, 1.96)]


def test_a_spikes_fall_gives_back_its_own_rise_where_spikes_of_its_size_came_and_went_before() -> None:
    # spikes of 3.5-6 rose and fell three times; then a 5.0 spike, a 4.6 step while it is up, and the spike's fall of
    # 5.0. Falls that alike repeat were taken for a tooth's wraps, which give back nothing, so the spike's rise was left
    # as a step, dated before the step. Spikes rose as often as they fell: the fall is the spike's end
    moves = [(1.0, 5.9), (2.0, -6.0), (3.0, 3.5), (4.0, -3.5), (5.0, 5.0), (6.0, -5.1), (7.0, 5.0), (8.0, 4.6), (9.0, -5.0)]
    assert unmatched_rises(moves, within=0.2) == [(8.0, 4.6)]


def test_a_tooths_wrap_gives_back_no_rise_of_its_size_where_wraps_repeat_without_rises() -> None:
    # a slow sawtooth rises by its flank (no jump) and wraps down 1.4-1.6 each period; a 1.6 step came between two
    # wraps. Wraps outnumber the rises of their size: the next wrap is the tooth's, and the step stays
    moves = [(1.0, -1.5), (2.0, -1.4), (3.0, -1.6), (4.0, 1.6), (5.0, -1.6)]
    assert unmatched_rises(moves, within=0.2) == [(4.0, 1.6)]


def _spike_and_step(first: float, second: float, fall: float, step_first: bool) -> list[tuple[float, float]]:
    """Readings every 15 s in noise of 0.05: twenty on the old level (0), rises of ``first`` and ``second``, the second
    read first as ``second`` over the readings before it, and a fall of ``fall`` read the same way; the levels between
    are those of a step with a spike on it (``step_first``) or of a spike with a step inside it. The two readings
    either side of each jump are the noisiest of them: they pair the fall the other way round from the levels."""
    noise = [0.03, -0.05, 0.04, -0.02, 0.05, -0.04, 0.01, -0.03, 0.02, 0.0]
    step, spike = (first, second) if step_first else (second, first)
    levels = [0.0] * 20 + [first] * 20 + [first + second] * 6 + [step] * 20
    values = [level + noise[i % 10] for i, level in enumerate(levels)]
    values[20], values[40] = values[19] + first, values[39] + second  # the jumps as two readings read them
    values[46] = values[45] - fall
    return [(15.0 * i, v) for i, v in enumerate(values)]


def test_a_spikes_fall_gives_back_the_rise_whose_level_it_ends_not_the_one_two_readings_match_best() -> None:
    # a 2.08 spike, a 2.0 step inside it 53 s before the spike's fall: read a reading apart the step's rise (2.01) is
    # nearer the fall (1.97) than the spike's (2.17), but the levels say the spike rose and fell by 2.08: the step
    # is the second rise (a held-out log's step, 700052, was dated at the spike's start, five minutes early)
    raw = _spike_and_step(2.08, 2.0, 1.97, step_first=False)
    raw[20] = (raw[20][0], raw[19][1] + 2.17)
    raw[40] = (raw[40][0], raw[39][1] + 2.01)
    found = jumps(raw, level=0.0, size=2.0, tau=0.35).found
    assert [when for when, _ in found] == [600.0]
    # and the mirror: a 2.44 step, a 2.36 spike on it whose fall reads 2.42 a reading apart: the step is the first
    mirror = _spike_and_step(2.44, 2.36, 2.42, step_first=True)
    assert [when for when, _ in jumps(mirror, level=0.0, size=2.44, tau=0.35).found] == [300.0]
