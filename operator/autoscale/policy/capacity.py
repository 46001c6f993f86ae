"""The SLO-capacity rule's actions: scale out ahead of the demand, and fuller batches while it starts.

``ahead_of_demand`` acts when ``Tick.needed`` (``plan.plan``) is over the replicas provisioned;
``during_cold_start`` amends whichever rule acted while added replicas start.
"""

from __future__ import annotations

from dataclasses import replace

from kubeinfer.operator.autoscale.policy.common import ms
from kubeinfer.operator.autoscale.policy.plan import cold_start_timeout
from kubeinfer.operator.autoscale.policy.tick import Outcome, Tick, unchanged

__all__ = ["ahead_of_demand", "during_cold_start"]


def ahead_of_demand(t: Tick) -> Outcome:
    """The SLO-capacity rule: the demand needs more replicas than are provisioned (those starting
    included), so add them now, before the P99 over the query window shows the breach. No cooldown: the
    count comes from the demand, not from a latency that still holds the past (``Tick.needed``)."""
    needed = t.needed if t.needed is not None else t.replicas
    head = (
        f"demand {t.demand or 0:.0f}/s needs {needed} replicas at "
        f"{t.policy.plan_utilization:.0%} of {t.capacity or 0:.0f}/s each{t.needed_why}"
    )
    out = unchanged(t, f"{head}: {t.replicas} → {needed} replicas")
    return replace(out, replicas=needed, recommendation=needed, last_scale_up=t.now)


def during_cold_start(t: Tick, out: Outcome) -> Outcome:
    """While replicas are starting and the demand is over what the ready ones serve, lengthen the batch
    timeout to ``cold_start_timeout``: fuller batches raise a replica's throughput b / s(b). ``out`` as it
    was when the policy's ``cold_start_timeout`` is off or s(b) is unknown."""
    p, obs = t.policy, t.obs
    ready = t.replicas - t.starting  # serving now; out.replicas - ready will be starting
    a, c, batch = obs.service_time_a_seconds, obs.service_time_c_seconds, obs.max_batch_size
    if not p.cold_start_timeout or a is None or c is None or batch is None or t.capacity is None:
        return out
    if out.replicas <= ready or (t.demand or 0.0) <= ready * t.capacity:
        return out
    bounds = (p.max_queue_delay_min_seconds, p.max_queue_delay_max_seconds)
    longer = cold_start_timeout(a, c, int(batch), p.target_p99_seconds, bounds)
    if longer <= out.max_queue_delay_seconds + 1e-12:
        return out
    words = f"{out.words}; cold start: max queue delay {ms(out.max_queue_delay_seconds)} → {ms(longer)}"
    return replace(out, max_queue_delay_seconds=longer, last_max_queue_delay_change=t.now, words=words)
