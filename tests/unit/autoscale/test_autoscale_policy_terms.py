"""Each rule of the policy package on its own: the terms of the SLO-capacity count (``plan``), the
reactive rules' parts (``reactive``), the stabilization window (``stabilization``), the cold-start
timeout (``capacity``), the choice of rule and the next state (``decide``'s composition)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import pytest
from kubeinfer.operator.autoscale.headroom import Burst
from kubeinfer.operator.autoscale.policy import (
    Current,
    Observation,
    Policy,
    State,
    Tick,
    capacity,
    memory,
    plan,
    reactive,
    rule_for,
    stabilization,
)
from kubeinfer.operator.autoscale.policy.tick import unchanged

from tests.unit.autoscale.test_autoscale_policy import POLICY, SETTLED
from tests.unit.autoscale.test_autoscale_policy_rules import FULL, MODEL, seen

#: What one replica serves at MODEL's SLO with a 20 ms max queue delay: B = 32 binds, so FULL.
CAP = FULL


def at(obs: Observation, current: Current, policy: Policy = MODEL, state: State = SETTLED) -> Tick:
    return Tick.of(obs, current, policy, state, 0.0)


# --- plan: the terms of the count ----------------------------------------------------------------------


def test_demand_is_the_higher_rate_plus_the_backlog() -> None:
    obs = seen(0.04, 0.5, 1800.0, inflight=6000.0, rate=1500.0)
    assert plan.demand(obs, backlog=False) == 1800.0
    assert plan.demand(obs, backlog=True) == 1800.0 + 6000.0 / plan.BACKLOG_DRAIN_SECONDS
    assert plan.demand(replace(obs, arrival_rate=None), backlog=False) == 1500.0
    assert plan.demand(Observation(0.04, 0.5), backlog=True) is None


def test_slo_replicas_is_the_demand_at_the_planning_utilization() -> None:
    assert plan.slo_replicas(3000.0, CAP, MODEL) == 4  # 3000 / (0.85 x 1142.9) = 3.09
    assert plan.slo_replicas(3 * 0.85 * CAP, CAP, MODEL) == 3  # exactly 3: no rounding up past it
    assert plan.slo_replicas(3000.0, CAP, replace(MODEL, plan_utilization=1.0)) == 3


def test_burst_headroom_term() -> None:
    learned = Burst(factor=1.8, level=2500.0, rises=52, bursts=5)
    term = plan.burst_headroom(learned, 2500.0, 2500.0, CAP)
    assert term == plan.Term(4, " (burst headroom x1.80 learned from 5 bursts)")  # 4500 / 1142.9
    # rising from the floor, not yet halfway to a x1.8 burst: carried one reaction time ahead, 1200 + 200
    assert plan.burst_headroom(learned, 1200.0, 1000.0, CAP).replicas == 3  # 1.8 x 1400 / 1142.9
    # nothing learned (factor 1): the arrival rate's trend alone, in words
    flat = Burst(factor=1.0, level=1000.0, rises=52)
    term = plan.burst_headroom(flat, 1000.0, 1000.0, CAP)
    assert term == plan.Term(1, " (arrivals carried one reaction time ahead: 1000/s)")


def test_level_hold_term() -> None:
    left = Burst(factor=1.0, level=800.0, rises=52, left_level=3000.0)
    assert plan.level_hold(left, CAP, MODEL) == plan.Term(
        3, " (held for the 3000/s the traffic left suddenly)"
    )
    assert plan.level_hold(left, CAP, replace(MODEL, hold_left_level=False)) is None
    assert plan.level_hold(replace(left, left_level=None), CAP, MODEL) is None


def test_surge_floor_term() -> None:
    # the prior: x5 of the floor at full batches, at most surge_max_replicas
    assert plan.surge_floor(400.0, FULL, None, MODEL) == plan.Term(2, " (x5 surge prior)")
    assert plan.surge_floor(2000.0, FULL, None, MODEL).replicas == MODEL.surge_max_replicas
    short = Burst(factor=1.0, level=800.0, rises=MODEL.burst_min_samples - 1)
    assert plan.surge_floor(800.0, FULL, short, MODEL).words == " (x5 surge prior)"
    # learned: the step floor, x2.5
    learned = replace(short, rises=MODEL.burst_min_samples)
    assert plan.surge_floor(800.0, FULL, learned, MODEL) == plan.Term(2, " (x2.5 step floor)")
    assert plan.surge_floor(800.0, FULL, learned, replace(MODEL, step_factor=1.0)).replicas == 1


def test_plan_is_the_largest_term_within_bounds_and_names_it() -> None:
    obs = seen(0.04, 0.5, 2500.0)
    learned = Burst(factor=1.8, level=2500.0, rises=52, bursts=5)
    counted = plan.plan(obs, MODEL, 0.02, learned)
    assert (counted.needed, counted.capacity, counted.burst) == (4, pytest.approx(CAP), learned)
    assert counted.needed_why == " (burst headroom x1.80 learned from 5 bursts)"
    assert counted.demand == 2500.0  # no requests in flight: nothing added for a backlog
    # the demand sets the count: no words
    assert plan.plan(seen(0.04, 0.5, 3000.0), MODEL, 0.02, None).needed_why == ""
    # capped by max_replicas, still naming the term that asked: x3 of 1500/s is 4, the demand 2
    large = Burst(factor=3.0, level=1500.0, rises=52, bursts=2)
    capped = plan.plan(seen(0.04, 0.5, 1500.0), replace(MODEL, max_replicas=3), 0.02, large)
    assert capped.needed == 3 and "burst headroom x3.00" in capped.needed_why
    # min_replicas sets it: no term is named
    floor = plan.plan(seen(0.04, 0.2, 100.0), replace(MODEL, min_replicas=4), 0.02, None)
    assert (floor.needed, floor.needed_why) == (4, "")
    with pytest.raises(dataclasses.FrozenInstanceError):
        counted.needed = 5  # type: ignore[misc]


def test_plan_on_a_tie_prefers_the_learned_headroom_then_the_held_level() -> None:
    # 800/s (the demand needs 1): the headroom (x1.5), the hold (1500/s) and the step floor (x2.5) each
    # ask for 2; the headroom's words win, then the hold's
    both = Burst(factor=1.5, level=800.0, rises=52, bursts=2, left_level=1500.0)
    counted = plan.plan(seen(0.04, 0.2, 800.0), MODEL, 0.02, both)
    assert counted.needed == 2 and "burst headroom" in counted.needed_why
    held = replace(both, factor=1.0)
    counted = plan.plan(seen(0.04, 0.2, 800.0), MODEL, 0.02, held)
    assert counted.needed == 2 and "held for the 1500/s" in counted.needed_why


def test_plan_does_not_apply_without_the_rule_or_s_of_b() -> None:
    obs = seen(0.04, 0.5, 1800.0, inflight=6000.0)
    off = plan.plan(obs, replace(MODEL, capacity_rule=False), 0.02, None)
    assert off == plan.Plan(demand=1800.0)  # no backlog added, no count
    assert plan.plan(replace(obs, max_batch_size=None), MODEL, 0.02, None) == plan.Plan(demand=1800.0)
    # not even one row meets a 5 ms target: capacity 0, no count
    tight = plan.plan(obs, replace(MODEL, target_p99_seconds=0.005), 0.001, None)
    assert (tight.capacity, tight.needed) == (0.0, None)


def test_learned_burst_is_off_with_the_switch_or_without_arrivals() -> None:
    obs = seen(0.04, 0.5, 2500.0)
    assert plan.learned_burst(obs, MODEL, SETTLED, 0.0) is not None
    assert plan.learned_burst(obs, replace(MODEL, burst_headroom=False), SETTLED, 0.0) is None
    assert plan.learned_burst(replace(obs, arrival_rate=None), MODEL, SETTLED, 0.0) is None


# --- reactive: the P99 and utilization rules ------------------------------------------------------------


def test_band_headroom_only_when_busy_and_uncounted() -> None:
    busy = Tick.of(Observation(0.1, 0.85), Current(4, 0.02), POLICY, SETTLED, 0.0)
    out = reactive.band_headroom(busy, "head")
    assert out is not None and out.replicas == 5 and out.words == "head: 4 → 5 replicas"
    calm = Tick.of(Observation(0.1, 0.5), Current(4, 0.02), POLICY, SETTLED, 0.0)
    assert reactive.band_headroom(calm, "head") is None
    off = Tick.of(Observation(0.1, 0.85), Current(4, 0.02), replace(POLICY, keep_in_band=False), SETTLED, 0.0)
    assert reactive.band_headroom(off, "head") is None
    counted = at(seen(0.04, 0.9, 3000.0), Current(4, 0.05))  # the capacity rule planned it
    assert counted.needed is not None and reactive.band_headroom(counted, "head") is None


def test_in_recommendation() -> None:
    def rec(obs: Observation, n: int) -> int:
        return reactive.in_recommendation(Tick.of(obs, Current(n, 0.02), POLICY, SETTLED, 0.0))

    assert rec(Observation(0.1, 0.9), 6) == 6  # busy: keep
    assert rec(Observation(0.1, 0.1), 6) == 1  # 6 x 0.1 / 0.65 → 1
    assert rec(Observation(0.1, 0.6), 4) == 4  # 4 x 0.6 / 0.65 → 4: no fewer would do
    assert reactive.in_recommendation(at(seen(0.04, 0.1, 700.0), Current(6, 0.05))) == 3  # the count


def test_scale_up_is_bounded_by_the_step_and_the_maximum() -> None:
    t = Tick.of(Observation(0.9, 0.95), Current(3, 0.01), POLICY, SETTLED, 0.0)
    assert reactive.scale_up(t, 10.0) == (7, "3 → 7 replicas", None)  # max_scale_up_step 4
    assert reactive.scale_up(t, 1.01) == (4, "3 → 4 replicas", None)  # at least one
    top = Tick.of(Observation(0.9, 0.95), Current(10, 0.01), POLICY, SETTLED, 0.0)
    assert reactive.scale_up(top, 2.0)[2] == "AtMaxReplicas"


def test_grow_max_queue_delay() -> None:
    t = Tick.of(Observation(0.1, 0.3), Current(1, 0.005), POLICY, SETTLED, 0.0)
    out, words = reactive.grow_max_queue_delay(t, unchanged(t, "head"))
    assert math.isclose(out.max_queue_delay_seconds, 0.006) and words == "max queue delay 5 ms → 6 ms"
    top = Tick.of(Observation(0.1, 0.3), Current(1, 0.02), POLICY, SETTLED, 0.0)
    assert reactive.grow_max_queue_delay(top, unchanged(top, "head"))[1] is None
    cooling = Tick.of(
        Observation(0.1, 0.3),
        Current(1, 0.005),
        POLICY,
        replace(SETTLED, last_max_queue_delay_change=-5.0),
        0.0,
    )
    out, words = reactive.grow_max_queue_delay(cooling, unchanged(cooling, "head"))
    assert out.holds == ("MaxQueueDelayCoolingDown",) and words == "max queue delay cooling down"


# --- stabilization ----------------------------------------------------------------------------------


def test_recommendations_keep_the_window() -> None:
    state = replace(SETTLED, recommendations=((-400.0, 5), (-100.0, 3)))
    t = Tick.of(Observation(0.1, 0.1), Current(6, 0.02), POLICY, state, 0.0)
    out = replace(unchanged(t, "head"), recommendation=1)
    assert stabilization.recommendations(t, out) == ((-100.0, 3), (0.0, 1))


def test_scale_in_goes_to_the_window_max_after_its_cooldown() -> None:
    state = replace(SETTLED, recommendations=((-100.0, 3),))
    t = Tick.of(Observation(0.1, 0.1), Current(6, 0.02), POLICY, state, 0.0)
    out, words = stabilization.scale_in(t, replace(unchanged(t, "head"), recommendation=1))
    assert (out.replicas, out.last_scale_down, words) == (3, 0.0, "6 → 3 replicas")
    recent = replace(state, last_scale_down=-30.0)
    t = Tick.of(Observation(0.1, 0.1), Current(6, 0.02), POLICY, recent, 0.0)
    out, words = stabilization.scale_in(t, replace(unchanged(t, "head"), recommendation=1))
    assert (out.replicas, out.holds, words) == (6, ("ScaleInCoolingDown",), "scale-in cooling down")
    # nothing under the count: nothing to say
    t = Tick.of(Observation(0.1, 0.1), Current(3, 0.02), POLICY, state, 0.0)
    assert stabilization.scale_in(t, unchanged(t, "head"))[1] is None


def test_arrivals_rising() -> None:
    rising = replace(SETTLED, arrivals=((-15.0, 1000.0),))
    t = at(seen(0.03, 0.3, 2000.0), Current(6, 0.05), state=rising)
    assert stabilization.arrivals_rising(t, 3) == (
        "arrivals rising (1000 → 2000/s, 3000/s next tick needs more than 3)"
    )
    assert stabilization.arrivals_rising(t, 4) is None  # 3000/s fits in 4
    assert stabilization.arrivals_rising(at(seen(0.03, 0.3, 2000.0), Current(6, 0.05)), 3) is None


# --- capacity: the cold-start timeout ------------------------------------------------------------------


def test_during_cold_start_lengthens_the_timeout_only_while_short_of_capacity() -> None:
    t = at(seen(0.04, 0.9, 3000.0), Current(2, 0.005, ready_replicas=2))
    out = capacity.ahead_of_demand(t)
    longer = capacity.during_cold_start(t, out)
    assert (
        out.max_queue_delay_seconds == 0.005
        and longer.max_queue_delay_seconds == 0.05
        and longer.last_max_queue_delay_change == 0.0
    )
    assert longer.words == f"{out.words}; cold start: max queue delay 5 ms → 50 ms"
    # nothing added: as it was
    assert capacity.during_cold_start(t, unchanged(t, "head")) == unchanged(t, "head")
    # the ready replicas serve the demand: as it was
    calm = at(seen(0.04, 0.3, 1500.0), Current(2, 0.005, ready_replicas=2))
    assert (
        capacity.during_cold_start(calm, replace(unchanged(calm, "head"), replicas=3)).max_queue_delay_seconds
        == 0.005
    )
    off = at(
        seen(0.04, 0.9, 3000.0), Current(2, 0.005, ready_replicas=2), replace(MODEL, cold_start_timeout=False)
    )
    assert capacity.during_cold_start(off, out) == out


# --- decide's composition ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obs", "current", "rule"),
    [
        (seen(0.04, 0.5, 3000.0), Current(2, 0.02), capacity.ahead_of_demand),  # the count is over 2
        (seen(0.5, 0.95, 3000.0, inflight=3000.0), Current(4, 0.05), reactive.over_target),
        (seen(0.03, 0.1, 700.0), Current(6, 0.05), reactive.under_target),
        (seen(0.12, 0.5, 1000.0), Current(3, 0.05), reactive.within_tolerance),
        (Observation(0.31, 0.91), Current(3, 0.01), reactive.over_target),  # no s(b): by the P99
    ],
)
def test_rule_for_picks_one_rule(obs: Observation, current: Current, rule: object) -> None:
    assert rule_for(at(obs, current)) is rule


def test_next_state_carries_the_clocks_and_histories() -> None:
    t = at(seen(0.04, 0.5, 3000.0), Current(2, 0.02, ready_replicas=1), state=State())
    out = capacity.ahead_of_demand(t)
    state = memory.next_state(t, out)
    assert (state.first_seen, state.last_scale_up, state.last_unready) == (0.0, 0.0, 0.0)
    assert state.recommendations == ((0.0, out.recommendation),) and state.arrivals == ((0.0, 3000.0),)
