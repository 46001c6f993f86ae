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
    Problem,
    State,
    Tick,
    _hold,
    _over_target,
    _under_target,
    check_observation,
)

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
    assert (out.replicas, out.batch_timeout, out.holds) == (5, 0.01, ())
    assert out.recommendation == 5 and out.last_scale_up == 0.0


def test_over_target_not_busy_halves_the_timeout_first() -> None:
    out = _over_target(tick(Observation(0.3, 0.4), Current(3, 0.01)))
    assert (out.replicas, out.batch_timeout, out.last_timeout_change) == (3, 0.005, 0.0)
    cooling = _over_target(
        tick(Observation(0.3, 0.4), Current(3, 0.01), replace(SETTLED, last_timeout_change=-5.0))
    )
    assert (cooling.batch_timeout, cooling.holds) == (0.01, ("BatchTimeoutCoolingDown",))


def test_over_target_timeout_at_minimum_adds_replicas() -> None:
    out = _over_target(tick(Observation(0.3, 0.4), Current(2, POLICY.batch_timeout_min_seconds)))
    assert out.replicas == 3 and "batch timeout at minimum" in out.words


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
    assert math.isclose(out.batch_timeout, 0.006) and out.last_timeout_change == 0.0
    assert out.recommendation == 1  # this tick's own recommendation: 6 x 0.1 / 0.65 → 1


def test_under_target_waits_for_the_stabilization_window() -> None:
    out = _under_target(tick(Observation(0.1, 0.1), Current(4, 0.02), State(first_seen=-100.0)))
    assert out.replicas == 4 and out.holds == ("StabilizationWindow", "TargetMet")


def test_under_target_busy_adds_headroom() -> None:
    out = _under_target(tick(Observation(0.1, 0.85), Current(4, 0.02)))
    assert out.replicas == 5 and out.recommendation == 5 and out.last_scale_up == 0.0


def test_under_target_nothing_to_change() -> None:
    out = _under_target(tick(Observation(0.1, 0.3), Current(1, 0.02)))
    assert (out.replicas, out.batch_timeout, out.holds) == (1, 0.02, ("TargetMet",))
    assert out.words.endswith("nothing to change")


# --- _hold ---------------------------------------------------------------------------------------------


def test_hold_within_tolerance_changes_nothing() -> None:
    state = replace(SETTLED, last_scale_up=-100.0, last_timeout_change=-50.0)
    out = _hold(tick(Observation(0.21, 0.95), Current(3, 0.01), state))
    assert (out.replicas, out.batch_timeout, out.recommendation) == (3, 0.01, 3)
    assert out.holds == ("WithinTolerance",)
    assert (out.last_scale_up, out.last_timeout_change) == (-100.0, -50.0)
