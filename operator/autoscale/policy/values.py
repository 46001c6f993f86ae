"""What ``decide`` reads and returns: the observation and its check, what is in force, the tunables,
the memory between ticks and the decision. Pure data and validation: no rule lives here."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from kubeinfer.operator import conditions

__all__ = [
    "DECIDE_REQUIRES",
    "READER_REQUIRES",
    "Current",
    "Decision",
    "Observation",
    "Policy",
    "Problem",
    "State",
    "check_observation",
]

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
        instance_concurrency: mean model instances running a batch at once while any is, averaged over
            the service's pods (1 with one instance); ``None`` when unknown (read as 1).

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
    instance_concurrency: float | None = None

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
        return Problem(conditions.INVALID_METRICS, f"{what} is {value}")
    if value < 0:
        return Problem(conditions.INVALID_METRICS, f"{what} is negative ({value})")
    return None


def _age_problem(age: float | None, stale_after_seconds: float) -> Problem | None:
    if age is not None and (not _finite(age) or age > stale_after_seconds):
        return Problem(
            conditions.STALE_METRICS,
            f"stale metrics: newest sample {age:.0f} s old (limit {stale_after_seconds:.0f} s)",
        )
    return None


def _p99_problem(obs: Observation, required: Collection[str]) -> Problem | None:
    p99 = obs.p99_seconds
    if obs.idle and (p99 is not None or "p99_seconds" not in required):
        return None  # idle: NaN from histogram_quantile on zero rates, no latency to judge
    if obs.request_rate == 0.0 and obs.queue_size and not _finite(p99):
        return Problem(
            conditions.UNUSABLE_SIGNALS,
            f"no request completed in the window while {obs.queue_size:.0f} are queued",
        )
    if p99 is None:
        return Problem(conditions.METRICS_MISSING, _MISSING_WORDS["p99_seconds"])
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
        flight, arrival rate, s(b) intercept) that are NaN, infinite or negative, and a slope, max
        batch size or instance concurrency that is not > 0, become ``None``, an idle service's P99 becomes
        ``None``, GPU utilization is capped at 1 and a negative sample age (clock skew) becomes 0.
    """
    if observation.unknown_reason is not None:
        return Problem(conditions.UNUSABLE_SIGNALS, observation.unknown_reason)
    obs = replace(
        observation,
        queue_size=_optional(observation.queue_size),
        inflight_requests=_optional(observation.inflight_requests),
        arrival_rate=_optional(observation.arrival_rate),
        service_time_a_seconds=_optional(observation.service_time_a_seconds),
        service_time_c_seconds=_positive(observation.service_time_c_seconds),
        max_batch_size=_positive(observation.max_batch_size),
        instance_concurrency=_positive(observation.instance_concurrency),
    )
    for name in dict.fromkeys((*required, "gpu_utilization")):  # decide cannot act without it
        if getattr(obs, name) is None:
            return Problem(conditions.METRICS_MISSING, _MISSING_WORDS.get(name, f"{name} missing"))
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
        return Problem(conditions.METRICS_MISSING, _MISSING_WORDS["gpu_utilization"])
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
        max_queue_delay_seconds: the runtime's ``batching.max_queue_delay_seconds``, seconds.
        ready_replicas: the Deployment's ready replicas, ``None`` when unknown. While fewer than
            ``replicas`` are ready, the last scale-up is still starting and no further one is made
            (their capacity is on its way; the HPA likewise discounts unready pods).
    """

    replicas: int
    max_queue_delay_seconds: float
    ready_replicas: int | None = None


@dataclass(frozen=True)
class Policy:
    """Tunables of the control law. Durations in seconds, utilizations as ratios in [0, 1].

    ``loop.policy_from_spec`` sets the fields the InferenceService API exposes (replica bounds, target,
    utilization band, max-queue-delay bounds, tolerance, stabilization, cooldowns, max scale-up step,
    plan utilization) and the staleness limit; the others keep their defaults in the operator. Numbers
    nothing ever sets are module constants of the rule that reads them, each with its source
    (``tick.DRAINED_WAIT_FRACTION``, ``tick.DRAINED_WAIT_MODEL_FRACTION``, ``plan.BACKLOG_DRAIN_SECONDS``,
    ``plan.BURST_QUANTILE``, ``plan.BURST_LIMIT``).

    Defaults and their sources:
        tolerance 0.1 and scale_down_stabilization_seconds 300: the Kubernetes HPA's defaults
        (``--horizontal-pod-autoscaler-tolerance``, ``behavior.scaleDown.stabilizationWindowSeconds``).
        max_queue_delay_decrease_factor 0.5 / max_queue_delay_step_seconds: AIMD as in TCP congestion control
        (RFC 5681: halve on congestion, grow by a constant per round trip); the step is 1 ms here.
        gpu_low/gpu_high 0.5/0.8: kubeinfer's choice, a band around the 70 % HPA target that the
        benchmark's ``hpa_gpu`` uses. Cooldowns: kubeinfer's choice, at least one scrape + query
        window apart so an action's effect is visible before the next of the same kind.
        plan_utilization 0.85, surge_max_replicas 3: the SLO-capacity rule (``plan.slo_capacity``;
        the package docstring), tuned with ``bench/autoscaler_sim.py`` on the step, ramp, diurnal and
        MMPP traces only. surge_factor 5 (was 4 on those four; raised after the held-out flash_crowd
        trace showed a x8 crowd meeting 2 replicas where the HPA had 3: see bench/traces/README.md).
        burst_memory_seconds 1800, burst_lead_seconds 60, burst_min_samples 20, burst_min_rise 1.5,
        burst_min_bursts 2: the burst headroom (the package docstring; ``headroom``), chosen with
        ``bench/autoscaler_sim.py`` after eleven traces had been seen, the noise floor after the
        eleventh (bench/traces/README.md gives the sensitivity: burst_min_rise 1.2-1.6 and
        burst_min_bursts 2-3 keep every trace at or under the HPA's replica-seconds and over its SLO;
        under 1.5 the sawtooth's tops count as bursts and cost up to 1.46x the oracle; 1.7, or
        min_bursts 4, misses compressed_day's first morning burst). The lead is one 15 s tick plus the
        simulated 30 s cold start, rounded up.
        step_factor 2.5: the surge floor once the burst headroom has learned (the eighth pass, chosen
        after the unseen tenant_onboarding and business_hours traces; 1.75-2 keep all but
        business_hours, 3-4 cost weekend_low more: bench/traces/README.md).

    Scale to zero (``zero``): ``idle_after_seconds``, the seconds a service must be idle (no request
    completed, none queued or in flight) before its replicas go to 0; None (the default): never, and
    ``min_replicas`` (at least 1) is the floor. The other rules never go under ``min_replicas``; only
    this one goes to 0, and at 0 ``decide`` holds.

    Switches, all on in the operator (no API field sets them), each turning one rule off for the
    benchmark's ablations (``bench/autoscaler_sim.py``'s ``VARIANTS``) and the tests:
        capacity_rule: the SLO-capacity rule (``plan.plan``; off: the reactive law alone decides).
        cold_start_timeout: while replicas it asked for are starting and the demand is over the ready
            replicas' capacity, the max queue delay goes to the largest one at which a full batch still
            meets the SLO (``capacity.during_cold_start``).
        burst_headroom: the learned burst headroom, the surge prior giving way to the step floor and
            the hold of a left level (``plan.learned_burst``; off, one reaction time of arrival samples
            is kept).
        hold_left_level: a level the traffic left suddenly is held for its return (``plan.level_hold``),
            the seventh pass of ``bench/autoscaler_sim.py``, chosen after the unseen failover trace
            (bench/traces/README.md gives its price on a drop that stays, job_ends).
        keep_in_band: P99 under target with the GPUs over the band adds headroom
            (``reactive.band_headroom``): kubeinfer's choice, tuned with ``bench/autoscaler_sim.py``
            (without it and ``tick.DRAINED_WAIT_FRACTION`` the simulated step trace overshoots to max
            replicas). Only a test turns it off.

    Raises:
        ValueError: naming the field, when a value is out of range or bounds are inverted.
    """

    min_replicas: int = 1
    max_replicas: int = 10
    target_p99_seconds: float = 0.2
    gpu_low: float = 0.5
    gpu_high: float = 0.8
    max_queue_delay_min_seconds: float = 0.0005
    max_queue_delay_max_seconds: float = 0.02
    tolerance: float = 0.1
    scale_down_stabilization_seconds: float = 300.0
    scale_up_cooldown_seconds: float = 30.0
    scale_down_cooldown_seconds: float = 60.0
    max_queue_delay_cooldown_seconds: float = 15.0
    max_scale_up_step: int = 4
    max_queue_delay_decrease_factor: float = 0.5
    max_queue_delay_step_seconds: float = 0.001
    stale_after_seconds: float = 120.0
    keep_in_band: bool = True
    capacity_rule: bool = True
    plan_utilization: float = 0.85
    surge_factor: float = 5.0
    surge_max_replicas: int = 3
    cold_start_timeout: bool = True
    burst_headroom: bool = True
    burst_memory_seconds: float = 1800.0
    burst_lead_seconds: float = 60.0
    burst_min_samples: int = 20
    burst_min_rise: float = 1.5
    burst_min_bursts: int = 2
    hold_left_level: bool = True
    step_factor: float = 2.5
    idle_after_seconds: float | None = None

    def __post_init__(self) -> None:
        cooldowns = (
            "scale_down_stabilization_seconds",
            "scale_up_cooldown_seconds",
            "scale_down_cooldown_seconds",
            "max_queue_delay_cooldown_seconds",
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
            ("max_queue_delay_min_seconds", self.max_queue_delay_min_seconds >= 0, "must be >= 0"),
            (
                "max_queue_delay_max_seconds",
                self.max_queue_delay_max_seconds >= self.max_queue_delay_min_seconds,
                "must be >= max_queue_delay_min_seconds",
            ),
            ("tolerance", 0 <= self.tolerance < 1, "must be in [0, 1)"),
            *((name, getattr(self, name) >= 0, "must be >= 0") for name in cooldowns),
            ("max_scale_up_step", self.max_scale_up_step >= 1, "must be at least 1"),
            (
                "max_queue_delay_decrease_factor",
                0 < self.max_queue_delay_decrease_factor < 1,
                "must be in (0, 1)",
            ),
            ("max_queue_delay_step_seconds", self.max_queue_delay_step_seconds > 0, "must be > 0"),
            ("stale_after_seconds", self.stale_after_seconds > 0, "must be > 0"),
            ("plan_utilization", 0 < self.plan_utilization <= 1, "must be in (0, 1]"),
            ("surge_factor", self.surge_factor >= 1, "must be >= 1"),
            ("step_factor", self.step_factor >= 1, "must be >= 1"),
            ("surge_max_replicas", self.surge_max_replicas >= 0, "must be >= 0"),
            ("burst_memory_seconds", self.burst_memory_seconds >= 0, "must be >= 0"),
            ("burst_lead_seconds", self.burst_lead_seconds > 0, "must be > 0"),
            ("burst_min_samples", self.burst_min_samples >= 0, "must be >= 0"),
            ("burst_min_rise", self.burst_min_rise >= 1, "must be >= 1"),
            ("burst_min_bursts", self.burst_min_bursts >= 0, "must be >= 0"),
            (
                "idle_after_seconds",
                self.idle_after_seconds is None or self.idle_after_seconds > 0,
                "must be > 0 (None: never scale to zero)",
            ),
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
        last_max_queue_delay_change: ``now`` of the last max queue delay change, or ``None``.
        first_seen: ``now`` of the first known observation; no scale-in before a whole
            stabilization window has been observed (so a restarted operator waits one window).
        recommendations: ``(now, replicas)`` per known tick within the stabilization window, oldest
            first, like the HPA's recommendation history.
        arrivals: ``(now, requests/s)`` arrival-rate samples within ``Policy.burst_memory_seconds``,
            oldest first, that the burst headroom learns from (``headroom.burst_factor``); the last one
            also tells a scale-in whether the arrivals are rising (``stabilization.arrivals_rising``).
            With the burst headroom off only one reaction time (``burst_lead_seconds``) of samples is
            kept.
        idle_since: ``now`` of the first tick of the current run of idle ticks (``zero.idle_since``),
            or ``None`` (not idle, or scale to zero off).
    """

    last_scale_up: float | None = None
    last_unready: float | None = None
    last_scale_down: float | None = None
    last_max_queue_delay_change: float | None = None
    first_seen: float | None = None
    recommendations: tuple[tuple[float, int], ...] = field(default_factory=tuple)
    arrivals: tuple[tuple[float, float], ...] = field(default_factory=tuple)
    idle_since: float | None = None


