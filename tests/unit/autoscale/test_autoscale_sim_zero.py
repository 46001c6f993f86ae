"""Scale to zero in the autoscaler simulator: the activator's hold (bench/autoscaler_sim.py), kubeinfer's
policy taking a service to zero and back, the zero paths of Knative's KPA and KEDA's http-add-on
(bench/autoscaler_peers.py), and the benchmark that compares them (bench/autoscaler_zero.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.bench import load_bench

sim = load_bench("autoscaler_sim")
peers = load_bench("autoscaler_peers")
zero = load_bench("autoscaler_zero")


def _to_zero_after(at: float) -> Any:
    """A controller that keeps its replicas until ``at``, then asks for none."""

    def tick(t: float, m: Any, n: int, timeout: float) -> tuple[int, float]:
        return (0 if t >= at else n), timeout

    return tick


# --------------------------------------------------------------------------------------------------
# the hold


def test_autoscale_sim_zero_hold_bound_and_deadline() -> None:
    act = sim.Activator("test", 2, 5.0)
    out = sim.hold(np.array([0.0, 1.0, 2.0, 6.0, 7.0]), 10.0, act)
    # 2.0 finds two held: refused; at 6.0 the first two's deadlines (5, 6) have come: they leave, 6.0 and
    # 7.0 are held and released at 10 (deadlines 11, 12)
    assert out.held.tolist() == [False, False, False, True, True]
    assert out.overflow.tolist() == [False, False, True, False, False]
    assert out.timed_out.tolist() == [True, True, False, False, False]
    assert out.leave.tolist() == [5.0, 6.0, 2.0, 10.0, 10.0]
    # a deadline equal to the release is met; one before it is not
    assert sim.hold(np.array([0.0]), 5.0, act).held.tolist() == [True]
    assert sim.hold(np.array([0.0]), 5.5, act).timed_out.tolist() == [True]
    # no bound, no deadline: everything is held
    assert sim.hold(np.arange(50.0), 100.0, sim.Activator("open", None, None)).held.all()
    with pytest.raises(ValueError, match="before the release"):
        sim.hold(np.array([10.0]), 10.0, act)
    with pytest.raises(ValueError, match="max_held"):
        sim.Activator("bad", 0, None)
    # kubeinfer's own activator: HoldLimits' defaults
    assert (sim.KUBEINFER_ACTIVATOR.max_held, sim.KUBEINFER_ACTIVATOR.hold_timeout) == (100, 60.0)


def test_autoscale_sim_zero_held_requests_wait_the_cold_start() -> None:
    cfg = sim.SimConfig(a=0.01, c=0.002, horizon=120.0, initial_max_queue_delay=0.004, cold_start=20.0)
    arrivals = np.array([40.0, 41.0, 42.5])
    res = sim.Simulator(cfg, arrivals, 1, activator=sim.Activator("test", 10, 60.0)).run(_to_zero_after(15.0))
    # at zero from t = 15; the request at 40 asks for a replica, Ready at 60; the three held ones go in one
    # batch that fires a max queue delay later: their latency is the wait plus the batch
    assert res.held.all() and not res.lost.any()
    assert res.activations == [(40.0, 60.0)]
    assert np.allclose(res.done, 60.0 + 0.004 + cfg.s(3))
    assert np.allclose(res.latency, [20.0 + 0.004 + cfg.s(3), 19.004 + cfg.s(3), 17.504 + cfg.s(3)])
    # the replica stays while the released requests are queued at it (t = 60), then goes (t = 75)
    assert res.replicas == [1, 0, 0, 1, 1, 0, 0, 0]
    # replica-seconds count the activation from its demand (40 .. 45), then the ticks at 1
    assert res.replica_seconds == pytest.approx(15.0 + 5.0 + 30.0)
    assert res.zero_seconds == pytest.approx(120.0 - 50.0)


def test_autoscale_sim_zero_overflow_past_the_bound_is_lost() -> None:
    cfg = sim.SimConfig(a=0.01, c=0.002, horizon=90.0, initial_max_queue_delay=0.004, cold_start=20.0)
    arrivals = 30.0 + np.arange(8) * 0.5  # 8 requests within the cold start, 3 may be held
    res = sim.Simulator(cfg, arrivals, 1, activator=sim.Activator("test", 3, None)).run(_to_zero_after(15.0))
    assert res.held.tolist() == [True] * 3 + [False] * 5
    assert res.overflow.sum() == 5 and not res.timed_out.any()
    assert np.isinf(res.done[3:]).all() and np.isfinite(res.done[:3]).all()
    fig = zero.zero_figures(cfg, res)
    assert (fig["held"], fig["lost"], fig["lost_overflow"], fig["violations"]) == (3, 5, 5, 8)
    assert fig["p99_seconds"] is None and fig["slo_attainment"] == 0.0  # over 1 % refused: unbounded


def test_autoscale_sim_zero_held_timeout_and_what_the_controller_sees() -> None:
    cfg = sim.SimConfig(a=0.01, c=0.002, horizon=120.0, initial_max_queue_delay=0.004, cold_start=30.0)
    seen: list[tuple[float, Any]] = []

    def controller(t: float, m: Any, n: int, timeout: float) -> tuple[int, float]:
        seen.append((t, m))
        return (0 if t >= 15 else n), timeout

    arrivals = np.array([31.0, 42.0, 55.0])  # Ready at 61: the first waited past its 20 s deadline
    res = sim.Simulator(cfg, arrivals, 1, activator=sim.Activator("test", 10, 20.0)).run(controller)
    assert res.timed_out.tolist() == [True, False, False] and res.held.tolist() == [False, True, True]
    by_t = dict(seen)
    # while the replica starts, nothing the pods export is known; the activator's count is: over the
    # tick before t = 45 the request of 31 was held from 31, the one of 42 from 42 (14 + 3 request-s)
    m = by_t[45.0]
    assert m.ready == 0 and math.isnan(m.rate) and math.isnan(m.p99) and math.isnan(m.queue)
    assert m.concurrency == pytest.approx((14.0 + 3.0) / 15.0)
    assert m.offered_rate == pytest.approx(2 / 60.0) and m.last_arrival == 42.0
    # at t = 60 the first had left at its deadline (51); the second is still held
    assert by_t[60.0].concurrency == pytest.approx((6.0 + 15.0 + 5.0) / 15.0)


def test_autoscale_sim_zero_without_activator_keeps_a_replica() -> None:
    cfg = sim.SimConfig(a=0.01, c=0.002, horizon=60.0)
    res = sim.Simulator(cfg, np.array([10.0, 40.0]), 1).run(_to_zero_after(15.0))
    assert res.replicas == [1, 1, 1, 1] and res.held is None and not res.lost.any()
    with pytest.raises(ValueError, match="priority"):
        sim.Simulator(cfg, np.array([1.0]), 1, high=np.array([True]), activator=sim.KUBEINFER_ACTIVATOR)


# --------------------------------------------------------------------------------------------------
# kubeinfer


def test_autoscale_sim_zero_kubeinfer_idles_to_zero_and_back_on_demand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = sim.SimConfig(horizon=900.0, cold_start=20.0)
    rng = np.random.default_rng(5)
    rates = np.zeros(900)
    rates[:60] = rates[600:660] = 20.0
    arrivals = sim.poisson_arrivals(rates, rng)
    decisions: list[tuple[float, Any]] = []
    real = sim.decide

    def spy(*args: Any) -> Any:
        d = real(*args)
        decisions.append((args[-1], d))
        return d

    monkeypatch.setattr(sim, "decide", spy)
    controller = sim.make_kubeinfer(cfg, idle_after_seconds=120.0)
    res = sim.Simulator(cfg, arrivals, 1, activator=sim.KUBEINFER_ACTIVATOR).run(controller)
    # the last answer before 60 s leaves the 60 s window at 120: idle from the tick at 135, to zero by
    # the policy's own decision 120 s later; the same after the traffic of 600..660
    to_zero = [(t, d) for t, d in decisions if d.replicas == 0 and d.replicas_changed]
    assert [t for t, _ in to_zero] == [255.0, 855.0]
    assert "no requests for 120 s" in to_zero[0][1].reason
    assert res.replicas[int(240 / 15)] == 1 and res.replicas[int(255 / 15)] == 0
    # the first request after 600 asks for a replica, Ready a cold start later; held until then
    first = float(arrivals[arrivals >= 600][0])
    assert res.activations == [(first, first + 20.0)]
    assert (
        res.held.sum() == 100
        and res.overflow.sum() == np.count_nonzero(arrivals[arrivals >= 600] < first + 20) - 100
    )
    # while it starts the policy reads nothing and holds one replica; then it decides again
    starting = [d for t, d in decisions if first < t < first + 20.0]
    assert starting and all(not d.known and d.replicas == 1 for d in starting)
    assert any(d.known for t, d in decisions if t > first + 20.0)
    assert res.zero_seconds == pytest.approx((first - 255.0) + (900.0 - 855.0))  # at zero twice
    assert res.lost.sum() == res.overflow.sum() and not np.isnan(res.done).any()


def test_autoscale_sim_zero_policy_is_policy_from_spec() -> None:
    cfg = sim.SimConfig()
    # minReplicas 0 with the activator: the API's idle window (5 minutes), unless --policy says otherwise
    assert zero.idle_after_seconds(cfg) == 300.0
    with_override = sim.SimConfig(policy_overrides=(("idle_after_seconds", 90),))
    assert zero.idle_after_seconds(with_override) == 90.0
    labels = [s.label for s in zero.setups(cfg)]
    assert labels[:4] == ["kubeinfer", "kubeinfer_zero", "kubeinfer_zero_large_hold", "hpa_gpu"]
    assert {s.activator for s in zero.setups(cfg) if s.family == "knative_kpa_zero"} == {
        peers.KNATIVE_ACTIVATOR
    }
    assert {s.activator for s in zero.setups(cfg) if s.family in ("kubeinfer", "hpa_gpu", "keda_http")} == {
        None
    }


# --------------------------------------------------------------------------------------------------
# Knative KPA


def test_autoscale_sim_zero_kpa_pa_timers() -> None:
    spec, z = peers.KpaSpec(10.0), peers.KpaZeroSpec()
    assert (z.grace_period, z.pod_retention_period, z.target_burst_capacity) == (30.0, 0.0, 211.0)
    active = peers.PaState("active", 0.0, 0.0)
    # active for less than the stable window: at most 1 pod
    assert peers.kpa_pa_step(spec, z, active, 0, -200.0, 1, 30.0) == (1, active)
    # for the stable window: left as is, the PodAutoscaler turns inactive
    scale, pa = peers.kpa_pa_step(spec, z, active, 0, -200.0, 1, 60.0)
    assert scale is None and pa == peers.PaState("inactive", 60.0, 0.0)
    # the activator has been in the path for the grace period already (a negative burst capacity): 0
    assert peers.kpa_pa_step(spec, z, pa, 0, -200.0, 1, 62.0)[0] == 0
    # out of the path until then: the grace period runs from the inactive mark
    served = peers.PaState("inactive", 60.0, None)
    assert peers.kpa_pa_step(spec, z, served, 0, -200.0, 1, 80.0)[0] is None
    assert peers.kpa_pa_step(spec, z, served, 0, -200.0, 1, 90.0)[0] == 0
    # a pod retention period keeps the last pod that long after the inactive mark
    keep = peers.KpaZeroSpec(pod_retention_period=45.0)
    assert peers.kpa_pa_step(spec, keep, pa, 0, -200.0, 1, 62.0)[0] is None
    assert peers.kpa_pa_step(spec, keep, pa, 0, -200.0, 1, 105.0)[0] == 0
    # scale to zero off: 1
    assert (
        peers.kpa_pa_step(spec, peers.KpaZeroSpec(enable_scale_to_zero=False), active, 0, 0.0, 1, 99.0)[0]
        == 1
    )
    # demand at zero: applied, activating until a pod is Ready, then active
    scale, pa = peers.kpa_pa_step(spec, z, peers.PaState("inactive", 60.0, 0.0), 3, -200.0, 0, 300.0)
    assert scale == 3 and pa == peers.PaState("activating", 300.0, 0.0)
    scale, pa = peers.kpa_pa_step(spec, z, pa, 3, 5.0, 3, 320.0)
    assert scale == 3 and pa == peers.PaState("active", 320.0, None)  # burst capacity >= 0: out of the path
    # activating with nothing wanted: left, until the activation timeout (600 s + 10 s) passes
    activating = peers.PaState("activating", 100.0, 100.0)
    assert peers.kpa_pa_step(spec, z, activating, 0, -200.0, 0, 500.0) == (None, activating)
    assert peers.kpa_pa_step(spec, z, activating, 0, -200.0, 0, 711.0)[0] == 0


def test_autoscale_sim_zero_kpa_goes_to_zero_a_stable_window_after_the_last_request() -> None:
    cfg = sim.SimConfig(a=0.01, c=0.002, horizon=400.0, cold_start=20.0, sync=peers.PEER_TICK_SECONDS)
    arrivals = np.concatenate([np.arange(0.5, 30.0, 0.5), [300.0]])
    controller = peers.make_kpa(cfg, 10.0, peers.KpaZeroSpec())
    res = sim.Simulator(cfg, arrivals, 1, p99_signal=False, activator=peers.KNATIVE_ACTIVATOR).run(controller)
    times = [k * cfg.sync for k in range(len(res.replicas))]
    first_zero = next(t for t, r in zip(times, res.replicas, strict=True) if r == 0)
    # the last answer at 29.5 + a batch: every concurrency sample of the stable window is 0 from
    # 29.5 + 62 (2 s samples, a 60 s window), the PodAutoscaler turns inactive then, and the
    # activator in the path for longer than the grace period takes the last pod one tick later
    assert 92.0 <= first_zero <= 96.0
    assert res.activations == [(300.0, 320.0)] and res.held.sum() == 1


# --------------------------------------------------------------------------------------------------
# KEDA's http-add-on


def test_autoscale_sim_zero_keda_scale_executor() -> None:
    spec = peers.KedaHttpSpec(100.0)
    assert (spec.min_replicas, spec.cooldown_period, spec.window) == (0, 300.0, 60.0)
    assert peers.keda_scale_to_zero(spec, True, 50.0, 0, 50.0) == 1  # activation from zero
    assert peers.keda_scale_to_zero(spec, True, 50.0, 3, 50.0) is None  # active: the HPA decides
    assert peers.keda_scale_to_zero(spec, False, 100.0, 2, 400.0) is None  # cooling down (not before now)
    assert peers.keda_scale_to_zero(spec, False, 100.0, 2, 400.5) == 0  # cooldown over
    assert peers.keda_scale_to_zero(spec, False, None, 2, 1.0) == 0  # never active, initial cooldown 0
    assert peers.keda_scale_to_zero(spec, False, 100.0, 0, 120.0) == 0  # stays at zero
    assert peers.keda_scale_to_zero(peers.KedaHttpSpec(100.0, min_replicas=1), False, 0.0, 2, 999.0) is None
    assert peers.KEDA_INTERCEPTOR.max_held is None and peers.KEDA_INTERCEPTOR.hold_timeout is None


def test_autoscale_sim_zero_keda_cools_down_then_activates() -> None:
    cfg = sim.SimConfig(a=0.01, c=0.002, horizon=900.0, cold_start=20.0)
    arrivals = np.concatenate([np.arange(0.5, 30.0, 0.5), [600.0, 600.5]])
    controller = peers.make_keda_http(cfg, 100.0)
    res = sim.Simulator(cfg, arrivals, 1, activator=peers.KEDA_INTERCEPTOR).run(controller)
    # last arrival 29.5: the rate's window keeps the trigger active until 89.5; 300 s of cooldown later
    # the first poll after 389.5 takes the last replica
    assert res.replicas[int(375 / 15)] == 1 and res.replicas[int(390 / 15)] == 0
    assert res.activations == [(600.0, 620.0)] and res.held.sum() == 2 and not res.lost.any()
    assert res.replicas[int(615 / 15)] >= 1
    # without scale to zero it never goes under one replica
    keep = sim.Simulator(cfg, arrivals, 1).run(peers.make_keda_http(cfg, 100.0, scale_to_zero=False))
    assert min(keep.replicas) == 1


# --------------------------------------------------------------------------------------------------
# the benchmark


def test_autoscale_sim_zero_benchmark_writes_its_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a lock file of its own: never waits on (or delays) a benchmark holding the machine's
    monkeypatch.setattr(load_bench("quiet"), "LOCK_PATH", tmp_path / "bench.lock")
    rates = np.zeros(420)
    rates[:60] = rates[380:400] = 0.003 * 930.0  # a few requests a second, idle between
    trace = tmp_path / "traces" / "tiny.csv"
    sim.write_trace(sim.Trace("tiny", np.round(rates, 1)), trace)
    out = tmp_path / "zero.json"
    argv = ["--trace", str(trace), "--repeats", "1", "--jobs", "1", "--cold-start", "15", "--out", str(out)]
    argv += [
        "--service-model",
        str(sim.TRACES_DIR / "service_model.json"),
        "--policy",
        "idle_after_seconds=120",
    ]
    assert zero.main(argv) == 0
    result = json.loads(out.read_text())
    rows = result["traces"]["tiny"]["controllers"]
    assert result["config"]["cold_start_seconds"] == 15.0 and result["config"]["idle_after_seconds"] == 120.0
    assert result["machine"]["load_check"].startswith("not applied")
    assert result["machine"]["lock"]["path"] == str(tmp_path / "bench.lock")
    assert rows["kubeinfer"]["zero_seconds"] == 0 and rows["kubeinfer_zero"]["zero_seconds"] > 0
    assert rows["kubeinfer_zero"]["activations"] == 1 and rows["kubeinfer_zero"]["held"] > 0
    assert rows["hpa_gpu"]["zero_seconds"] == 0
    assert set(result["summary"]["tiny"]) >= {
        "zero_saves_replica_seconds",
        "verdict",
        "cheapest_peer_at_zero_slo",
    }
    assert "kubeinfer_zero" in out.with_suffix(".md").read_text()
    # a bad cold start is one line and status 2
    with pytest.raises(SystemExit) as exc:
        zero.main([*argv[:-2], "--cold-start", "0"])
    assert exc.value.code == 2
