"""The autoscalers users run instead of kubeinfer's, as simulator controllers: Knative's KPA and Ray Serve.

The HPA (on GPU utilization, and KEDA's request rate per replica) is ``autoscaler_sim.make_hpa``. This
module holds the other two peers' rules as pure functions, transcribed from their sources, and the
controllers that feed them the simulated signals:

- **Knative KPA** (``kpa_scale``, ``make_kpa``): knative/serving at commit
  ``98e5ef90aa7033797aa0a61ef97f3ff7e49a3944`` (``KNATIVE_COMMIT``).
- **Ray Serve's default policy** (``ray_*``, ``make_ray_serve``): ray-project/ray at commit
  ``00590c456b9afe0fd393db55b6ec21c9b7f3921b`` (``RAY_COMMIT``).

The signal both read is the **concurrency**: requests in flight (queued + in service) summed over the
replicas, ``autoscaler_sim.Metrics.concurrency`` (the in-flight count averaged over each tick). Neither
reads Prometheus: the KPA scrapes its pods' queue-proxies every second and decides every 2 s, Ray Serve's
handles push their samples every 10 s to a controller that loops every 0.1 s; each is simulated with its
own pipeline's delay (a tick of 2 s, ``PEER_TICK_SECONDS``) and the same replicas, cold start and
bounds as the HPA. Neither tunes the batch timeout: it stays at its initial value, as under the HPA.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import autoscaler_sim as sim

KNATIVE_COMMIT = "98e5ef90aa7033797aa0a61ef97f3ff7e49a3944"
RAY_COMMIT = "00590c456b9afe0fd393db55b6ec21c9b7f3921b"
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


def make_kpa(cfg: sim.SimConfig, target: float) -> sim.Controller:
    """The KPA at soft target ``target`` (requests per pod) as a controller ticking every ``cfg.sync``
    seconds (run it with ``sync = PEER_TICK_SECONDS``): each tick records ``Metrics.concurrency``, then
    ``kpa_scale`` on its stable- and panic-window averages, bounded by the simulation's min/max replicas
    (the PodAutoscaler's min-scale and max-scale; scale to zero off). No sample yet: hold.
    """
    spec = KpaSpec(target)
    samples: list[tuple[float, float]] = []
    state = KpaState()

    def tick(t: float, m: sim.Metrics, n: int, timeout: float) -> tuple[int, float]:
        nonlocal state
        if not math.isnan(m.concurrency):
            samples.append((t, m.concurrency))
        del samples[: max(0, len(samples) - int(spec.stable_window / cfg.sync) - 2)]
        stable = window_average(samples, t, spec.stable_window)
        panic = window_average(samples, t, spec.panic_window)
        if math.isnan(stable) or math.isnan(panic):
            return n, timeout
        desired, state = kpa_scale(spec, state, stable, panic, m.ready, t)
        return min(max(desired, cfg.min_replicas), cfg.max_replicas), timeout

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
