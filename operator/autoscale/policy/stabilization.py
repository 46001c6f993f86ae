"""Stabilization: a scale-in goes to the highest recommendation of the window, and waits for the
window to be observed, for the arrivals to stop rising and for its cooldown."""

from __future__ import annotations

import math
from dataclasses import replace

from kubeinfer.operator import conditions
from kubeinfer.operator.autoscale.policy.common import EPS, cooled, rate
from kubeinfer.operator.autoscale.policy.tick import Outcome, Tick

__all__ = ["arrivals_rising", "recommendations", "scale_in"]


def recommendations(t: Tick, out: Outcome) -> tuple[tuple[float, int], ...]:
    """The recommendation history for the next ``State``: those still within the stabilization window
    and this tick's (``out.recommendation``), oldest first (the HPA's recommendation history)."""
    window = t.policy.scale_down_stabilization_seconds
    kept = ((when, r) for when, r in t.state.recommendations if t.now - when < window)
    return (*kept, (t.now, out.recommendation))


def scale_in(t: Tick, out: Outcome) -> tuple[Outcome, str | None]:
    """Scale in to the highest recommendation of the stabilization window, if below the count; the
    words for it (or why it waits), ``None`` when there is nothing to scale in."""
    p = t.policy
    window = p.scale_down_stabilization_seconds
    recent = (r for when, r in t.state.recommendations if t.now - when < window)
    stable = max([out.recommendation, *recent])
    if stable >= t.replicas:
        return out, None
    first_seen = t.state.first_seen if t.state.first_seen is not None else t.now
    if t.now - first_seen < window:
        words = f"scale-in waits for the {window:.0f} s stabilization window"
        return replace(out, holds=(*out.holds, conditions.STABILIZATION_WINDOW)), words
    rising = arrivals_rising(t, stable)
    if rising is not None:
        return replace(out, holds=(*out.holds, conditions.ARRIVALS_RISING)), f"scale-in waits: {rising}"
    if not cooled(t.state.last_scale_down, p.scale_down_cooldown_seconds, t.now):
        return replace(out, holds=(*out.holds, conditions.SCALE_IN_COOLING_DOWN)), "scale-in cooling down"
    return replace(out, replicas=stable, last_scale_down=t.now), f"{t.replicas} → {stable} replicas"


def arrivals_rising(t: Tick, target: int) -> str | None:
    """Words when a scale-in to ``target`` replicas would go into a rise, else ``None``: the arrival rate
    rose by more than the tolerance since the last sample (at most one reaction time,
    ``burst_lead_seconds``, old) and, carried one more tick on that rise (``2*arrival - before``), needs
    more than ``target`` replicas at the planning utilization (with s(b) unknown, the rise alone counts).
    Such a scale-in would be undone one reaction time later: a flap (the stabilization window only looks
    back at recommendations). The replica test keeps noise on a small rate (0 → 0.5/s) from holding
    scale-in: it needs no more replicas."""
    arrival = t.obs.arrival_rate
    if arrival is None or not t.state.arrivals:
        return None
    when, before = t.state.arrivals[-1]
    if t.now - when > t.policy.burst_lead_seconds or arrival <= before * (1 + t.policy.tolerance):
        return None
    ahead = 2 * arrival - before
    if t.capacity:
        if math.ceil(ahead / (t.policy.plan_utilization * t.capacity) - EPS) <= target:
            return None
        needs = f"{rate(ahead)}/s next tick needs more than {target}"
        return f"arrivals rising ({rate(before)} → {rate(arrival)}/s, {needs})"
    return f"arrivals rising ({rate(before)} → {rate(arrival)}/s)"
