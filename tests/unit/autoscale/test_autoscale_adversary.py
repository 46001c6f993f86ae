"""The adversarial-step benchmark (bench/autoscaler_adversary.py): its pure parts and one short probe."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.support.bench import load_bench

adv = load_bench("autoscaler_adversary")
sim = adv.sim


def _standing(*pairs: tuple[int, int]) -> list:
    return [adv.Standing(ready, provisioned) for ready, provisioned in pairs]


def test_autoscale_adversary_weakest_moment_is_the_widest_gap_earliest_on_a_tie() -> None:
    # one replica sustains 80/s and serves 100/s at most: the gap is other.ready*80 - victim.provisioned*100
    victim = _standing((2, 2), (2, 2), (2, 2), (2, 2), (2, 2), (2, 2))
    other = _standing((2, 2), (3, 3), (4, 4), (4, 4), (3, 4), (3, 3))
    peaks = [100.0] * 6
    kw = {"sustained": 80.0, "top": 100.0}
    # gaps -40, 40, 120, 120, 40, 40: the first 120 is tick 2, the step halfway from 200/s to 320/s
    assert adv.weakest_moment(victim, other, peaks, first=0, last=6, **kw) == (2, 260.0)
    assert adv.weakest_moment(victim, other, peaks, first=3, last=6, **kw) == (3, 260.0)
    assert adv.weakest_moment(victim, other, peaks, first=4, last=6, **kw) == (4, 220.0)
    assert adv.weakest_moment(victim, other, peaks, first=0, last=2, **kw) == (1, 220.0)


def test_autoscale_adversary_weakest_moment_counts_the_victims_starting_replicas_and_own_overload() -> None:
    kw = {"sustained": 80.0, "top": 100.0, "first": 0, "last": 2}
    # the victim has 2 ready and 3 starting: its ceiling counts all 5 (500/s), over the other's 6*80
    assert adv.weakest_moment(_standing((2, 5), (2, 2)), _standing((6, 6), (6, 6)), [10.0, 10.0], **kw) == (
        1,
        (200.0 + 480.0) / 2,
    )
    # the other's starting replicas do not count: its 2 ready sustain 160/s, under the victim's 200/s
    assert (
        adv.weakest_moment(_standing((2, 2), (2, 2)), _standing((2, 6), (2, 6)), [10.0, 10.0], **kw) is None
    )
    # tick 0: the traffic over the span (170/s) is over what the victim's 2 ready sustain (160/s)
    victim, other = _standing((2, 2), (2, 2)), _standing((4, 4), (4, 4))
    assert adv.weakest_moment(victim, other, [170.0, 100.0], **kw) == (1, 260.0)
    assert adv.weakest_moment(victim, other, [170.0, 165.0], **kw) is None


def test_autoscale_adversary_step_arrivals_fill_up_to_the_level_inside_the_step_only() -> None:
    rates = np.full(100, 50.0)
    rates[30:40] = 500.0  # already over the level: nothing added there
    step = adv.Step(start=20.0, seconds=30.0, level=300.0, victim="kubeinfer")
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
    # no traffic at all: no ratio (None, not NaN: the JSON stays strict)
    idle = adv.headroom_figures(ready, np.zeros(3), 40.0)
    assert idle["kubeinfer"]["median_headroom"] is None and idle["kubeinfer"]["p10_headroom"] is None


def test_autoscale_adversary_ceiling_is_full_batches_back_to_back() -> None:
    cfg = _short_config()
    # target P99 = 4*s(16) rounded up: the full batch meets it, so the ceiling is B / s(B)
    assert adv.ceiling(cfg) == pytest.approx(cfg.max_batch / cfg.s(cfg.max_batch))
    assert cfg.mu == pytest.approx(0.8 * adv.ceiling(cfg))


def _short_config() -> sim.SimConfig:
    return sim.SimConfig(a=0.004, c=0.0008, max_batch=16)


def test_autoscale_adversary_step_leaves_everything_before_it_unchanged() -> None:
    cfg = _short_config()
    rates = np.full(900, 1.5 * cfg.mu)
    trace = sim.Trace("flat", rates)
    tcfg = replace(cfg, horizon=float(len(rates)))
    arrivals, high, start_n = sim._seed_inputs(trace, tcfg, 1)
    step = adv.Step(start=450.0, seconds=60.0, level=4 * cfg.mu, victim="kubeinfer")
    merged, merged_high = adv._with_step(trace, step, 1, arrivals, high)
    assert merged_high is None
    assert np.all(np.diff(merged) >= 0)
    before = merged[merged < 450.0]
    np.testing.assert_array_equal(before, arrivals[arrivals < 450.0])
    # the extra arrivals are a stream of their own: the original ones are all still there
    assert np.isin(arrivals, merged).all() and merged.size > arrivals.size
    for name in adv.PAIR:
        _, standing_a = adv._run(tcfg, trace, name, arrivals, high, start_n)
        _, standing_b = adv._run(tcfg, trace, name, merged, merged_high, start_n)
        assert standing_a[: int(450 / tcfg.sync) + 1] == standing_b[: int(450 / tcfg.sync) + 1]


def test_autoscale_adversary_step_keeps_each_arrivals_priority() -> None:
    cfg = _short_config()
    n = 600
    share = np.where(np.arange(n) < 300, 0.9, 0.1)
    trace = sim.Trace("mix", np.full(n, cfg.mu), high_priority_share=share)
    tcfg = replace(cfg, horizon=float(n))
    arrivals, high, _ = sim._seed_inputs(trace, tcfg, 2)
    assert high is not None
    step = adv.Step(start=270.0, seconds=60.0, level=3 * cfg.mu, victim="kubeinfer")
    merged, merged_high = adv._with_step(trace, step, 2, arrivals, high)
    assert merged_high is not None and merged_high.shape == merged.shape
    # each original arrival keeps its level: find it in the merged sequence
    at = np.searchsorted(merged, arrivals)
    np.testing.assert_array_equal(merged[at], arrivals)
    np.testing.assert_array_equal(merged_high[at], high)
    # the extra ones draw theirs from their second's share: 0.9 before 300 s, 0.1 after
    extra = np.ones(merged.size, dtype=bool)
    extra[at] = False
    early, late = extra & (merged < 300), extra & (merged >= 300)
    assert 0.85 < merged_high[early].mean() < 0.95 and 0.05 < merged_high[late].mean() < 0.15


def test_autoscale_adversary_standing_is_after_each_ticks_decision() -> None:
    cfg = _short_config()
    trace = sim.builtin_trace("step", cfg.mu)
    tcfg = replace(cfg, horizon=float(len(trace.rates)))
    arrivals, high, start_n = sim._seed_inputs(trace, tcfg, 1)
    for name in adv.PAIR:
        res, standing = adv._run(tcfg, trace, name, arrivals, high, start_n)
        assert len(standing) == int(tcfg.horizon / tcfg.sync) == len(res.replicas)
        assert [s.provisioned for s in standing] == res.replicas
        assert all(s.ready <= s.provisioned for s in standing)
        # a scale-up's replicas are not ready at its own tick
        ups = [k for k in range(1, len(standing)) if res.replicas[k] > res.replicas[k - 1]]
        assert ups and all(standing[k].ready <= res.replicas[k - 1] for k in ups)


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
    out = adv.probe_trace(cfg, trace, [1, 2], log=lambda line: None)
    assert set(out["headroom"]) == set(adv.PAIR)
    assert out["headroom"][victim]["share_of_ticks_below_other"] > 0
    row = out[f"against_{victim}"]
    assert row is not None
    other = next(n for n in adv.PAIR if n != victim)
    tcfg = replace(cfg, horizon=float(len(trace.rates)))
    k = int(row["at_seconds"] / tcfg.sync)
    assert row["at_seconds"] == k * tcfg.sync >= adv.WARMUP_SECONDS
    # what each stood with at that tick is what the base run of the first seed stood with
    arrivals, high, start_n = sim._seed_inputs(trace, tcfg, 1)
    for name in adv.PAIR:
        _, standing = adv._run(tcfg, trace, name, arrivals, high, start_n)
        assert row["standing"][name]["ready"][0] == standing[k].ready
        assert row["standing"][name]["provisioned"][0] == standing[k].provisioned
    top = row["standing"][victim]["provisioned"][0] * adv.ceiling(cfg)
    sustained = row["standing"][other]["ready"][0] * cfg.mu
    assert top < row["level_requests_per_second"] < sustained
    # the step is the victim's breach and within what the other sustains
    assert row[victim]["slo_attainment"] < out["original"][victim]["slo_attainment"]
    assert row[victim]["slo_attainment"] < row[other]["slo_attainment"]
    assert row[victim]["window_attainment"] < row[other]["window_attainment"]
    assert len(row[victim]["per_seed_slo_attainment"]) == 2


def test_autoscale_adversary_skips_a_trace_shorter_than_two_ticks_and_needs_a_seed() -> None:
    cfg = _short_config()
    short = sim.Trace("short", np.full(20, cfg.mu))
    assert "skipped" in adv.probe_trace(cfg, short, [1], log=lambda line: None)
    with pytest.raises(ValueError, match="seed"):
        adv.probe_trace(cfg, short, [], log=lambda line: None)
