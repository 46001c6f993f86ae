"""Table-driven and trace-driven tests of the autoscaler's control law (``policy.decide``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
from kubeinfer.operator.autoscale.policy import (
    Current,
    Decision,
    Observation,
    Policy,
    State,
    decide,
    restore_arrivals,
    restore_state,
)

NAN = float("nan")
INF = float("inf")

POLICY = Policy(
    min_replicas=1,
    max_replicas=10,
    target_p99_seconds=0.2,
    gpu_low=0.5,
    gpu_high=0.8,
    max_queue_delay_min_seconds=0.001,
    max_queue_delay_max_seconds=0.02,
    tolerance=0.1,
    scale_down_stabilization_seconds=300,
    scale_up_cooldown_seconds=30,
    scale_down_cooldown_seconds=60,
    max_queue_delay_cooldown_seconds=15,
    max_scale_up_step=4,
    max_queue_delay_decrease_factor=0.5,
    max_queue_delay_step_seconds=0.001,
    stale_after_seconds=60,
)
# A state whose stabilization window has been fully observed, with no recent actions.
SETTLED = State(first_seen=-1000.0)


def obs(p99: float | None, gpu: float | None, **kw: float | str | None) -> Observation:
    return Observation(p99_seconds=p99, gpu_utilization=gpu, **kw)  # type: ignore[arg-type]


@dataclass
class Case:
    id: str
    observation: Observation
    current: Current
    replicas: int
    timeout: float
    reason_has: str
    state: State = SETTLED
    now: float = 0.0
    policy: Policy = POLICY


CASES = [
    # --- over target, GPU busy: scale out by the HPA ratio on the binding signal ---
    Case(
        "busy-p99-binding",
        obs(0.31, 0.91),
        Current(3, 0.01),
        5,
        0.01,
        "P99 0.31 s > target 0.20 s, GPU 0.91 busy: 3 → 5 replicas",
    ),
    Case("busy-gpu-binding", obs(0.23, 0.99), Current(4, 0.01), 5, 0.01, "4 → 5 replicas"),
    Case("busy-at-least-one", obs(0.221, 0.8), Current(10, 0.01), 10, 0.01, "at max replicas 10"),
    Case("busy-max-step", obs(2.0, 0.95), Current(2, 0.01), 6, 0.01, "2 → 6 replicas"),
    Case("busy-max-replicas", obs(0.5, 0.95), Current(8, 0.01), 10, 0.01, "8 → 10 replicas"),
    Case(
        "busy-scale-up-cooldown",
        obs(0.5, 0.95),
        Current(3, 0.01),
        3,
        0.01,
        "scale-up cooling down",
        state=replace(SETTLED, last_scale_up=-10.0),
    ),
    Case(
        "busy-scale-up-after-cooldown",
        obs(0.5, 0.95),
        Current(3, 0.01),
        7,
        0.01,
        "3 → 7 replicas",
        state=replace(SETTLED, last_scale_up=-30.0),
    ),
    # --- over target, GPU not busy: cut the max queue delay first (multiplicative decrease) ---
    Case("idle-gpu-cut-timeout", obs(0.3, 0.4), Current(3, 0.01), 3, 0.005, "max queue delay 10 ms → 5 ms"),
    Case("idle-gpu-cut-to-min", obs(0.3, 0.4), Current(3, 0.0015), 3, 0.001, "→ 1 ms"),
    Case(
        "idle-gpu-timeout-cooldown",
        obs(0.3, 0.4),
        Current(3, 0.01),
        3,
        0.01,
        "max queue delay cooling down",
        state=replace(SETTLED, last_max_queue_delay_change=-5.0),
    ),
    Case(
        "idle-gpu-timeout-at-min-add-replicas",
        obs(0.3, 0.4),
        Current(2, 0.001),
        3,
        0.001,
        "max queue delay at minimum: 2 → 3",
    ),
    # --- comfortably under target: grow timeout additively, scale in after the window ---
    Case(
        "under-grow-timeout-and-scale-in",
        obs(0.1, 0.3),
        Current(4, 0.005),
        2,
        0.006,
        "4 → 2 replicas, max queue delay 5 ms → 6 ms",
    ),
    Case("under-timeout-at-max", obs(0.1, 0.3), Current(1, 0.02), 1, 0.02, "nothing to change"),
    Case(
        "under-busy-adds-headroom", obs(0.1, 0.85), Current(4, 0.02), 5, 0.02, "GPU 0.85 busy: 4 → 5 replicas"
    ),
    Case(
        "under-busy-no-headroom-when-disabled",
        obs(0.1, 0.85),
        Current(4, 0.02),
        4,
        0.02,
        "nothing to change",
        policy=replace(POLICY, keep_in_band=False),
    ),
    Case(
        "busy-scale-up-waits-for-starting-replicas",
        obs(0.5, 0.95),
        Current(5, 0.01, ready_replicas=2),
        5,
        0.01,
        "3 added replicas still starting",
    ),
    Case(
        "busy-scale-up-when-all-ready",
        obs(0.5, 0.95),
        Current(5, 0.01, ready_replicas=5),
        9,
        0.01,
        "5 → 9 replicas",
    ),
    # --- the drained-backlog rule: Little's law on the requests in flight (queued + executing) ---
    Case(
        "busy-backlog-drained-waits-for-window",
        obs(0.5, 0.95, request_rate=1000.0, queue_size=10.0, inflight_requests=10.0),
        Current(3, 0.01),
        3,
        0.01,
        "backlog drained (10 in flight at 1000.0/s: 10 ms by Little's law)",
    ),
    Case(
        "busy-backlog-drained-at-the-edge",  # 20 / 1000 s = 0.1 x target 0.2 s: still drained
        obs(0.5, 0.95, request_rate=1000.0, queue_size=0.0, inflight_requests=20.0),
        Current(3, 0.01),
        3,
        0.01,
        "backlog drained (20 in flight at 1000.0/s: 20 ms",
    ),
    Case(
        "busy-backlog-just-over-the-edge-scales",  # 21 ms > 20 ms
        obs(0.5, 0.95, request_rate=1000.0, queue_size=0.0, inflight_requests=21.0),
        Current(3, 0.01),
        7,
        0.01,
        "3 → 7 replicas",
    ),
    Case(
        "busy-queue-backlog-scales",
        obs(0.5, 0.95, request_rate=1000.0, queue_size=5000.0, inflight_requests=5000.0),
        Current(3, 0.01),
        7,
        0.01,
        "3 → 7 replicas",
    ),
    Case(
        # The demo's case: every request taken into batches (queue 0) but 600 in flight at 200/s is 3 s
        # in the service by Little's law; the old queue-based rule read it as drained and held.
        "busy-empty-queue-with-requests-executing-scales",
        obs(0.5, 0.95, request_rate=200.0, queue_size=0.0, inflight_requests=600.0),
        Current(3, 0.01),
        7,
        0.01,
        "3 → 7 replicas",
    ),
    Case(
        "idle-gpu-empty-queue-with-requests-executing-cuts-timeout",
        obs(0.5, 0.4, request_rate=200.0, queue_size=0.0, inflight_requests=600.0),
        Current(3, 0.01),
        3,
        0.005,
        "max queue delay 10 ms → 5 ms",
    ),
    Case(
        "busy-inflight-unknown-the-rule-does-not-apply",  # the queue alone is not read as drained
        obs(0.5, 0.95, request_rate=1000.0, queue_size=0.0),
        Current(3, 0.01),
        7,
        0.01,
        "3 → 7 replicas",
    ),
    Case(
        "under-projection-over-top-no-scale-in",
        obs(0.1, 0.7),
        Current(2, 0.02),
        2,
        0.02,
        "nothing to change",
    ),
    Case(
        "under-window-not-observed",
        obs(0.1, 0.2),
        Current(4, 0.02),
        4,
        0.02,
        "waits for the 300 s stabilization window",
        state=State(first_seen=-100.0),
    ),
    Case(
        "under-window-holds-high-recommendation",
        obs(0.1, 0.2),
        Current(4, 0.02),
        4,
        0.02,
        "nothing to change",
        state=replace(SETTLED, recommendations=((-200.0, 4),)),
    ),
    Case(
        "under-window-uses-max-recommendation",
        obs(0.1, 0.1),
        Current(6, 0.02),
        3,
        0.02,
        "6 → 3 replicas",
        state=replace(SETTLED, recommendations=((-310.0, 6), (-200.0, 3), (-100.0, 2))),
    ),
    Case(
        "under-scale-down-cooldown",
        obs(0.1, 0.1),
        Current(4, 0.02),
        4,
        0.02,
        "scale-in cooling down",
        state=replace(SETTLED, last_scale_down=-30.0),
    ),
    Case(
        "under-min-replicas",
        obs(0.05, 0.0),
        Current(2, 0.02),
        2,
        0.02,
        "nothing",
        policy=replace(POLICY, min_replicas=2),
    ),
    Case(
        "idle-zero-rate-scales-to-min",
        obs(None, 0.0, request_rate=0.0),
        Current(3, 0.01),
        1,
        0.011,
        "no requests",
    ),
    # --- tolerance band: nothing moves ---
    Case("band-upper-edge", obs(0.22, 0.95), Current(3, 0.01), 3, 0.01, "within 10% of target"),
    Case("band-lower-edge", obs(0.18, 0.1), Current(3, 0.01), 3, 0.01, "within 10% of target"),
    Case("band-exact-target", obs(0.2, 0.5), Current(3, 0.01), 3, 0.01, "hold"),
    # --- unknown observations hold everything, never read as zero ---
    Case("nan-p99", obs(NAN, 0.1), Current(3, 0.01), 3, 0.01, "holding: P99 latency is nan"),
    Case("inf-p99", obs(INF, 0.1), Current(3, 0.01), 3, 0.01, "holding: P99 latency is inf"),
    Case(
        "missing-p99-with-traffic",
        obs(None, 0.1, request_rate=5.0),
        Current(3, 0.01),
        3,
        0.01,
        "P99 latency missing",
    ),
    Case("missing-p99-no-rate", obs(None, 0.1), Current(3, 0.01), 3, 0.01, "P99 latency missing"),
    Case("nan-gpu", obs(0.1, NAN), Current(3, 0.01), 3, 0.01, "GPU utilization is nan"),
    Case("missing-gpu", obs(0.5, None), Current(3, 0.01), 3, 0.01, "GPU utilization missing"),
    Case("empty", Observation.unknown("no data for this service"), Current(3, 0.01), 3, 0.01, "no data"),
    Case(
        "error",
        Observation.unknown("Prometheus unavailable: connection refused"),
        Current(3, 0.01),
        3,
        0.01,
        "holding: Prometheus unavailable",
    ),
    Case("stale", obs(0.05, 0.0, sample_age_seconds=90.0), Current(3, 0.01), 3, 0.01, "stale metrics"),
    Case("fresh-enough", obs(0.05, 0.0, sample_age_seconds=30.0), Current(3, 0.01), 1, 0.011, "3 → 1"),
    # --- bounds enforced even when holding ---
    Case(
        "zero-replicas-brought-to-min",
        Observation.unknown("down"),
        Current(0, 0.01),
        1,
        0.01,
        "outside [1, 10]",
    ),
    Case("above-max-clamped", obs(0.2, 0.5), Current(12, 0.01), 10, 0.01, "replicas 12 outside"),
    Case(
        "timeout-above-max-clamped", obs(0.2, 0.5), Current(3, 0.5), 3, 0.02, "max queue delay 500 ms outside"
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_autoscale_policy_table(case: Case) -> None:
    d = decide(case.observation, case.current, case.policy, case.state, case.now)
    assert d.replicas == case.replicas, d.reason
    assert math.isclose(d.max_queue_delay_seconds, case.timeout, abs_tol=1e-12), d.reason
    assert case.reason_has in d.reason, d.reason
    assert d.replicas_changed == (case.replicas != case.current.replicas)
    assert d.max_queue_delay_changed == (not math.isclose(case.timeout, case.current.max_queue_delay_seconds))
    assert case.policy.min_replicas <= d.replicas <= case.policy.max_replicas
    assert (d.hold is None) == (d.changed or not d.known), (d.hold, d.reason)


#: The kind of hold (``Decision.hold``, shown as the AutoscalingActive condition's reason) per table case
#: that holds; ``None``: the case acts or its observation is unknown.
HOLDS: dict[str, str | None] = {
    "busy-at-least-one": "AtMaxReplicas",
    "busy-scale-up-cooldown": "ScaleUpCoolingDown",
    "idle-gpu-timeout-cooldown": "MaxQueueDelayCoolingDown",
    "under-timeout-at-max": "TargetMet",
    "under-busy-no-headroom-when-disabled": "TargetMet",
    "busy-scale-up-waits-for-starting-replicas": "ReplicasStarting",
    "busy-backlog-drained-waits-for-window": "BacklogDrained",
    "busy-backlog-drained-at-the-edge": "BacklogDrained",
    "band-upper-edge": "WithinTolerance",
    "band-exact-target": "WithinTolerance",
    "busy-backlog-just-over-the-edge-scales": None,
    "busy-empty-queue-with-requests-executing-scales": None,
    "idle-gpu-cut-timeout": None,
    "nan-p99": None,
    "stale": None,
}


@pytest.mark.parametrize(("case_id", "hold"), HOLDS.items())
def test_autoscale_policy_hold_kind(case_id: str, hold: str | None) -> None:
    case = next(c for c in CASES if c.id == case_id)
    d = decide(case.observation, case.current, case.policy, case.state, case.now)
    assert d.hold == hold, d.reason


def test_autoscale_policy_unknown_keeps_state_and_is_not_known() -> None:
    state = replace(SETTLED, last_scale_up=-5.0, recommendations=((-1.0, 3),))
    d = decide(Observation.unknown("Prometheus unavailable"), Current(3, 0.01), POLICY, state, 0.0)
    assert not d.known and not d.changed
    assert d.state == state


def test_autoscale_policy_records_recommendations_within_window() -> None:
    state = replace(SETTLED, recommendations=((-400.0, 9), (-100.0, 5)))
    d = decide(obs(0.2, 0.5), Current(3, 0.01), POLICY, state, 0.0)
    assert d.state.recommendations == ((-100.0, 5), (0.0, 3))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("min_replicas", 0),
        ("max_replicas", 0),
        ("target_p99_seconds", 0.0),
        ("gpu_high", 0.4),
        ("max_queue_delay_max_seconds", 0.0001),
        ("tolerance", 1.5),
        ("max_queue_delay_decrease_factor", 1.0),
        ("max_scale_up_step", 0),
        ("step_factor", 0.5),
    ],
)
def test_autoscale_policy_rejects_bad_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        replace(POLICY, **{field: value})


def test_autoscale_policy_restore_state_waits_a_window() -> None:
    state = restore_state(now=1000.0, last_scale_up_age=20.0)
    assert state.last_scale_up == 980.0
    d = decide(obs(0.05, 0.0), Current(4, 0.02), POLICY, state, 1000.0)
    assert d.replicas == 4 and "stabilization window" in d.reason
    d2 = decide(obs(0.05, 0.0), Current(4, 0.02), POLICY, d.state, 1300.0)
    assert d2.replicas == 1


def test_autoscale_policy_restore_arrivals() -> None:
    # Ages become times before now, oldest first; samples past the burst memory, NaN or negative are
    # left out; samples the state already holds stay after the history, and history that overlaps them
    # is dropped (no sample twice).
    own = State(arrivals=((995.0, 7.0),))
    history = [(10.0, 3.0), (2000.0, 1.0), (30.0, 2.0), (20.0, NAN), (25.0, -1.0), (4.0, 9.0)]
    state = restore_arrivals(own, history, now=1000.0, policy=POLICY)
    assert state.arrivals == ((970.0, 2.0), (990.0, 3.0), (995.0, 7.0))
    assert restore_arrivals(own, history, now=1000.0, policy=replace(POLICY, burst_headroom=False)) == own


# --------------------------------------------------------------------------------------------------
# Trace-driven runs: a sequence of observations every 15 s, the decision fed back as `current`.


def run_trace(observations: list[Observation], start: Current, policy: Policy = POLICY) -> list[Decision]:
    state, current, out = State(), start, []
    for i, o in enumerate(observations):
        d = decide(o, current, policy, state, now=15.0 * i)
        out.append(d)
        state, current = d.state, Current(d.replicas, d.max_queue_delay_seconds)
    return out


def test_autoscale_policy_trace_overload_then_calm() -> None:
    # 4 ticks overloaded and busy, then 40 ticks (10 min) of calm at low utilization.
    trace = [obs(0.5, 0.95)] * 4 + [obs(0.08, 0.2)] * 40
    ds = run_trace(trace, Current(2, 0.01))
    replicas = [d.replicas for d in ds]
    assert replicas[:4] == [5, 5, 9, 9]  # 2 × 2.5 → 5; cooldown 30 s; 5 × 2.5 capped by step 4 → 9
    # The last high recommendation was at tick 3 (t = 45 s): no scale-in before t = 345 s.
    first_in = next(i for i, d in enumerate(ds) if d.replicas < 9 and i > 3)
    assert 15.0 * first_in >= 45.0 + 300.0
    assert all(r == 9 for r in replicas[2:first_in])
    assert replicas[first_in] == 3  # 9 × 0.2 / 0.65 → 3 (projected utilization 0.6 < 0.8)
    # The trace keeps saying 0.2 busy, so one more window later the recommendation of 1 takes over.
    assert all(r == 3 for r in replicas[first_in:-1])
    assert replicas[-1] == 1 and 15.0 * (len(ds) - 1) >= 15.0 * first_in + 300.0
    # the timeout grows by 1 ms per 15 s cooldown, up to 20 ms, never down while calm
    timeouts = [d.max_queue_delay_seconds for d in ds[4:]]
    assert timeouts == sorted(timeouts) and math.isclose(timeouts[-1], 0.02)


def test_autoscale_policy_trace_self_inflicted_queueing() -> None:
    # P99 over target with idle GPUs: timeout halves each cooldown down to min, then replicas are added.
    trace = [obs(0.4, 0.3)] * 8
    ds = run_trace(trace, Current(2, 0.016))
    timeouts = [round(d.max_queue_delay_seconds * 1000, 3) for d in ds]
    assert timeouts[:5] == [8.0, 4.0, 2.0, 1.0, 1.0]
    assert [d.replicas for d in ds[:4]] == [2, 2, 2, 2]
    assert ds[4].replicas == 4 and "max queue delay at minimum" in ds[4].reason
    assert ds[5].replicas == 4  # scale-up cooldown


def test_autoscale_policy_trace_flapping_input_does_not_flap_replicas() -> None:
    # P99 alternates between the tolerance band and comfortably under: the in-band ticks recommend
    # the current count, so the window's highest recommendation never allows a scale-in.
    trace = [obs(0.21, 0.6) if i % 2 == 0 else obs(0.1, 0.3) for i in range(60)]
    ds = run_trace(trace, Current(3, 0.01))
    assert {d.replicas for d in ds} == {3}
    # Alternating overload and calm: replicas only ever go up (no up/down oscillation).
    trace = [obs(0.3, 0.9) if i % 2 == 0 else obs(0.1, 0.3) for i in range(60)]
    ds = run_trace(trace, Current(3, 0.01))
    replicas = [d.replicas for d in ds]
    assert replicas == sorted(replicas) and replicas[-1] == 10


def test_autoscale_policy_scale_up_cooldown_runs_from_readiness() -> None:
    # Scale-up at t=0; the new replicas are ready only at t=45; the 30 s cooldown runs from there.
    s0 = State(first_seen=-1000.0)
    d0 = decide(obs(0.5, 0.95), Current(2, 0.01, ready_replicas=2), POLICY, s0, 0.0)
    assert d0.replicas == 5
    d1 = decide(obs(0.5, 0.95), Current(5, 0.01, ready_replicas=2), POLICY, d0.state, 30.0)
    assert d1.replicas == 5 and "still starting" in d1.reason
    d2 = decide(obs(0.5, 0.95), Current(5, 0.01, ready_replicas=5), POLICY, d1.state, 45.0)
    assert d2.replicas == 5 and "cooling down" in d2.reason
    d3 = decide(obs(0.5, 0.95), Current(5, 0.01, ready_replicas=5), POLICY, d2.state, 60.0)
    assert d3.replicas == 9


def test_autoscale_policy_trace_prometheus_outage_holds() -> None:
    trace = [obs(0.5, 0.95)] + [Observation.unknown("Prometheus unavailable")] * 10 + [obs(0.5, 0.95)]
    ds = run_trace(trace, Current(2, 0.01))
    assert ds[0].replicas == 5
    assert all(d.replicas == 5 and not d.known for d in ds[1:-1])
    assert ds[-1].replicas == 9 and ds[-1].known
