"""The autoscaler's control law: a pure function of (observation, current, policy, state, now).

``decide`` keeps the P99 latency at or under ``Policy.target_p99_seconds`` with the fewest replicas,
using two levers: the replica count and the batch timeout (the runtime's max queue delay).

**The SLO-capacity rule** (``capacity_rule``, when the observation carries the arrival rate and the
runtime's batch service time s(b) = a + c*b with its max batch size B): what only kubeinfer sees lets
it count the replicas a demand needs instead of waiting for the P99 over the query window to show a
breach. One replica meets the SLO with batches of b rows while ``timeout + 2*s(b) <= target`` (a
request waits at most the batch timeout, the batch in progress and its own batch: Nexus' worst case,
Shen et al., SOSP 2019), so it serves ``b/s(b)`` requests/s (the physical limit of a batching server;
Clipper, Crankshaw et al., NSDI 2017; ``slo_capacity``). The demand is the arrival rate (or the
completion rate if higher) plus the requests in flight drained over ``backlog_drain_seconds`` (Little's
law, L = λW). ``needed = ceil(demand / (plan_utilization * b/s(b)))``, at least enough full-batch
capacity for a ``surge_factor`` surge while the fleet is small (up to ``surge_max_replicas``: a cold
start is longer than a burst takes to build a backlog). More than provisioned (starting replicas
count): scale out now, no cooldown (``_ahead_of_demand``; proactive provisioning from a demand model
as in MArk, Zhang et al., USENIX ATC 2019, and predictive scaling in Autopilot, Rzadca et al.,
EuroSys 2020). While replicas it asked for start and the demand is over what the ready ones serve,
the batch timeout goes to the longest at which a full batch still meets the SLO
(``cold_start_timeout``: fuller batches raise b/s(b)). Scale-in goes to ``needed`` after the
stabilization window. P99 over target with the demand covered adds one replica, not the P99 ratio (the
window still holds the past), and a backlog whose Little's-law wait is under half the target counts as
drained. Without s(b) the reactive law below decides, unchanged; it is also the rule's fallback.

**Burst headroom** (``headroom.burst_factor``, ``burst_headroom``): bursts shorter than a reaction time
(a tick plus a cold start, ``burst_lead_seconds``) meet only the capacity standing when they begin, so
the rule also provisions ``factor * rate`` at a replica's full SLO capacity, where ``factor`` is a high
quantile of the peaks of the bursts (transient rises of the arrival rate within one reaction time, of
more than ``burst_min_rise`` and out of the traffic's own noise: ``headroom.noise_floor``) seen over the
last ``burst_memory_seconds``, once ``burst_min_bursts`` were seen (Autopilot's moving-window
percentile, Rzadca et al., EuroSys 2020; the arrival samples live in ``State.arrivals``). Smooth traffic
learns no burst and pays nothing; a level shift (a step, a ramp) is not a burst. The rate it multiplies
(``_burst_base``) is the arrival rate (not the completion rate, which after a burst is its backlog
draining) carried one reaction time ahead on its rise from the floor (the lowest rate of the last
reaction time), or the floor while a burst is in progress (a burst is not counted twice). Until
``burst_min_samples`` rises are learned the surge floor above, standing on the floor rate, is the prior
for the unknown burstiness; after that the learned factor replaces it, and the surge floor keeps a
smaller factor, ``step_factor``: a step (a level shift, such as a tenant onboarded or a job started)
is never learned as a burst, and on a small fleet the smallest step that outgrows the planned headroom
overloads it for a whole cold start. A level the arrivals left within one reaction time
(``headroom.left_level``: a sudden drop of more than ``1 / plan_utilization``, the standing headroom
planned for the level after it, and more than the noise floor) is held at a replica's full SLO capacity
for ``burst_memory_seconds`` (``hold_left_level``): traffic that left that fast, in a failover, can come
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
  Cut the batch timeout multiplicatively (AIMD's multiplicative decrease, as in TCP congestion
  control, RFC 5681 / Chiu & Jain 1989); add replicas only once the timeout is at its lower bound.
- P99 comfortably under target: grow the batch timeout additively toward its upper bound (AIMD's
  additive increase). Scale in only after the stabilization window: like the HPA, every tick records
  a replica recommendation and a scale-in goes to the highest recommendation of the last
  ``scale_down_stabilization_seconds`` (HPA default 300 s); a recommendation below the current
  count requires that the utilization projected for it, ``utilization * replicas / recommended``,
  stays under ``gpu_high``. A scale-in also waits (``ArrivalsRising``) while the arrival rate rose by
  more than the tolerance since the last tick and, carried one more tick on that rise, needs more
  replicas than the scale-in leaves (``_arrivals_rising``): scaling in into a rise is a flap, undone
  one reaction time later, and the window only looks back.
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
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from kubeinfer.operator.autoscale import headroom

__all__ = [
    "DECIDE_REQUIRES",
    "INVALID_METRICS",
    "METRICS_MISSING",
    "READER_REQUIRES",
    "STALE_METRICS",
    "UNUSABLE_SIGNALS",
    "Current",
    "Decision",
    "Observation",
    "Policy",
    "Problem",
    "State",
    "check_observation",
    "decide",
    "restore_arrivals",
    "restore_state",
]

#: ``AutoscalingActive=False`` reasons given by ``check_observation`` (the readers' own, such as
#: ``PrometheusUnavailable`` and ``QueryError``, live in ``signals``).
METRICS_MISSING = "MetricsMissing"
INVALID_METRICS = "InvalidMetrics"
STALE_METRICS = "StaleMetrics"
UNUSABLE_SIGNALS = "UnusableSignals"

#: Signals without which ``decide`` holds. P99 is required too unless the service is idle.
DECIDE_REQUIRES: tuple[str, ...] = ("gpu_utilization",)
#: Signals a reader of Prometheus must find (``signals.read_signals``): an empty answer to any of them
#: is ``MetricsMissing``, even for an idle service.
READER_REQUIRES: tuple[str, ...] = ("request_rate", "sample_age_seconds", "gpu_utilization", "p99_seconds")

#: What each missing required signal is called in a ``MetricsMissing`` message.
_MISSING_WORDS = {
    "request_rate": "no request-rate data for this service",
    "sample_age_seconds": "no runtime samples for this service",
    "gpu_utilization": "GPU utilization missing: no GPU utilization data for this service",
    "p99_seconds": "P99 latency missing: no request-duration data for this service",
}


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
        arrival_rate: requests/s arriving over a short window (completions plus the growth of the
            requests in flight); ``None`` when unknown (the capacity rule then uses ``request_rate``).
        service_time_a_seconds, service_time_c_seconds: the runtime's batch service time
            s(b) = a + c*b, seconds and seconds per row; ``None`` when unknown (no capacity rule).
        max_batch_size: the runtime's max batch size in force, rows; ``None`` when unknown.

    Values are as read (NaN, +Inf and negatives included); ``check_observation`` is the one place that
    says whether they can be acted on.
    """

    p99_seconds: float | None
    gpu_utilization: float | None
    request_rate: float | None = None
    queue_size: float | None = None
    sample_age_seconds: float | None = None
    inflight_requests: float | None = None
    unknown_reason: str | None = None
    arrival_rate: float | None = None
    service_time_a_seconds: float | None = None
    service_time_c_seconds: float | None = None
    max_batch_size: float | None = None

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


