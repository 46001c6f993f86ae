"""The parts of ``policy.decide``, each on its own: ``check_observation``, ``_over_target``,
``_under_target`` and ``_hold`` (``decide`` itself is table- and trace-tested in test_autoscale_policy)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from kubeinfer.operator.autoscale.policy import (
    READER_REQUIRES,
    Current,
    Observation,
    Policy,
    Problem,
    State,
    Tick,
    check_observation,
    cold_start_timeout,
    decide,
    restore_arrivals,
    restore_state,
    slo_capacity,
)
from kubeinfer.operator.autoscale.policy.capacity import ahead_of_demand as _ahead_of_demand
from kubeinfer.operator.autoscale.policy.plan import burst_base as _burst_base
from kubeinfer.operator.autoscale.policy.reactive import over_target as _over_target
from kubeinfer.operator.autoscale.policy.reactive import under_target as _under_target
from kubeinfer.operator.autoscale.policy.reactive import within_tolerance as _hold

from tests.unit.autoscale.test_autoscale_policy import POLICY, SETTLED

NAN = float("nan")


def tick(obs: Observation, current: Current, state: State = SETTLED, now: float = 0.0) -> Tick:
    checked = check_observation(obs, POLICY.stale_after_seconds)
    assert isinstance(checked, Observation), checked
    return Tick.of(checked, current, POLICY, state, now)


# --- check_observation: the one place values are judged ---------------------------------------------


@pytest.mark.parametrize(
    ("obs", "required", "reason", "words"),
    [
        (Observation.unknown("Prometheus down"), (), "UnusableSignals", "Prometheus down"),
        (Observation(0.1, None), (), "MetricsMissing", "GPU utilization missing"),
        (Observation(None, 0.5, request_rate=3.0), (), "MetricsMissing", "P99 latency missing"),
        (Observation(0.1, 0.5), READER_REQUIRES, "MetricsMissing", "no request-rate data"),
        (Observation(0.1, 0.5, request_rate=1.0), READER_REQUIRES, "MetricsMissing", "no runtime samples"),
        (Observation(NAN, 0.5), (), "InvalidMetrics", "P99 latency is nan"),
        (Observation(-0.1, 0.5), (), "InvalidMetrics", "P99 latency is negative (-0.1)"),
        (Observation(0.1, -0.5), (), "InvalidMetrics", "GPU utilization is negative"),
        (Observation(0.1, 0.5, request_rate=math.inf), (), "InvalidMetrics", "request rate is inf"),
        (Observation(0.1, 0.5, sample_age_seconds=61.0), (), "StaleMetrics", "newest sample 61 s old"),
        (Observation(0.1, 0.5, sample_age_seconds=NAN), (), "StaleMetrics", "stale metrics"),
        (
            Observation(None, 0.0, request_rate=0.0, queue_size=4.0),
            (),
            "UnusableSignals",
            "no request completed in the window while 4 are queued",
        ),
        # an idle service's empty P99 answer is still a missing series to a reader of Prometheus
        (
            Observation(None, 0.0, request_rate=0.0, sample_age_seconds=1.0),
            READER_REQUIRES,
            "MetricsMissing",
            "P99",
        ),
    ],
)
def test_check_observation_problems(
    obs: Observation, required: tuple[str, ...], reason: str, words: str
) -> None:
    problem = check_observation(obs, 60.0, required)
    assert isinstance(problem, Problem)
    assert problem.reason == reason and words in problem.message, problem


def test_check_observation_cleans_what_it_accepts() -> None:
    raw = Observation(
        NAN, 1.3, request_rate=0.0, queue_size=NAN, inflight_requests=-1.0, sample_age_seconds=-2.0
    )
    clean = check_observation(raw, 60.0, READER_REQUIRES)
    assert isinstance(clean, Observation) and clean.idle
    # idle: NaN P99 becomes None; optional signals that are NaN or negative become None (never 0)
    assert (clean.p99_seconds, clean.queue_size, clean.inflight_requests) == (None, None, None)
    assert clean.gpu_utilization == 1.0 and clean.sample_age_seconds == 0.0


def test_check_observation_stale_limit_is_the_setting() -> None:
    obs = Observation(0.1, 0.5, sample_age_seconds=90.0)
    assert isinstance(check_observation(obs, 120.0), Observation)
    assert isinstance(check_observation(obs, 60.0), Problem)


# --- _over_target ------------------------------------------------------------------------------------


def test_over_target_busy_scales_out_by_the_binding_signal() -> None:
    out = _over_target(tick(Observation(0.31, 0.91), Current(3, 0.01)))
    assert (out.replicas, out.max_queue_delay_seconds, out.holds) == (5, 0.01, ())
    assert out.recommendation == 5 and out.last_scale_up == 0.0


def test_over_target_not_busy_halves_the_timeout_first() -> None:
    out = _over_target(tick(Observation(0.3, 0.4), Current(3, 0.01)))
    assert (out.replicas, out.max_queue_delay_seconds, out.last_max_queue_delay_change) == (3, 0.005, 0.0)
    cooling = _over_target(
        tick(Observation(0.3, 0.4), Current(3, 0.01), replace(SETTLED, last_max_queue_delay_change=-5.0))
    )
    assert (cooling.max_queue_delay_seconds, cooling.holds) == (0.01, ("MaxQueueDelayCoolingDown",))


def test_over_target_timeout_at_minimum_adds_replicas() -> None:
    out = _over_target(tick(Observation(0.3, 0.4), Current(2, POLICY.max_queue_delay_min_seconds)))
    assert out.replicas == 3 and "max queue delay at minimum" in out.words


@pytest.mark.parametrize(
    ("current", "state", "hold"),
    [
        (Current(10, 0.01), SETTLED, "AtMaxReplicas"),
        (Current(5, 0.01, ready_replicas=2), SETTLED, "ReplicasStarting"),
        (Current(3, 0.01), replace(SETTLED, last_scale_up=-10.0), "ScaleUpCoolingDown"),
    ],
)
def test_over_target_scale_up_waits(current: Current, state: State, hold: str) -> None:
    out = _over_target(tick(Observation(0.5, 0.95), current, state))
    assert out.replicas == current.replicas and out.holds == (hold,)
    assert out.last_scale_up == state.last_scale_up


def test_over_target_drained_backlog_holds() -> None:
    obs = Observation(0.5, 0.95, request_rate=1000.0, inflight_requests=10.0)
    out = _over_target(tick(obs, Current(3, 0.01)))
    assert out.replicas == 3 and out.holds == ("BacklogDrained",) and "Little's law" in out.words


# --- _under_target -----------------------------------------------------------------------------------


def test_under_target_scales_in_to_the_window_max_and_grows_the_timeout() -> None:
    state = replace(SETTLED, recommendations=((-200.0, 3), (-100.0, 2)))
    out = _under_target(tick(Observation(0.1, 0.1), Current(6, 0.005), state))
    assert (out.replicas, out.last_scale_down) == (3, 0.0)
    assert math.isclose(out.max_queue_delay_seconds, 0.006) and out.last_max_queue_delay_change == 0.0
    assert out.recommendation == 1  # this tick's own recommendation: 6 x 0.1 / 0.65 → 1


def test_under_target_waits_for_the_stabilization_window() -> None:
    out = _under_target(tick(Observation(0.1, 0.1), Current(4, 0.02), State(first_seen=-100.0)))
    assert out.replicas == 4 and out.holds == ("StabilizationWindow", "TargetMet")


def test_under_target_busy_adds_headroom() -> None:
    out = _under_target(tick(Observation(0.1, 0.85), Current(4, 0.02)))
    assert out.replicas == 5 and out.recommendation == 5 and out.last_scale_up == 0.0


def test_under_target_nothing_to_change() -> None:
    out = _under_target(tick(Observation(0.1, 0.3), Current(1, 0.02)))
    assert (out.replicas, out.max_queue_delay_seconds, out.holds) == (1, 0.02, ("TargetMet",))
    assert out.words.endswith("nothing to change")


# --- _hold ---------------------------------------------------------------------------------------------


def test_hold_within_tolerance_changes_nothing() -> None:
    state = replace(SETTLED, last_scale_up=-100.0, last_max_queue_delay_change=-50.0)
    out = _hold(tick(Observation(0.21, 0.95), Current(3, 0.01), state))
    assert (out.replicas, out.max_queue_delay_seconds, out.recommendation) == (3, 0.01, 3)
    assert out.holds == ("WithinTolerance",)
    assert (out.last_scale_up, out.last_max_queue_delay_change) == (-100.0, -50.0)


# --- the SLO-capacity rule (what only kubeinfer sees: arrival rate, in-flight requests, s(b)) -------


# s(b) = 4 ms + 0.75 ms * b, B = 32, target 120 ms: b* = 32, full-batch throughput 32 / 28 ms.
A, C, B = 0.004, 0.00075, 32.0
MODEL = Policy(
    min_replicas=1,
    max_replicas=12,
    target_p99_seconds=0.12,
    max_queue_delay_min_seconds=0.001,
    max_queue_delay_max_seconds=0.05,
    stale_after_seconds=60,
)
FULL = 32 / (A + C * 32)  # 1142.9 requests/s


def seen(p99: float, gpu: float, arrivals: float, inflight: float = 0.0, **kw: float) -> Observation:
    return Observation(
        p99,
        gpu,
        request_rate=kw.pop("rate", arrivals),
        queue_size=0.0,
        inflight_requests=inflight,
        arrival_rate=arrivals,
        service_time_a_seconds=A,
        service_time_c_seconds=C,
        max_batch_size=B,
        **kw,
    )


def test_slo_capacity_is_nexus_bound() -> None:
    # timeout + 2 s(b) <= target: (0.12 - 0.005) / 2 = 57.5 ms → b <= 71 → B = 32 binds
    assert slo_capacity(A, C, 32, 0.12, 0.005) == (32, pytest.approx(FULL))
    # a tight target: (0.03 - 0.001) / 2 - 0.004 = 10.5 ms → b = 14
    b, rate = slo_capacity(A, C, 32, 0.03, 0.001)
    assert b == 14 and rate == pytest.approx(14 / (A + C * 14))
    assert slo_capacity(A, C, 32, 0.008, 0.001) == (0, 0.0)  # not even one row meets it
    # the longest timeout at which a full batch still meets 120 ms: 120 - 2 * 28 = 64 ms, bounded
    assert cold_start_timeout(A, C, 32, 0.12, (0.001, 0.05)) == 0.05
    assert cold_start_timeout(A, C, 32, 0.08, (0.001, 0.05)) == pytest.approx(0.024)


def test_capacity_rule_scales_ahead_of_the_p99() -> None:
    # P99 still fine (40 ms) but 3000/s arrive: 3000 / (0.85 x 1142.9) = 3.09 → 4 replicas now.
    d = decide(seen(0.04, 0.5, 3000.0), Current(2, 0.02, ready_replicas=2), MODEL, SETTLED, 0.0)
    assert d.replicas == 4 and "demand 3000/s needs 4 replicas" in d.reason
    t = Tick.of(seen(0.04, 0.5, 3000.0), Current(2, 0.02, ready_replicas=2), MODEL, SETTLED, 0.0)
    out = _ahead_of_demand(t)
    assert (out.replicas, out.recommendation, out.last_scale_up) == (4, 4, 0.0)


def test_capacity_rule_counts_the_batches_a_replicas_instances_run_at_once() -> None:
    # 3000/s at 85 % of 1142.9/s: 4 replicas of one instance (surge floor off). Two instances measured
    # running 1.9 batches at once (separate CPU cores, s(b) as measured): 2171.4/s a replica, 3000 /
    # (0.85 x 2171.4) → 2.
    policy = replace(MODEL, surge_factor=1.0)
    now = Current(1, 0.02)
    two = decide(seen(0.04, 0.5, 3000.0, instance_concurrency=1.9), now, policy, SETTLED, 0.0)
    assert two.replicas == 2 and "of 2171/s each" in two.reason, two.reason
    # unknown, or under 1 (no overlap: one instance's worth), as with one instance
    for overlap in (None, 1.0, 0.5):
        obs = seen(0.04, 0.5, 3000.0, instance_concurrency=overlap)  # type: ignore[arg-type]
        assert decide(obs, now, policy, SETTLED, 0.0).replicas == 4
    # on a GPU the instances share the device: overlapping batches take twice as long each, so the
    # measured s(b) doubles and the product is one instance's capacity again
    shared = replace(
        seen(0.04, 0.5, 3000.0, instance_concurrency=2.0),
        service_time_a_seconds=2 * A,
        service_time_c_seconds=2 * C,
    )
    assert decide(shared, now, policy, SETTLED, 0.0).replicas == 4


def test_capacity_rule_no_cooldown_and_counts_starting_replicas() -> None:
    # Scaled up 10 s ago, 2 of 4 still starting: 4 cover 3000/s, nothing more; 5000/s needs 6 now.
    state = replace(SETTLED, last_scale_up=-10.0)
    held = decide(seen(0.04, 0.9, 3000.0), Current(4, 0.05, ready_replicas=2), MODEL, state, 0.0)
    assert held.replicas == 4
    more = decide(seen(0.04, 0.9, 5000.0), Current(4, 0.05, ready_replicas=2), MODEL, state, 0.0)
    assert more.replicas == 6


def test_capacity_rule_backlog_adds_demand() -> None:
    # 1800/s arrive: 2 replicas (surge floor off). With 6000 requests in the service, drained over
    # 30 s, the demand is 2000/s → 3.
    policy = replace(MODEL, surge_factor=1.0)
    assert decide(seen(0.04, 0.5, 1800.0), Current(1, 0.02), policy, SETTLED, 0.0).replicas == 2
    d = decide(seen(2.0, 1.0, 1800.0, inflight=6000.0), Current(1, 0.02), policy, SETTLED, 0.0)
    assert d.replicas == 3 and "demand 2000/s" in d.reason


def test_capacity_rule_surge_floor() -> None:
    # 700/s needs 1 replica at the SLO, but a small fleet keeps room for a x5 surge: 3500 / 1142.9 → 4,
    # at most surge_max_replicas (3).
    t = tick_model(seen(0.04, 0.3, 700.0), Current(1, 0.02))
    assert t.needed == 3
    # below the cap the floor is the surge itself: 400/s x 5 = 2000/s → 2 replicas
    assert tick_model(seen(0.04, 0.3, 400.0), Current(1, 0.02)).needed == 2
    # the floor stops at surge_max_replicas (3): 2000/s x 5 would be 9
    assert tick_model(seen(0.04, 0.3, 2000.0), Current(1, 0.02)).needed == 3
    assert tick_model(seen(0.04, 0.3, 700.0), Current(1, 0.02), replace(MODEL, surge_factor=1.0)).needed == 1


def test_capacity_rule_scale_in_goes_to_the_model_count() -> None:
    # Calm for a whole window at 700/s with 6 replicas: scale in to the surge floor 3, not by utilization.
    d = decide(seen(0.03, 0.1, 700.0), Current(6, 0.05), MODEL, SETTLED, 0.0)
    assert d.replicas == 3


def test_scale_in_waits_while_the_arrivals_rise() -> None:
    # Calm for a whole window with 6 replicas; 2000/s needs 3. The arrival rate rose from 1000/s since
    # the last tick (over the 10 % tolerance), and one more tick on that rise (3000/s) needs 4: the
    # scale-in to 3 waits, else one reaction time later it would be undone (a flap).
    rising = replace(SETTLED, arrivals=((-15.0, 1000.0),))
    d = decide(seen(0.03, 0.3, 2000.0), Current(6, 0.05), MODEL, rising, 0.0)
    assert d.replicas == 6 and d.hold == "ArrivalsRising", d.reason
    assert "arrivals rising (1000 → 2000/s, 3000/s next tick needs more than 3)" in d.reason
    # within the tolerance (1900 → 2000/s), or the last sample older than one reaction time: scale in
    for arrivals in (((-15.0, 1900.0),), ((-90.0, 1000.0),)):
        state = replace(SETTLED, arrivals=arrivals)
        assert decide(seen(0.03, 0.3, 2000.0), Current(6, 0.05), MODEL, state, 0.0).replicas == 3
    # a rise that needs no more replicas (noise on a small rate, 0 → 0.5/s) does not hold a scale-in
    small = replace(SETTLED, arrivals=((-15.0, 0.0),))
    assert decide(seen(0.03, 0.1, 0.5), Current(6, 0.05), MODEL, small, 0.0).replicas == 1
    # without s(b) the rise alone holds the scale-in
    bare = replace(seen(0.03, 0.1, 2000.0), service_time_a_seconds=None)
    assert decide(bare, Current(6, 0.05), MODEL, rising, 0.0).hold == "ArrivalsRising"


def test_capacity_rule_over_target_busy_adds_one_not_the_ratio() -> None:
    # P99 8x target, busy, demand covered by 4 replicas: +1 (the reactive law would go to 8).
    obs = seen(1.0, 0.95, 3000.0, inflight=3000.0)
    d = decide(obs, Current(4, 0.05, ready_replicas=4), MODEL, SETTLED, 0.0)
    assert d.replicas == 5 and "demand covered" in d.reason
    reactive = decide(
        obs, Current(4, 0.05, ready_replicas=4), replace(MODEL, capacity_rule=False), SETTLED, 0.0
    )
    assert reactive.replicas == 8


def test_capacity_rule_drained_backlog_uses_half_the_target() -> None:
    # 100 in flight at 3000/s: 33 ms by Little's law < 60 ms (half of 120 ms): history, hold.
    d = decide(
        seen(1.0, 0.95, 3000.0, inflight=100.0), Current(4, 0.05, ready_replicas=4), MODEL, SETTLED, 0.0
    )
    assert d.replicas == 4 and d.hold == "BacklogDrained"


def test_capacity_rule_keep_in_band_defers_to_the_model() -> None:
    # Under target and GPUs over the band: the reactive law adds headroom, the capacity rule already
    # planned it (4 replicas for 3000/s at 85 %), so nothing is added.
    obs = seen(0.04, 0.9, 3000.0)
    assert decide(obs, Current(4, 0.05), MODEL, SETTLED, 0.0).replicas == 4
    assert decide(obs, Current(4, 0.05), replace(MODEL, capacity_rule=False), SETTLED, 0.0).replicas == 5


def test_cold_start_lengthens_the_max_queue_delay() -> None:
    # 3000/s on 2 ready replicas (2286/s at full batches): add 2 and, while they start, lengthen
    # the max queue delay to the longest at which a full batch meets the SLO (bounded at 50 ms).
    d = decide(seen(0.04, 0.9, 3000.0), Current(2, 0.005, ready_replicas=2), MODEL, SETTLED, 0.0)
    assert d.replicas == 4 and d.max_queue_delay_seconds == 0.05 and "cold start" in d.reason
    off = replace(MODEL, cold_start_timeout=False)
    assert (
        decide(
            seen(0.04, 0.9, 3000.0), Current(2, 0.005, ready_replicas=2), off, SETTLED, 0.0
        ).max_queue_delay_seconds
        == 0.005
    )
    # ready capacity enough: no lengthening
    d = decide(seen(0.04, 0.3, 1500.0), Current(2, 0.005, ready_replicas=2), MODEL, SETTLED, 0.0)
    assert d.max_queue_delay_seconds < 0.05


def test_capacity_rule_off_without_s_of_b() -> None:
    # Without the runtime's s(b) the rule cannot count: the reactive law decides (in the band: hold).
    obs = replace(seen(0.12, 0.5, 3000.0), service_time_c_seconds=None)
    d = decide(obs, Current(2, 0.02), MODEL, SETTLED, 0.0)
    assert d.replicas == 2 and d.hold == "WithinTolerance"


def tick_model(obs: Observation, current: Current, policy: Policy = MODEL) -> Tick:
    checked = check_observation(obs, policy.stale_after_seconds)
    assert isinstance(checked, Observation)
    return Tick.of(checked, current, policy, SETTLED, 0.0)


# --- burst headroom (headroom.burst_factor inside the capacity rule) -----------------------------------


def bursty_history(base: float, ratio: float, n: int = 60) -> State:
    """``n`` arrival samples 15 s apart ending 15 s before 0: ``base`` with 30 s bursts of ``ratio``
    every 3 minutes (the last sample off-burst)."""
    rates = [base * ratio if i % 12 in (6, 7) else base for i in range(n)]
    return replace(SETTLED, arrivals=tuple(((i - n) * 15.0, r) for i, r in enumerate(rates)))


def test_burst_headroom_provisions_for_the_learned_burst() -> None:
    # 2500/s needs 3 replicas at 85 % of 1142.9/s; x1.8 bursts recur: 4500/s at full capacity → 4.
    state = bursty_history(2500.0, 1.8)
    obs = seen(0.04, 0.5, 2500.0)
    t = Tick.of(obs, Current(3, 0.02, ready_replicas=3), MODEL, state, 0.0)
    assert t.burst is not None and t.burst.factor == pytest.approx(1.8)
    assert t.needed == 4
    d = decide(obs, Current(3, 0.02, ready_replicas=3), MODEL, state, 0.0)
    assert d.replicas == 4
    off = replace(MODEL, burst_headroom=False)
    assert decide(obs, Current(3, 0.02, ready_replicas=3), off, state, 0.0).replicas == 3
    # steady traffic learns nothing: the same rate keeps 3
    steady = replace(SETTLED, arrivals=tuple((i * 15.0 - 900.0, 2500.0) for i in range(60)))
    assert decide(obs, Current(3, 0.02, ready_replicas=3), MODEL, steady, 0.0).replicas == 3


def test_burst_headroom_does_not_count_a_burst_in_progress_twice() -> None:
    # Now inside a x1.8 burst (4500/s over a 2500/s floor): the headroom stands on the floor
    # (1.8 x 2500 = 4500/s → 4 replicas at full capacity), and the demand itself wants 4500 / (0.85 x
    # 1142.9) → 5; 1.8 x 4500/s would have asked for 8.
    state = bursty_history(2500.0, 1.8)
    t = Tick.of(seen(0.04, 0.9, 4500.0), Current(4, 0.02, ready_replicas=4), MODEL, state, 0.0)
    assert t.needed == 5


def test_learned_bursts_replace_the_surge_floor() -> None:
    # 400/s: the surge prior keeps 2 replicas (x5 → 2000/s) until enough rises are learned; a steady
    # history of 60 samples (52 rises) learns factor 1, and 1 replica serves 400/s.
    fresh = Tick.of(seen(0.04, 0.2, 400.0), Current(1, 0.02), MODEL, SETTLED, 0.0)
    assert fresh.needed == 2
    steady = replace(SETTLED, arrivals=tuple((i * 15.0 - 900.0, 400.0) for i in range(60)))
    learned = Tick.of(seen(0.04, 0.2, 400.0), Current(1, 0.02), MODEL, steady, 0.0)
    assert learned.burst is not None and learned.burst.rises >= MODEL.burst_min_samples
    assert learned.needed == 1
    # a short history is not enough evidence: the prior stays
    short = replace(SETTLED, arrivals=tuple((i * 15.0 - 300.0, 400.0) for i in range(20)))
    assert Tick.of(seen(0.04, 0.2, 400.0), Current(1, 0.02), MODEL, short, 0.0).needed == 2


def failover_history(now: float = 0.0) -> State:
    """3000/s for 10 minutes, then 800/s for 5, 15 s apart, ending 15 s before ``now``."""
    rates = [3000.0] * 40 + [800.0] * 20
    return replace(SETTLED, arrivals=tuple((now + (i - 60) * 15.0, r) for i, r in enumerate(rates)))


def test_the_hold_survives_an_operator_restart() -> None:
    # the restarted operator reads the arrival history back from Prometheus: the hold stands at once
    obs = seen(0.04, 0.2, 800.0)
    history = [(-when, r) for when, r in failover_history().arrivals]
    restored = restore_arrivals(restore_state(now=0.0), history, now=0.0, policy=MODEL)
    t = Tick.of(obs, Current(3, 0.02, ready_replicas=3), MODEL, restored, 0.0)
    assert t.needed == 3 and "held for the 3000/s" in t.needed_why
    # without it (a fresh state) only the surge prior stands: x5 of 800/s, capped at 3 replicas
    fresh = Tick.of(obs, Current(3, 0.02, ready_replicas=3), MODEL, restore_state(now=0.0), 0.0)
    assert fresh.burst is not None and fresh.burst.left_level is None


def test_a_short_stabilization_window_does_not_flap_on_the_drop() -> None:
    # With no stabilization window a drop used to scale in at once and out again when the hold was
    # learned a reaction time later: the drop now counts from its first sample, so the fleet stays.
    policy = replace(MODEL, scale_down_stabilization_seconds=0.0, scale_down_cooldown_seconds=0.0)
    state = replace(SETTLED, arrivals=tuple(((i - 40) * 15.0, 3000.0) for i in range(40)))
    replicas, history = 3, []
    for k in range(8):  # 800/s from now on, for two minutes
        d = decide(
            seen(0.04, 0.2, 800.0), Current(replicas, 0.02, ready_replicas=replicas), policy, state, k * 15.0
        )
        replicas, state = d.replicas, d.state
        history.append(replicas)
    assert history == [3] * 8, history


def test_the_reason_names_what_keeps_the_replicas() -> None:
    # min_replicas 3 keeps 3 at 800/s: the step floor (2) is not what keeps them, so no words for it
    steady = replace(SETTLED, arrivals=tuple((i * 15.0 - 900.0, 800.0) for i in range(60)))
    floor3 = replace(MODEL, min_replicas=3)
    t = Tick.of(seen(0.04, 0.2, 800.0), Current(3, 0.02, ready_replicas=3), floor3, steady, 0.0)
    assert t.needed == 3 and t.needed_why == ""
    d = decide(seen(0.04, 0.2, 800.0), Current(3, 0.02, ready_replicas=3), floor3, steady, 0.0)
    assert "keeps" not in d.reason and "step floor" not in d.reason, d.reason
    # max_replicas 2 caps the hold of a 3000/s level: the cap, not the hold, sets the count
    cap2 = replace(MODEL, max_replicas=2)
    t = Tick.of(seen(0.04, 0.2, 800.0), Current(2, 0.02, ready_replicas=2), cap2, failover_history(), 0.0)
    assert t.needed == 2 and "held for the 3000/s" in t.needed_why  # the hold asks for it, capped
    t = Tick.of(seen(0.04, 0.9, 2400.0), Current(2, 0.02, ready_replicas=2), cap2, failover_history(), 0.0)
    assert t.needed == 2 and t.needed_why == ""  # the demand alone reaches the cap


def test_a_small_fleet_keeps_a_step_floor_once_learned() -> None:
    # Learned steady traffic at 800/s: the demand alone needs 1 replica (800 / (0.85 x 1142.9)), but a
    # step (a level shift, never learned as a burst) of x1.5 would overload it for a cold start: the
    # small fleet keeps x2.5 of its floor at full capacity, 2000 / 1142.9 → 2 replicas, and says so.
    steady = replace(SETTLED, arrivals=tuple((i * 15.0 - 900.0, 800.0) for i in range(60)))
    obs = seen(0.04, 0.2, 800.0)
    t = Tick.of(obs, Current(1, 0.02, ready_replicas=1), MODEL, steady, 0.0)
    assert t.burst is not None and t.burst.rises >= MODEL.burst_min_samples and t.burst.factor == 1.0
    assert t.needed == 2 and t.needed_why == " (x2.5 step floor)"
    d = decide(obs, Current(1, 0.02, ready_replicas=1), MODEL, steady, 0.0)
    assert d.replicas == 2 and "(x2.5 step floor)" in d.reason
    assert Tick.of(obs, Current(1, 0.02), replace(MODEL, step_factor=1.0), steady, 0.0).needed == 1
    # it is a small fleet's floor: at 2500/s (x2.5 would be 6 replicas) it stops at surge_max_replicas
    big = replace(SETTLED, arrivals=tuple((i * 15.0 - 900.0, 2500.0) for i in range(60)))
    assert Tick.of(seen(0.04, 0.5, 2500.0), Current(3, 0.02), MODEL, big, 0.0).needed == 3


def test_arrival_samples_are_kept_for_the_memory_only() -> None:
    policy = replace(MODEL, burst_memory_seconds=60.0)
    state = replace(SETTLED, arrivals=((-90.0, 100.0), (-45.0, 200.0)))
    d = decide(seen(0.04, 0.2, 300.0), Current(1, 0.02), policy, state, 0.0)
    assert d.state.arrivals == ((-45.0, 200.0), (0.0, 300.0))
    # an unknown arrival rate adds no sample; an unknown observation keeps the state as it was
    no_rate = replace(seen(0.04, 0.2, 300.0), arrival_rate=None)
    assert decide(no_rate, Current(1, 0.02), policy, state, 0.0).state.arrivals == ((-45.0, 200.0),)
    held = decide(Observation.unknown("Prometheus down"), Current(1, 0.02), policy, state, 0.0)
    assert held.state.arrivals == state.arrivals
    # the headroom off: only one reaction time of samples is kept (the rising-arrivals check reads
    # the last one), whatever the burst memory
    off = replace(policy, burst_headroom=False, burst_memory_seconds=1800.0, burst_lead_seconds=60.0)
    assert decide(seen(0.04, 0.2, 300.0), Current(1, 0.02), off, state, 0.0).state.arrivals == (
        (-45.0, 200.0),
        (0.0, 300.0),
    )


def test_burst_base_trend_and_burst() -> None:
    # flat: the demand itself; rising from the floor (not yet halfway to a x1.8 burst): carried one
    # reaction time ahead, 1200 + (1200 - 1000); inside a burst: the floor under it
    assert _burst_base(1000.0, 1000.0, 1.8) == 1000.0
    assert _burst_base(1200.0, 1000.0, 1.8) == 1400.0
    assert _burst_base(1600.0, 1000.0, 1.8) == 1000.0


def test_inside_a_burst_the_headroom_stands_on_the_lowest_reading_of_the_lead() -> None:
    # The burst-headroom e2e's scale-in, replayed on its figures: min 3, max 4 replicas, s(b) = 34.75 ms
    # x b (28.8/s per replica at full batches of 8), a level of 48.7/s with x1.95 bursts of 30 s every
    # 4 minutes learned, and a live x1.4 burst read at 65/s. On the level, 65/s is under halfway to x1.95
    # (71.8/s): a rise carried ahead, 2 x 65 - 48.7 = 81.3/s, x1.95 → 4 replicas kept. One reading of the
    # last minute at 43.8/s (10 % under the level, the arrival rate's irate noise) is the floor: 65/s is
    # over halfway from it, inside a burst, and the headroom stands on it, 1.95 x 43.8 = 85.5/s, which
    # 3 replicas serve (86.3/s): the bursts are still learned and the count is three.
    policy = Policy(
        min_replicas=3,
        max_replicas=4,
        target_p99_seconds=1.0,
        gpu_low=0.05,
        gpu_high=0.95,
        max_queue_delay_min_seconds=0.005,
        max_queue_delay_max_seconds=0.02,
        scale_down_stabilization_seconds=30,
        scale_up_cooldown_seconds=4,
        scale_down_cooldown_seconds=5,
        max_queue_delay_cooldown_seconds=10,
        stale_after_seconds=20,
    )
    obs = Observation(
        0.42,
        0.61,
        request_rate=68.2,
        queue_size=2.0,
        inflight_requests=8.0,
        sample_age_seconds=1.0,
        arrival_rate=65.0,
        service_time_a_seconds=0.0,
        service_time_c_seconds=0.0347498,
        max_batch_size=8,
    )

    def past_burst(age: int) -> bool:
        return 300 < age < 1740 and (age - 300) % 240 < 30

    def history(dip: float) -> list[tuple[float, float]]:
        """5 s samples of the last 30 minutes: the level, the past's bursts, the live burst's last 25 s
        and, 40 s ago, one reading ``dip`` x the level."""
        level = 48.7
        return [
            (age, level * (1.4 if age <= 25 else dip if age == 40 else 1.95 if past_burst(age) else 1.0))
            for age in range(5, 1800, 5)
        ]

    four = Current(4, 0.02, ready_replicas=4)
    for dip, replicas in ((1.0, 4), (0.9, 3)):
        state = restore_arrivals(SETTLED, history(dip), now=0.0, policy=policy)
        t = Tick.of(obs, four, policy, state, 0.0)
        assert t.burst is not None and t.burst.factor == pytest.approx(1.95) and t.burst.bursts == 6
        assert t.burst.level == pytest.approx(48.7 * dip)
        assert t.needed == replicas, (dip, t.needed)
        assert decide(obs, four, policy, state, 0.0).replicas == replicas
    # A replay in a fresh State (a restarted controller: first_seen unknown) never scales in: it waits
    # for a first stabilization window. Comparing a running operator's scale-in with it needs first_seen.
    fresh = restore_arrivals(State(), history(0.9), now=0.0, policy=policy)
    held = decide(obs, four, policy, fresh, 0.0)
    assert held.replicas == 4 and "stabilization window" in held.reason, held.reason


def test_burst_headroom_stands_on_the_arrivals_not_on_a_backlog_draining() -> None:
    # Just after a burst the replicas complete 2700/s (the backlog draining) while 2000/s arrive. The
    # headroom is x1.8 of what arrives: 3600/s at full capacity → 4. Standing on the completions (the
    # first design) it was x1.8 of 2700/s carried ahead on its rise from the 2000/s floor, 6120/s → 6,
    # held for the stabilization window. Draining the backlog is the demand's part: 2700/s at 85 % → 3.
    state = bursty_history(2000.0, 1.8)
    t = Tick.of(seen(0.04, 0.9, 2000.0, rate=2700.0), Current(4, 0.02, ready_replicas=4), MODEL, state, 0.0)
    assert t.burst is not None and t.burst.factor == pytest.approx(1.8)
    assert t.needed == 4


def test_surge_prior_stands_on_the_floor() -> None:
    # A short history (the prior applies): 400/s for the last minute, 800/s now. x5 of 800/s would be
    # 3 replicas; the prior stands on the floor, 400/s: 2000 / 1142.9 → 2.
    state = replace(SETTLED, arrivals=((-45.0, 400.0), (-30.0, 400.0), (-15.0, 400.0)))
    t = Tick.of(seen(0.04, 0.3, 800.0), Current(1, 0.02), MODEL, state, 0.0)
    assert t.burst is not None and t.burst.rises < MODEL.burst_min_samples and t.burst.level == 400.0
    assert t.needed == 2


def test_drained_backlog_recommends_what_the_demand_needs() -> None:
    # P99 over target from a backlog that has drained (Little's law), 6 replicas, 1500/s: the hold
    # recommends the capacity rule's count (2 for 1500/s at 85 %, the x5 surge prior capped at 3),
    # so the stabilization window starts counting down now, not when the window's P99 catches up.
    t = tick_model(seen(1.0, 0.3, 1500.0, inflight=20.0), Current(6, 0.05, ready_replicas=6))
    out = _over_target(t)
    assert out.replicas == 6 and out.holds == ("BacklogDrained",) and out.recommendation == 3


def test_decision_says_what_set_the_count() -> None:
    state = bursty_history(2500.0, 1.8)
    d = decide(seen(0.04, 0.5, 2500.0), Current(3, 0.02, ready_replicas=3), MODEL, state, 0.0)
    assert "burst headroom x1.80 learned from" in d.reason and "3 → 4 replicas" in d.reason
    d = decide(seen(0.04, 0.3, 700.0), Current(1, 0.02), MODEL, SETTLED, 0.0)
    assert "(x5 surge prior)" in d.reason and "1 → 3 replicas" in d.reason
    d = decide(seen(0.04, 0.5, 3000.0), Current(2, 0.02, ready_replicas=2), MODEL, SETTLED, 0.0)
    assert "each: 2 → 4 replicas" in d.reason  # the demand itself: no note


def test_a_level_left_suddenly_is_held_for_its_return() -> None:
    # 3000/s for 10 minutes, then 800/s for 5 (a failover to another region): 800/s alone needs 1
    # replica, but the 3000/s that left within one reaction time can return as fast, faster than a cold
    # start: its replicas at full SLO capacity (3000 / 1142.9 → 3) are held for the burst memory.
    rates = [3000.0] * 40 + [800.0] * 20
    state = replace(SETTLED, arrivals=tuple(((i - 60) * 15.0, r) for i, r in enumerate(rates)))
    obs = seen(0.04, 0.2, 800.0)
    t = Tick.of(obs, Current(3, 0.02, ready_replicas=3), MODEL, state, 0.0)
    assert t.burst is not None and t.burst.left_level == 3000.0
    assert t.needed == 3 and "held for the 3000/s the traffic left suddenly" in t.needed_why
    d = decide(obs, Current(3, 0.02, ready_replicas=3), MODEL, state, 0.0)
    assert d.replicas == 3 and "keeps 3 replicas (held for the 3000/s" in d.reason, d.reason
    # a fleet scaled in by someone else is brought back up, saying why
    up = decide(obs, Current(1, 0.02, ready_replicas=1), MODEL, state, 0.0)
    assert up.replicas == 3 and "held for the 3000/s the traffic left suddenly" in up.reason, up.reason
    # the hold off, the demand and the small fleet's step floor decide (x2.5 of 800/s at full capacity,
    # 2000 / 1142.9 → 2): scale-in to 2
    off = replace(MODEL, hold_left_level=False)
    assert decide(obs, Current(3, 0.02, ready_replicas=3), off, state, 0.0).replicas == 2
    # once the drop is older than the burst memory, its samples are gone and so is the hold
    short = replace(MODEL, burst_memory_seconds=240.0)
    later = decide(obs, Current(3, 0.02, ready_replicas=3), short, state, 0.0).state
    assert later.arrivals[0][0] > -315.0  # the last 3000/s sample, t = -315 s, is dropped
    t = Tick.of(obs, Current(3, 0.02, ready_replicas=3), short, later, 15.0)
    assert t.burst is not None and t.burst.left_level is None and "held" not in t.needed_why
    # a decline over 10 minutes is followed down: nothing is held
    gradual = [3000.0] * 10 + [3000.0 - 55.0 * i for i in range(40)] + [800.0] * 10
    glide = replace(SETTLED, arrivals=tuple(((i - 60) * 15.0, r) for i, r in enumerate(gradual)))
    assert decide(obs, Current(3, 0.02, ready_replicas=3), MODEL, glide, 0.0).replicas == 2
