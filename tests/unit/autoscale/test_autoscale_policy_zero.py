"""Scale to zero in the pure policy (``policy.zero``): an idle run of ``idle_after_seconds`` takes the
replicas to 0, anything else ends the run, and at 0 ``decide`` holds. Trace-driven: ``decide`` is
called tick after tick with the state it returned, as the autoscaler's loop does."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kubeinfer.operator.autoscale.policy import Current, Decision, Observation, Policy, State, decide

from tests.unit.autoscale.test_autoscale_policy import POLICY, SETTLED

ZERO = replace(POLICY, idle_after_seconds=300.0)
TICK = 15.0
IDLE = Observation(None, 0.0, request_rate=0.0, queue_size=0.0, inflight_requests=0.0)
BUSY = Observation(0.05, 0.3, request_rate=4.0, queue_size=0.0, inflight_requests=1.0)
UNKNOWN = Observation.unknown("Prometheus down")


def run(trace: list[Observation], policy: Policy = ZERO, replicas: int = 1) -> list[Decision]:
    """``decide`` on one observation per tick, ``TICK`` seconds apart, carrying replicas and state."""
    state, current, decisions = SETTLED, Current(replicas, 0.005, ready_replicas=replicas), []
    for i, observation in enumerate(trace):
        decision = decide(observation, current, policy, state, i * TICK)
        decisions.append(decision)
        state = decision.state
        current = Current(
            decision.replicas, decision.max_queue_delay_seconds, ready_replicas=decision.replicas
        )
    return decisions


def first_zero(decisions: list[Decision]) -> int | None:
    return next((i for i, d in enumerate(decisions) if d.replicas == 0), None)


def test_an_idle_service_goes_to_zero_after_its_window_and_not_before() -> None:
    decisions = run([IDLE] * 30)
    # the run starts on tick 0; 300 s later is tick 20
    assert first_zero(decisions) == 20
    assert all(d.replicas == 1 for d in decisions[:20])
    assert decisions[20].replicas_changed and "no requests for 300 s" in decisions[20].reason
    assert "1 → 0 replicas" in decisions[20].reason


def test_at_zero_the_autoscaler_holds_whatever_it_observes() -> None:
    decisions = run([IDLE] * 21 + [BUSY, UNKNOWN, IDLE])
    assert [d.replicas for d in decisions[20:]] == [0, 0, 0, 0]
    assert all(d.hold == "ScaledToZero" and d.known for d in decisions[21:])
    assert all(not d.replicas_changed for d in decisions[21:])


@pytest.mark.parametrize(
    ("interruption", "why"),
    [
        (BUSY, "a request completed"),
        (replace(IDLE, queue_size=2.0), "requests queued (a stuck service is not idle)"),
        (replace(IDLE, inflight_requests=1.0), "a request in flight"),
        (UNKNOWN, "unknown signals"),
    ],
)
def test_anything_but_an_idle_tick_starts_the_window_over(interruption: Observation, why: str) -> None:
    decisions = run([IDLE] * 15 + [interruption] + [IDLE] * 25)
    # the new run starts on tick 16 and lasts 300 s: tick 36
    assert first_zero(decisions) == 36, why


def test_off_by_default_never_zero() -> None:
    assert POLICY.idle_after_seconds is None
    assert first_zero(run([IDLE] * 100, policy=POLICY)) is None
    assert all(d.state.idle_since is None for d in run([IDLE] * 3, policy=POLICY))


def test_from_several_replicas_straight_to_zero() -> None:
    # the stabilization window (300 s) scales in first; the idle window then takes the last one
    decisions = run([IDLE] * 30, policy=replace(ZERO, scale_down_stabilization_seconds=60.0), replicas=3)
    zero = first_zero(decisions)
    assert zero == 20 and min(d.replicas for d in decisions[:zero]) >= 1


def test_a_restarted_operator_waits_a_whole_window() -> None:
    # the idle run is not persisted: State() after a restart starts it over
    decisions = run([IDLE] * 19)
    assert decisions[-1].state.idle_since == 0.0
    restarted = decide(IDLE, Current(1, 0.005, 1), ZERO, State(first_seen=-1000.0), 19 * TICK)
    assert restarted.replicas == 1 and restarted.state.idle_since == 19 * TICK


def test_the_idle_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="idle_after_seconds must be > 0"):
        Policy(idle_after_seconds=0.0)


def test_a_replica_still_starting_is_not_idle() -> None:
    """Woken from zero (1 replica asked, none ready yet), the stale series of its last pod read idle:
    no idle run starts until the replica is ready, so the requests held for it are not stranded."""
    state, decisions = SETTLED, []
    for i in range(40):
        ready = 0 if i < 30 else 1  # the new pod turns ready on tick 30
        decision = decide(IDLE, Current(1, 0.005, ready_replicas=ready), ZERO, state, i * TICK)
        decisions.append(decision)
        state = decision.state
    assert all(d.replicas == 1 for d in decisions), [d.reason for d in decisions if d.replicas != 1]
    assert state.idle_since == 30 * TICK  # the run starts once the replica is ready