@dataclass(frozen=True)
class Problem:
    """Why an observation cannot be acted on.

    Attributes:
        reason: the ``AutoscalingActive=False`` reason: ``MetricsMissing``, ``InvalidMetrics``,
            ``StaleMetrics`` or ``UnusableSignals``.
        message: plain words, e.g. ``"P99 latency is nan"``.
    """

    reason: str
    message: str


def _optional(value: float | None) -> float | None:
    """An optional signal: ``None`` when absent, NaN, infinite or negative (never read as zero)."""
    return value if _finite(value) and value is not None and value >= 0 else None


def _positive(value: float | None) -> float | None:
    """An optional signal that must be > 0 (a slope, a batch size): ``None`` otherwise."""
    value = _optional(value)
    return value if value is not None and value > 0 else None


def _invalid(what: str, value: float) -> Problem | None:
    if not _finite(value):
        return Problem(INVALID_METRICS, f"{what} is {value}")
    if value < 0:
        return Problem(INVALID_METRICS, f"{what} is negative ({value})")
    return None


def _age_problem(age: float | None, stale_after_seconds: float) -> Problem | None:
    if age is not None and (not _finite(age) or age > stale_after_seconds):
        return Problem(
            STALE_METRICS,
            f"stale metrics: newest sample {age:.0f} s old (limit {stale_after_seconds:.0f} s)",
        )
    return None


def _p99_problem(obs: Observation, required: Collection[str]) -> Problem | None:
    p99 = obs.p99_seconds
    if obs.idle and (p99 is not None or "p99_seconds" not in required):
        return None  # idle: NaN from histogram_quantile on zero rates, no latency to judge
    if obs.request_rate == 0.0 and obs.queue_size and not _finite(p99):
        return Problem(
            UNUSABLE_SIGNALS, f"no request completed in the window while {obs.queue_size:.0f} are queued"
        )
    if p99 is None:
        return Problem(METRICS_MISSING, _MISSING_WORDS["p99_seconds"])
    return _invalid("P99 latency", p99)


