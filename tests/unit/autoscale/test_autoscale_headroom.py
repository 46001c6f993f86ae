"""``headroom.burst_factor``: what the burst headroom learns from arrival-rate samples, and what it
must not learn (noise-free traffic, level shifts, ramps, small rises, a single crowd, bursts beyond the
limit); the level a sudden drop left, and the drops that leave none."""

from __future__ import annotations

import pytest
from kubeinfer.operator.autoscale.headroom import (
    Burst,
    _rise,
    burst_factor,
    burst_peaks,
    floor_level,
    left_level,
    noise_floor,
)

TICK = 15.0
LEARN = {"lead": 60.0, "quantile": 0.9, "limit": 2.0, "min_rise": 1.5, "min_bursts": 2, "min_drop": 1 / 0.85}


def samples(rates: list[float]) -> list[tuple[float, float]]:
    return [(i * TICK, r) for i, r in enumerate(rates)]


def with_bursts(base: float, ratio: float, n: int, every: int = 12, width: int = 2) -> list[float]:
    """``n`` samples at ``base`` with a ``width``-sample burst of ``ratio`` every ``every`` samples."""
    return [base * ratio if i % every in range(6, 6 + width) else base for i in range(n)]


def test_nothing_known() -> None:
    assert burst_factor([], **LEARN) == Burst(1.0, None, 0)
    # one sample: a level, nothing learned
    assert burst_factor(samples([500.0]), **LEARN) == Burst(1.0, 500.0, 0)


def test_floor_level_is_the_lowest_within_the_span() -> None:
    times, rates = [0.0, 15.0, 30.0, 45.0, 60.0], [10.0, 50.0, 300.0, 200.0, 250.0]
    assert floor_level(times, rates, 4, 45.0) == 200.0  # 15 s is 45 s before 60 s: out
    assert floor_level(times, rates, 4, 60.0) == 50.0  # 0 s is a whole span before: out
    assert floor_level(times, rates, 4, 61.0) == 10.0
    assert floor_level(times, rates, 0, 60.0) == 10.0


def test_steady_traffic_learns_no_headroom() -> None:
    b = burst_factor(samples([800.0] * 120), **LEARN)
    assert b.factor == 1.0 and b.level == 800.0
    # every sample whose 2 leads (120 s = 8 ticks) are observed teaches
    assert b.rises == 120 - 8


def test_recurring_short_bursts_set_the_factor() -> None:
    b = burst_factor(samples(with_bursts(500.0, 1.8, 120)), **LEARN)
    assert b.factor == pytest.approx(1.8)
    assert b.level == 500.0  # the last sample is off-burst: the floor is the base
    # one burst per 12 samples, each seen by the 5 samples up to it; 112 samples have taught
    assert b.bursts == 10


def test_the_factor_is_the_size_of_the_bursts_not_how_often_they_come() -> None:
    # two x1.8 bursts in half an hour: only 10 of 112 samples see one, so a quantile over every
    # sample (the first design) read 1.0; the bursts' peaks say 1.8
    b = burst_factor(samples(with_bursts(500.0, 1.8, 120, every=60)), **LEARN)
    assert b.bursts == 2 and b.factor == pytest.approx(1.8)


def test_a_burst_must_recur() -> None:
    rates = with_bursts(500.0, 1.8, 120, every=200)  # one burst, at samples 6-7
    assert burst_factor(samples(rates), **LEARN) == Burst(1.0, 500.0, 112, 1)
    assert burst_factor(samples(rates), **{**LEARN, "min_bursts": 1}).factor == pytest.approx(1.8)


def test_rises_under_the_minimum_are_not_bursts() -> None:
    b = burst_factor(samples(with_bursts(500.0, 1.4, 120)), **LEARN)
    assert b.factor == 1.0 and b.bursts == 0
    assert burst_factor(samples(with_bursts(500.0, 1.4, 120)), **{**LEARN, "min_rise": 1.3}).factor == (
        pytest.approx(1.4)
    )


def test_burst_peaks_are_the_highest_rise_of_each_run() -> None:
    assert burst_peaks([1.0, 1.6, 1.8, 1.7, 1.0, None, 1.9, 1.6], 1.5) == [1.8, 1.9]
    assert burst_peaks([1.6, None, 1.7], 1.5) == [1.6, 1.7]  # an unknown rise ends a run
    assert burst_peaks([1.5, 1.2, 1.0], 1.5) == []  # over the minimum, not at it


def test_the_floor_under_a_burst_in_progress_is_the_base() -> None:
    rates = with_bursts(500.0, 1.8, 120)
    rates[-1] = 900.0  # a burst now: the floor over the last lead is still 500
    assert burst_factor(samples(rates), **LEARN).level == 500.0


