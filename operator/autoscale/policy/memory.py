"""The memory between ticks: the next ``State`` after a decision, and the ``State`` rebuilt after an
operator restart."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from kubeinfer.operator.autoscale.policy.stabilization import recommendations
from kubeinfer.operator.autoscale.policy.tick import Outcome, Tick
from kubeinfer.operator.autoscale.policy.values import Observation, Policy, State
from kubeinfer.operator.autoscale.policy.zero import idle_since

__all__ = ["arrivals", "next_state", "restore_arrivals", "restore_state"]


def next_state(t: Tick, out: Outcome) -> State:
    """The ``State`` after the tick ``t`` decided ``out``: its clocks, the recommendation history and the
    arrival samples."""
    return State(
        last_scale_up=out.last_scale_up,
        last_unready=t.last_unready,
        last_scale_down=out.last_scale_down,
        last_max_queue_delay_change=out.last_max_queue_delay_change,
        first_seen=t.state.first_seen if t.state.first_seen is not None else t.now,
        recommendations=recommendations(t, out),
        arrivals=arrivals(t.state, t.obs, t.policy, t.now),
        idle_since=idle_since(t),
    )


def arrivals(state: State, obs: Observation, policy: Policy, now: float) -> tuple[tuple[float, float], ...]:
    """The arrival samples for the next ``State``: this tick's added (when known), those older than
    ``burst_memory_seconds`` (or than one reaction time, ``burst_lead_seconds``, with the burst headroom
    off: only the last sample is read then) dropped."""
    memory = policy.burst_memory_seconds if policy.burst_headroom else policy.burst_lead_seconds
    kept = tuple((when, r) for when, r in state.arrivals if now - when < memory)
    if obs.arrival_rate is None:
        return kept
    return (*kept, (now, obs.arrival_rate))


def restore_state(
    *,
    now: float,
    last_scale_up_age: float | None = None,
    last_scale_down_age: float | None = None,
    last_max_queue_delay_change_age: float | None = None,
) -> State:
    """Rebuild a ``State`` after an operator restart from ages (seconds before ``now``) in status.

    The recommendation history is not persisted, so ``first_seen = now``: the restarted controller
    observes a whole stabilization window before it scales in.
    """

    def at(age: float | None) -> float | None:
        return None if age is None else now - max(0.0, age)

    return replace(
        State(),
        last_scale_up=at(last_scale_up_age),
        last_scale_down=at(last_scale_down_age),
        last_max_queue_delay_change=at(last_max_queue_delay_change_age),
    )


def restore_arrivals(
    state: State, history: Iterable[tuple[float, float]], *, now: float, policy: Policy
) -> State:
    """``state`` with the arrival-rate samples an operator restart lost, read back from Prometheus, so
    that the burst headroom (``headroom.burst_factor``) stands from the first tick after the restart
    instead of relearning for ``burst_memory_seconds``.

    Args:
        state: the state so far (its own samples, if any, are kept after the history).
        history: ``(age, requests/s)`` pairs, age in seconds before ``now`` (> 0), any order; those
            older than ``policy.burst_memory_seconds``, not finite or negative are left out.
        now: the current time, seconds, on the clock ``decide`` gets.
        policy: for ``burst_memory_seconds`` and ``burst_headroom`` (off: ``state`` unchanged).
    """
    if not policy.burst_headroom:
        return state
    kept = sorted(
        (now - age, rate)
        for age, rate in history
        if 0 < age < policy.burst_memory_seconds and math.isfinite(rate) and rate >= 0
    )
    oldest_own = state.arrivals[0][0] if state.arrivals else math.inf
    return replace(state, arrivals=(*(s for s in kept if s[0] < oldest_own), *state.arrivals))