def check_observation(
    observation: Observation, stale_after_seconds: float, required: Collection[str] = DECIDE_REQUIRES
) -> Observation | Problem:
    """The one place that decides whether an observation can be acted on.

    Checks, in order: an explicit ``unknown_reason`` (``UnusableSignals`` with that message); each
    ``required`` signal present (``MetricsMissing``); request rate and GPU utilization finite and not
    negative (``InvalidMetrics``); the newest sample no older than ``stale_after_seconds``
    (``StaleMetrics``; a non-finite age is stale); P99 finite and not negative unless the service is
    idle (a measured rate of 0 with nothing queued), and not undefined while requests are queued
    (``UnusableSignals``: a stuck service, not an idle one).

    Args:
        observation: the values as read.
        stale_after_seconds: the largest acceptable ``sample_age_seconds``, seconds.
        required: names of ``Observation`` fields that must not be ``None`` (``DECIDE_REQUIRES`` or
            ``READER_REQUIRES``).

    Returns:
        A ``Problem``, or the observation cleaned for use: optional signals (queue size, requests in
        flight, arrival rate, s(b) intercept) that are NaN, infinite or negative, and a slope or max
        batch size that is not > 0, become ``None``, an idle service's P99 becomes
        ``None``, GPU utilization is capped at 1 and a negative sample age (clock skew) becomes 0.
    """
    if observation.unknown_reason is not None:
        return Problem(UNUSABLE_SIGNALS, observation.unknown_reason)
    obs = replace(
        observation,
        queue_size=_optional(observation.queue_size),
        inflight_requests=_optional(observation.inflight_requests),
        arrival_rate=_optional(observation.arrival_rate),
        service_time_a_seconds=_optional(observation.service_time_a_seconds),
        service_time_c_seconds=_positive(observation.service_time_c_seconds),
        max_batch_size=_positive(observation.max_batch_size),
    )
    for name in dict.fromkeys((*required, "gpu_utilization")):  # decide cannot act without it
        if getattr(obs, name) is None:
            return Problem(METRICS_MISSING, _MISSING_WORDS.get(name, f"{name} missing"))
    checks = (
        None if obs.request_rate is None else _invalid("request rate", obs.request_rate),
        _age_problem(obs.sample_age_seconds, stale_after_seconds),
        None if obs.gpu_utilization is None else _invalid("GPU utilization", obs.gpu_utilization),
        _p99_problem(obs, required),
    )
    for problem in checks:
        if problem is not None:
            return problem
    gpu = obs.gpu_utilization
    if gpu is None:  # unreachable: required above; keeps the type narrow
        return Problem(METRICS_MISSING, _MISSING_WORDS["gpu_utilization"])
    return replace(
        obs,
        p99_seconds=None if obs.idle else obs.p99_seconds,
        gpu_utilization=min(gpu, 1.0),
        sample_age_seconds=None if obs.sample_age_seconds is None else max(obs.sample_age_seconds, 0.0),
    )


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
        capacity_rule True, plan_utilization 0.85, surge_max_replicas 3: the SLO-capacity rule
        (``slo_capacity``; module docstring), tuned with ``bench/autoscaler_sim.py`` on the step, ramp,
        diurnal and MMPP traces only. surge_factor 5 (was 4 on those four; raised after the held-out
        flash_crowd trace showed a x8 crowd meeting 2 replicas where the HPA had 3: see
        bench/traces/README.md). backlog_drain_seconds 30, drained_wait_model_fraction 0.5: kubeinfer's
        choice.
        cold_start_timeout True: while replicas it asked for are starting and the demand is over the
        ready replicas' capacity, the batch timeout goes to the largest one at which a full batch still
        meets the SLO (``cold_start_timeout``).
        burst_headroom True, burst_memory_seconds 1800, burst_lead_seconds 60, burst_quantile 0.9,
        burst_limit 2, burst_min_samples 20, burst_min_rise 1.5, burst_min_bursts 2: the burst headroom
        (module docstring; ``headroom``), chosen with ``bench/autoscaler_sim.py`` after eleven traces
        had been seen, the noise floor after the eleventh (bench/traces/README.md gives the sensitivity:
        burst_min_rise 1.2-1.6 and burst_min_bursts 2-3 keep every trace at or under the HPA's
        replica-seconds and over its SLO; under 1.5 the sawtooth's tops count as bursts and cost up to
        1.46x the oracle; 1.7, or min_bursts 4, misses compressed_day's first morning burst).
        The lead is one 15 s tick plus the simulated 30 s cold start, rounded up.
        hold_left_level True (read from the burst headroom's samples: off with it): a level the traffic
        left suddenly is held for its return (module docstring), the seventh pass of
        ``bench/autoscaler_sim.py``, chosen after the unseen failover trace (bench/traces/README.md
        gives its price on a drop that stays, job_ends).
        step_factor 2.5: the surge floor once the burst headroom has learned (the eighth pass, chosen
        after the unseen tenant_onboarding and business_hours traces; 1.75-2 keep all but
        business_hours, 3-4 cost weekend_low more: bench/traces/README.md).

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
    capacity_rule: bool = True
    plan_utilization: float = 0.85
    surge_factor: float = 5.0
    surge_max_replicas: int = 3
    drained_wait_model_fraction: float = 0.5
    backlog_drain_seconds: float = 30.0
    cold_start_timeout: bool = True
    burst_headroom: bool = True
    burst_memory_seconds: float = 1800.0
    burst_lead_seconds: float = 60.0
    burst_quantile: float = 0.9
    burst_limit: float = 2.0
    burst_min_samples: int = 20
    burst_min_rise: float = 1.5
    burst_min_bursts: int = 2
    hold_left_level: bool = True
    step_factor: float = 2.5

    def __post_init__(self) -> None:
        cooldowns = (
            "scale_down_stabilization_seconds",
            "scale_up_cooldown_seconds",
            "scale_down_cooldown_seconds",
            "timeout_cooldown_seconds",
        )
        rules: tuple[tuple[str, bool, str], ...] = (
            ("min_replicas", self.min_replicas >= 1, "must be at least 1"),
            (
                "max_replicas",
                self.max_replicas >= self.min_replicas,
                f"must be >= min_replicas ({self.min_replicas})",
            ),
            ("target_p99_seconds", self.target_p99_seconds > 0, "must be > 0"),
            (
                "gpu_high",
                0 <= self.gpu_low < self.gpu_high <= 1,
                f"must satisfy 0 <= gpu_low ({self.gpu_low}) < gpu_high <= 1",
            ),
            ("batch_timeout_min_seconds", self.batch_timeout_min_seconds >= 0, "must be >= 0"),
            (
                "batch_timeout_max_seconds",
                self.batch_timeout_max_seconds >= self.batch_timeout_min_seconds,
                "must be >= batch_timeout_min_seconds",
            ),
            ("tolerance", 0 <= self.tolerance < 1, "must be in [0, 1)"),
            *((name, getattr(self, name) >= 0, "must be >= 0") for name in cooldowns),
            ("max_scale_up_step", self.max_scale_up_step >= 1, "must be at least 1"),
            ("timeout_decrease_factor", 0 < self.timeout_decrease_factor < 1, "must be in (0, 1)"),
            ("timeout_increase_step_seconds", self.timeout_increase_step_seconds > 0, "must be > 0"),
            ("drained_wait_fraction", 0 <= self.drained_wait_fraction < 1, "must be in [0, 1)"),
            ("stale_after_seconds", self.stale_after_seconds > 0, "must be > 0"),
            ("plan_utilization", 0 < self.plan_utilization <= 1, "must be in (0, 1]"),
            ("surge_factor", self.surge_factor >= 1, "must be >= 1"),
            ("step_factor", self.step_factor >= 1, "must be >= 1"),
            ("surge_max_replicas", self.surge_max_replicas >= 0, "must be >= 0"),
            ("drained_wait_model_fraction", 0 <= self.drained_wait_model_fraction < 1, "must be in [0, 1)"),
            ("backlog_drain_seconds", self.backlog_drain_seconds > 0, "must be > 0"),
            ("burst_memory_seconds", self.burst_memory_seconds >= 0, "must be >= 0"),
            ("burst_lead_seconds", self.burst_lead_seconds > 0, "must be > 0"),
            ("burst_quantile", 0 < self.burst_quantile <= 1, "must be in (0, 1]"),
            ("burst_limit", self.burst_limit >= 1, "must be >= 1"),
            ("burst_min_samples", self.burst_min_samples >= 0, "must be >= 0"),
            ("burst_min_rise", self.burst_min_rise >= 1, "must be >= 1"),
            ("burst_min_bursts", self.burst_min_bursts >= 0, "must be >= 0"),
        )
        for name, ok, why in rules:
            if not ok:
                raise ValueError(f"autoscaling policy: {name} {why} (got {getattr(self, name)!r})")

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
        arrivals: ``(now, requests/s)`` arrival-rate samples within ``Policy.burst_memory_seconds``,
            oldest first, that the burst headroom learns from (``headroom.burst_factor``); the last one
            also tells a scale-in whether the arrivals are rising (``_arrivals_rising``). With the
            burst headroom off only one reaction time (``burst_lead_seconds``) of samples is kept.
    """

    last_scale_up: float | None = None
    last_unready: float | None = None
    last_scale_down: float | None = None
    last_timeout_change: float | None = None
    first_seen: float | None = None
    recommendations: tuple[tuple[float, int], ...] = field(default_factory=tuple)
    arrivals: tuple[tuple[float, float], ...] = field(default_factory=tuple)


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
            ``StabilizationWindow``, ``ArrivalsRising``, ``ScaleInCoolingDown``, ``WithinTolerance``,
            ``TargetMet``;
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


#: Keeps the tolerance band's edges inside the band despite float rounding (0.18 / 0.2).
_EPS = 1e-9


@dataclass(frozen=True)
class Tick:
    """What every rule of one ``decide`` step reads; built once by ``Tick.of``, never changed.

    Attributes:
        obs: the checked observation. policy, state, now: as given to ``decide``.
        replicas, batch_timeout: the values in force brought into the policy's bounds.
        utilization: GPU utilization, ratio. ratio: P99 over target (0 when idle).
        busy: utilization at or above ``gpu_high``. head_words: the signals in words.
        starting: replicas of the last scale-up not yet ready.
        last_unready: ``now`` if some are starting, else the state's.
        up_since: the later of the last scale-up and the last tick with replicas starting.
        drained: why the backlog counts as drained (Little's law), or ``None``.
        demand: requests/s to plan for (arrival rate, else completion rate), ``None`` if unknown.
        capacity: requests/s one replica serves at the SLO (``slo_capacity``), ``None`` if unknown.
        needed: replicas the capacity rule asks for (bounded), ``None`` when the rule does not apply.
        burst: the burst headroom learned so far (``headroom.burst_factor``), ``None`` when off/unknown.
        needed_why: words for what set ``needed`` when it is not the demand at the planning utilization
            (the left level held, the burst headroom or the surge prior), else ``""``.
    """

    obs: Observation
    policy: Policy
    state: State
    now: float
    replicas: int
    batch_timeout: float
    utilization: float
    ratio: float
    busy: bool
    p99_words: str
    gpu_words: str
    starting: int
    last_unready: float | None
    up_since: float | None
    drained: str | None
    demand: float | None = None
    capacity: float | None = None
    needed: int | None = None
    burst: headroom.Burst | None = None
    needed_why: str = ""

    @classmethod
    def of(cls, obs: Observation, current: Current, policy: Policy, state: State, now: float) -> Tick:
        """The tick for a checked ``obs`` (``check_observation`` returned it)."""
        n, timeout = _bounded(current, policy)
        u = float(obs.gpu_utilization or 0.0)
        busy = u >= policy.gpu_high
        idle = obs.idle or obs.p99_seconds is None
        starting = 0 if current.ready_replicas is None else max(0, n - current.ready_replicas)
        last_unready = now if starting > 0 else state.last_unready
        plan = _plan(obs, policy, timeout, _burst(obs, policy, state, now))
        known = plan.get("needed") is not None
        drained_fraction = policy.drained_wait_model_fraction if known else policy.drained_wait_fraction
        return cls(
            obs=obs,
            policy=policy,
            state=state,
            now=now,
            replicas=n,
            batch_timeout=timeout,
            utilization=u,
            ratio=0.0 if idle or obs.p99_seconds is None else obs.p99_seconds / policy.target_p99_seconds,
            busy=busy,
            p99_words="no requests" if idle else f"P99 {obs.p99_seconds:.2f} s",
            gpu_words=f"GPU {u:.2f} {'busy' if busy else 'not busy'}",
            starting=starting,
            last_unready=last_unready,
            up_since=max((t for t in (state.last_scale_up, last_unready) if t is not None), default=None),
            drained=_drained(obs, policy.target_p99_seconds * drained_fraction),
            **plan,
        )


def _drained(obs: Observation, limit: float) -> str | None:
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
        f"{_ms(latency)} by Little's law), waiting for the window to catch up"
    )


def slo_capacity(a: float, c: float, max_batch: int, target: float, timeout: float) -> tuple[int, float]:
    """The batch size and throughput one replica sustains at a latency SLO (Nexus' batch bound).

    A batching server whose batch of b rows takes s(b) = a + c*b seconds makes a request wait, at
    worst, for the batch timeout, the batch in progress and its own batch: ``timeout + 2*s(b) <=
    target`` (Shen et al., "Nexus: a GPU cluster engine for accelerating DNN-based video analysis",
    SOSP 2019, section 4: worst-case latency of a saturated batch is twice its execution time). The
    largest such b (at most ``max_batch``) sets the throughput b / s(b), the physical limit of a
    batching server (Crankshaw et al., "Clipper", NSDI 2017).

    Args:
        a: fixed part of the batch service time, seconds. c: seconds per row (> 0).
        max_batch: the runtime's max batch size, rows. target: the P99 objective, seconds.
        timeout: the batch timeout (max queue delay) in force, seconds.

    Returns:
        ``(b, requests per second)``; ``(0, 0.0)`` when not even one row meets the target.
    """
    b = min(max_batch, math.floor(((target - timeout) / 2 - a) / c + 1e-9))
    if b < 1:
        return 0, 0.0
    return b, b / (a + c * b)


def cold_start_timeout(
    a: float, c: float, max_batch: int, target: float, bounds: tuple[float, float]
) -> float:
    """The longest batch timeout at which a full batch still meets the SLO, ``target - 2*s(B)``, in
    ``bounds`` (seconds): longer timeouts fill batches, and b / s(b) grows with b."""
    return min(max(target - 2 * (a + c * max_batch), bounds[0]), bounds[1])


def _burst(obs: Observation, policy: Policy, state: State, now: float) -> headroom.Burst | None:
    """The burst headroom learned from the arrival samples so far and this tick's, ``None`` when off or
    the arrival rate is unknown."""
    if not policy.burst_headroom or obs.arrival_rate is None:
        return None
    return headroom.burst_factor(
        (*state.arrivals, (now, obs.arrival_rate)),
        lead=policy.burst_lead_seconds,
        quantile=policy.burst_quantile,
        limit=policy.burst_limit,
        min_rise=policy.burst_min_rise,
        min_bursts=policy.burst_min_bursts,
        min_drop=max(1 / policy.plan_utilization, 1 + policy.tolerance),
    )


def _burst_base(arrival: float, floor: float, factor: float) -> float:
    """The rate, requests/s, that the burst headroom multiplies. Inside a burst (the arrival rate more
    than halfway from the floor to ``factor`` times it) the floor, so that the burst is not counted
    twice; outside, the arrival rate carried one reaction time ahead on its rise from the floor (a
    linear trend: ``arrival + (arrival - floor)``)."""
    if arrival > floor * (1 + (factor - 1) / 2):
        return floor
    return 2 * arrival - floor


def _plan(obs: Observation, policy: Policy, timeout: float, burst: headroom.Burst | None) -> dict[str, Any]:
    """``demand``, ``capacity``, ``needed`` and ``burst`` of a ``Tick`` (the SLO-capacity rule's inputs)."""
    demand = max((r for r in (obs.arrival_rate, obs.request_rate) if r is not None), default=None)
    a, c, batch = obs.service_time_a_seconds, obs.service_time_c_seconds, obs.max_batch_size
    if not policy.capacity_rule or demand is None or a is None or c is None or batch is None:
        return {"demand": demand}
    # The requests in the service are drained within backlog_drain_seconds on top of the arrivals.
    demand += (obs.inflight_requests or 0.0) / policy.backlog_drain_seconds
    _, capacity = slo_capacity(a, c, int(batch), policy.target_p99_seconds, timeout)
    if capacity <= 0:
        return {"demand": demand, "capacity": 0.0}
    wanted = math.ceil(demand / (policy.plan_utilization * capacity) - _EPS)
    full = int(batch) / (a + c * int(batch))  # a replica's throughput at full batches, requests/s
    # The floor: the lowest arrival rate of the last reaction time (the level a burst stands on).
    floor = min(demand, burst.level) if burst is not None and burst.level is not None else demand
    surge_factor, surge_words = policy.surge_factor, "surge prior"
    bursts, base = 0, 0.0
    if burst is not None and obs.arrival_rate is not None:
        # Bursts stand on what arrives; the completion rate after a burst is its backlog draining.
        arrival = obs.arrival_rate
        base = _burst_base(arrival, min(floor, arrival), burst.factor)
        bursts = math.ceil(burst.factor * base / capacity - _EPS)
        if burst.rises >= policy.burst_min_samples:  # learned: the prior gives way to the step floor
            surge_factor, surge_words = policy.step_factor, "step floor"
    surge = min(math.ceil(surge_factor * floor / full - _EPS), policy.surge_max_replicas)
    left = 0  # a level left suddenly can return as suddenly: hold it at the full SLO capacity
    if burst is not None and burst.left_level is not None and policy.hold_left_level:
        left = math.ceil(burst.left_level / capacity - _EPS)
    needed = min(max(wanted, surge, bursts, left, policy.min_replicas), policy.max_replicas)
    # Words for the term that set ``needed`` when the demand did not (none when min_replicas did).
    named = [(surge, f" (x{surge_factor:g} {surge_words})")]
    if burst is not None and burst.left_level is not None:
        named.insert(0, (left, f" (held for the {_rate(burst.left_level)}/s the traffic left suddenly)"))
    if burst is not None and burst.factor > 1:  # on a tie, the learned headroom says the most
        named.insert(0, (bursts, f" (burst headroom x{burst.factor:.2f} learned from {burst.bursts} bursts)"))
    elif burst is not None:  # factor 1: the arrival rate's trend alone
        named.insert(0, (bursts, f" (arrivals carried one reaction time ahead: {_rate(base)}/s)"))
    why = next((words for n, words in named if n >= needed), "") if needed > wanted else ""
    return {"demand": demand, "capacity": capacity, "needed": needed, "burst": burst, "needed_why": why}


@dataclass(frozen=True)
class Outcome:
    """What one rule (``_over_target``, ``_under_target``, ``_hold``) decided.

    Attributes:
        replicas, batch_timeout: the values to have in force.
        words: the reason, without the bounds note.
        holds: kinds of hold met, first = the one reported when nothing changes.
        recommendation: this tick's replica recommendation for the stabilization window.
        last_scale_up, last_scale_down, last_timeout_change: the clocks for the next ``State``.
    """

    replicas: int
    batch_timeout: float
    words: str
    holds: tuple[str, ...]
    recommendation: int
    last_scale_up: float | None
    last_scale_down: float | None
    last_timeout_change: float | None


def _unchanged(t: Tick, words: str, *holds: str) -> Outcome:
    return Outcome(
        t.replicas,
        t.batch_timeout,
        words,
        holds,
        t.replicas,
        t.state.last_scale_up,
        t.state.last_scale_down,
        t.state.last_timeout_change,
    )


def _scale_up(t: Tick, overload: float) -> tuple[int, str, str | None]:
    """Replicas for a scale-up by the HPA ratio ``overload``, the words, and the kind of hold if it
    waits (``AtMaxReplicas``, ``ReplicasStarting``, ``ScaleUpCoolingDown``)."""
    p = t.policy
    step_cap = min(p.max_replicas, t.replicas + p.max_scale_up_step)
    wanted = min(step_cap, max(t.replicas + 1, math.ceil(t.replicas * overload - _EPS)))
    if wanted <= t.replicas:
        return t.replicas, f"at max replicas {p.max_replicas}", "AtMaxReplicas"
    if t.starting > 0:
        return t.replicas, f"{t.starting} added replicas still starting", "ReplicasStarting"
    if not _cooled(t.up_since, p.scale_up_cooldown_seconds, t.now):
        return t.replicas, "scale-up cooling down", "ScaleUpCoolingDown"
    return wanted, f"{t.replicas} → {wanted} replicas", None


def _with_scale_up(t: Tick, head: str, overload: float) -> Outcome:
    replicas, words, hold = _scale_up(t, overload)
    out = _unchanged(t, f"{head}: {words}", *(() if hold is None else (hold,)))
    if replicas == t.replicas:
        return out
    return replace(out, replicas=replicas, recommendation=replicas, last_scale_up=t.now)


def _over_target(t: Tick) -> Outcome:
    """P99 over target beyond the tolerance band.

    Backlog drained (Little's law): hold. GPUs busy: scale out by the HPA ratio on the binding signal.
    GPUs not busy: cut the batch timeout multiplicatively (AIMD), and add replicas only once it is at
    its lower bound.
    """
    p = t.policy
    head = f"{t.p99_words} > target {p.target_p99_seconds:.2f} s, {t.gpu_words}"
    if t.drained is not None:  # the window's P99 is history: recommend what the demand needs now
        out = _unchanged(t, f"{head}: {t.drained}", "BacklogDrained")
        return out if t.needed is None else replace(out, recommendation=min(t.needed, t.replicas))
    if t.busy and t.needed is not None:  # the demand is covered: one replica more, not the P99 ratio
        return _with_scale_up(t, f"{head}, demand covered", (t.replicas + 1) / t.replicas)
    if t.busy:
        return _with_scale_up(t, head, max(t.ratio, t.utilization / p.gpu_high))
    if t.batch_timeout <= p.batch_timeout_min_seconds:
        return _with_scale_up(t, f"{head}, batch timeout at minimum", t.ratio)
    if not _cooled(t.state.last_timeout_change, p.timeout_cooldown_seconds, t.now):
        return _unchanged(t, f"{head}: batch timeout cooling down", "BatchTimeoutCoolingDown")
    cut = max(p.batch_timeout_min_seconds, t.batch_timeout * p.timeout_decrease_factor)
    return replace(
        _unchanged(t, f"{head}: batch timeout {_ms(t.batch_timeout)} → {_ms(cut)}"),
        batch_timeout=cut,
        last_timeout_change=t.now,
    )


def _ahead_of_demand(t: Tick) -> Outcome:
    """The SLO-capacity rule: the demand needs more replicas than are provisioned (those starting
    included), so add them now, before the P99 over the query window shows the breach. No cooldown: the
    count comes from the demand, not from a latency that still holds the past (``Tick.needed``)."""
    needed = t.needed if t.needed is not None else t.replicas
    head = (
        f"demand {t.demand or 0:.0f}/s needs {needed} replicas at "
        f"{t.policy.plan_utilization:.0%} of {t.capacity or 0:.0f}/s each{t.needed_why}"
    )
    out = _unchanged(t, f"{head}: {t.replicas} → {needed} replicas")
    return replace(out, replicas=needed, recommendation=needed, last_scale_up=t.now)


def _during_cold_start(t: Tick, out: Outcome) -> Outcome:
    """While replicas are starting and the demand is over what the ready ones serve, lengthen the batch
    timeout to ``cold_start_timeout``: fuller batches raise a replica's throughput b / s(b)."""
    p, obs = t.policy, t.obs
    ready = t.replicas - t.starting  # serving now; out.replicas - ready will be starting
    a, c, batch = obs.service_time_a_seconds, obs.service_time_c_seconds, obs.max_batch_size
    if not p.cold_start_timeout or a is None or c is None or batch is None or t.capacity is None:
        return out
    if out.replicas <= ready or (t.demand or 0.0) <= ready * t.capacity:
        return out
    bounds = (p.batch_timeout_min_seconds, p.batch_timeout_max_seconds)
    longer = cold_start_timeout(a, c, int(batch), p.target_p99_seconds, bounds)
    if longer <= out.batch_timeout + 1e-12:
        return out
    words = f"{out.words}; cold start: batch timeout {_ms(out.batch_timeout)} → {_ms(longer)}"
    return replace(out, batch_timeout=longer, last_timeout_change=t.now, words=words)


def _in_recommendation(t: Tick) -> int:
    """Fewest replicas whose projected utilization is near the band's middle and strictly under its top
    (the current count when the GPUs are busy or no fewer would do)."""
    p = t.policy
    if t.busy:
        return t.replicas
    if t.needed is not None:  # the SLO-capacity rule knows the count
        return min(t.needed, t.replicas)
    wanted = max(p.min_replicas, math.ceil(t.replicas * t.utilization / p.gpu_target - _EPS))
    if wanted < t.replicas and t.replicas * t.utilization / wanted < p.gpu_high:
        return wanted
    return t.replicas


def _scale_in(t: Tick, out: Outcome) -> tuple[Outcome, str | None]:
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
        return replace(out, holds=(*out.holds, "StabilizationWindow")), words
    rising = _arrivals_rising(t, stable)
    if rising is not None:
        return replace(out, holds=(*out.holds, "ArrivalsRising")), f"scale-in waits: {rising}"
    if not _cooled(t.state.last_scale_down, p.scale_down_cooldown_seconds, t.now):
        return replace(out, holds=(*out.holds, "ScaleInCoolingDown")), "scale-in cooling down"
    return replace(out, replicas=stable, last_scale_down=t.now), f"{t.replicas} → {stable} replicas"


def _arrivals_rising(t: Tick, target: int) -> str | None:
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
        if math.ceil(ahead / (t.policy.plan_utilization * t.capacity) - _EPS) <= target:
            return None
        needs = f"{_rate(ahead)}/s next tick needs more than {target}"
        return f"arrivals rising ({_rate(before)} → {_rate(arrival)}/s, {needs})"
    return f"arrivals rising ({_rate(before)} → {_rate(arrival)}/s)"


def _rate(requests_per_second: float) -> str:
    return f"{requests_per_second:.0f}" if requests_per_second >= 10 else f"{requests_per_second:.2g}"


def _grow_timeout(t: Tick, out: Outcome) -> tuple[Outcome, str | None]:
    """Grow the batch timeout additively toward its upper bound (AIMD); the words, ``None`` at the top."""
    p = t.policy
    if t.batch_timeout >= p.batch_timeout_max_seconds:
        return out, None
    if not _cooled(t.state.last_timeout_change, p.timeout_cooldown_seconds, t.now):
        return replace(out, holds=(*out.holds, "BatchTimeoutCoolingDown")), "batch timeout cooling down"
    grown = min(p.batch_timeout_max_seconds, t.batch_timeout + p.timeout_increase_step_seconds)
    words = f"batch timeout {_ms(t.batch_timeout)} → {_ms(grown)}"
    return replace(out, batch_timeout=grown, last_timeout_change=t.now), words


def _under_target(t: Tick) -> Outcome:
    """P99 comfortably under target: headroom when the GPUs run above the band (``keep_in_band``),
    else a scale-in after the stabilization window; the batch timeout grows additively."""
    p = t.policy
    head = f"{t.p99_words} < target {p.target_p99_seconds:.2f} s, {t.gpu_words}"
    parts: list[str] = []
    if t.busy and p.keep_in_band and t.needed is None:  # the capacity rule plans the headroom itself
        out = _with_scale_up(t, head, t.utilization / p.gpu_high)
        parts.append(out.words.removeprefix(f"{head}: "))
    else:
        out = replace(_unchanged(t, head), recommendation=_in_recommendation(t))
    if t.needed_why and t.needed is not None and t.needed >= t.replicas:  # why no scale-in, in words
        parts.append(f"keeps {t.replicas} replicas{t.needed_why}")
    for step in (_scale_in, _grow_timeout):
        out, words = step(t, out)
        if words is not None:
            parts.append(words)
    words = f"{head}: {', '.join(parts) if parts else 'nothing to change'}"
    return replace(out, words=words, holds=(*out.holds, "TargetMet"))


def _hold(t: Tick) -> Outcome:
    """Inside the tolerance band ``|p99 / target - 1| <= tolerance``: nothing moves."""
    p = t.policy
    words = (
        f"{t.p99_words} within {p.tolerance:.0%} of target {p.target_p99_seconds:.2f} s, {t.gpu_words}: hold"
    )
    return _unchanged(t, words, "WithinTolerance")


def _bounded(current: Current, policy: Policy) -> tuple[int, float]:
    """The replicas and batch timeout in force, brought into the policy's bounds."""
    replicas = min(max(current.replicas, policy.min_replicas), policy.max_replicas)
    timeout = min(
        max(current.batch_timeout_seconds, policy.batch_timeout_min_seconds), policy.batch_timeout_max_seconds
    )
    return replicas, timeout


def _bounds_note(current: Current, policy: Policy) -> str:
    replicas, timeout = _bounded(current, policy)
    note = ""
    if replicas != current.replicas:
        span = f"[{policy.min_replicas}, {policy.max_replicas}]"
        note += f"replicas {current.replicas} outside {span} → {replicas}; "
    if not math.isclose(timeout, current.batch_timeout_seconds, rel_tol=1e-9, abs_tol=1e-12):
        note += f"batch timeout {_ms(current.batch_timeout_seconds)} outside bounds → {_ms(timeout)}; "
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
    timeout_changed = not math.isclose(timeout, current.batch_timeout_seconds, rel_tol=1e-9, abs_tol=1e-12)
    return Decision(
        replicas=replicas,
        batch_timeout_seconds=timeout,
        reason=reason,
        replicas_changed=replicas_changed,
        timeout_changed=timeout_changed,
        known=known,
        state=state,
        hold=None if replicas_changed or timeout_changed or not known else hold,
    )


def decide(observation: Observation, current: Current, policy: Policy, state: State, now: float) -> Decision:
    """One step of the control law (see the module docstring).

    The observation is checked (``check_observation``); a problem holds everything but the bounds. Else
    the P99 ratio picks one rule: ``_over_target``, ``_under_target`` or ``_hold`` (the tolerance band).

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
    note = _bounds_note(current, policy)
    checked = check_observation(observation, policy.stale_after_seconds)
    if isinstance(checked, Problem):
        replicas, timeout = _bounded(current, policy)
        return _decision(
            current, replicas, timeout, f"{note}holding: {checked.message}", state, None, known=False
        )
    t = Tick.of(checked, current, policy, state, now)
    if t.needed is not None and t.needed > t.replicas:
        out = _ahead_of_demand(t)
    elif t.ratio > 1 + policy.tolerance + _EPS:
        out = _over_target(t)
    elif t.ratio < 1 - policy.tolerance - _EPS:
        out = _under_target(t)
    else:
        out = _hold(t)
    out = _during_cold_start(t, out)
    window = policy.scale_down_stabilization_seconds
    next_state = State(
        last_scale_up=out.last_scale_up,
        last_unready=t.last_unready,
        last_scale_down=out.last_scale_down,
        last_timeout_change=out.last_timeout_change,
        first_seen=state.first_seen if state.first_seen is not None else now,
        recommendations=(
            *((when, r) for when, r in state.recommendations if now - when < window),
            (now, out.recommendation),
        ),
        arrivals=_arrivals(state, checked, policy, now),
    )
    hold = out.holds[0] if out.holds else None
    return _decision(current, out.replicas, out.batch_timeout, note + out.words, next_state, hold, known=True)


def _arrivals(state: State, obs: Observation, policy: Policy, now: float) -> tuple[tuple[float, float], ...]:
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
