"""The SLO-capacity rule's count, ``Plan``: how many replicas the demand needs, term by term.

Each term is a pure function of the checked observation, the tunables and what the burst headroom
learned (``learned_burst``), and ``plan`` composes them: the replica count is the largest term, within
``[min_replicas, max_replicas]``, and the words name the term that set it when the demand alone did not.

- ``slo_replicas``: the demand (``demand``: the arrival rate, or the completion rate if higher, plus the
  requests in flight drained over ``BACKLOG_DRAIN_SECONDS``) at ``plan_utilization`` of what one
  replica serves at the SLO (``slo_capacity``: Nexus' batch bound, times the batches its instances run at
  once, ``instance_concurrency``).
- ``burst_headroom``: the learned burst factor times the arrival rate (``burst_base``), at a replica's
  full SLO capacity.
- ``level_hold``: a level the traffic left suddenly, held at a replica's full SLO capacity.
- ``surge_floor``: a small fleet's room for a surge (the prior until bursts are learned, the step
  floor after), at full batches.

No clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kubeinfer.operator.autoscale import headroom
from kubeinfer.operator.autoscale.policy.common import EPS, rate
from kubeinfer.operator.autoscale.policy.values import Observation, Policy, State

__all__ = [
    "BACKLOG_DRAIN_SECONDS",
    "BURST_LIMIT",
    "BURST_QUANTILE",
    "Plan",
    "Term",
    "burst_base",
    "burst_headroom",
    "cold_start_timeout",
    "demand",
    "instance_concurrency",
    "learned_burst",
    "level_hold",
    "plan",
    "slo_capacity",
    "slo_replicas",
    "surge_floor",
]

#: The requests in the service (``kubeinfer_inflight_requests``) are planned to drain within this many
#: seconds on top of the arrivals (Little's law, L = λW, read backwards): kubeinfer's choice, two ticks of
#: 15 s, so a backlog is gone about when the replicas the rule adds for it are ready.
BACKLOG_DRAIN_SECONDS = 30.0
#: The burst factor is this quantile of the bursts' peaks: Autopilot's moving-window percentile (Rzadca
#: et al., EuroSys 2020, section 3.2), chosen with ``bench/autoscaler_sim.py`` after eleven traces had
#: been seen (bench/traces/README.md).
BURST_QUANTILE = 0.9
#: Peaks over this factor are left out of the burst headroom: bursts that large (x5 in a
#: Markov-modulated trace) outgrow any headroom worth paying for, and the reactive rules handle them
#: (``headroom``'s docstring); chosen with the quantile above.
BURST_LIMIT = 2.0


@dataclass(frozen=True)
class Term:
    """One term of the count: the replicas it asks for and the words that name it in the reason.

    Attributes:
        replicas: replicas the term asks for (not yet within the policy's bounds).
        words: e.g. ``" (x5 surge prior)"``, with its leading space, as it is appended to the reason.
    """

    replicas: int
    words: str


@dataclass(frozen=True)
class Plan:
    """The SLO-capacity rule's inputs to one tick, as ``plan`` counted them.

    Attributes:
        demand: requests/s to plan for (arrival rate, else completion rate; plus the backlog drained
            over ``BACKLOG_DRAIN_SECONDS`` when the rule applies), ``None`` if neither rate is known.
        capacity: requests/s one replica serves at the SLO (``slo_capacity`` times
            ``instance_concurrency``), ``None`` when the rule
            does not apply (off, or s(b) or the max batch size unknown); ``0.0`` when not even one row
            meets the target.
        needed: replicas the rule asks for, within ``[min_replicas, max_replicas]``; ``None`` when the
            rule does not apply (or the capacity is 0).
        burst: the burst headroom learned so far (``learned_burst``), ``None`` when off, unknown or the
            rule does not apply.
        needed_why: the words of the term that set ``needed`` when the demand at the planning
            utilization did not (the burst headroom, the left level held or the surge floor), else ``""``.
    """

    demand: float | None = None
    capacity: float | None = None
    needed: int | None = None
    burst: headroom.Burst | None = None
    needed_why: str = ""


def slo_capacity(a: float, c: float, max_batch: int, target: float, timeout: float) -> tuple[int, float]:
    """The batch size and throughput one replica sustains at a latency SLO (Nexus' batch bound).

    A batching server whose batch of b rows takes s(b) = a + c*b seconds makes a request wait, at
    worst, for the max queue delay, the batch in progress and its own batch: ``timeout + 2*s(b) <=
    target`` (Shen et al., "Nexus: a GPU cluster engine for accelerating DNN-based video analysis",
    SOSP 2019, section 4: worst-case latency of a saturated batch is twice its execution time). The
    largest such b (at most ``max_batch``) sets the throughput b / s(b), the physical limit of a
    batching server (Crankshaw et al., "Clipper", NSDI 2017).

    Args:
        a: fixed part of the batch service time, seconds. c: seconds per row (> 0).
        max_batch: the runtime's max batch size, rows. target: the P99 objective, seconds.
        timeout: the max queue delay in force, seconds.

    Returns:
        ``(b, requests per second)``; ``(0, 0.0)`` when not even one row meets the target.
    """
    b = min(max_batch, math.floor(((target - timeout) / 2 - a) / c + 1e-9))
    if b < 1:
        return 0, 0.0
    return b, b / (a + c * b)


def instance_concurrency(obs: Observation) -> float:
    """The batches a replica runs at once, >= 1: the runtime's measured mean over its instances while any
    runs one (``Observation.instance_concurrency``), 1 when unknown.

    A replica of several instances serves this times b / s(b): on separate CPU cores overlapping batches
    keep their s(b) and the replica's throughput grows with the overlap; on one GPU they share the device,
    each s(b) (measured on those same batches) grows, and the product stays near one instance's. At low
    load the instances seldom overlap and this reads near 1: one instance's capacity, the safe side
    (more replicas, not fewer)."""
    return max(1.0, obs.instance_concurrency or 1.0)


def cold_start_timeout(
    a: float, c: float, max_batch: int, target: float, bounds: tuple[float, float]
) -> float:
    """The longest max queue delay at which a full batch still meets the SLO, ``target - 2*s(B)``, in
    ``bounds`` (seconds): longer timeouts fill batches, and b / s(b) grows with b."""
    return min(max(target - 2 * (a + c * max_batch), bounds[0]), bounds[1])


def learned_burst(obs: Observation, policy: Policy, state: State, now: float) -> headroom.Burst | None:
    """The burst headroom learned from the arrival samples so far and this tick's, ``None`` when off or
    the arrival rate is unknown."""
    if not policy.burst_headroom or obs.arrival_rate is None:
        return None
    return headroom.burst_factor(
        (*state.arrivals, (now, obs.arrival_rate)),
        lead=policy.burst_lead_seconds,
        quantile=BURST_QUANTILE,
        limit=BURST_LIMIT,
        min_rise=policy.burst_min_rise,
        min_bursts=policy.burst_min_bursts,
        min_drop=max(1 / policy.plan_utilization, 1 + policy.tolerance),
    )


def demand(obs: Observation, *, backlog: bool) -> float | None:
    """Requests/s to plan for: the arrival rate, or the completion rate if higher (a backlog draining
    completes faster than it arrives), ``None`` when neither is known; with ``backlog``, plus the requests
    in flight drained over ``BACKLOG_DRAIN_SECONDS``."""
    rates = max((r for r in (obs.arrival_rate, obs.request_rate) if r is not None), default=None)
    if rates is None or not backlog:
        return rates
    return rates + (obs.inflight_requests or 0.0) / BACKLOG_DRAIN_SECONDS


def slo_replicas(demand: float, capacity: float, policy: Policy) -> int:
    """The SLO-capacity rule itself: replicas for ``demand`` requests/s at ``plan_utilization`` of
    ``capacity`` (requests/s one replica serves at the SLO, > 0)."""
    return math.ceil(demand / (policy.plan_utilization * capacity) - EPS)


def burst_base(arrival: float, floor: float, factor: float) -> float:
    """The rate, requests/s, that the burst headroom multiplies. Inside a burst (the arrival rate more
    than halfway from the floor to ``factor`` times it) the floor, so that the burst is not counted
    twice; outside, the arrival rate carried one reaction time ahead on its rise from the floor (a
    linear trend: ``arrival + (arrival - floor)``)."""
    if arrival > floor * (1 + (factor - 1) / 2):
        return floor
    return 2 * arrival - floor


def burst_headroom(burst: headroom.Burst, arrival: float, floor: float, capacity: float) -> Term:
    """Burst headroom: ``burst.factor`` times the arrival rate (``burst_base``; bursts stand on what
    arrives, not on the completion rate, which after a burst is its backlog draining) at a replica's full
    SLO capacity. With factor 1 (nothing learned) the arrival rate's trend alone."""
    base = burst_base(arrival, min(floor, arrival), burst.factor)
    replicas = math.ceil(burst.factor * base / capacity - EPS)
    if burst.factor > 1:
        return Term(replicas, f" (burst headroom x{burst.factor:.2f} learned from {burst.bursts} bursts)")
    return Term(replicas, f" (arrivals carried one reaction time ahead: {rate(base)}/s)")


def level_hold(burst: headroom.Burst, capacity: float, policy: Policy) -> Term | None:
    """Level hold: a level the traffic left within one reaction time (``burst.left_level``) can return as
    suddenly, so its replicas at a replica's full SLO capacity are kept; ``None`` when no level was left
    or ``hold_left_level`` is off."""
    if burst.left_level is None or not policy.hold_left_level:
        return None
    replicas = math.ceil(burst.left_level / capacity - EPS)
    return Term(replicas, f" (held for the {rate(burst.left_level)}/s the traffic left suddenly)")


def surge_floor(floor: float, full: float, burst: headroom.Burst | None, policy: Policy) -> Term:
    """Surge floor: a small fleet (up to ``surge_max_replicas``) keeps room for ``surge_factor`` times the
    floor rate at full batches (``full``: requests/s a replica serves with full batches), the prior for the
    unknown burstiness; once ``burst_min_samples`` rises are learned, for ``step_factor`` times it (a step,
    a level shift, is never learned as a burst)."""
    learned = burst is not None and burst.rises >= policy.burst_min_samples
    factor, words = (policy.step_factor, "step floor") if learned else (policy.surge_factor, "surge prior")
    replicas = min(math.ceil(factor * floor / full - EPS), policy.surge_max_replicas)
    return Term(replicas, f" (x{factor:g} {words})")


def plan(obs: Observation, policy: Policy, timeout: float, burst: headroom.Burst | None) -> Plan:
    """The SLO-capacity rule's count for the max queue delay in force (see the module docstring).

    Args:
        obs: the checked observation. policy: the tunables. timeout: the max queue delay in force, seconds.
        burst: what the burst headroom learned (``learned_burst``), ``None`` when off or unknown.
    """
    a, c, batch = obs.service_time_a_seconds, obs.service_time_c_seconds, obs.max_batch_size
    applies = policy.capacity_rule and a is not None and c is not None and batch is not None
    wanted_rate = demand(obs, backlog=applies)
    if not applies or wanted_rate is None or a is None or c is None or batch is None:
        return Plan(demand=wanted_rate)
    overlap = instance_concurrency(obs)
    _, one = slo_capacity(a, c, int(batch), policy.target_p99_seconds, timeout)
    capacity = overlap * one
    if capacity <= 0:
        return Plan(demand=wanted_rate, capacity=0.0)
    wanted = slo_replicas(wanted_rate, capacity, policy)
    full = overlap * int(batch) / (a + c * int(batch))  # a replica's throughput at full batches, requests/s
    # The floor: the lowest arrival rate of the last reaction time (the level a burst stands on).
    floor = min(wanted_rate, burst.level) if burst is not None and burst.level is not None else wanted_rate
    # The terms over the demand's own count, in the order their words are preferred on a tie: the
    # learned headroom says the most, then the held level, then the surge floor.
    terms: list[Term] = []
    if burst is not None and obs.arrival_rate is not None:
        terms.append(burst_headroom(burst, obs.arrival_rate, floor, capacity))
    if burst is not None:
        hold = level_hold(burst, capacity, policy)
        if hold is not None:
            terms.append(hold)
    terms.append(surge_floor(floor, full, burst if obs.arrival_rate is not None else None, policy))
    needed = min(max(wanted, *(term.replicas for term in terms), policy.min_replicas), policy.max_replicas)
    # Words for the term that set ``needed`` when the demand did not (none when min_replicas did).
    why = next((term.words for term in terms if term.replicas >= needed), "") if needed > wanted else ""
    return Plan(demand=wanted_rate, capacity=capacity, needed=needed, burst=burst, needed_why=why)
