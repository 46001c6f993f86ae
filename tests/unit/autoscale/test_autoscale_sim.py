"""Invariants of the autoscaler benchmark's simulator (bench/autoscaler_sim.py)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "bench" / "autoscaler_sim.py"
    spec = importlib.util.spec_from_file_location("autoscaler_sim", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["autoscaler_sim"] = mod
    spec.loader.exec_module(mod)
    return mod


sim = _load()


def test_autoscale_sim_histogram_quantile_matches_promql() -> None:
    bounds = [0.1, 0.2, 0.5]
    # 10 in (0, 0.1], 80 in (0.1, 0.2], 10 in (0.2, 0.5], 0 in (0.5, +Inf)
    assert sim.histogram_quantile(0.5, bounds, [10, 80, 10, 0]) == pytest.approx(0.15)
    assert sim.histogram_quantile(0.99, bounds, [10, 80, 10, 0]) == pytest.approx(0.2 + 0.3 * 9 / 10)
    assert sim.histogram_quantile(0.05, bounds, [10, 80, 10, 0]) == pytest.approx(0.05)
    # rank in the +Inf bucket: the largest finite bound, as Prometheus returns
    assert sim.histogram_quantile(0.99, bounds, [1, 0, 0, 99]) == pytest.approx(0.5)
    assert math.isnan(sim.histogram_quantile(0.99, bounds, [0, 0, 0, 0]))


def test_autoscale_sim_isolated_requests_wait_the_batch_timeout() -> None:
    cfg = sim.SimConfig(a=0.01, c=0.002, horizon=60.0, initial_timeout=0.004)
    arrivals = np.arange(0.5, 60.0, 0.5)  # far apart: every batch holds one request
    res = sim.Simulator(cfg, arrivals, 1).run(sim.make_fixed(cfg, np.ones(60)))
    assert np.allclose(res.latency, 0.004 + cfg.s(1))
    assert res.replica_seconds == pytest.approx(60.0)
    assert res.scaling_actions == 0


def test_autoscale_sim_conserves_requests_and_respects_physics() -> None:
    cfg = sim.SimConfig(horizon=300.0)
    rng = np.random.default_rng(7)
    rates = sim.trace_rates("step", cfg, rng)
    arrivals = sim.poisson_arrivals(rates, rng)
    res = sim.Simulator(cfg, arrivals, 1).run(sim.make_kubeinfer(cfg))
    # conservation: every request completes once, never before it arrived plus one batch's service
    assert res.done.shape == arrivals.shape and not np.isnan(res.done).any()
    assert (res.latency >= cfg.s(1) - 1e-12).all()
    # replica-seconds integrate the provisioned replicas over the horizon
    assert res.replica_seconds == pytest.approx(sum(res.replicas) * cfg.sync)
    assert all(cfg.min_replicas <= r <= cfg.max_replicas for r in res.replicas)
    fig = sim.figures(cfg, res)
    assert set(fig) == {
        "slo_attainment",
        "window_attainment",
        "replica_seconds",
        "scaling_actions",
        "recovery_seconds",
    }
    assert 0.0 <= fig["slo_attainment"] <= 1.0


def test_autoscale_sim_scrape_p99_tracks_exact_p99() -> None:
    # Constant load on a fixed fleet: the histogram P99 the controller sees is within one bucket
    # (<= 9 % with the runtime's geometric buckets) of the exact P99 of the same requests.
    cfg = sim.SimConfig(horizon=180.0)
    rng = np.random.default_rng(3)
    rates = np.full(180, 1.5 * cfg.mu)
    arrivals = sim.poisson_arrivals(rates, rng)
    seen: list[tuple[float, float]] = []

    def controller(t: float, m: object, n: int, timeout: float) -> tuple[int, float]:
        seen.append((t, m.p99))  # type: ignore[attr-defined]
        return n, timeout

    res = sim.Simulator(cfg, arrivals, 3).run(controller)
    t, p99 = seen[-1]
    mask = (res.done > t - cfg.window) & (res.done <= t)
    exact = float(np.quantile(res.latency[mask], 0.99))
    assert p99 == pytest.approx(exact, rel=0.1)