@dataclass(frozen=True)
class Decision:
    """The outcome of one tick.

    Attributes:
        replicas: replica count to have in force.
        max_queue_delay_seconds: max queue delay to have in force, seconds.
        reason: plain words, e.g. ``"P99 0.31 s > target 0.20 s, GPU 0.91 busy: 3 → 5 replicas"``.
        replicas_changed / max_queue_delay_changed: whether the value differs from ``Current``.
        known: False when the observation was unknown and everything was held.
        state: the ``State`` to pass to the next ``decide``.
        hold: when a known decision changes nothing, the kind of hold in CamelCase, stable from tick to
            tick while the numbers in ``reason`` move: ``BacklogDrained``, ``AtMaxReplicas``,
            ``ReplicasStarting``, ``ScaleUpCoolingDown``, ``MaxQueueDelayCoolingDown``,
            ``StabilizationWindow``, ``ArrivalsRising``, ``ScaleInCoolingDown``, ``WithinTolerance``,
            ``TargetMet``;
            ``None`` when the decision changes something or the observation is unknown.
    """

    replicas: int
    max_queue_delay_seconds: float
    reason: str
    replicas_changed: bool
    max_queue_delay_changed: bool
    known: bool
    state: State
    hold: str | None = None

    @property
    def changed(self) -> bool:
        """True when the decision changes replicas or the max queue delay."""
        return self.replicas_changed or self.max_queue_delay_changed
