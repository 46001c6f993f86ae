"""The peers' rules (bench/autoscaler_peers.py: Knative's KPA, Ray Serve) on hand-computed inputs, the
simulator's concurrency signal and KEDA's request-rate HPA (bench/autoscaler_sim.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from tests.support.bench import load_bench

sim = load_bench("autoscaler_sim")
peers = load_bench("autoscaler_peers")


# --------------------------------------------------------------------------------------------------
# Knative KPA


def test_autoscale_peers_kpa_spec_defaults() -> None:
    spec = peers.KpaSpec(10.0)
    assert spec.target_value == pytest.approx(7.0)  # 70 % of the soft target
    assert spec.panic_window == 6.0  # 10 % of the 60 s stable window
    assert (spec.panic_threshold, spec.max_scale_up_rate, spec.max_scale_down_rate) == (2.0, 1000.0, 2.0)
    assert spec.scale_down_delay == 0.0
    # rounded to whole seconds as time.Duration.Round does (halfway away from zero), at least 1 s
    assert peers.KpaSpec(10.0, stable_window=25.0).panic_window == 3.0
    assert peers.KpaSpec(10.0, stable_window=7.0).panic_window == 1.0
    assert peers.KpaSpec(10.0, stable_window=4.0).panic_window == 1.0


def test_autoscale_peers_kpa_stable_mode() -> None:
    spec = peers.KpaSpec(10.0)  # TargetValue 7
    # 20 in flight: ceil(20 / 7) = 3 pods; panic 3 / 2 ready = 1.5 < 2: stable
    assert peers.kpa_scale(spec, peers.KpaState(), 20.0, 20.0, 2, 50.0) == (3, peers.KpaState())
    # no ready pod counts as one: ceil(6 / 7) = 1
    assert peers.kpa_scale(spec, peers.KpaState(), 6.0, 6.0, 0, 50.0)[0] == 1


def test_autoscale_peers_kpa_scale_rates_bound_a_tick() -> None:
    spec = peers.KpaSpec(10.0)
    # 8 ready, 0.5 in flight: ceil(0.5 / 7) = 1, but at most down to floor(8 / 2) = 4 per tick
    assert peers.kpa_scale(spec, peers.KpaState(), 0.5, 0.5, 8, 10.0)[0] == 4
    # max-scale-up-rate 1.5 on 2 ready: at most ceil(1.5 * 2) = 3 though ceil(70 / 7) = 10
    slow = peers.KpaSpec(10.0, max_scale_up_rate=1.5)
    desired, state = peers.kpa_scale(slow, peers.KpaState(), 70.0, 70.0, 2, 10.0)
    assert desired == 3 and state == peers.KpaState(10.0, 3)  # 10 / 2 >= 2: panic as well


def test_autoscale_peers_kpa_panic_enters_holds_and_leaves() -> None:
    spec = peers.KpaSpec(10.0)  # TargetValue 7, panic at 200 %, stable window 60 s
    # panic window 30 in flight: ceil(30 / 7) = 5 pods, 5 / 2 ready = 2.5 >= 2: panic at t = 100
    desired, state = peers.kpa_scale(spec, peers.KpaState(), 14.0, 30.0, 2, 100.0)
    assert desired == 5 and state == peers.KpaState(100.0, 5)  # max(stable 2, panic 5)
    # 30 s later the load fell (1 pod wanted, bounded at floor(5 / 2) = 2): still in panic, no scale-down
    desired, state = peers.kpa_scale(spec, state, 7.0, 7.0, 5, 130.0)
    assert desired == 5 and state == peers.KpaState(100.0, 5)
    # at t = 160 the last panic is exactly one stable window ago: not "before now" yet
    assert peers.kpa_scale(spec, state, 7.0, 7.0, 5, 160.0) == (5, peers.KpaState(100.0, 5))
    # at t = 161 it leaves panic: the stable count, 2 (at most halved), and the memory is reset
    assert peers.kpa_scale(spec, state, 7.0, 7.0, 5, 161.0) == (2, peers.KpaState())
    # still over the threshold: the panic is extended to now, and the count only rises
    desired, state = peers.kpa_scale(spec, peers.KpaState(100.0, 5), 7.0, 50.0, 3, 150.0)
    assert desired == 8 and state == peers.KpaState(150.0, 8)  # ceil(50 / 7) = 8, 8 / 3 >= 2


def test_autoscale_peers_kpa_refuses_a_scale_down_delay() -> None:
    with pytest.raises(ValueError, match="scale-down-delay"):
        peers.kpa_scale(peers.KpaSpec(10.0, scale_down_delay=30.0), peers.KpaState(), 1.0, 1.0, 1, 0.0)


def test_autoscale_peers_window_average() -> None:
    samples = [(2.0, 10.0), (4.0, 20.0), (6.0, 30.0)]
    assert peers.window_average(samples, 6.0, 4.0) == pytest.approx(25.0)  # (2, 6]: 20 and 30
    assert peers.window_average(samples, 6.0, 60.0) == pytest.approx(20.0)  # a young window: what it has
    assert math.isnan(peers.window_average(samples, 20.0, 6.0))


# --------------------------------------------------------------------------------------------------
# Ray Serve


def test_autoscale_peers_ray_core_policy() -> None:
    assert peers.ray_core_policy(30.0, 3, 5.0) == pytest.approx(6.0)  # 3 * 30 / (5 * 3)
    assert peers.ray_core_policy(3.0, 4, 2.0) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        peers.ray_core_policy(1.0, 0, 2.0)


def test_autoscale_peers_ray_scaling_factors() -> None:
    assert peers.ray_apply_scaling_factors(6.0, 3, 1.0, 1.0) == 6
    assert peers.ray_apply_scaling_factors(2.2, 3, 1.0, 1.0) == 3  # ceil(2.2) = 3: no change
    # ceil(3 - 0.5 * 1.5) = 3 is stuck although ceil(1.5) = 2 < 3: down by one
    assert peers.ray_apply_scaling_factors(1.5, 3, 1.0, 0.5) == 2
    assert peers.ray_apply_scaling_factors(10.0, 2, 0.5, 1.0) == 6  # ceil(2 + 0.5 * 8)
    assert peers.ray_apply_bounds(0, 1, 12) == 1 and peers.ray_apply_bounds(20, 1, 12) == 12


def test_autoscale_peers_ray_delay_logic_counts_decisions() -> None:
    config = peers.RayServeConfig(2.0, loop_interval_s=2.0)  # up after > 15 decisions, down after > 300
    assert peers.ray_apply_delay_logic(5, 3, config, 14) == (3, 15)  # the 15th: not yet
    assert peers.ray_apply_delay_logic(5, 3, config, 15) == (5, 0)  # the 16th: applied, reset
    assert peers.ray_apply_delay_logic(5, 3, config, -40) == (3, 1)  # a scale-down streak is reset
    assert peers.ray_apply_delay_logic(2, 3, config, 7) == (3, -1)  # and the other way
    assert peers.ray_apply_delay_logic(2, 3, config, -299) == (3, -300)
    assert peers.ray_apply_delay_logic(0, 3, config, -300) == (1, 0)  # applied, to at least 1
    assert peers.ray_apply_delay_logic(3, 3, config, 9) == (3, 0)  # no change resets the streak
    # Ray's own loop: 0.1 s, so 30 s is int(30 / 0.1) = 300 decisions
    default = peers.RayServeConfig(2.0)
    assert peers.ray_apply_delay_logic(5, 3, default, 299) == (3, 300)
    assert peers.ray_apply_delay_logic(5, 3, default, 300) == (5, 0)


def test_autoscale_peers_ray_decide_composes_the_rules() -> None:
    config = peers.RayServeConfig(10.0, loop_interval_s=2.0)
    # 55 in flight over 2 running: 5.5 -> ceil(5.5) = 6, applied on the 16th decision in a row
    assert peers.ray_decide(config, 55.0, 2, 2, (1, 12), 15) == (6, 0)
    assert peers.ray_decide(config, 55.0, 2, 2, (1, 12), 0) == (2, 1)
    # bounded before the delay: 500 in flight wants 50, the max is 12
    assert peers.ray_decide(config, 500.0, 2, 2, (1, 12), 15) == (12, 0)
    # no running replica: the cold-start path, no delay
    assert peers.ray_decide(config, 5.0, 0, 0, (1, 12), 0) == (1, 0)
    assert peers.ray_decide(config, 0.0, 0, 3, (1, 12), 4) == (3, 4)


def test_autoscale_peers_ray_reads_the_last_push() -> None:
    config = peers.RayServeConfig(2.0)  # pushes every 10 s, 30 s look-back
    samples = [(float(t), float(t)) for t in range(2, 41, 2)]
    # at t = 45 the last push was at 40: the samples of (10, 40], 12..40, mean 26
    assert peers.ray_total_requests(samples, 45.0, config) == pytest.approx(26.0)
    assert peers.ray_total_requests(samples, 40.0, config) == pytest.approx(26.0)
    assert peers.ray_total_requests(samples, 39.0, config) == pytest.approx(16.0)  # push at 30: (0, 30]
    assert math.isnan(peers.ray_total_requests(samples, 9.0, config))  # nothing pushed yet


# --------------------------------------------------------------------------------------------------
# the simulated signals and controllers


def test_autoscale_sim_concurrency_is_the_time_averaged_in_flight_count() -> None:
    cfg = sim.SimConfig(a=0.004, c=0.0008, max_batch=16, horizon=120.0, sync=2.0)
    rng = np.random.default_rng(11)
    arrivals = sim.poisson_arrivals(np.full(120, 1.6 * cfg.mu), rng)  # 2 replicas, 80 % of mu each
    seen: list[tuple[float, float]] = []

    def controller(t: float, m: object, n: int, timeout: float) -> tuple[int, float]:
        seen.append((t, m.concurrency))  # type: ignore[attr-defined]
        return n, timeout

    res = sim.Simulator(cfg, arrivals, 2, p99_signal=False).run(controller)
    for t, value in seen[5:]:
        overlap = np.minimum(res.done, t) - np.maximum(res.arrivals, t - cfg.sync)
        assert value == pytest.approx(float(overlap[overlap > 0].sum()) / cfg.sync)
    # Little's law over the run: the mean in-flight count is the arrival rate times the mean latency
    mean = float(np.mean([v for _, v in seen[5:]]))
    assert mean == pytest.approx(1.6 * cfg.mu * float(res.latency.mean()), rel=0.05)


def test_autoscale_sim_hpa_on_request_rate_per_replica() -> None:
    cfg = sim.SimConfig()
    with pytest.raises(ValueError, match="needs a target"):
        sim.make_hpa(cfg, "rate")
    nan = math.nan
    # 2000 req/s over 2 replicas at 500 per replica: ratio 2, desired ceil(2 * 2) = 4
    hpa = sim.make_hpa(cfg, "rate", 500.0)
    assert hpa(15.0, sim.Metrics(nan, nan, 2000.0, 0.0, 2), 2, 0.005) == (4, 0.005)
    # 1050 req/s: ratio 1.05, inside the 10 % tolerance: hold
    hpa = sim.make_hpa(cfg, "rate", 500.0)
    assert hpa(15.0, sim.Metrics(nan, nan, 1050.0, 0.0, 2), 2, 0.005) == (2, 0.005)
    # the divisor is the replicas provisioned (the scale's status.replicas), starting ones included
    hpa = sim.make_hpa(cfg, "rate", 500.0)
    assert hpa(15.0, sim.Metrics(nan, nan, 2000.0, 0.0, 1), 4, 0.005) == (4, 0.005)


def test_autoscale_peers_targets_set_their_standing_headroom() -> None:
    cfg = sim.SimConfig(a=0.004, c=0.0008, max_batch=16)
    rng = np.random.default_rng(5)
    trace = sim.Trace("plateau", 2.5 * cfg.mu * np.exp(0.05 * rng.standard_normal(300)))
    tcfg = replace(cfg, horizon=float(len(trace.rates)), sync=peers.PEER_TICK_SECONDS)
    arrivals, _, start_n = sim._seed_inputs(trace, tcfg, 1)

    def run(controller: object) -> float:
        res = sim.Simulator(tcfg, arrivals, start_n, p99_signal=False).run(controller)  # type: ignore[arg-type]
        return float(res.replica_seconds)

    # in flight per replica from 0.3 to 0.6 of mu * s(B) (12.8 requests here), under saturation: a
    # target past it lets the queue grow, and the in-flight count with it, which scales the fleet up
    scale = cfg.mu * cfg.s(cfg.max_batch)
    util = peers.KpaSpec(1.0).target_utilization
    assert run(peers.make_kpa(tcfg, 0.3 * scale / util)) > run(peers.make_kpa(tcfg, 0.6 * scale / util))
    assert run(peers.make_ray_serve(tcfg, 0.3 * scale)) > run(peers.make_ray_serve(tcfg, 0.6 * scale))
