"""Scale to zero: the rule that takes an idle service from its replicas to none, and the hold at zero.

Off unless ``Policy.idle_after_seconds`` is set. A service is idle on a tick when its observation says
so (``Observation.idle``: a measured request rate of 0 with nothing queued) and nothing is in flight;
``State.idle_since`` is the first tick of the current idle run (``memory.next_state`` carries it; any
tick that is not idle, or whose signals are unknown, ends the run). Once a run has lasted
``idle_after_seconds`` the replicas go to 0 whatever the other rules decided (Knative's scale-to-zero
grace period and KEDA's ``cooldownPeriod`` play this part). The run starts over after an operator
restart: the memory is not persisted, so a restarted operator waits a whole window.

One writer per transition: 1 -> 0 is this rule's decision, written by the reconciler like any other;
0 -> 1 is demand, which the autoscaler does not see at zero (no pod, no metrics): at zero ``decide``
holds (``at_zero``), and a replica is asked for by what holds the service's requests while it has none.
"""

from __future__ import annotations

from dataclasses import replace

from kubeinfer.operator import conditions
from kubeinfer.operator.autoscale.policy.tick import Outcome, Tick
from kubeinfer.operator.autoscale.policy.values import Observation, Policy

__all__ = ["AT_ZERO_HOLD", "at_zero", "idle", "idle_since", "scale_to_zero"]


def idle(obs: Observation) -> bool:
    """Whether a checked observation shows an idle service: no request completed in the window, none
    queued and none in flight (unknown in flight counts as none: the queue and rate already say idle)."""
    return obs.idle and not obs.inflight_requests


def idle_since(t: Tick) -> float | None:
    """The start of the idle run ``t`` is part of (``t.now`` when it starts here), or None when ``t``
    is not idle, a replica is still starting, or scale to zero is off (the state then carries nothing).

    A tick with a replica starting (``Tick.starting``: fewer ready than asked for) is not idle: a
    service woken from zero reads idle on its last pod's series until its new pod serves the requests
    the activator holds for it, and going back to zero then would leave them waiting for a replica
    nobody asks for any more (the activator's demand is older than the new scale to zero). The cost: a
    replica that never turns ready (unschedulable, crash-looping) keeps its service from zero, its
    ``Ready=False`` condition saying why."""
    if t.policy.idle_after_seconds is None or not idle(t.obs) or t.starting > 0:
        return None
    return t.state.idle_since if t.state.idle_since is not None else t.now


def scale_to_zero(t: Tick, out: Outcome) -> Outcome:
    """``out``, or 0 replicas once the service has been idle for ``Policy.idle_after_seconds``.

    Args:
        t: the tick (its ``state.idle_since`` and ``now``, seconds).
        out: what the other rules decided on it.

    Returns:
        An ``Outcome`` with ``replicas == 0`` (``last_scale_down = t.now``) when the idle run that
        includes this tick began at least ``idle_after_seconds`` before ``t.now``; else ``out``.
    """
    after = t.policy.idle_after_seconds
    since = idle_since(t)
    if after is None or since is None or t.now - since < after:
        return out
    words = (
        f"no requests for {t.now - since:.0f} s (scale to zero after {after:.0f} s): "
        f"{t.replicas} → 0 replicas"
    )
    return replace(out, replicas=0, words=words, holds=(), recommendation=0, last_scale_down=t.now)


def at_zero(policy: Policy) -> str:
    """The reason of a tick at zero replicas: the autoscaler holds; a request asks for a replica."""
    return (
        f"at zero replicas (scaled to zero after {policy.idle_after_seconds or 0.0:.0f} s without requests); "
        "a request brings one back"
    )


#: The hold of a tick at zero replicas.
AT_ZERO_HOLD = conditions.SCALED_TO_ZERO