def test_a_level_shift_is_not_a_burst() -> None:
    # x4 step that stays: the rise is measured against the level after it, so it teaches nothing
    b = burst_factor(samples([500.0] * 40 + [2000.0] * 80), **LEARN)
    assert b.factor == 1.0


def test_a_ramp_is_not_a_burst() -> None:
    b = burst_factor(samples([100.0 + 10.0 * i for i in range(120)]), **LEARN)
    assert b.factor == pytest.approx(1.0)


def test_one_crowd_is_not_a_recurring_burst() -> None:
    rates = [500.0] * 120
    rates[60:62] = [4000.0, 4000.0]  # x8 for 30 s, once in half an hour
    assert burst_factor(samples(rates), **LEARN).factor == 1.0
    # ... recurring or not, it is beyond the limit; with neither rule it would have been learned
    assert burst_factor(samples(rates), **{**LEARN, "limit": 10.0}).factor == 1.0
    assert burst_factor(samples(rates), **{**LEARN, "limit": 10.0, "min_bursts": 1}).factor == (
        pytest.approx(8.0)
    )


def test_bursts_beyond_the_limit_get_no_headroom() -> None:
    # x5 bursts recur: a factor of 2 would cover less than a third of them
    assert burst_factor(samples(with_bursts(500.0, 5.0, 120)), **LEARN).factor == 1.0
    assert burst_factor(samples(with_bursts(500.0, 5.0, 120)), **{**LEARN, "limit": 6.0}).factor == (
        pytest.approx(5.0)
    )


def test_a_burst_beyond_the_limit_leaves_the_others_their_headroom() -> None:
    rates = with_bursts(500.0, 1.8, 120)
    rates[66:68] = [2500.0, 2500.0]  # one of the ten is a x5 crowd: left to the reactive rules
    b = burst_factor(samples(rates), **LEARN)
    assert b.bursts == 9 and b.factor == pytest.approx(1.8)


def test_samples_teach_only_once_their_leads_are_observed() -> None:
    # a burst in the last 2 minutes has not been followed long enough to tell it from a level shift
    rates = [500.0] * 30 + [900.0, 900.0]
    b = burst_factor(samples(rates), **LEARN)
    assert b.factor == 1.0 and b.rises == 32 - 8


def noisy(base: float, n: int) -> list[float]:
    """``n`` samples around ``base`` in a fixed pseudo-random pattern, lows and highs up to x1.7
    apart: no burst, every sample as likely to be high as any other."""
    pattern = [1.0, 1.3, 0.9, 1.5, 1.1, 0.88, 1.4, 1.2, 0.95, 1.35, 0.9]
    return [base * pattern[(i * 7) % len(pattern)] for i in range(n)]


def rises_of(rates: list[float]) -> list[float | None]:
    times = [i * TICK for i in range(len(rates))]
    return [_rise(times, rates, i, 60.0) for i in range(len(rates) - 8)]


def test_noise_floor_is_the_squared_median_rise() -> None:
    assert noise_floor([]) == 1.0 and noise_floor([None, None]) == 1.0
    assert noise_floor([1.0, 1.2, None, 1.1]) == pytest.approx(1.1**2)


def test_noise_alone_learns_no_headroom() -> None:
    rates = noisy(2000.0, 120)
    # the noise rises over its floor by more than x1.5 in runs all the time ...
    assert len(burst_peaks(rises_of(rates), 1.5)) >= 5
    # ... and by about its median rise at every sample: only what stands out of that is a burst
    b = burst_factor(samples(rates), **LEARN)
    assert b.factor == 1.0 and b.bursts == 0


def test_bursts_stand_out_of_mild_noise() -> None:
    # x1.8 bursts on traffic with +-5 % noise: the noise floor (about 1.1**2) leaves them be
    rates = [r * (1.05 if i % 3 == 0 else 0.97) for i, r in enumerate(with_bursts(500.0, 1.8, 120))]
    b = burst_factor(samples(rates), **LEARN)
    assert b.bursts == 10 and b.factor == pytest.approx(1.8 * 1.05 / 0.97, rel=0.05)


# --- the left level: a level the traffic fell from within one reaction time ---------------------------


def test_a_sudden_drop_leaves_its_level() -> None:
    # 3000/s for 10 minutes, then 800/s at once (a failover): the level left is the floor before the drop
    b = burst_factor(samples([3000.0] * 40 + [800.0] * 40), **LEARN)
    assert b.left_level == 3000.0 and b.factor == 1.0
    times, rates = [i * TICK for i in range(80)], [3000.0] * 40 + [800.0] * 40
    assert left_level(times, rates, 39, 60.0, 1 / 0.85) == 3000.0  # the last sample before the drop
    assert left_level(times, rates, 30, 60.0, 1 / 0.85) is None  # 3000/s follows within the lead
    # the floor before the drop is what stood: a 30 s peak just before it is not the level
    peaked = [3000.0] * 38 + [3900.0, 3900.0] + [800.0] * 40
    assert burst_factor(samples(peaked), **LEARN).left_level == 3000.0


