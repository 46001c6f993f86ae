"""The autoscaler's control law: a pure function of (observation, current, policy, state, now).

``decide`` keeps the P99 latency at or under ``Policy.target_p99_seconds`` with the fewest replicas,
using two levers: the replica count and the max queue delay (the runtime's batch timeout).

**The SLO-capacity rule** (``plan.plan``, when the observation carries the arrival rate and the
runtime's batch service time s(b) = a + c*b with its max batch size B): what only kubeinfer sees lets
it count the replicas a demand needs instead of waiting for the P99 over the query window to show a
breach. One replica meets the SLO with batches of b rows while ``timeout + 2*s(b) <= target`` (a
request waits at most the max queue delay, the batch in progress and its own batch: Nexus' worst case,
Shen et al., SOSP 2019), so it serves ``b/s(b)`` requests/s (the physical limit of a batching server;
Clipper, Crankshaw et al., NSDI 2017; ``plan.slo_capacity``), times the batches its model instances
run at once as the runtime measures it (``plan.instance_concurrency``, 1 with one instance). The demand
is the arrival rate (or the completion rate if higher) plus the requests in flight drained over
``plan.BACKLOG_DRAIN_SECONDS`` (Little's law, L = λW). ``needed = ceil(demand / (plan_utilization *
b/s(b)))`` (that capacity times the concurrency), at least enough full-batch capacity for a
``surge_factor`` surge while the fleet is small (up to ``surge_max_replicas``: a cold start is longer
than a burst takes to build a backlog). More than provisioned (starting replicas
count): scale out now, no cooldown (``capacity.ahead_of_demand``; proactive provisioning from a demand model
as in MArk, Zhang et al., USENIX ATC 2019, and predictive scaling in Autopilot, Rzadca et al.,
EuroSys 2020). While replicas it asked for start and the demand is over what the ready ones serve,
the max queue delay goes to the longest at which a full batch still meets the SLO
(``capacity.during_cold_start``: fuller batches raise b/s(b)). Scale-in goes to ``needed`` after the
stabilization window. P99 over target with the demand covered adds one replica, not the P99 ratio (the
window still holds the past), and a backlog whose Little's-law wait is under half the target counts as
drained. Without s(b) the reactive law below decides, unchanged; it is also the rule's fallback.

**Burst headroom** (``headroom.burst_factor``, ``plan.burst_headroom``): bursts shorter than a reaction time
(a tick plus a cold start, ``burst_lead_seconds``) meet only the capacity standing when they begin, so
the rule also provisions ``factor * rate`` at a replica's full SLO capacity, where ``factor`` is a high
quantile of the peaks of the bursts (transient rises of the arrival rate within one reaction time, of
more than ``burst_min_rise`` and out of the traffic's own noise: ``headroom.noise_floor``) seen over the
last ``burst_memory_seconds``, once ``burst_min_bursts`` were seen (Autopilot's moving-window
percentile, Rzadca et al., EuroSys 2020; the arrival samples live in ``State.arrivals``). Smooth traffic
learns no burst and pays nothing; a level shift (a step, a ramp) is not a burst. The rate it multiplies
(``plan.burst_base``) is the arrival rate (not the completion rate, which after a burst is its backlog
draining) carried one reaction time ahead on its rise from the floor (the lowest rate of the last
reaction time), or the floor while a burst is in progress (a burst is not counted twice). Until
``burst_min_samples`` rises are learned the surge floor above, standing on the floor rate, is the prior
for the unknown burstiness; after that the learned factor replaces it, and the surge floor keeps a
smaller factor, ``step_factor``: a step (a level shift, such as a tenant onboarded or a job started)
is never learned as a burst, and on a small fleet the smallest step that outgrows the planned headroom
overloads it for a whole cold start. A level the arrivals left within one reaction time
(``headroom.left_level``: a sudden drop of more than ``1 / plan_utilization``, the standing headroom
planned for the level after it, and more than the noise floor) is held at a replica's full SLO capacity
for ``burst_memory_seconds`` (``plan.level_hold``): traffic that left that fast, in a failover, can come
back as fast, and the cold start would meet it with the smaller fleet (the same memory as the bursts';
a drop that stays costs its replicas for that long). A P99 over target from a drained backlog
recommends the rule's count, so the stabilization window runs from the demand, not from the query
window's memory of the backlog.

The reactive law:

- P99 over target while the GPUs are busy (utilization at or above ``gpu_high``): scale out in
  proportion to the overload on the binding signal, the HPA ratio
  ``ceil(replicas * max(p99 / target, utilization / gpu_high))`` (Kubernetes HPA algorithm,
  https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details),
  bounded by ``max_replicas`` and ``max_scale_up_step``.
- P99 over target while the GPUs are not busy: the delay is queueing the service imposes on itself.
  Cut the max queue delay multiplicatively (AIMD's multiplicative decrease, as in TCP congestion
  control, RFC 5681 / Chiu & Jain 1989); add replicas only once the timeout is at its lower bound.
- P99 comfortably under target: grow the max queue delay additively toward its upper bound (AIMD's
  additive increase). Scale in only after the stabilization window: like the HPA, every tick records
  a replica recommendation and a scale-in goes to the highest recommendation of the last
  ``scale_down_stabilization_seconds`` (HPA default 300 s); a recommendation below the current
  count requires that the utilization projected for it, ``utilization * replicas / recommended``,
  stays under ``gpu_high``. A scale-in also waits (``ArrivalsRising``) while the arrival rate rose by
  more than the tolerance since the last tick and, carried one more tick on that rise, needs more
  replicas than the scale-in leaves (``stabilization.arrivals_rising``): scaling in into a rise is a
  flap, undone one reaction time later, and the window only looks back.
- P99 comfortably under target but the GPUs above the band's top (``reactive.band_headroom``): add
  headroom, ``ceil(replicas * utilization / gpu_high)``, so that a load step finds spare capacity.
- Inside the tolerance band ``|p99 / target - 1| <= tolerance`` (HPA default 0.1) nothing moves.
- No scale-up while replicas of the last one are still starting (``Current.ready_replicas``): their
  capacity is on its way (the HPA likewise discounts unready pods).
- P99 over target while the service holds little work (Little's law, L = λW: the requests in flight,
  queued *and* executing, over the completion rate, ``inflight / rate``, at most
  ``tick.DRAINED_WAIT_FRACTION * target``) is history, not a present overload: the query window still
  holds the slow requests of a backlog that has drained. Nothing moves until the window catches up.
  The queue alone is not that signal: requests already taken into batches have left the queue but
  not the service, so a service slow in execution shows an empty queue while its latency is seconds.
- Cooldowns separate actions of the same kind; replicas stay in ``[min_replicas, max_replicas]``
  and reach zero only by scale to zero (``zero``), when it is on.

An observation that is missing, NaN, infinite, stale or an error is *unknown*: the decision holds
everything and says why. It is never read as zero. One exception is spelled out: a measured request
rate of exactly 0 (the counter exists and did not move) means the service is idle, so its P99 is not
defined (Prometheus' ``histogram_quantile`` returns NaN on zero rates); an idle service is treated
as comfortably under target.

**Layout.** ``decide`` (here) composes small pure rules, each in its own module and each with its
own unit tests, the way Ray Serve's ``autoscaling_policy`` composes its steps:

1. ``values.check_observation``: a signal that cannot be acted on holds everything but the bounds.
2. ``tick.Tick.of``: the values in force within bounds, the signals in words, and the SLO-capacity
   rule's count, ``plan.Plan``, from its terms: ``plan.slo_replicas`` (the demand at the planning
   utilization), ``plan.burst_headroom``, ``plan.level_hold`` and ``plan.surge_floor``.
3. One rule by where the demand and the P99 stand: ``capacity.ahead_of_demand`` (the count is over
   what is provisioned), ``reactive.over_target``, ``reactive.under_target`` (with
   ``reactive.band_headroom``, the stabilization window's ``stabilization.scale_in`` and
   ``reactive.grow_max_queue_delay``) or ``reactive.within_tolerance``.
4. ``capacity.during_cold_start``: fuller batches while added replicas start.
5. ``zero.scale_to_zero``: with ``Policy.idle_after_seconds`` set, an idle run that long takes the
   replicas to 0 (at 0, ``decide`` holds before step 1: ``zero.at_zero``).
6. ``memory.next_state``: the clocks, the recommendation history, the arrival samples and the idle run.

``values`` holds the types (``Observation``, ``Current``, ``Policy``, ``State``, ``Decision``);
``memory`` also rebuilds a ``State`` after an operator restart (``restore_state``,
``restore_arrivals``). This package re-exports the public names.

Nothing here reads a clock, sleeps or does I/O: ``now`` (seconds, any monotonic epoch) is an
argument and the next ``State`` is part of the ``Decision``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from kubeinfer.operator.autoscale.policy.capacity import ahead_of_demand, during_cold_start
from kubeinfer.operator.autoscale.policy.common import EPS, ms
from kubeinfer.operator.autoscale.policy.memory import next_state, restore_arrivals, restore_state
from kubeinfer.operator.autoscale.policy.plan import Plan, cold_start_timeout, slo_capacity
from kubeinfer.operator.autoscale.policy.reactive import over_target, under_target, within_tolerance
from kubeinfer.operator.autoscale.policy.tick import Outcome, Tick, bounded
from kubeinfer.operator.autoscale.policy.values import (
    DECIDE_REQUIRES,
    READER_REQUIRES,
    Current,
    Decision,
    Observation,
    Policy,
    Problem,
    State,
    check_observation,
)
from kubeinfer.operator.autoscale.policy.zero import AT_ZERO_HOLD, at_zero, scale_to_zero

__all__ = [
    "DECIDE_REQUIRES",
    "READER_REQUIRES",
    "Current",
    "Decision",
    "Observation",
    "Outcome",
    "Plan",
    "Policy",
    "Problem",
    "State",
    "Tick",
    "check_observation",
    "cold_start_timeout",
    "decide",
    "restore_arrivals",
    "restore_state",
    "rule_for",
    "slo_capacity",
]


def rule_for(t: Tick) -> Callable[[Tick], Outcome]:
    """The one rule that acts on this tick: ``capacity.ahead_of_demand`` when the SLO-capacity rule's
    count is over the replicas provisioned, else by the P99 ratio ``reactive.over_target``,
    ``reactive.under_target`` or, inside the tolerance band, ``reactive.within_tolerance``."""
    tolerance = t.policy.tolerance
    if t.needed is not None and t.needed > t.replicas:
        return ahead_of_demand
    if t.ratio > 1 + tolerance + EPS:
        return over_target
    if t.ratio < 1 - tolerance - EPS:
        return under_target
    return within_tolerance


def decide(observation: Observation, current: Current, policy: Policy, state: State, now: float) -> Decision:
    """One step of the control law (see the package docstring).

    The observation is checked (``check_observation``); a problem holds everything but the bounds. Else
    one rule acts (``rule_for``), ``capacity.during_cold_start`` amends it while replicas start, and
    ``memory.next_state`` carries the clocks and histories to the next tick.

    Args:
        observation: the signals; unknown ones make the decision hold.
        current: replicas and max queue delay in force.
        policy: tunables.
        state: the previous decision's ``state`` (``State()`` at start).
        now: the current time, seconds on any clock that only moves forward.

    Returns:
        A ``Decision``; ``replicas`` is within ``[policy.min_replicas, policy.max_replicas]``, or 0
        with ``policy.idle_after_seconds`` set (scaled to zero, or held there), and
        ``max_queue_delay_seconds`` within the policy's timeout bounds.
    """
    if policy.idle_after_seconds is not None and current.replicas == 0:
        _, timeout = bounded(current, policy)
        return _decision(current, 0, timeout, at_zero(policy), State(), AT_ZERO_HOLD, known=True)
    note = _bounds_note(current, policy)
    checked = check_observation(observation, policy.stale_after_seconds)
    if isinstance(checked, Problem):
        replicas, timeout = bounded(current, policy)
        return _decision(
            current,
            replicas,
            timeout,
            f"{note}holding: {checked.message}",
            replace(state, idle_since=None),  # unknown signals end an idle run
            None,
            known=False,
        )
    t = Tick.of(checked, current, policy, state, now)
    out = scale_to_zero(t, during_cold_start(t, rule_for(t)(t)))
    hold = out.holds[0] if out.holds else None
    return _decision(
        current,
        out.replicas,
        out.max_queue_delay_seconds,
        note + out.words,
        next_state(t, out),
        hold,
        known=True,
    )


def _bounds_note(current: Current, policy: Policy) -> str:
    replicas, timeout = bounded(current, policy)
    note = ""
    if replicas != current.replicas:
        span = f"[{policy.min_replicas}, {policy.max_replicas}]"
        note += f"replicas {current.replicas} outside {span} → {replicas}; "
    if not math.isclose(timeout, current.max_queue_delay_seconds, rel_tol=1e-9, abs_tol=1e-12):
        note += f"max queue delay {ms(current.max_queue_delay_seconds)} outside bounds → {ms(timeout)}; "
    return note


def _decision(
    current: Current,
    replicas: int,
    timeout: float,
    reason: str,
    state: State,
    hold: str | None,
    *,
    known: bool,
) -> Decision:
    replicas_changed = replicas != current.replicas
    max_queue_delay_changed = not math.isclose(
        timeout, current.max_queue_delay_seconds, rel_tol=1e-9, abs_tol=1e-12
    )
    return Decision(
        replicas=replicas,
        max_queue_delay_seconds=timeout,
        reason=reason,
        replicas_changed=replicas_changed,
        max_queue_delay_changed=max_queue_delay_changed,
        known=known,
        state=state,
        hold=None if replicas_changed or max_queue_delay_changed or not known else hold,
    )
