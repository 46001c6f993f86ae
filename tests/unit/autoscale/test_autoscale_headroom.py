"""``headroom.burst_factor``: what the burst headroom learns from arrival-rate samples, and what it
must not learn (noise-free traffic, level shifts, ramps, a single crowd, bursts beyond the limit)."""

from __future__ import annotations

import pytest
from kubeinfer.operator.autoscale.headroom import Burst, burst_factor, floor_level

TICK = 15.0
LEARN = {"lead": 60.0, "quantile": 0.9, "limit": 2.0}


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


def test_one_crowd_among_many_samples_moves_a_high_quantile_little() -> None:
    rates = [500.0] * 120
    rates[60:62] = [4000.0, 4000.0]  # x8 for 30 s, once in half an hour
    assert burst_factor(samples(rates), **LEARN).factor == 1.0
    # ... the maximum would have learned it (and been clamped out as beyond the limit)
    assert burst_factor(samples(rates), lead=60.0, quantile=1.0, limit=10.0).factor == pytest.approx(8.0)


def test_bursts_beyond_the_limit_get_no_headroom() -> None:
    # x5 bursts recur: a factor of 2 would cover less than a third of them
    assert burst_factor(samples(with_bursts(500.0, 5.0, 120)), **LEARN).factor == 1.0
    assert burst_factor(samples(with_bursts(500.0, 5.0, 120)), lead=60.0, quantile=0.9, limit=6.0).factor == (
        pytest.approx(5.0)
    )


def test_samples_teach_only_once_their_leads_are_observed() -> None:
    # a burst in the last 2 minutes has not been followed long enough to tell it from a level shift
    rates = [500.0] * 30 + [900.0, 900.0]
    b = burst_factor(samples(rates), **LEARN)
    assert b.factor == 1.0 and b.rises == 32 - 8
