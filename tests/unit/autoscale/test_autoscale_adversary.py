"""The adversarial-step benchmark (bench/autoscaler_adversary.py): its pure parts and one short probe."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "bench" / "autoscaler_adversary.py"
    spec = importlib.util.spec_from_file_location("autoscaler_adversary", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["autoscaler_adversary"] = mod
    spec.loader.exec_module(mod)
    return mod


adv = _load()
sim = adv.sim


def test_autoscale_adversary_weakest_moment_is_the_largest_gap_earliest_on_a_tie() -> None:
    victim = [2, 2, 3, 2, 2, 2]
    other = [2, 3, 5, 4, 4, 3]
    peaks = [100.0] * 6
    # gaps 0, 1, 2, 2, 2, 1: the first gap of 2 is tick 2
    assert adv.weakest_moment(victim, other, peaks, 100.0, first=0, last=6) == 2
    assert adv.weakest_moment(victim, other, peaks, 100.0, first=3, last=6) == 3
    assert adv.weakest_moment(victim, other, peaks, 100.0, first=5, last=6) == 5
    assert adv.weakest_moment(victim, other, peaks, 100.0, first=0, last=2) == 1


def test_autoscale_adversary_weakest_moment_skips_the_victims_own_overload() -> None:
    victim, other = [2, 2], [4, 3]
    # tick 0: the traffic over the span (190/s) is over 90 % of the victim's 2 * 100/s: its own breach
    assert adv.weakest_moment(victim, other, [190.0, 100.0], 100.0, first=0, last=2) == 1
    assert adv.weakest_moment(victim, other, [190.0, 185.0], 100.0, first=0, last=2) is None
    # never under the other: no moment
    assert adv.weakest_moment([3, 3], [3, 2], [10.0, 10.0], 100.0, first=0, last=2) is None


def test_autoscale_adversary_step_arrivals_fill_up_to_the_level_inside_the_step_only() -> None:
    rates = np.full(100, 50.0)
    rates[30:40] = 500.0  # already over the level: nothing added there
    step = adv.Step(start=20.0, seconds=30.0, level=300.0, victim="kubeinfer", ready={})
    times, seconds = adv.step_arrivals(rates, step, np.random.default_rng(7))
    assert times.size > 0 and np.all(np.diff(times) >= 0)
    assert times.min() >= 20.0 and times.max() < 50.0
    assert not np.any((seconds >= 30) & (seconds < 40))
    # 20 seconds at 250/s extra: 5000 expected, Poisson spread ~71
    assert abs(times.size - 5000) < 400
    np.testing.assert_array_equal(seconds, times.astype(np.int64))


def test_autoscale_adversary_tick_rates_and_headroom() -> None:
    rates = np.array([10.0] * 15 + [20.0] * 15 + [0.0] * 15)
    assert adv.tick_rates(rates, 15.0, 4).tolist() == [10.0, 20.0, 0.0, 0.0]
    ready = {"kubeinfer": [1, 1, 2], "hpa_gpu": [2, 1, 2]}
    h = adv.headroom_figures(ready, np.array([10.0, 20.0, 0.0]), 40.0)
    # ticks with traffic: kubeinfer 1*40/10 = 4, 1*40/20 = 2; the HPA 8 and 2
    assert h["kubeinfer"]["median_headroom"] == pytest.approx(3.0)
    assert h["hpa_gpu"]["median_headroom"] == pytest.approx(5.0)
    assert h["kubeinfer"]["share_of_ticks_below_other"] == pytest.approx(1 / 3, abs=1e-3)
    assert h["hpa_gpu"]["share_of_ticks_below_other"] == 0.0


def _short_config() -> sim.SimConfig:
    return sim.SimConfig(a=0.004, c=0.0008, max_batch=16)


def test_autoscale_adversary_step_leaves_everything_before_it_unchanged() -> None:
    cfg = _short_config()
    rates = np.full(900, 1.5 * cfg.mu)
    trace = sim.Trace("flat", rates)
    tcfg = replace(cfg, horizon=float(len(rates)))
    arrivals, high, start_n = sim._seed_inputs(trace, tcfg, 1)
    step = adv.Step(start=450.0, seconds=60.0, level=4 * cfg.mu, victim="kubeinfer", ready={})
    merged, merged_high = adv._with_step(trace, step, 1, arrivals, high)
    assert merged_high is None
    assert np.all(np.diff(merged) >= 0)
    before = merged[merged < 450.0]
    np.testing.assert_array_equal(before, arrivals[arrivals < 450.0])
    assert merged.size > arrivals.size
    for name in adv.PAIR:
        _, ready_a = adv._run(tcfg, trace, name, arrivals, high, start_n)
        _, ready_b = adv._run(tcfg, trace, name, merged, merged_high, start_n)
        assert ready_a[: int(450 / tcfg.sync) + 1] == ready_b[: int(450 / tcfg.sync) + 1]


@pytest.mark.parametrize(
    ("shape", "victim"),
    [("step", "kubeinfer"), ("flat", "hpa_gpu")],
)
def test_autoscale_adversary_probe_steps_between_the_two_standing_capacities(shape: str, victim: str) -> None:
    """The built-in step trace finds kubeinfer under the HPA (the HPA overshoots the step); a flat trace
    finds the HPA under kubeinfer (kubeinfer's surge prior on a small fleet)."""
    cfg = _short_config()
    if shape == "step":
        trace = sim.builtin_trace("step", cfg.mu)
    else:
        rng = np.random.default_rng(3)
        trace = sim.Trace("flat", 1.2 * cfg.mu * np.exp(0.05 * rng.standard_normal(900)))
    out = adv.probe_trace(cfg, trace, [1], log=lambda line: None)
    rate = adv.replica_rate(cfg)
    assert set(out["headroom"]) == set(adv.PAIR)
    assert out["headroom"][victim]["share_of_ticks_below_other"] > 0
    row = out[f"against_{victim}"]
    assert row is not None
    other = next(n for n in adv.PAIR if n != victim)
    low, high_n = row["ready_replicas"][victim], row["ready_replicas"][other]
    assert low < high_n
    assert low * rate < row["level_requests_per_second"] < high_n * rate
    assert row["at_seconds"] >= adv.WARMUP_SECONDS
    # the step is the victim's breach and within the other's standing capacity
    assert row[victim]["slo_attainment"] < out["original"][victim]["slo_attainment"]
    assert row[victim]["slo_attainment"] < row[other]["slo_attainment"]
