"""What every rule of one ``decide`` step reads (``Tick``) and what each returns (``Outcome``)."""

from __future__ import annotations

from dataclasses import dataclass

from kubeinfer.operator.autoscale import headroom
from kubeinfer.operator.autoscale.policy.common import ms
from kubeinfer.operator.autoscale.policy.plan import Plan, learned_burst
from kubeinfer.operator.autoscale.policy.plan import plan as count_replicas
from kubeinfer.operator.autoscale.policy.values import Current, Observation, Policy, State

__all__ = [
    "DRAINED_WAIT_FRACTION",
    "DRAINED_WAIT_MODEL_FRACTION",
    "Outcome",
    "Tick",
    "bounded",
    "drained",
    "unchanged",
]

#: A P99 over target while the requests in the service would wait at most this share of the target by
#: Little's law is a drained backlog still in the query window: kubeinfer's choice, tuned with
#: ``bench/autoscaler_sim.py`` (without it the simulated step trace overshoots to max replicas).
DRAINED_WAIT_FRACTION = 0.1
#: The same share when the SLO-capacity rule knows the count (it recommends what the demand needs, so a
#: larger share is safe and lets the stabilization window start from the demand): kubeinfer's choice.
DRAINED_WAIT_MODEL_FRACTION = 0.5


@dataclass(frozen=True)
class Tick:
    """What every rule of one ``decide`` step reads; built once by ``Tick.of``, never changed.

    Attributes:
        obs: the checked observation. policy, state, now: as given to ``decide``.
        replicas, max_queue_delay_seconds: the values in force brought into the policy's bounds.
        utilization: GPU utilization, ratio. ratio: P99 over target (0 when idle).
        busy: utilization at or above ``gpu_high``. p99_words, gpu_words: the signals in words.
        starting: replicas of the last scale-up not yet ready.
        last_unready: ``now`` if some are starting, else the state's.
        up_since: the later of the last scale-up and the last tick with replicas starting.
        drained: why the backlog counts as drained (Little's law), or ``None``.
        plan: the SLO-capacity rule's count (``plan.plan``); its fields read as the tick's own
            (``demand``, ``capacity``, ``needed``, ``burst``, ``needed_why``).
    """

    obs: Observation
    policy: Policy
    state: State
    now: float
    replicas: int
    max_queue_delay_seconds: float
    utilization: float
    ratio: float
    busy: bool
    p99_words: str
    gpu_words: str
    starting: int
    last_unready: float | None
    up_since: float | None
    drained: str | None
    plan: Plan

    @property
    def demand(self) -> float | None:
        """Requests/s to plan for (``Plan.demand``)."""
        return self.plan.demand

    @property
    def capacity(self) -> float | None:
        """Requests/s one replica serves at the SLO (``Plan.capacity``)."""
        return self.plan.capacity

    @property
    def needed(self) -> int | None:
        """Replicas the capacity rule asks for, ``None`` when it does not apply (``Plan.needed``)."""
        return self.plan.needed

    @property
    def burst(self) -> headroom.Burst | None:
        """The burst headroom learned so far (``Plan.burst``)."""
        return self.plan.burst

    @property
    def needed_why(self) -> str:
        """Words for what set ``needed`` when the demand did not (``Plan.needed_why``)."""
        return self.plan.needed_why

    @classmethod
    def of(cls, obs: Observation, current: Current, policy: Policy, state: State, now: float) -> Tick:
        """The tick for a checked ``obs`` (``check_observation`` returned it)."""
        n, timeout = bounded(current, policy)
        u = float(obs.gpu_utilization or 0.0)
        busy = u >= policy.gpu_high
        idle = obs.idle or obs.p99_seconds is None
        starting = 0 if current.ready_replicas is None else max(0, n - current.ready_replicas)
        last_unready = now if starting > 0 else state.last_unready
        counted = count_replicas(obs, policy, timeout, learned_burst(obs, policy, state, now))
        fraction = DRAINED_WAIT_MODEL_FRACTION if counted.needed is not None else DRAINED_WAIT_FRACTION
        return cls(
            obs=obs,
            policy=policy,
            state=state,
            now=now,
            replicas=n,
            max_queue_delay_seconds=timeout,
            utilization=u,
            ratio=0.0 if idle or obs.p99_seconds is None else obs.p99_seconds / policy.target_p99_seconds,
            busy=busy,
            p99_words="no requests" if idle else f"P99 {obs.p99_seconds:.2f} s",
            gpu_words=f"GPU {u:.2f} {'busy' if busy else 'not busy'}",
            starting=starting,
            last_unready=last_unready,
            up_since=max((t for t in (state.last_scale_up, last_unready) if t is not None), default=None),
            drained=drained(obs, policy.target_p99_seconds * fraction),
            plan=counted,
        )


@dataclass(frozen=True)
class Outcome:
    """What one rule (``capacity.ahead_of_demand``, ``reactive.over_target``, ``reactive.under_target``,
    ``reactive.within_tolerance``) decided, and what the rules after it (``capacity.during_cold_start``)
    amend.

    Attributes:
        replicas, max_queue_delay_seconds: the values to have in force.
        words: the reason, without the bounds note.
        holds: kinds of hold met, first = the one reported when nothing changes.
        recommendation: this tick's replica recommendation for the stabilization window.
        last_scale_up, last_scale_down, last_max_queue_delay_change: the clocks for the next ``State``.
    """

    replicas: int
    max_queue_delay_seconds: float
    words: str
    holds: tuple[str, ...]
    recommendation: int
    last_scale_up: float | None
    last_scale_down: float | None
    last_max_queue_delay_change: float | None


def unchanged(t: Tick, words: str, *holds: str) -> Outcome:
    """An outcome that keeps what is in force (and the state's clocks), with ``words`` and ``holds``."""
    return Outcome(
        t.replicas,
        t.max_queue_delay_seconds,
        words,
        holds,
        t.replicas,
        t.state.last_scale_up,
        t.state.last_scale_down,
        t.state.last_max_queue_delay_change,
    )


def bounded(current: Current, policy: Policy) -> tuple[int, float]:
    """The replicas and max queue delay in force, brought into the policy's bounds."""
    replicas = min(max(current.replicas, policy.min_replicas), policy.max_replicas)
    timeout = min(
        max(current.max_queue_delay_seconds, policy.max_queue_delay_min_seconds),
        policy.max_queue_delay_max_seconds,
    )
    return replicas, timeout


def drained(obs: Observation, limit: float) -> str | None:
    """Why a P99 over target is history, not a present overload, or ``None``.

    Little's law (L = λW): the time a request arriving now can expect to spend in the service is the
    requests in it (queued + executing) over the throughput. When it is at most ``limit`` seconds while
    P99 is over target, the P99 over the query window describes a backlog that has already drained (the
    window still holds its slow requests): acting on it would overshoot. Unknown in-flight count: the
    rule does not apply (the queue alone misses the requests executing in batches).
    """
    if obs.inflight_requests is None or not obs.request_rate:
        return None
    latency = obs.inflight_requests / obs.request_rate
    if latency > limit:
        return None
    return (
        f"backlog drained ({obs.inflight_requests:.0f} in flight at {obs.request_rate:.1f}/s: "
        f"{ms(latency)} by Little's law), waiting for the window to catch up"
    )
