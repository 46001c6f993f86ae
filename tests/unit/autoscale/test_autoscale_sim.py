"""Invariants of the autoscaler benchmark's simulator (bench/autoscaler_sim.py)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pytest

from tests.support.bench import load_bench

sim = load_bench("autoscaler_sim")


def test_autoscale_sim_histogram_quantile_matches_promql() -> None:
    bounds = [0.1, 0.2, 0.5]
    # 10 in (0, 0.1], 80 in (0.1, 0.2], 10 in (0.2, 0.5], 0 in (0.5, +Inf)
    assert sim.histogram_quantile(0.5, bounds, [10, 80, 10, 0]) == pytest.approx(0.15)
    assert sim.histogram_quantile(0.99, bounds, [10, 80, 10, 0]) == pytest.approx(0.2 + 0.3 * 9 / 10)
    assert sim.histogram_quantile(0.05, bounds, [10, 80, 10, 0]) == pytest.approx(0.05)
    # rank in the +Inf bucket: the largest finite bound, as Prometheus returns
    assert sim.histogram_quantile(0.99, bounds, [1, 0, 0, 99]) == pytest.approx(0.5)
    assert math.isnan(sim.histogram_quantile(0.99, bounds, [0, 0, 0, 0]))


def test_autoscale_sim_isolated_requests_wait_the_max_queue_delay() -> None:
    cfg = sim.SimConfig(a=0.01, c=0.002, horizon=60.0, initial_max_queue_delay=0.004)
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
        "direction_changes_per_hour",
        "peak_replicas",
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


def test_autoscale_sim_read_trace_any_step(tmp_path: Path) -> None:
    # 100/s for 0.5 s, 300/s for 2 s, 50/s for 2 s (the last row lasts as long as the step before it)
    path = tmp_path / "odd.csv"
    path.write_text("seconds,requests_per_second\n0,100\n0.5,300\n2.5,50\n")
    trace = sim.read_trace(path)
    assert trace.name == "odd" and trace.high_priority_share is None
    # averaged over each second; the last second is half covered
    assert np.allclose(trace.rates, [200.0, 300.0, 175.0, 50.0, 25.0])
    # the integral (requests per run) is kept: 50 + 600 + 100 = 750
    assert trace.rates.sum() == pytest.approx(750.0)


def test_autoscale_sim_read_trace_priority_column_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("seconds,requests_per_second,high_priority_share\n0,10,0.25\n1,20,0.5\n")
    trace = sim.read_trace(path)
    assert np.allclose(trace.rates, [10.0, 20.0]) and np.allclose(trace.high_priority_share, [0.25, 0.5])
    bad = tmp_path / "bad.csv"
    bad.write_text("seconds,requests_per_second\n0,10\n0,20\n")
    with pytest.raises(ValueError, match="increase"):
        sim.read_trace(bad)
    bad.write_text("seconds,requests_per_second\n0,10\n1,x\n")
    with pytest.raises(ValueError, match=r"bad\.csv:3"):
        sim.read_trace(bad)


def test_autoscale_sim_builtin_traces_round_trip(tmp_path: Path) -> None:
    for name in sim.BUILTIN:
        trace = sim.builtin_trace(name, 100.0)
        sim.write_trace(trace, tmp_path / f"{name}.csv")
        back = sim.read_trace(tmp_path / f"{name}.csv")
        assert np.allclose(back.rates, trace.rates) and len(back.rates) == sim.BUILTIN[name][1]
        if trace.high_priority_share is None:
            assert back.high_priority_share is None
        else:
            assert np.allclose(back.high_priority_share, trace.high_priority_share)
    assert sim.builtin_trace("interactive_batch", 100.0).high_priority_share is not None
    # the checked-in CSVs are the built-ins written at the runtime's mu (regenerate: --write-traces)
    stored = sorted(p.stem for p in sim.TRACES_DIR.glob("*.csv"))
    assert stored == sorted(sim.BUILTIN)


def test_autoscale_sim_direction_changes() -> None:
    assert sim.direction_changes([1, 1, 2, 3, 3, 2, 2, 4, 1]) == 3  # up, down, up, down
    assert sim.direction_changes([1, 2, 3, 4]) == 0
    assert sim.direction_changes([]) == 0


@pytest.mark.parametrize("kind", ["down", "nan"])
def test_autoscale_sim_fault_holds_then_recovers(kind: str) -> None:
    # Load goes x4 while Prometheus is down (or answers NaN): no action while the signal is missing;
    # once it returns, kubeinfer scales out.
    cfg = sim.SimConfig(horizon=300.0)
    rates = np.where(np.arange(300) < 100, 1.0 * cfg.mu, 4.0 * cfg.mu)
    arrivals = sim.poisson_arrivals(rates, np.random.default_rng(5))
    fault = (90.0, 180.0, kind)
    res = sim.Simulator(cfg, arrivals, 2, fault=fault).run(sim.make_kubeinfer(cfg))
    assert [t for t in res.actions_at if 90.0 <= t < 180.0] == []
    assert res.replicas[int(90 / cfg.sync)] == res.replicas[int(165 / cfg.sync)]
    after = [t for t in res.actions_at if t >= 180.0]
    assert after and after[0] <= 195.0 and max(res.replicas) > res.replicas[int(165 / cfg.sync)]


def test_autoscale_sim_traces_keep_their_service_model(tmp_path: Path) -> None:
    # The built-in traces are in units of the mu they were written for: their folder records that s(b),
    # and it reproduces the checked-in CSVs (a newer runtime.json does not change what they mean).
    a, c, batch, source = sim.load_service_model(sim.TRACES_DIR / sim.SERVICE_MODEL_FILE)
    assert source == "bench/traces/service_model.json" and batch == 32
    cfg = sim.SimConfig(a=a, c=c, max_batch=batch)
    for name in sim.BUILTIN:
        stored, built = sim.read_trace(sim.TRACES_DIR / f"{name}.csv"), sim.builtin_trace(name, cfg.mu)
        assert np.allclose(stored.rates, built.rates), name
        assert (stored.high_priority_share is None) == (built.high_priority_share is None), name
    path = sim.write_service_model(cfg, "test", tmp_path)
    assert sim.load_service_model(path)[:3] == (a, c, batch)
    assert sim.load_service_model(tmp_path / "absent.json")[3].startswith("defaults")


def _overloaded(cfg: object, seconds: int, rng: np.random.Generator) -> np.ndarray:
    return sim.poisson_arrivals(np.full(seconds, 2.5 * cfg.mu), rng)  # type: ignore[attr-defined]


def test_autoscale_sim_one_priority_level_is_fifo() -> None:
    # Every arrival at one level: the two-level batcher runs exactly the FIFO batches.
    cfg = sim.SimConfig(horizon=120.0)
    arrivals = _overloaded(cfg, 120, np.random.default_rng(11))
    fifo = sim.Simulator(cfg, arrivals, 2).run(sim.make_fixed(cfg, np.ones(120)))
    for level_one in (False, True):
        high = np.full(arrivals.size, level_one)
        res = sim.Simulator(cfg, arrivals, 2, high=high).run(sim.make_fixed(cfg, np.ones(120)))
        assert np.array_equal(res.done, fifo.done)


def test_autoscale_sim_batch_takes_level_one_first() -> None:
    # One replica, batches of 4: four level-2 requests fill the first batch; while it runs, four more
    # level-2 and then two level-1 requests queue. The next batch takes the two level-1 requests and the
    # two oldest level-2 ones; the last two level-2 requests wait for the batch after.
    cfg = sim.SimConfig(a=0.01, c=0.001, max_batch=4, horizon=15.0, initial_max_queue_delay=0.004)
    arrivals = np.array([1.0, 1.0001, 1.0002, 1.0003, 1.001, 1.0011, 1.0012, 1.0013, 1.005, 1.006])
    high = np.array([False] * 8 + [True] * 2)
    res = sim.Simulator(cfg, arrivals, 1, high=high).run(sim.make_fixed(cfg, np.ones(15)))
    first = 1.0003 + cfg.s(4)
    second = first + cfg.s(4)
    assert np.allclose(res.done[:4], first)
    assert np.allclose(res.done[[8, 9, 4, 5]], second)
    assert np.allclose(res.done[[6, 7]], second + cfg.s(2))


def test_autoscale_sim_priority_levels_in_overload() -> None:
    # x2.5 overload on a fixed fleet: level 1 (20 % of arrivals) is served first and meets the SLO;
    # level 2 takes the backlog. Every request completes once, after its arrival plus one batch.
    cfg = sim.SimConfig(horizon=120.0)
    rng = np.random.default_rng(12)
    arrivals = _overloaded(cfg, 120, rng)
    high = rng.random(arrivals.size) < 0.2
    res = sim.Simulator(cfg, arrivals, 2, high=high).run(sim.make_fixed(cfg, np.ones(120)))
    assert not np.isnan(res.done).any() and (res.latency >= cfg.s(1) - 1e-12).all()
    fig = sim.figures(cfg, res)
    assert fig["slo_attainment_high_priority"] > 0.99
    assert fig["slo_attainment_low_priority"] < 0.5
    total = (
        high.sum() * fig["slo_attainment_high_priority"] + (~high).sum() * fig["slo_attainment_low_priority"]
    ) / high.size
    assert fig["slo_attainment"] == pytest.approx(total, abs=1e-4)


def test_autoscale_sim_priority_column_round_trip(tmp_path: Path) -> None:
    trace = sim.Trace("mix", np.array([10.0, 20.0, 30.0]), np.array([0.25, 0.5, 1.0]))
    sim.write_trace(trace, tmp_path / "mix.csv")
    back = sim.read_trace(tmp_path / "mix.csv")
    assert np.allclose(back.rates, trace.rates) and np.allclose(back.high_priority_share, [0.25, 0.5, 1.0])
    # each arrival's level is drawn from its second's share
    arrivals = np.array([0.1, 0.2, 2.5, 2.9])
    assert sim._priorities(back, arrivals, 1)[2:].all()
    assert sim._priorities(sim.Trace("fifo", np.ones(3)), arrivals, 1) is None


def test_autoscale_sim_priority_share_is_weighted_by_the_rate(tmp_path: Path) -> None:
    # Half-second rows: every request is at level 1 (the level-2 rows carry no traffic), so the share of
    # each second's requests is 1, not the time average 0.5.
    path = tmp_path / "fine.csv"
    path.write_text("seconds,requests_per_second,high_priority_share\n0,100,1\n0.5,0,0\n1,100,1\n1.5,0,0\n")
    assert np.allclose(sim.read_trace(path).high_priority_share, [1.0, 1.0])
    path.write_text("seconds,requests_per_second,high_priority_share\n0,100,1.5\n1,100,0\n")
    with pytest.raises(ValueError, match=r"high_priority_share must be in \[0, 1\]"):
        sim.read_trace(path)


def test_autoscale_sim_summary_counts_the_seeds() -> None:
    def row(slo: float, rs: float) -> dict[str, float]:
        return {"slo_attainment": slo, "replica_seconds": rs, "direction_changes_per_hour": 0.0}

    traces = {"t": {"kubeinfer": row(0.974, 90.0), "hpa_gpu": row(0.975, 100.0), "oracle": row(1.0, 80.0)}}
    per_seed = {"t": {"kubeinfer": [0.974, 0.974, 0.98], "hpa_gpu": [0.975, 1.0, 0.97]}}
    s = sim.summarize(traces, per_seed)["t"]
    assert s["seeds_kubeinfer_slo_ge_hpa_gpu"] == 1
    assert s["misses"][0] == "SLO 0.9740 < HPA-on-GPU 0.9750 (at least HPA's on 1 of 3 seeds)"


def test_autoscale_sim_operator_restart_scenario() -> None:
    # compressed_day's first 900 s, one seed: a restart that reads the arrival history back decides as
    # if nothing happened until the stabilization window would allow a scale-in; one that loses it
    # has no burst headroom for the bursts after it.
    cfg = sim.SimConfig(a=0.0036, c=0.00075, max_batch=32)
    trace = sim.builtin_trace("compressed_day", cfg.mu)
    short = sim.Trace("compressed_day", trace.rates[:900])
    out = sim.run_restarts(cfg, {"compressed_day": short}, [1])["operator_restart"]
    assert out["restart_seconds"] == 450.0
    assert set(out) == {
        "trace",
        "restart_seconds",
        "no_restart",
        "restart_history_read_back",
        "restart_history_lost",
    }
    kept, lost = out["restart_history_read_back"], out["restart_history_lost"]
    assert kept["slo_attainment"] >= lost["slo_attainment"]
    assert kept["slo_attainment"] == out["no_restart"]["slo_attainment"]


def test_autoscale_sim_policy_overrides() -> None:
    assert sim.parse_policy_override("plan_utilization=0.7") == ("plan_utilization", 0.7)
    assert sim.parse_policy_override("surge_max_replicas=2") == ("surge_max_replicas", 2)
    assert sim.parse_policy_override("burst_headroom=false") == ("burst_headroom", False)
    for bad in ("plan_utilization", "nope=1", "plan_utilization=x"):
        with pytest.raises(argparse.ArgumentTypeError, match="--policy"):
            sim.parse_policy_override(bad)
    cfg = sim.SimConfig(policy_overrides=(("plan_utilization", 0.7),))
    assert sim.kubeinfer_policy(cfg).plan_utilization == 0.7
    assert sim.kubeinfer_policy(sim.SimConfig()).plan_utilization == 0.85


def test_autoscale_sim_a_trace_folder_keeps_its_service_model(tmp_path: Path) -> None:
    # `--traces DIR` simulates the s(b) the folder's traces were shaped for when it records one;
    # without one, and for `--trace FILE`, the runtime as measured now
    args = argparse.Namespace(trace=None, traces=[tmp_path], write_traces=None)
    assert sim._default_service_model(args) == sim.RUNTIME_RESULTS
    sim.write_service_model(sim.SimConfig(), "test", tmp_path)
    assert sim._default_service_model(args) == tmp_path / sim.SERVICE_MODEL_FILE
    assert sim._default_service_model(argparse.Namespace(trace=None, traces=None, write_traces=None)) == (
        sim.TRACES_DIR / sim.SERVICE_MODEL_FILE
    )
    one = argparse.Namespace(trace=[tmp_path / "x.csv"], traces=None, write_traces=None)
    assert sim._default_service_model(one) == sim.RUNTIME_RESULTS


@pytest.mark.parametrize("batch", ["peers_batch", "idle"])
def test_autoscale_sim_later_batch_is_written_to_its_own_folder(tmp_path: Path, batch: str) -> None:
    # --write-traces DIR --batch NAME reproduces the committed folder of that batch, byte for byte
    committed = sim.TRACES_DIR / batch
    assert (
        sim.main(
            [
                "--write-traces",
                str(tmp_path),
                "--batch",
                batch,
                "--service-model",
                str(sim.TRACES_DIR / "service_model.json"),
            ]
        )
        == 0
    )
    names = sorted(p.name for p in committed.glob("*.csv"))
    assert names == sorted(f"{n}.csv" for n in sim.BATCHES[batch])
    for name in names:
        assert (tmp_path / name).read_bytes() == (committed / name).read_bytes()
    # the default run of bench/traces/ does not read a batch's folder
    assert not set(sim.BATCHES[batch]) & set(sim.BUILTIN)
