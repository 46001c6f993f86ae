"""The reactive law on P99 and utilization: one rule per side of the tolerance band.

- ``over_target``: a drained backlog holds; busy GPUs scale out by the HPA ratio on the binding signal
  (one replica when the SLO-capacity rule says the demand is covered); idle GPUs cut the max queue delay
  multiplicatively (AIMD) and add replicas once it is at its lower bound.
- ``under_target``: ``band_headroom`` when the GPUs run over the band, else a recommendation
  (``in_recommendation``) and the stabilization window's scale-in (``stabilization.scale_in``); the
  max queue delay grows additively (``grow_max_queue_delay``).
- ``within_tolerance``: nothing moves.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kubeinfer.operator import conditions
from kubeinfer.operator.autoscale.policy.common import EPS, cooled, ms
from kubeinfer.operator.autoscale.policy.stabilization import scale_in
from kubeinfer.operator.autoscale.policy.tick import Outcome, Tick, unchanged

__all__ = [
    "band_headroom",
    "grow_max_queue_delay",
    "in_recommendation",
    "over_target",
    "scale_up",
    "under_target",
    "with_scale_up",
    "within_tolerance",
]


def scale_up(t: Tick, overload: float) -> tuple[int, str, str | None]:
    """Replicas for a scale-up by the HPA ratio ``overload``, the words, and the kind of hold if it
    waits (``AtMaxReplicas``, ``ReplicasStarting``, ``ScaleUpCoolingDown``)."""
    p = t.policy
    step_cap = min(p.max_replicas, t.replicas + p.max_scale_up_step)
    wanted = min(step_cap, max(t.replicas + 1, math.ceil(t.replicas * overload - EPS)))
    if wanted <= t.replicas:
        return t.replicas, f"at max replicas {p.max_replicas}", conditions.AT_MAX_REPLICAS
    if t.starting > 0:
        return t.replicas, f"{t.starting} added replicas still starting", conditions.REPLICAS_STARTING
    if not cooled(t.up_since, p.scale_up_cooldown_seconds, t.now):
        return t.replicas, "scale-up cooling down", conditions.SCALE_UP_COOLING_DOWN
    return wanted, f"{t.replicas} → {wanted} replicas", None


def with_scale_up(t: Tick, head: str, overload: float) -> Outcome:
    """The outcome of ``scale_up`` by ``overload``: the replicas (and this tick's recommendation) raised,
    or what is in force with the kind of hold."""
    replicas, words, hold = scale_up(t, overload)
    out = unchanged(t, f"{head}: {words}", *(() if hold is None else (hold,)))
    if replicas == t.replicas:
        return out
    return replace(out, replicas=replicas, recommendation=replicas, last_scale_up=t.now)


def over_target(t: Tick) -> Outcome:
    """P99 over target beyond the tolerance band.

    Backlog drained (Little's law): hold. GPUs busy: scale out by the HPA ratio on the binding signal.
    GPUs not busy: cut the max queue delay multiplicatively (AIMD), and add replicas only once it is at
    its lower bound.
    """
    p = t.policy
    head = f"{t.p99_words} > target {p.target_p99_seconds:.2f} s, {t.gpu_words}"
    if t.drained is not None:  # the window's P99 is history: recommend what the demand needs now
        out = unchanged(t, f"{head}: {t.drained}", conditions.BACKLOG_DRAINED)
        return out if t.needed is None else replace(out, recommendation=min(t.needed, t.replicas))
    if t.busy and t.needed is not None:  # the demand is covered: one replica more, not the P99 ratio
        return with_scale_up(t, f"{head}, demand covered", (t.replicas + 1) / t.replicas)
    if t.busy:
        return with_scale_up(t, head, max(t.ratio, t.utilization / p.gpu_high))
    if t.max_queue_delay_seconds <= p.max_queue_delay_min_seconds:
        return with_scale_up(t, f"{head}, max queue delay at minimum", t.ratio)
    if not cooled(t.state.last_max_queue_delay_change, p.max_queue_delay_cooldown_seconds, t.now):
        return unchanged(t, f"{head}: max queue delay cooling down", conditions.MAX_QUEUE_DELAY_COOLING_DOWN)
    cut = max(p.max_queue_delay_min_seconds, t.max_queue_delay_seconds * p.max_queue_delay_decrease_factor)
    return replace(
        unchanged(t, f"{head}: max queue delay {ms(t.max_queue_delay_seconds)} → {ms(cut)}"),
        max_queue_delay_seconds=cut,
        last_max_queue_delay_change=t.now,
    )


def in_recommendation(t: Tick) -> int:
    """Fewest replicas whose projected utilization is near the band's middle and strictly under its top
    (the current count when the GPUs are busy or no fewer would do)."""
    p = t.policy
    if t.busy:
        return t.replicas
    if t.needed is not None:  # the SLO-capacity rule knows the count
        return min(t.needed, t.replicas)
    wanted = max(p.min_replicas, math.ceil(t.replicas * t.utilization / p.gpu_target - EPS))
    if wanted < t.replicas and t.replicas * t.utilization / wanted < p.gpu_high:
        return wanted
    return t.replicas


def grow_max_queue_delay(t: Tick, out: Outcome) -> tuple[Outcome, str | None]:
    """Grow the max queue delay additively toward its upper bound (AIMD); the words, ``None`` at the top."""
    p = t.policy
    if t.max_queue_delay_seconds >= p.max_queue_delay_max_seconds:
        return out, None
    if not cooled(t.state.last_max_queue_delay_change, p.max_queue_delay_cooldown_seconds, t.now):
        return replace(
            out, holds=(*out.holds, conditions.MAX_QUEUE_DELAY_COOLING_DOWN)
        ), "max queue delay cooling down"
    grown = min(p.max_queue_delay_max_seconds, t.max_queue_delay_seconds + p.max_queue_delay_step_seconds)
    words = f"max queue delay {ms(t.max_queue_delay_seconds)} → {ms(grown)}"
    return replace(out, max_queue_delay_seconds=grown, last_max_queue_delay_change=t.now), words


def band_headroom(t: Tick, head: str) -> Outcome | None:
    """P99 under target but the GPUs at or over the band's top: add headroom,
    ``ceil(replicas * utilization / gpu_high)``, so that a load step finds spare capacity. ``None`` when
    the GPUs are not busy, ``keep_in_band`` is off or the SLO-capacity rule knows the count (it plans
    the headroom itself)."""
    if not t.busy or not t.policy.keep_in_band or t.needed is not None:
        return None
    return with_scale_up(t, head, t.utilization / t.policy.gpu_high)


def under_target(t: Tick) -> Outcome:
    """P99 comfortably under target: headroom when the GPUs run above the band (``band_headroom``),
    else a scale-in after the stabilization window; the max queue delay grows additively."""
    p = t.policy
    head = f"{t.p99_words} < target {p.target_p99_seconds:.2f} s, {t.gpu_words}"
    parts: list[str] = []
    headroom = band_headroom(t, head)
    if headroom is not None:
        out = headroom
        parts.append(out.words.removeprefix(f"{head}: "))
    else:
        out = replace(unchanged(t, head), recommendation=in_recommendation(t))
    if t.needed_why and t.needed is not None and t.needed >= t.replicas:  # why no scale-in, in words
        parts.append(f"keeps {t.replicas} replicas{t.needed_why}")
    for step in (scale_in, grow_max_queue_delay):
        out, words = step(t, out)
        if words is not None:
            parts.append(words)
    words = f"{head}: {', '.join(parts) if parts else 'nothing to change'}"
    return replace(out, words=words, holds=(*out.holds, conditions.TARGET_MET))


def within_tolerance(t: Tick) -> Outcome:
    """Inside the tolerance band ``|p99 / target - 1| <= tolerance``: nothing moves."""
    p = t.policy
    words = (
        f"{t.p99_words} within {p.tolerance:.0%} of target {p.target_p99_seconds:.2f} s, {t.gpu_words}: hold"
    )
    return unchanged(t, words, conditions.WITHIN_TOLERANCE)
