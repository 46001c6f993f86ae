"""The autoscalers users run instead of kubeinfer's, as simulator controllers: Knative's KPA, Ray Serve
and KEDA's http-add-on.

The HPA (on GPU utilization, and KEDA's request rate per replica) is ``autoscaler_sim.make_hpa``. This
module holds the other peers' rules as pure functions, transcribed from their sources, and the
controllers that feed them the simulated signals:

- **Knative KPA** (``kpa_scale``, ``make_kpa``; its scale to zero ``kpa_pa_step``, ``KpaZeroSpec``,
  and its activator ``KNATIVE_ACTIVATOR``): knative/serving at commit
  ``98e5ef90aa7033797aa0a61ef97f3ff7e49a3944`` (``KNATIVE_COMMIT``).
- **Ray Serve's default policy** (``ray_*``, ``make_ray_serve``): ray-project/ray at commit
  ``00590c456b9afe0fd393db55b6ec21c9b7f3921b`` (``RAY_COMMIT``).
- **KEDA's http-add-on** (``make_keda_http``: an HTTPScaledObject on the request rate, its scale to
  zero ``keda_scale_to_zero`` and its interceptor ``KEDA_INTERCEPTOR``): kedacore/keda at
  ``KEDA_COMMIT`` and kedacore/http-add-on at ``KEDA_HTTP_ADD_ON_COMMIT``.

The signal both read is the **concurrency**: requests in flight (queued + in service) summed over the
replicas, ``autoscaler_sim.Metrics.concurrency`` (the in-flight count averaged over each tick). Neither
reads Prometheus: the KPA scrapes its pods' queue-proxies every second and decides every 2 s, Ray Serve's
handles push their samples every 10 s to a controller that loops every 0.1 s; each is simulated with its
own pipeline's delay (a tick of 2 s, ``PEER_TICK_SECONDS``) and the same replicas, cold start and
bounds as the HPA. Neither tunes the max queue delay: it stays at its initial value, as under the HPA.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import autoscaler_sim as sim

KNATIVE_COMMIT = "98e5ef90aa7033797aa0a61ef97f3ff7e49a3944"
RAY_COMMIT = "00590c456b9afe0fd393db55b6ec21c9b7f3921b"
KEDA_COMMIT = "8b4f083ca8c8c2baf8477e322bd4d16ac4dfa09a"
KEDA_HTTP_ADD_ON_COMMIT = "59b2f6a115ad735a108d830f4d525f8462497c7d"
#: How often the KPA decides, seconds (``tickInterval`` in pkg/autoscaler/scaling/multiscaler.go); the
#: simulator ticks Ray Serve at the same interval (see ``RayServeConfig.loop_interval_s``).
PEER_TICK_SECONDS = 2.0


def window_average(samples: Sequence[tuple[float, float]], now: float, window: float) -> float:
    """The mean of the ``(time, value)`` samples with ``now - window < time <= now``; NaN when none.

    Knative's ``TimedFloat64Buckets.WindowAverage`` (pkg/autoscaler/aggregation/bucketing.go, the
    default aggregation of pkg/autoscaler/metrics/collector.go): the window's total over the buckets that
    hold data (a young window averages over what it has, not over zeros). Each sample here is the
    concurrency averaged over one tick, so the mean of the ticks is the mean of the 1 s buckets.
    """
    values = [v for t, v in samples if now - window < t <= now]
    return sum(values) / len(values) if values else math.nan


# --------------------------------------------------------------------------------------------------
# Knative KPA


@dataclass(frozen=True)
class KpaSpec:
    """The KPA's ``DeciderSpec`` with the defaults of config/core/configmaps/autoscaler.yaml.

    Attributes:
        target: the soft concurrency target per pod, requests (``autoscaling.knative.dev/target``; the
            swept knob). ``container-concurrency-target-default`` is 100, far above what one replica
            of this model holds at its SLO, so a user sets it.
        target_utilization: ``container-concurrency-target-percentage`` 70 %, a ratio: the decider's
            ``TargetValue`` is ``target * target_utilization``
            (pkg/reconciler/autoscaling/resources/target.go ``ResolveMetricTarget``).
        stable_window: ``stable-window`` 60 s.
        panic_window_percentage: ``panic-window-percentage`` 10 %: the panic window is 6 s.
        panic_threshold: ``panic-threshold-percentage`` 200 %, as the ratio 2.0
            (pkg/reconciler/autoscaling/kpa/resources/decider.go ``MakeDecider`` divides by 100).
        max_scale_up_rate: ``max-scale-up-rate`` 1000 (pods may go from N to 1000 N per tick).
        max_scale_down_rate: ``max-scale-down-rate`` 2 (from N to N/2 per tick at most).
        scale_down_delay: ``scale-down-delay`` 0 s: no delay window (``New`` builds none).
    """

    target: float
    target_utilization: float = 0.7
    stable_window: float = 60.0
    panic_window_percentage: float = 10.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_down_delay: float = 0.0

    @property
    def target_value(self) -> float:
        """Concurrent requests per pod the KPA aims at (``DeciderSpec.TargetValue``)."""
        return self.target * self.target_utilization

    @property
    def panic_window(self) -> float:
        """Seconds: the stable window times the percentage, rounded to whole seconds, at least the 1 s
        bucket (pkg/reconciler/autoscaling/resources/metric.go ``MakeMetric``)."""
        # time.Duration.Round rounds halfway values away from zero (Python's round() to even)
        return max(1.0, math.floor(self.stable_window * self.panic_window_percentage / 100.0 + 0.5))


@dataclass(frozen=True)
class KpaState:
    """The KPA's memory between ticks: when it last was over the panic threshold (``None``: not in
    panic mode), seconds, and the most pods it asked for while panicking (``maxPanicPods``)."""

    panic_time: float | None = None
    max_panic_pods: int = 0


def kpa_scale(
    spec: KpaSpec, state: KpaState, stable: float, panic: float, ready: int, now: float
) -> tuple[int, KpaState]:
    """One ``autoscaler.Scale`` (pkg/autoscaler/scaling/autoscaler.go) on the concurrency averaged over
    the stable window (``stable``) and the panic window (``panic``), requests summed over the pods; ``ready``
    pods; ``now`` in seconds. Returns the desired pod count (before the PodAutoscaler's min/max scale)
    and the next state.

    - ``readyPodsCount = max(1, ready)``; ``maxScaleUp = ceil(max_scale_up_rate * readyPodsCount)``,
      ``maxScaleDown = floor(readyPodsCount / max_scale_down_rate)`` (the revision is reachable).
    - ``dspc = ceil(stable / TargetValue)``, ``dppc = ceil(panic / TargetValue)``, each clamped to
      [maxScaleDown, maxScaleUp].
    - Over the panic threshold when ``dppc / readyPodsCount >= panic_threshold``: panic starts (or is
      extended to ``now``). Panic ends when it is no longer over the threshold and the last time it was
      is more than a stable window ago (``panicTime + StableWindow`` before now).
    - In panic the desired count is the larger of the stable and the panic counts, and never decreases:
      ``maxPanicPods`` holds the most asked for. Out of panic it is the stable count.
    - ``scale-down-delay`` 0: no delay window (the only spec here; a non-zero delay is refused).
    """
    if spec.scale_down_delay:
        raise ValueError("kpa_scale implements scale-down-delay 0 (the default) only")
    ready_pods = max(1.0, float(ready))
    max_up = math.ceil(spec.max_scale_up_rate * ready_pods)
    max_down = math.floor(ready_pods / spec.max_scale_down_rate)
    dspc = math.ceil(stable / spec.target_value)
    dppc = math.ceil(panic / spec.target_value)
    desired_stable = int(min(max(dspc, max_down), max_up))
    desired_panic = int(min(max(dppc, max_down), max_up))
    over = dppc / ready_pods >= spec.panic_threshold
    panic_time, max_panic = state.panic_time, state.max_panic_pods
    if over:
        panic_time = now  # begin panicking, or extend the panic window
    elif panic_time is not None and panic_time + spec.stable_window < now:
        panic_time, max_panic = None, 0  # the surge has made its way into the stable metric
    desired = desired_stable
    if panic_time is not None:
        desired = max(desired, desired_panic)
        max_panic = max(max_panic, desired)  # no scale-down while panicking
        desired = max_panic
    return desired, KpaState(panic_time, max_panic)


#: Knative's activator: a revision's requests queue in its throttler's breaker, at most
#: ``breakerQueueDepth`` 10,000 (pkg/activator/net/throttler.go; past it 503), each for at most the
#: revision's timeout, ``revision-timeout-seconds`` 300 s (cmd/activator/main.go; past it 503).
KNATIVE_ACTIVATOR = sim.Activator("knative", 10_000, 300.0)


@dataclass(frozen=True)
class KpaZeroSpec:
    """The KPA's scale to zero with the defaults of pkg/autoscaler/config/config.go ``defaultConfig``.

    Attributes:
        enable_scale_to_zero: ``enable-scale-to-zero`` true.
        grace_period: ``scale-to-zero-grace-period`` 30 s: how long the activator must have been in the
            request path (the ServerlessService's proxy mode), or the PodAutoscaler inactive, before the
            last pod goes.
        pod_retention_period: ``scale-to-zero-pod-retention-period`` 0 s: the least time the last pod
            stays once the PodAutoscaler is inactive.
        target_burst_capacity: ``target-burst-capacity`` 211 requests: the activator stays in the path
            while the excess burst capacity, ``floor(ready * target - 211 - panic concurrency)``, is
            negative (pkg/autoscaler/scaling/autoscaler.go; pkg/reconciler/autoscaling/kpa/kpa.go).
        activation_timeout: seconds a PodAutoscaler may activate (no pod Ready) before it goes back to
            0: the Deployment's progress deadline, 600 s, plus ``activationTimeoutBuffer`` 10 s.
    """

    enable_scale_to_zero: bool = True
    grace_period: float = 30.0
    pod_retention_period: float = 0.0
    target_burst_capacity: float = 211.0
    activation_timeout: float = 610.0


@dataclass(frozen=True)
class PaState:
    """The PodAutoscaler's ``Active`` condition: ``mode`` ``"active"`` (True), ``"activating"`` (Unknown)
    or ``"inactive"`` (False) since ``since`` (its last transition), and ``proxy_since``: when the
    activator last entered the request path (``None`` while it is out of it), seconds. A service that
    starts with ready pods is active, the activator in its path (its excess burst capacity is negative
    until the pods' total target passes ``target_burst_capacity``)."""

    mode: str = "active"
    since: float = 0.0
    proxy_since: float | None = 0.0


def kpa_pa_step(
    spec: KpaSpec, zero: KpaZeroSpec, pa: PaState, desired: int, ebc: float, ready: int, now: float
) -> tuple[int | None, PaState]:
    """One reconcile of the PodAutoscaler on the decider's ``desired`` pods (within min-scale 0 and
    max-scale), with excess burst capacity ``ebc`` and ``ready`` pods at ``now`` (seconds). Returns the
    scale to apply (``None``: leave it) and the next state.

    ``handleScaleToZero`` (pkg/reconciler/autoscaling/kpa/scaler.go), giving the reconciler's ``want``:

    - ``desired`` > 0: applied. Scale to zero off: 1.
    - activating: left as is (``want`` unknown), unless activating for more than
      ``activation_timeout``: 0.
    - active: active for at least the stable window: left as is, ``want`` 0 (the PodAutoscaler turns
      inactive); else 1.
    - inactive: 0 once inactive for ``max(grace_period, pod_retention_period)``, or inactive for the
      retention period with the activator in the path for ``grace_period``; else left as is.

    Then (pkg/reconciler/autoscaling/kpa/kpa.go) the activator is in the path unless ``want`` > 0 and
    ``ebc`` >= 0, and ``computeActiveCondition``: ``want`` 0 makes it inactive; with no pod ready it is
    activating (unless inactive and ``want`` is not > 0); with one it is active (same exception).
    """
    in_mode = now - pa.since
    apply: int | None
    if desired != 0:
        want, apply = desired, desired
    elif not zero.enable_scale_to_zero:
        want, apply = 1, 1
    elif pa.mode == "activating":
        want, apply = (0, 0) if in_mode > zero.activation_timeout else (-1, None)
    elif pa.mode == "active":
        want, apply = (0, None) if in_mode >= spec.stable_window else (1, 1)
    else:
        retention = zero.pod_retention_period
        proxy_for = 0.0 if pa.proxy_since is None else now - pa.proxy_since
        gone = in_mode >= max(zero.grace_period, retention) or (
            in_mode >= retention and proxy_for >= zero.grace_period
        )
        want, apply = 0, (0 if gone else None)
    proxy = not (want > 0 and ebc >= 0)
    proxy_since = (pa.proxy_since if pa.proxy_since is not None else now) if proxy else None
    if want == 0:
        mode = "inactive"
    elif want > 0 or pa.mode != "inactive":
        mode = "activating" if ready < 1 else "active"
    else:
        mode = pa.mode
    return apply, PaState(mode, pa.since if mode == pa.mode else now, proxy_since)


def make_kpa(cfg: sim.SimConfig, target: float, zero: KpaZeroSpec | None = None) -> sim.Controller:
    """The KPA at soft target ``target`` (requests per pod) as a controller ticking every ``cfg.sync``
    seconds (run it with ``sync = PEER_TICK_SECONDS``): each tick records ``Metrics.concurrency``, then
    ``kpa_scale`` on its stable- and panic-window averages, bounded by the simulation's min/max replicas
    (the PodAutoscaler's min-scale and max-scale). No sample yet: hold.

    ``zero``: scale to zero on (min-scale 0): the desired count, bounded by max-scale only, goes through
    ``kpa_pa_step`` (run it with ``KNATIVE_ACTIVATOR``). ``None``: off (min-scale the simulation's).
    """
    spec = KpaSpec(target)
    samples: list[tuple[float, float]] = []
    state = KpaState()
    pa = PaState()

    def tick(t: float, m: sim.Metrics, n: int, timeout: float) -> tuple[int, float]:
        nonlocal state, pa
        if not math.isnan(m.concurrency):
            samples.append((t, m.concurrency))
        del samples[: max(0, len(samples) - int(spec.stable_window / cfg.sync) - 2)]
        stable = window_average(samples, t, spec.stable_window)
        panic = window_average(samples, t, spec.panic_window)
        if math.isnan(stable) or math.isnan(panic):
            return n, timeout
        desired, state = kpa_scale(spec, state, stable, panic, m.ready, t)
        if zero is None:
            return min(max(desired, cfg.min_replicas), cfg.max_replicas), timeout
        ebc = math.floor(m.ready * spec.target - zero.target_burst_capacity - panic)
        scale, pa = kpa_pa_step(spec, zero, pa, min(desired, cfg.max_replicas), ebc, m.ready, t)
        return (n if scale is None else scale), timeout

    return tick


# --------------------------------------------------------------------------------------------------
# Ray Serve


@dataclass(frozen=True)
class RayServeConfig:
    """Ray Serve's ``AutoscalingConfig`` (python/ray/serve/config.py) with its defaults.

    Attributes:
        target_ongoing_requests: requests in flight per replica the policy aims at (the swept knob;
            default ``DEFAULT_TARGET_ONGOING_REQUESTS`` 2 in python/ray/serve/_private/constants.py).
        upscale_delay_s: 30 s a scale-up decision must persist before it is applied.
        downscale_delay_s: 600 s a scale-down decision must persist.
        look_back_period_s: 30 s: the window the ongoing-request samples are averaged over (mean, the
            default ``aggregation_function``).
        metrics_interval_s: 10 s between the handles' pushes of their samples
            (``RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S``; handles record queued and running
            requests, ``RAY_SERVE_COLLECT_AUTOSCALING_METRICS_ON_HANDLE`` on by default).
        upscaling_factor: 1.0 (``get_upscaling_factor``: ``upscaling_factor`` or ``smoothing_factor``).
        downscaling_factor: 1.0.
        loop_interval_s: seconds between the controller's decisions; Ray's is ``CONTROL_LOOP_INTERVAL_S``
            0.1 s. The delays count decisions (``int(delay / loop)`` in a row), so a simulator that
            decides every 2 s passes 2 s here: the same delays, to within one tick.
    """

    target_ongoing_requests: float
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_period_s: float = 30.0
    metrics_interval_s: float = 10.0
    upscaling_factor: float = 1.0
    downscaling_factor: float = 1.0
    loop_interval_s: float = 0.1


def ray_core_policy(total_num_requests: float, current_num_replicas: int, target: float) -> float:
    """``_core_replica_queue_length_policy`` (python/ray/serve/autoscaling_policy.py): the desired replicas
    as a float, ``current * total / (target * current)``, i.e. ``total / target``.

    Raises:
        ValueError: with no running replica (the cold-start path handles that case first).
    """
    if current_num_replicas == 0:
        raise ValueError("Number of replicas cannot be zero")
    error_ratio = total_num_requests / (target * current_num_replicas)
    return current_num_replicas * error_ratio


def ray_apply_scaling_factors(desired: float, current: int, up: float, down: float) -> int:
    """``_apply_scaling_factors``: ``ceil(current + factor * (desired - current))`` with the up- or
    downscaling factor by the sign of the change; a scale-down the factor rounds back to ``current``
    goes down by one."""
    delta = desired - current
    factor = up if delta > 0 else down
    scaled = math.ceil(current + factor * delta)
    if math.ceil(desired) < current and scaled == current:
        scaled -= 1
    return scaled


def ray_apply_bounds(num_replicas: int, lower: int, upper: int) -> int:
    """``_apply_bounds``: clip to [lower, upper] (the capacity-adjusted min and max replicas)."""
    return max(lower, min(upper, num_replicas))


def ray_apply_delay_logic(
    desired: int, curr_target: int, config: RayServeConfig, counter: int
) -> tuple[int, int]:
    """``_apply_delay_logic``: the decision and the next decision counter (``counter``: consecutive
    scale-up decisions when positive, scale-down when negative).

    A scale-up is applied once the counter, reset if it was negative and then incremented, exceeds
    ``int(upscale_delay_s / loop_interval_s)``; a scale-down once it falls under
    ``-int(downscale_delay_s / loop_interval_s)`` (to at least 1 replica: scale to zero, from 1, is not
    simulated); applying resets the counter; no change resets it to 0. Otherwise the target stays.
    """
    decision = curr_target
    if desired > curr_target:
        counter = max(counter, 0) + 1
        if counter > int(config.upscale_delay_s / config.loop_interval_s):
            counter, decision = 0, desired
    elif desired < curr_target:
        counter = min(counter, 0) - 1
        desired = max(1, desired)
        if counter < -int(config.downscale_delay_s / config.loop_interval_s):
            counter, decision = 0, desired
    else:
        counter = 0
    return decision, counter


def ray_decide(
    config: RayServeConfig,
    total_num_requests: float,
    current_num_replicas: int,
    target_num_replicas: int,
    bounds: tuple[int, int],
    counter: int,
) -> tuple[int, int]:
    """One decision of the default policy as ``_apply_autoscaling_config`` wraps it, then
    ``get_decision_num_replicas``' bounds (python/ray/serve/_private/autoscaling_state.py): the new
    target and the next counter.

    ``current_num_replicas``: running replicas; ``target_num_replicas``: the current target (starting
    replicas included); ``bounds``: (min, max) replicas. With no running replica the cold-start path
    applies (``_get_cold_start_scale_up_replicas``): at least ``ceil(upscaling_factor)`` when requests
    wait, no delay. Otherwise ``ray_core_policy`` -> ``ray_apply_scaling_factors`` ->
    ``ray_apply_bounds`` -> ``ray_apply_delay_logic``.
    """
    lower, upper = bounds
    if current_num_replicas == 0:
        cold = target_num_replicas
        if total_num_requests > 0:
            cold = max(math.ceil(config.upscaling_factor), target_num_replicas)
        return ray_apply_bounds(cold, lower, upper), counter
    desired = ray_core_policy(total_num_requests, current_num_replicas, config.target_ongoing_requests)
    scaled = ray_apply_scaling_factors(
        desired, current_num_replicas, config.upscaling_factor, config.downscaling_factor
    )
    bounded = ray_apply_bounds(scaled, lower, upper)
    decision, counter = ray_apply_delay_logic(bounded, target_num_replicas, config, counter)
    return ray_apply_bounds(decision, lower, upper), counter


def ray_total_requests(samples: Sequence[tuple[float, float]], now: float, config: RayServeConfig) -> float:
    """What the controller reads as ``total_num_requests`` at ``now``: the mean of the concurrency
    samples over the look-back period ending at the handles' last push, the last multiple of
    ``metrics_interval_s`` at or before ``now`` (NaN when that window holds none)."""
    pushed = math.floor(now / config.metrics_interval_s + 1e-9) * config.metrics_interval_s
    return window_average(samples, pushed, config.look_back_period_s)


def make_ray_serve(cfg: sim.SimConfig, target_ongoing_requests: float) -> sim.Controller:
    """Ray Serve's default policy at ``target_ongoing_requests`` as a controller deciding every
    ``cfg.sync`` seconds (run it with ``sync = PEER_TICK_SECONDS``; the delays are counted in those
    ticks): ``ray_decide`` on ``ray_total_requests``, running replicas = the ready ones, the target = the
    replicas provisioned. No pushed sample yet: hold.
    """
    config = RayServeConfig(target_ongoing_requests, loop_interval_s=cfg.sync)
    samples: list[tuple[float, float]] = []
    counter = 0
    keep = int((config.look_back_period_s + config.metrics_interval_s) / cfg.sync) + 2

    def tick(t: float, m: sim.Metrics, n: int, timeout: float) -> tuple[int, float]:
        nonlocal counter
        if not math.isnan(m.concurrency):
            samples.append((t, m.concurrency))
        del samples[: max(0, len(samples) - keep)]
        total = ray_total_requests(samples, t, config)
        if math.isnan(total):
            return n, timeout
        bounds = (cfg.min_replicas, cfg.max_replicas)
        decision, counter = ray_decide(config, total, m.ready, n, bounds, counter)
        return decision, timeout

    return tick


# --------------------------------------------------------------------------------------------------
# KEDA's http-add-on

#: KEDA's http-add-on interceptor holds a request until the workload has a ready endpoint
#: (interceptor/middleware/endpoint_resolver.go ``WaitForReady``), with no bound on how many, for
#: ``KEDA_HTTP_READINESS_TIMEOUT``, default 0: as long as the request's own deadline,
#: ``KEDA_HTTP_REQUEST_TIMEOUT``, default 0: none (interceptor/config/timeouts.go).
KEDA_INTERCEPTOR = sim.Activator("keda_http_add_on", None, None)


@dataclass(frozen=True)
class KedaHttpSpec:
    """An HTTPScaledObject on the request rate (operator/apis/http/v1alpha1/httpscaledobject_types.go)
    and the ScaledObject the add-on makes of it (pkg/k8s/scaledobject.go), with their defaults.

    Attributes:
        target: ``scalingMetric.requestRate.targetValue``, requests/s per replica (the swept knob; its
            default 100 is a tenth of what one replica of this model serves).
        window: ``scalingMetric.requestRate.window`` 1m: the rate is the interceptor's count over it.
        min_replicas: ``replicas.min``, default 0: scale to zero; 1 turns it off.
        cooldown_period: ``scaledownPeriod``, KEDA's ``cooldownPeriod`` 300 s
            (pkg/scaling/executor/scale_executor.go ``defaultCooldownPeriod``).
        polling_interval: the ScaledObject's ``pollingInterval`` 15 s (the add-on's
            ``soPollingInterval``): how often KEDA checks the cooldown. The add-on's scaler pushes an
            active trigger every 200 ms (``KEDA_HTTP_SCALER_STREAM_INTERVAL_MS``), so activation (0 -> 1)
            and the last active time do not wait for a poll.
    """

    target: float
    window: float = 60.0
    min_replicas: int = 0
    cooldown_period: float = 300.0
    polling_interval: float = 15.0


def keda_scale_to_zero(
    spec: KedaHttpSpec, active: bool, last_active: float | None, replicas: int, now: float
) -> int | None:
    """KEDA's scale executor (pkg/scaling/executor/scale_scaledobjects.go ``RequestScale``) for the
    ScaledObject: the replicas KEDA itself sets, or ``None`` when the HPA it owns decides (1 and more).

    - ``min_replicas`` over 0: ``None`` (the HPA, at least ``min_replicas``).
    - The trigger active (the add-on's metric over 0): from 0 replicas, 1 (``scaleFromZeroOrIdle``);
      else ``None``.
    - Not active: at 0 replicas, 0; else 0 once the last active time (``None``: never, and the
      initial cooldown, 0 s, is over) plus ``cooldown_period`` is before ``now`` (``scaleToZeroOrIdle``),
      else ``None``.
    """
    if spec.min_replicas > 0:
        return None
    if active:
        return 1 if replicas == 0 else None
    if replicas == 0 or last_active is None or last_active + spec.cooldown_period < now:
        return 0
    return None


def make_keda_http(cfg: sim.SimConfig, target: float, *, scale_to_zero: bool = True) -> sim.Controller:
    """KEDA's http-add-on on the request rate at ``target`` requests/s per replica, as a controller
    ticking every ``cfg.sync`` (the HPA's sync and the ScaledObject's polling, both 15 s): the trigger
    is active while the interceptor counted a request in the last ``window`` (``Metrics.offered_rate`` >
    0), and it was last active at ``min(now, last arrival + window)`` (``Metrics.last_arrival``: the
    scaler's 200 ms pushes record the end of the activity), or at 0 before any arrival: the service
    starts warm, as under every other controller (its replicas Ready at 0, as if its last request had
    just been answered), not as a ScaledObject never active. KEDA's own decision first
    (``keda_scale_to_zero``), else the HPA algorithm on the interceptor's rate per replica
    (``autoscaler_sim.make_hpa(cfg, "offered", target)``: an AverageValue external metric).
    ``scale_to_zero`` False: ``replicas.min`` 1, the HPA alone. Run it with ``KEDA_INTERCEPTOR``.
    """
    spec = KedaHttpSpec(target, min_replicas=0 if scale_to_zero else 1)
    hpa = sim.make_hpa(cfg, "offered", target)

    def tick(t: float, m: sim.Metrics, n: int, timeout: float) -> tuple[int, float]:
        if math.isnan(m.offered_rate):
            return n, timeout
        last_active = 0.0 if math.isnan(m.last_arrival) else min(t, m.last_arrival + spec.window)
        keda = keda_scale_to_zero(spec, m.offered_rate > 0, last_active, n, t)
        return (keda, timeout) if keda is not None else hpa(t, m, n, timeout)

    return tick