def test_a_gradual_decline_leaves_no_level() -> None:
    # 3000/s down to 800/s over 10 minutes: about x1.1 per reaction time, followed down by the demand
    rates = [3000.0] * 20 + [3000.0 - 55.0 * i for i in range(40)] + [800.0] * 20
    assert burst_factor(samples(rates), **LEARN).left_level is None


def test_the_end_of_a_burst_leaves_no_level() -> None:
    # x1.8 bursts of 30 s: the floor before each end is the base, which the rate returns to
    assert burst_factor(samples(with_bursts(500.0, 1.8, 120)), **LEARN).left_level is None


def test_a_small_or_noisy_drop_leaves_no_level() -> None:
    # under 1 / plan utilization (x1.18): the standing headroom planned for 2700/s covers 3000/s
    assert burst_factor(samples([3000.0] * 40 + [2700.0] * 40), **LEARN).left_level is None
    assert burst_factor(samples([3000.0] * 40 + [2400.0] * 40), **LEARN).left_level == 3000.0
    # noise of x1.5 either way around 1000/s: its noise floor (2.25) hides a drop of x2
    noisy = [1500.0 if i % 2 else 1000.0 for i in range(40)] + [500.0 if i % 2 else 750.0 for i in range(40)]
    assert burst_factor(samples(noisy), **LEARN).left_level is None
    assert burst_factor(samples([1000.0] * 40 + [500.0] * 40), **LEARN).left_level == 1000.0


def test_a_level_stood_two_reaction_times_and_the_drop_counts_at_once() -> None:
    # the first samples of the memory do not reach two reaction times back: a peak there is not a level
    head = [3000.0] * 6 + [800.0] * 40  # 75 s of 3000/s: the window from 120 s back is not covered
    assert burst_factor(samples(head), **LEARN).left_level is None
    assert burst_factor(samples([3000.0] * 8 + [800.0] * 40), **LEARN).left_level == 3000.0
    # the drop counts from the first sample after it (the fleet that served the level is kept while
    # the rest of the lead is observed), and for as long as it is in the memory
    assert burst_factor(samples([3000.0] * 40 + [800.0]), **LEARN).left_level == 3000.0
    # ... and a dip that comes back within the lead is not a level left
    assert burst_factor(samples([3000.0] * 40 + [800.0, 3000.0]), **LEARN).left_level is None


def test_a_burst_shorter_than_two_reaction_times_is_not_a_level() -> None:
    # x3 bursts of 4 to 7 samples (60-105 s, over the x2 limit the headroom leaves to the reactive
    # rules): the floor of the two reaction times before each end is the base, which the rate returns to
    for width in (4, 7):
        rates = with_bursts(500.0, 3.0, 120, every=20, width=width)
        assert burst_factor(samples(rates), **LEARN).left_level is None, width
    # a level of 9 samples (135 s) that ends at once is one
    rates = with_bursts(500.0, 3.0, 120, every=40, width=9)
    assert burst_factor(samples(rates), **LEARN).left_level == 1500.0


def test_a_gap_in_the_samples_is_not_a_level() -> None:
    # 10 minutes without samples (arrival rate unknown, a hole in the history read back), then one
    # sample at 3000/s and 1000/s again: one sample is not a level
    times = [i * TICK for i in range(40)] + [1200.0] + [1215.0 + i * TICK for i in range(20)]
    rates = [1000.0] * 40 + [3000.0] + [1000.0] * 20
    assert burst_factor(list(zip(times, rates, strict=True)), **LEARN).left_level is None
    # nor a low sample followed by a hole: the drop is not observed within the lead
    times = [i * TICK for i in range(40)] + [600.0] + [900.0 + i * TICK for i in range(20)]
    rates = [3000.0] * 40 + [800.0] + [3000.0] * 20
    assert burst_factor(list(zip(times, rates, strict=True)), **LEARN).left_level is None
    # samples a minute apart (an autoscale interval as long as the lead): never dense enough
    minute = [(i * 60.0, 3000.0 if i < 20 else 800.0) for i in range(40)]
    assert burst_factor(minute, **LEARN).left_level is None


def test_min_drop_must_be_over_one() -> None:
    # a ratio of 1 would read every fall, a gradual one included, as a level left
    with pytest.raises(ValueError, match="min_drop must be > 1"):
        burst_factor(samples([3000.0] * 40), **{**LEARN, "min_drop": 1.0})
