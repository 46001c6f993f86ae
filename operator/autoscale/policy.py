"""The autoscaler's control law: a pure function of (observation, current, policy, state, now).

``decide`` keeps the P99 latency at or under ``Policy.target_p99_seconds`` with the fewest replicas,
using two levers: the replica count and the batch timeout (the runtime's max queue delay).

- P99 over target while the GPUs are busy (utilization at or above ``gpu_high``): scale out in
  proportion to the overload on the binding signal, the HPA ratio
  ``ceil(replicas * max(p99 / target, utilization / gpu_high))`` (Kubernetes HPA algorithm,
  https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details),
  bounded by ``max_replicas`` and ``max_scale_up_step``.
- P99 over target while the GPUs are not busy: the delay is queueing the service imposes on itself.
  Cut the batch timeout multiplicatively (AIMD's multiplicative decrease, as in TCP congestion
  control, RFC 5681 / Chiu & Jain 1989); add replicas only once the timeout is at its lower bound.
- P99 comfortably under target: grow the batch timeout additively toward its upper bound (AIMD's
  additive increase). Scale in only after the stabilization window: like the HPA, every tick records
  a replica recommendation and a scale-in goes to the highest recommendation of the last
  ``scale_down_stabilization_seconds`` (HPA default 300 s); a recommendation below the current
  count requires that the utilization projected for it, ``utilization * replicas / recommended``,
  stays under ``gpu_high``.
- P99 comfortably under target but the GPUs above the band's top (``keep_in_band``): add headroom,
  ``ceil(replicas * utilization / gpu_high)``, so that a load step finds spare capacity.
- Inside the tolerance band ``|p99 / target - 1| <= tolerance`` (HPA default 0.1) nothing moves.
- No scale-up while replicas of the last one are still starting (``Current.ready_replicas``): their
  capacity is on its way (the HPA likewise discounts unready pods).
- P99 over target while the service holds little work (Little's law, L = λW: the requests in flight,
  queued *and* executing, over the completion rate, ``inflight / rate``, at most
  ``drained_wait_fraction * target``) is history, not a present overload: the query window still
  holds the slow requests of a backlog that has drained. Nothing moves until the window catches up.
  The queue alone is not that signal: requests already taken into batches have left the queue but
  not the service, so a service slow in execution shows an empty queue while its latency is seconds.
- Cooldowns separate actions of the same kind; replicas stay in ``[min_replicas, max_replicas]``
  and never reach zero.

An observation that is missing, NaN, infinite, stale or an error is *unknown*: the decision holds
everything and says why. It is never read as zero. One exception is spelled out: a measured request
rate of exactly 0 (the counter exists and did not move) means the service is idle, so its P99 is not
defined (Prometheus' ``histogram_quantile`` returns NaN on zero rates); an idle service is treated
as comfortably under target.

Nothing here reads a clock, sleeps or does I/O: ``now`` (seconds, any monotonic epoch) is an
argument and the next ``State`` is part of the ``Decision``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

__all__ = ["Current", "Decision", "Observation", "Policy", "State", "decide"]


def _finite(value: float | None) -> bool:
    return value is not None and not math.isnan(value) and not math.isinf(value)


@dataclass(frozen=True)
class Observation:
    """What Prometheus said about one InferenceService.

    Attributes:
        p99_seconds: P99 request latency over the query window, seconds; ``None`` when not defined.
        gpu_utilization: mean accelerator utilization of the service's pods, ratio in [0, 1].
        request_rate: requests per second over the window; ``0.0`` is a measured zero (idle).
        queue_size: requests queued across the service's pods (waiting, not yet in a batch).
        inflight_requests: requests received and not yet answered across the service's pods (queued
            plus executing: ``kubeinfer_inflight_requests``); ``None`` when unknown.
        sample_age_seconds: age of the newest sample behind the signals, seconds.
        unknown_reason: set when the signals could not be read (Prometheus down, empty result,
            NaN, +Inf, stale samples, query error); the policy then holds. ``None`` when known.
    """

    p99_seconds: float | None
    gpu_utilization: float | None
    request_rate: float | None = None
    queue_size: float | None = None
    sample_age_seconds: float | None = None
    inflight_requests: float | None = None
    unknown_reason: str | None = None

    @classmethod
    def unknown(cls, reason: str) -> Observation:
        """An observation carrying no usable signal, only the reason why."""
        return cls(p99_seconds=None, gpu_utilization=None, unknown_reason=reason)

    @property
    def idle(self) -> bool:
        """True when the request rate is a measured 0 and the service therefore has no P99, and nothing
        is queued: a queue that no completed request drains is a stuck service, not an idle one."""
        return (
            self.request_rate is not None
            and self.request_rate == 0.0
            and not self.queue_size
            and not _finite(self.p99_seconds)
        )

    def problem(self, stale_after_seconds: float) -> str | None:
        """Why this observation cannot be acted on, or ``None`` when it can.

        Checks the explicit ``unknown_reason`` first, then staleness against
        ``stale_after_seconds``, then that P99 (unless idle) and GPU utilization are finite.
        """
        if self.unknown_reason is not None:
            return self.unknown_reason
        if self.sample_age_seconds is not None and (
            not _finite(self.sample_age_seconds) or self.sample_age_seconds > stale_after_seconds
        ):
            return f"stale metrics: newest sample {self.sample_age_seconds:.0f} s old"
        if not self.idle:
            if self.p99_seconds is None and self.request_rate == 0.0 and self.queue_size:
                return f"no request completed in the window while {self.queue_size:.0f} are queued"
            if self.p99_seconds is None:
                return "P99 latency missing"
            if not _finite(self.p99_seconds):
                return f"P99 latency is {self.p99_seconds}"
            if self.p99_seconds < 0:
                return f"P99 latency is negative ({self.p99_seconds})"
        if self.gpu_utilization is None:
            return "GPU utilization missing"
        if not _finite(self.gpu_utilization):
            return f"GPU utilization is {self.gpu_utilization}"
        if self.gpu_utilization < 0:
            return f"GPU utilization is negative ({self.gpu_utilization})"
        return None


@dataclass(frozen=True)
class Current:
    """What is in force now.

    Attributes:
        replicas: the Deployment's ``spec.replicas`` (may be 0 or out of bounds if someone else
            wrote it; ``decide`` brings it back into bounds).
        batch_timeout_seconds: the runtime's ``batching.max_queue_delay_seconds``, seconds.
        ready_replicas: the Deployment's ready replicas, ``None`` when unknown. While fewer than
            ``replicas`` are ready, the last scale-up is still starting and no further one is made
            (their capacity is on its way; the HPA likewise discounts unready pods).
    """

    replicas: int
    batch_timeout_seconds: float
    ready_replicas: int | None = None


@dataclass(frozen=True)
class Policy:
    """Tunables of the control law. Durations in seconds, utilizations as ratios in [0, 1].

    Defaults and their sources:
        tolerance 0.1 and scale_down_stabilization_seconds 300: the Kubernetes HPA's defaults
        (``--horizontal-pod-autoscaler-tolerance``, ``behavior.scaleDown.stabilizationWindowSeconds``).
        timeout_decrease_factor 0.5 / timeout_increase_step_seconds: AIMD as in TCP congestion control
        (RFC 5681: halve on congestion, grow by a constant per round trip); the step is 1 ms here.
        gpu_low/gpu_high 0.5/0.8: kubeinfer's choice, a band around the 70 % HPA target that the
        benchmark's ``hpa_gpu`` uses. Cooldowns: kubeinfer's choice, at least one scrape + query
        window apart so an action's effect is visible before the next of the same kind.
        drained_wait_fraction 0.1, keep_in_band True: kubeinfer's choice, tuned with
        ``bench/autoscaler_sim.py`` (without them the simulated step trace overshoots to max replicas).

    Raises:
        ValueError: naming the field, when a value is out of range or bounds are inverted.
    """

    min_replicas: int = 1
    max_replicas: int = 10
    target_p99_seconds: float = 0.2
    gpu_low: float = 0.5
    gpu_high: float = 0.8
    batch_timeout_min_seconds: float = 0.0005
    batch_timeout_max_seconds: float = 0.02
    tolerance: float = 0.1
    scale_down_stabilization_seconds: float = 300.0
    scale_up_cooldown_seconds: float = 30.0
    scale_down_cooldown_seconds: float = 60.0
    timeout_cooldown_seconds: float = 15.0
    max_scale_up_step: int = 4
    timeout_decrease_factor: float = 0.5
    timeout_increase_step_seconds: float = 0.001
    stale_after_seconds: float = 120.0
    drained_wait_fraction: float = 0.1
    keep_in_band: bool = True

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"autoscaling policy: {name} {why} (got {getattr(self, name)!r})")

        if self.min_replicas < 1:
            raise bad("min_replicas", "must be at least 1")
        if self.max_replicas < self.min_replicas:
            raise bad("max_replicas", f"must be >= min_replicas ({self.min_replicas})")
        if not self.target_p99_seconds > 0:
            raise bad("target_p99_seconds", "must be > 0")
        if not 0 <= self.gpu_low < self.gpu_high <= 1:
            raise bad("gpu_high", f"must satisfy 0 <= gpu_low ({self.gpu_low}) < gpu_high <= 1")
        if self.batch_timeout_min_seconds < 0:
            raise bad("batch_timeout_min_seconds", "must be >= 0")
        if self.batch_timeout_max_seconds < self.batch_timeout_min_seconds:
            raise bad("batch_timeout_max_seconds", "must be >= batch_timeout_min_seconds")
        if not 0 <= self.tolerance < 1:
            raise bad("tolerance", "must be in [0, 1)")
        for name in (
            "scale_down_stabilization_seconds",
            "scale_up_cooldown_seconds",
            "scale_down_cooldown_seconds",
            "timeout_cooldown_seconds",
        ):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        if self.max_scale_up_step < 1:
            raise bad("max_scale_up_step", "must be at least 1")
        if not 0 < self.timeout_decrease_factor < 1:
            raise bad("timeout_decrease_factor", "must be in (0, 1)")
        if self.timeout_increase_step_seconds <= 0:
            raise bad("timeout_increase_step_seconds", "must be > 0")
        if not 0 <= self.drained_wait_fraction < 1:
            raise bad("drained_wait_fraction", "must be in [0, 1)")
        if not self.stale_after_seconds > 0:
            raise bad("stale_after_seconds", "must be > 0")

    @property
    def gpu_target(self) -> float:
        """Utilization a scale-in aims for: the middle of the band, ratio."""
        return (self.gpu_low + self.gpu_high) / 2


@dataclass(frozen=True)
class State:
    """Memory of past decisions, carried from one ``decide`` to the next.

    Attributes:
        last_scale_up: ``now`` of the last scale-up, or ``None``.
        last_unready: ``now`` of the last tick that saw fewer ready replicas than desired; the
            scale-up cooldown runs from the later of this and ``last_scale_up`` (the effect of added
            capacity is only visible once it serves).
        last_scale_down: ``now`` of the last scale-down, or ``None``.
        last_timeout_change: ``now`` of the last batch-timeout change, or ``None``.
        first_seen: ``now`` of the first known observation; no scale-in before a whole
            stabilization window has been observed (so a restarted operator waits one window).
        recommendations: ``(now, replicas)`` per known tick within the stabilization window, oldest
            first, like the HPA's recommendation history.
    """

    last_scale_up: float | None = None
    last_unready: float | None = None
    last_scale_down: float | None = None
    last_timeout_change: float | None = None
    first_seen: float | None = None
    recommendations: tuple[tuple[float, int], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Decision:
    """The outcome of one tick.

    Attributes:
        replicas: replica count to have in force.
        batch_timeout_seconds: batch timeout to have in force, seconds.
        reason: plain words, e.g. ``"P99 0.31 s > target 0.20 s, GPU 0.91 busy: 3 → 5 replicas"``.
        replicas_changed / timeout_changed: whether the value differs from ``Current``.
        known: False when the observation was unknown and everything was held.
        state: the ``State`` to pass to the next ``decide``.
        hold: when a known decision changes nothing, the kind of hold in CamelCase, stable from tick to
            tick while the numbers in ``reason`` move: ``BacklogDrained``, ``AtMaxReplicas``,
            ``ReplicasStarting``, ``ScaleUpCoolingDown``, ``BatchTimeoutCoolingDown``,
            ``StabilizationWindow``, ``ScaleInCoolingDown``, ``WithinTolerance``, ``TargetMet``;
            ``None`` when the decision changes something or the observation is unknown.
    """

    replicas: int
    batch_timeout_seconds: float
    reason: str
    replicas_changed: bool
    timeout_changed: bool
    known: bool
    state: State
    hold: str | None = None

    @property
    def changed(self) -> bool:
        """True when the decision changes replicas or the batch timeout."""
        return self.replicas_changed or self.timeout_changed


def _cooled(last: float | None, cooldown: float, now: float) -> bool:
    return last is None or now - last >= cooldown


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3g} ms"


def decide(observation: Observation, current: Current, policy: Policy, state: State, now: float) -> Decision:
    """One step of the control law (see the module docstring).

    Args:
        observation: the signals; unknown ones make the decision hold.
        current: replicas and batch timeout in force.
        policy: tunables.
        state: the previous decision's ``state`` (``State()`` at start).
        now: the current time, seconds on any clock that only moves forward.

    Returns:
        A ``Decision``; ``replicas`` is always within ``[policy.min_replicas, policy.max_replicas]``
        and ``batch_timeout_seconds`` within the policy's timeout bounds.
    """
    n = current.replicas
    timeout = current.batch_timeout_seconds
    bounded_n = min(max(n, policy.min_replicas), policy.max_replicas)
    bounded_t = min(max(timeout, policy.batch_timeout_min_seconds), policy.batch_timeout_max_seconds)

    def result(
        replicas: int,
        batch_timeout: float,
        reason: str,
        next_state: State,
        known: bool,
        hold: str | None = None,
    ) -> Decision:
        replicas_changed = replicas != n
        timeout_changed = not math.isclose(batch_timeout, timeout, rel_tol=1e-9, abs_tol=1e-12)
        return Decision(
            replicas=replicas,
            batch_timeout_seconds=batch_timeout,
            reason=reason,
            replicas_changed=replicas_changed,
            timeout_changed=timeout_changed,
            known=known,
            state=next_state,
            hold=None if replicas_changed or timeout_changed or not known else hold,
        )

    bounds_note = ""
    if bounded_n != n:
        bounds_note += f"replicas {n} outside [{policy.min_replicas}, {policy.max_replicas}] → {bounded_n}; "
    if not math.isclose(bounded_t, timeout, rel_tol=1e-9, abs_tol=1e-12):
        bounds_note += f"batch timeout {_ms(timeout)} outside bounds → {_ms(bounded_t)}; "

    problem = observation.problem(policy.stale_after_seconds)
    if problem is not None:
        # Hold. Bounds are still enforced (they do not depend on the signals), nothing else moves.
        return result(bounded_n, bounded_t, f"{bounds_note}holding: {problem}", state, known=False)

    u = float(observation.gpu_utilization or 0.0)
    p99 = observation.p99_seconds
    target = policy.target_p99_seconds
    busy = u >= policy.gpu_high
    gpu_words = f"GPU {u:.2f} {'busy' if busy else 'not busy'}"
    if observation.idle or p99 is None:
        ratio = 0.0
        p99_words = "no requests"
    else:
        ratio = p99 / target
        p99_words = f"P99 {p99:.2f} s"

    first_seen = state.first_seen if state.first_seen is not None else now
    window = policy.scale_down_stabilization_seconds
    replicas = bounded_n
    batch_timeout = bounded_t
    last_up, last_down, last_t = state.last_scale_up, state.last_scale_down, state.last_timeout_change
    words: str
    holds: list[str] = []  # kinds of hold met this tick, first = the one reported

    # A tiny epsilon keeps the band's edges inside the band despite float rounding (0.18 / 0.2).
    step_cap = min(policy.max_replicas, bounded_n + policy.max_scale_up_step)
    starting = 0 if current.ready_replicas is None else max(0, bounded_n - current.ready_replicas)
    last_unready = now if starting > 0 else state.last_unready
    up_since = max((t for t in (last_up, last_unready) if t is not None), default=None)

    # Little's law (L = λW): the time a request arriving now can expect to spend in the service is the
    # requests in it (queued + executing) over the throughput. When it is a small part of the target
    # while P99 is over it, the P99 over the query window describes a backlog that has already drained
    # (the window still holds its slow requests): acting on it would overshoot. Unknown in-flight count:
    # the rule does not apply (the queue alone misses the requests executing in batches).
    drained: str | None = None
    if observation.inflight_requests is not None and observation.request_rate:
        latency = observation.inflight_requests / observation.request_rate
        if latency <= policy.drained_wait_fraction * target:
            drained = (
                f"backlog drained ({observation.inflight_requests:.0f} in flight at "
                f"{observation.request_rate:.1f}/s: {_ms(latency)} by Little's law), "
                "waiting for the window to catch up"
            )

    def scale_up(head: str, overload: float) -> tuple[int, str]:
        """Replicas and words for a scale-up by the HPA ratio ``overload``, or why it waits."""
        wanted = min(step_cap, max(bounded_n + 1, math.ceil(bounded_n * overload - 1e-9)))
        if wanted <= bounded_n:
            holds.append("AtMaxReplicas")
            return bounded_n, f"{head}: at max replicas {policy.max_replicas}"
        if starting > 0:
            holds.append("ReplicasStarting")
            return bounded_n, f"{head}: {starting} added replicas still starting"
        if not _cooled(up_since, policy.scale_up_cooldown_seconds, now):
            holds.append("ScaleUpCoolingDown")
            return bounded_n, f"{head}: scale-up cooling down"
        return wanted, f"{head}: {bounded_n} → {wanted} replicas"

    if ratio > 1 + policy.tolerance + 1e-9:
        head = f"{p99_words} > target {target:.2f} s, {gpu_words}"
        if drained is not None:
            holds.append("BacklogDrained")
            words = f"{head}: {drained}"
        elif busy:
            replicas, words = scale_up(head, max(ratio, u / policy.gpu_high))
        elif bounded_t > policy.batch_timeout_min_seconds:
            if _cooled(last_t, policy.timeout_cooldown_seconds, now):
                batch_timeout = max(
                    policy.batch_timeout_min_seconds, bounded_t * policy.timeout_decrease_factor
                )
                last_t = now
                words = f"{head}: batch timeout {_ms(bounded_t)} → {_ms(batch_timeout)}"
            else:
                holds.append("BatchTimeoutCoolingDown")
                words = f"{head}: batch timeout cooling down"
        else:
            replicas, words = scale_up(f"{head}, batch timeout at minimum", ratio)
        if replicas > bounded_n:
            last_up = now
        recommendation = replicas
    elif ratio < 1 - policy.tolerance - 1e-9:
        head = f"{p99_words} < target {target:.2f} s, {gpu_words}"
        # This tick's recommendation: fewest replicas whose projected utilization is near the band's
        # middle and strictly under its top.
        recommendation = bounded_n
        parts: list[str] = []
        if busy and policy.keep_in_band:
            # Latency is fine but the GPUs run above the band: add headroom toward the band's top.
            replicas, up_words = scale_up(head, u / policy.gpu_high)
            if replicas > bounded_n:
                last_up = now
                recommendation = replicas
            parts.append(up_words.removeprefix(f"{head}: "))
        elif not busy:
            wanted = max(policy.min_replicas, math.ceil(bounded_n * u / policy.gpu_target - 1e-9))
            if wanted < bounded_n and bounded_n * u / wanted < policy.gpu_high:
                recommendation = wanted
        stable = max([recommendation, *(r for t, r in state.recommendations if now - t < window)])
        if stable < bounded_n:
            if now - first_seen < window:
                holds.append("StabilizationWindow")
                parts.append(f"scale-in waits for the {window:.0f} s stabilization window")
            elif not _cooled(last_down, policy.scale_down_cooldown_seconds, now):
                holds.append("ScaleInCoolingDown")
                parts.append("scale-in cooling down")
            else:
                replicas, last_down = stable, now
                parts.append(f"{bounded_n} → {replicas} replicas")
        if bounded_t < policy.batch_timeout_max_seconds:
            if _cooled(last_t, policy.timeout_cooldown_seconds, now):
                batch_timeout = min(
                    policy.batch_timeout_max_seconds, bounded_t + policy.timeout_increase_step_seconds
                )
                last_t = now
                parts.append(f"batch timeout {_ms(bounded_t)} → {_ms(batch_timeout)}")
            else:
                holds.append("BatchTimeoutCoolingDown")
                parts.append("batch timeout cooling down")
        holds.append("TargetMet")
        words = f"{head}: {', '.join(parts) if parts else 'nothing to change'}"
    else:
        recommendation = bounded_n
        holds.append("WithinTolerance")
        words = f"{p99_words} within {policy.tolerance:.0%} of target {target:.2f} s, {gpu_words}: hold"

    history = (*((t, r) for t, r in state.recommendations if now - t < window), (now, recommendation))
    next_state = State(
        last_scale_up=last_up,
        last_unready=last_unready,
        last_scale_down=last_down,
        last_timeout_change=last_t,
        first_seen=first_seen,
        recommendations=history,
    )
    return result(
        replicas, batch_timeout, bounds_note + words, next_state, known=True, hold=holds[0] if holds else None
    )


def restore_state(
    *,
    now: float,
    last_scale_up_age: float | None = None,
    last_scale_down_age: float | None = None,
    last_timeout_change_age: float | None = None,
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
        last_timeout_change=at(last_timeout_change_age),
    )
