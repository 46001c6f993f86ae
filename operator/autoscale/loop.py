"""The autoscaler's per-InferenceService timer body: query → decide → actuate.

Called by the ``@kopf.timer`` in ``kubeinfer.operator.handlers`` (through
``kubeinfer.operator.controllers``, which creates the one ``Autoscaler`` with the reconciler at startup
and closes it at cleanup) every ``KUBEINFER_AUTOSCALE_INTERVAL_SECONDS`` (default 15 s) for each
InferenceService.

- ``spec.autoscaling.enabled: false`` → nothing is read or written (and the in-memory policy state of
  that InferenceService is dropped).
- Signals: ``prometheus.PrometheusSignals`` (blocking, run in a worker thread) with the default queries
  or the spec's ``autoscaling.queries`` overrides, over ``autoscaling.window``.
- Decision: ``policy.decide`` with the spec's tunables (``policy_from_spec``).
- Actuation, only when the decision changes something:
  replicas through the Deployment's **scale subresource** (merge patch, field manager
  ``kubeinfer-autoscaler``: the operator's reconcile then leaves ``spec.replicas`` alone);
  the max queue delay by writing ``status.maxQueueDelay``, and nothing else: the tick's result carries the
  InferenceService as stored with it (:attr:`TickResult.stored`), which ``controllers`` hands to the
  reconciler, the one writer of owned objects: it renders the ConfigMap from that status and applies
  it. The runtime hot-reloads the file. An Event (``Autoscaled``) with the decision's reason.
- Status: ``lastDecision`` and ``observed`` when a decision changes something; the
  ``AutoscalingActive`` condition when its status or reason changes: True/Active on a tick that acts;
  True with the kind of hold (``Decision.hold``: BacklogDrained, AtMaxReplicas, ReplicasStarting,
  ScaleUpCoolingDown, MaxQueueDelayCoolingDown, StabilizationWindow, ArrivalsRising, ScaleInCoolingDown,
  WithinTolerance, TargetMet) and the hold's words as message on a tick that holds; False with
  PrometheusUnavailable, QueryError, MetricsMissing, InvalidMetrics, StaleMetrics, UnusableSignals or
  NoDeployment. ``observed`` also when that condition changes. The message alone changing (new numbers,
  same kind of hold) writes nothing, so a tick that changes nothing in kind writes nothing. Written
  through ``kubeinfer.operator.status.StatusWriter`` (compare before patch, conflict retry).
- ``status.quantization``: on each tick whose signals Prometheus answered, the runtime's deviation from
  fp32 measured at load (``signals.quantization_query``: the least over the pods) with the quality
  gate's bars, written when it changes (its ``time``: when these figures were first read), removed
  when no pod measured any (quantization none on engine torch). Not a signal: the policy never reads it.
  With autoscaling off nothing reads it and the reconciler removes it, as ``observed``.
- Words: for a service without a GPU, the utilization is the runtime executor's busy time, and the
  reasons and messages say so (``wording.for_device``), not "GPU".

Policy state (cooldown clocks, the stabilization window's recommendations) lives in memory (the
``Autoscaler``, one per operator process). After an operator restart it is re-derived from
``status.lastDecision.time``: that time counts as the last scale-up, scale-down and timeout change (so
every cooldown is honoured), and the stabilization window starts afresh (no scale-in during the first
window after a restart). The arrival samples the burst headroom learns from are read back from
Prometheus: on the first tick whose signals are known, one range query of the arrival-rate PromQL over
the last ``burst_memory_seconds`` at the tick's interval (``policy.restore_arrivals``), so bursts
learned before a restart (an upgrade, a leader change) keep their headroom. It is tried once; if it
fails the headroom relearns from new samples.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

import pydantic
from kubeinfer.operator import api, conditions, k8s, metrics, rfc3339, status
from kubeinfer.operator.autoscale import prometheus, wording
from kubeinfer.operator.autoscale import signals as sig
from kubeinfer.operator.autoscale.policy import (
    Current,
    Decision,
    Observation,
    Policy,
    State,
    decide,
    restore_arrivals,
    restore_state,
)
from kubeinfer.operator.settings import Settings

logger = logging.getLogger(__name__)

#: Upper bound of the back-off between reads of one service's signals while Prometheus is unavailable, s.
SIGNAL_RETRY_MAX_SECONDS = 120.0
#: Most samples one arrival-history range query asks for (Prometheus refuses over 11,000 per series).
HISTORY_MAX_POINTS = 10_000


def prom_duration(seconds: float) -> str:
    """Seconds as a PromQL range duration in whole milliseconds (PromQL has no decimals): 1.5 → ``1500ms``."""
    return f"{max(1, round(seconds * 1000))}ms"


def policy_from_spec(
    spec: api.AutoscalingSpec, *, stale_after_seconds: float, activator: bool = False
) -> Policy:
    """The control law's tunables from ``spec.autoscaling`` (durations in seconds).

    ``minReplicas: 0`` is ``min_replicas=1`` (the floor of the other rules) with scale to zero on
    (``idle_after_seconds`` from ``scaleToZero.idleAfter``) only when ``activator`` (the operator is
    told the activator is installed); without it scale to zero stays off (``idle_after_seconds=None``)
    and the service keeps 1 replica (its ScaleToZero condition says why).

    Raises:
        ValueError: naming the policy field, when the spec's values are inconsistent.
    """
    to_zero = spec.min_replicas == 0 and activator
    return Policy(
        min_replicas=max(1, spec.min_replicas),
        max_replicas=spec.max_replicas,
        target_p99_seconds=spec.target_p99,
        gpu_low=spec.gpu_utilization.low,
        gpu_high=spec.gpu_utilization.high,
        max_queue_delay_min_seconds=spec.max_queue_delay.min,
        max_queue_delay_max_seconds=spec.max_queue_delay.max,
        tolerance=spec.tolerance,
        scale_down_stabilization_seconds=spec.scale_down_stabilization,
        scale_up_cooldown_seconds=spec.scale_up_cooldown,
        scale_down_cooldown_seconds=spec.scale_down_cooldown,
        max_queue_delay_cooldown_seconds=spec.max_queue_delay_cooldown,
        max_scale_up_step=spec.max_scale_up_step,
        plan_utilization=spec.plan_utilization,
        stale_after_seconds=stale_after_seconds,
        idle_after_seconds=float(spec.scale_to_zero_in_force.idle_after) if to_zero else None,
    )


def observed_status(obs: Observation, when: str) -> dict[str, Any]:
    """``status.observed`` (camelCase); unknown signals are ``None`` (never 0). ``p99`` is the P99 as a
    duration a person reads (``23.4ms``, 3 significant digits: the P99 printer column), ``p99Seconds``
    the same in seconds (6 decimals)."""

    def num(x: float | None, digits: int) -> float | None:
        return None if x is None or math.isnan(x) or math.isinf(x) else round(x, digits)

    p99 = num(obs.p99_seconds, 6)
    return {
        "p99": None if p99 is None or p99 < 0 else api.format_duration(p99, significant=3),
        "p99Seconds": p99,
        "gpuUtilization": num(obs.gpu_utilization, 4),
        "requestRate": num(obs.request_rate, 3),
        "queueSize": num(obs.queue_size, 1),
        "arrivalRate": num(obs.arrival_rate, 3),
        "inflightRequests": num(obs.inflight_requests, 1),
        "serviceTimeInterceptSeconds": num(obs.service_time_a_seconds, 6),
        "serviceTimeSlopeSeconds": num(obs.service_time_c_seconds, 7),
        "instanceConcurrency": num(obs.instance_concurrency, 3),
        "time": when,
        "unknownReason": obs.unknown_reason,
    }


def quantization_status(
    reading: sig.QuantizationReading | None, gate: api.GateSpec | None
) -> dict[str, Any] | None:
    """``status.quantization`` (camelCase) of a reading, less its ``time``: the figures (6 decimals), the
    gate's bars when it sets them, what and how many texts they were measured on. ``None`` when nothing
    was measured."""
    if reading is None:
        return None
    out: dict[str, Any] = {k: round(v, 6) for k, v in sorted(reading.figures.items())}
    if gate is not None and gate.min_cosine is not None:
        out["minCosine"] = gate.min_cosine
    if gate is not None and gate.min_agreement is not None:
        out["minAgreement"] = gate.min_agreement
    out["measuredOn"] = reading.measured_on
    out["texts"] = reading.texts
    return out


def quantization_patch(
    current_status: Mapping[str, Any], wanted: Mapping[str, Any] | None, when: str
) -> dict[str, Any]:
    """The status fields that make ``status.quantization`` say ``wanted`` (:func:`quantization_status`):
    ``{}`` when it says that already (its ``time`` kept, so reading the same figures writes nothing);
    ``{"quantization": None}`` to remove it; else ``wanted`` with ``time`` ``when`` and, as a merge patch
    needs, ``None`` for each field it says no longer (an embedder's cosine after a switch to a
    classifier, a bar the gate dropped)."""
    have = current_status.get("quantization")
    if wanted is None:
        return {} if have is None else {"quantization": None}
    previous = dict(have) if isinstance(have, Mapping) else {}
    if {k: v for k, v in previous.items() if k != "time"} == dict(wanted):
        return {}
    gone = {k: None for k in previous if k not in wanted and k != "time"}
    return {"quantization": {**gone, **wanted, "time": when}}


def condition_after(
    conds: list[Mapping[str, Any]],
    status_: api.ConditionStatus,
    reason: str,
    message: str,
    now: str,
    generation: int,
) -> list[dict[str, Any]] | None:
    """The conditions list with ``AutoscalingActive`` set (:func:`status.set_condition`; the message cut
    to 1000 characters), or ``None`` when its status, reason and observedGeneration are already those
    (the message alone changing is not worth a write; a new generation is, so that every condition's
    observedGeneration is current)."""
    previous = next((c for c in conds if c.get("type") == conditions.CONDITION_AUTOSCALING_ACTIVE), None)
    unchanged = (status_, reason, generation)
    if (
        previous is not None
        and (previous.get("status"), previous.get("reason"), previous.get("observedGeneration")) == unchanged
    ):
        return None
    state = status.ConditionState(status_, reason, message[:1000])
    return status.put_condition(conds, conditions.CONDITION_AUTOSCALING_ACTIVE, state, now, generation)


def decision_status(decision: Decision, observation: Observation, when: str) -> dict[str, Any]:
    """The ``status`` fields a decision writes (camelCase): ``lastDecision`` and ``observed`` when it
    changes something, ``maxQueueDelay`` when it changes the timeout, ``scaledToZeroAt`` (``when``) when
    it takes the replicas to 0 (written before the scale: a demand of the activator from then on is
    newer, and brings a replica back); ``{}`` otherwise."""
    patch: dict[str, Any] = {}
    if decision.changed:
        patch["lastDecision"] = {
            "time": when,
            "replicas": decision.replicas,
            "maxQueueDelay": api.format_duration(decision.max_queue_delay_seconds),
            "reason": decision.reason,
        }
        patch["observed"] = observed_status(observation, when)
    if decision.max_queue_delay_changed:
        patch["maxQueueDelay"] = api.format_duration(decision.max_queue_delay_seconds)
    if decision.replicas_changed and decision.replicas == 0:
        patch["scaledToZeroAt"] = when
    return patch


def condition_of(reading: sig.Reading, decision: Decision) -> status.ConditionState:
    """``AutoscalingActive``: False with the signal problem, or UnusableSignals when the policy cannot
    act on the values; True with the kind of hold, else Active.

    Written when the kind of hold changes (:func:`condition_after` compares status and reason only),
    never per tick for new numbers in the message: a steady resync writes nothing."""
    if reading.condition_reason is not None:
        unknown = reading.observation.unknown_reason or "unknown signals"
        return status.ConditionState("False", reading.condition_reason, unknown)
    if not decision.known:
        return status.ConditionState("False", conditions.UNUSABLE_SIGNALS, decision.reason)
    if decision.hold is not None:
        return status.ConditionState("True", decision.hold, decision.reason)
    return status.ConditionState("True", conditions.ACTIVE, f"last decision: {decision.reason}")


@dataclass
class _Memory:
    """In-memory state of one InferenceService: the policy's, and the signal problem of the last read
    (``None``: readable) with its back-off: ``failures`` reads in a row found Prometheus unavailable,
    the next read not before ``retry_at`` (monotonic seconds)."""

    state: State
    signal_problem: str | None = None
    failures: int = 0
    retry_at: float = 0.0
    history_pending: bool = True
    ticked_at: float | None = None
    """Monotonic seconds of a ModelPool's last tick (its members' timers ask, the first one due ticks)."""


@dataclass
class TickResult:
    """What one tick did: its decision (``None``: none was made), the AutoscalingActive reason, whether
    it wrote status and scaled the Deployment, and ``stored``: the InferenceService as the API server
    stored it with a new ``status.maxQueueDelay`` (``None`` when the max queue delay did not change or the
    write was skipped), for the reconciler to render the ConfigMap from."""

    decision: Decision | None
    condition_reason: str
    wrote_status: bool = False
    scaled: bool = False
    stored: Mapping[str, Any] | None = None


#: What the autoscaler scales: an InferenceService's Deployment or a ModelPool's.
_Scaled: TypeAlias = api.InferenceService | api.ModelPool

SignalsFactory = Callable[[], prometheus.PrometheusSignals]
#: Awaited before a scale to 0 with the InferenceService as stored: whether its Service now routes to
#: the activator (see :meth:`Autoscaler.tick`).
OnZero = Callable[[Mapping[str, Any]], Awaitable[bool]]


@dataclass
class Autoscaler:
    """One per operator process, created and closed with the reconciler
    (``kubeinfer.operator.controllers``).

    ``signals_factory`` creates the Prometheus client on the first read (from the operator settings,
    :func:`from_settings`); ``monotonic`` and ``wall`` are injected clocks (seconds; ``datetime``).
    Status is written by ``status_writer`` (field manager ``kubeinfer-autoscaler``), made from ``kube``.
    ``activator``: the activator is installed, so ``minReplicas: 0`` turns scale to zero on
    (:func:`policy_from_spec`).
    """

    kube: k8s.Kube
    signals_factory: SignalsFactory
    interval_seconds: float = 15.0
    activator: bool = False
    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    status_writer: status.StatusWriter = field(init=False)
    pool_status_writer: status.StatusWriter = field(init=False)
    _signals: prometheus.PrometheusSignals | None = None
    _memory: dict[tuple[str, str], _Memory] = field(default_factory=dict)
    _pool_memory: dict[tuple[str, str], _Memory] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.status_writer = status.StatusWriter(self.kube, api.AUTOSCALER_FIELD_MANAGER)
        self.pool_status_writer = status.StatusWriter(
            self.kube, api.AUTOSCALER_FIELD_MANAGER, path=k8s.MODEL_POOL.path
        )

    def forget(self, namespace: str, name: str) -> None:
        """Drop the policy state and the status memory of one InferenceService."""
        self._memory.pop((namespace, name), None)
        self.status_writer.forget(namespace, name)

    def forget_pool(self, namespace: str, name: str) -> None:
        """Drop the policy state and the status memory of one ModelPool."""
        self._pool_memory.pop((namespace, name), None)
        self.pool_status_writer.forget(namespace, name)

    def close(self) -> None:
        """Close the Prometheus client (a later tick would open a new one)."""
        if self._signals is not None:
            self._signals.close()
            self._signals = None

    def _memory_for(self, isvc: _Scaled, now: float) -> _Memory:
        memory = self._pool_memory if isinstance(isvc, api.ModelPool) else self._memory
        key = (isvc.namespace, isvc.name)
        mem = memory.get(key)
        if mem is None:
            last = isvc.status.last_decision
            when = rfc3339.parse_time(last.time if last else None)
            age = (self.wall() - when).total_seconds() if when else None
            mem = _Memory(
                restore_state(
                    now=now,
                    last_scale_up_age=age,
                    last_scale_down_age=age,
                    last_max_queue_delay_change_age=age,
                )
            )
            memory[key] = mem
        return mem

    async def tick(
        self,
        body: Mapping[str, Any],
        deployment: Mapping[str, Any] | None,
        *,
        on_zero: OnZero | None = None,
    ) -> TickResult | None:
        """One control step for the InferenceService ``body``; ``deployment``: its Deployment as last
        seen (``None`` if absent). Returns ``None`` when autoscaling is off, the object is being deleted
        or the spec is invalid (the operator's reconcile reports that). API errors are logged, not
        raised: the next tick tries again.

        ``on_zero``: awaited with the InferenceService as stored with ``status.scaledToZeroAt``, after
        that write and before the scale to 0 (the controllers have the reconciler route the Service to
        the activator there); ``False`` (the Service does not route to the activator) leaves the
        replicas as they are, and the next tick decides again."""
        try:
            isvc = api.InferenceService.from_body(body)
        except pydantic.ValidationError:
            return None
        if not isvc.spec.autoscaling.enabled or (body.get("metadata") or {}).get("deletionTimestamp"):
            self.forget(isvc.namespace, isvc.name)
            return None
        try:
            return await self._tick(isvc, body, deployment, on_zero)
        except k8s.KubeError as exc:
            logger.warning(
                "autoscale %s/%s: API error, next tick retries: %s", isvc.namespace, isvc.name, exc
            )
            return None

    async def _tick(
        self,
        isvc: api.InferenceService,
        body: Mapping[str, Any],
        deployment: Mapping[str, Any] | None,
        on_zero: OnZero | None = None,
    ) -> TickResult:
        spec = isvc.spec.autoscaling
        ns, name = isvc.namespace, isvc.name
        now, wall = self.monotonic(), self.wall()
        when = rfc3339.format_time(wall)
        mem = self._memory_for(isvc, now)

        if deployment is None:
            no_deployment = status.ConditionState("False", conditions.NO_DEPLOYMENT, "no Deployment yet")
            await self._write_status(isvc, body, {}, no_deployment, when)
            return TickResult(None, conditions.NO_DEPLOYMENT)

        if now < mem.retry_at:  # Prometheus was unavailable: wait out the back-off, read nothing
            return TickResult(None, mem.signal_problem or conditions.ACTIVE)
        window_s = spec.window
        queries = sig.default_queries(
            ns,
            name,
            prom_duration(window_s),
            spec.queries.model_dump(),
            arrival_window=prom_duration(2 * self.interval_seconds),  # two scrapes: a recent rate
        )
        # Samples older than the query window are stale: the one threshold, applied by
        # policy.check_observation both when reading and when deciding.
        policy = policy_from_spec(spec, stale_after_seconds=window_s, activator=self.activator)
        delay = isvc.spec.max_queue_delay_in_force(isvc.status.max_queue_delay)
        reading, current, decision = await self._decide(
            isvc, mem, queries, policy, deployment, delay, isvc.spec.resources.gpus, now, wall
        )
        result = TickResult(decision, reading.condition_reason or conditions.ACTIVE)

        fields = decision_status(decision, reading.observation, when)
        condition = condition_of(reading, decision)
        quantization = await self._read_quantization(isvc, reading)
        written = await self._write_status(
            isvc, body, fields, condition, when, reading.observation, quantization
        )
        result.wrote_status = written.sent
        if decision.max_queue_delay_changed and "maxQueueDelay" in written.patch:
            result.stored = written.stored

        to_zero = decision.replicas_changed and decision.replicas == 0
        if to_zero and not await self._ready_for_zero(isvc, body, written, on_zero):
            return result  # the next tick decides again
        if decision.replicas_changed:
            await self._scale(ns, name, decision.replicas)
            result.scaled = True
        if decision.changed:
            metrics.count_decision(
                ns,
                name,
                replicas_before=current.replicas,
                replicas_after=decision.replicas,
                max_queue_delay_changed=decision.max_queue_delay_changed,
            )
            logger.info("autoscale %s/%s: %s", ns, name, decision.reason)
            await self.kube.record_event(
                api.object_reference(body), reason=conditions.AUTOSCALED, message=decision.reason
            )
        return result

    async def tick_pool(
        self,
        body: Mapping[str, Any],
        deployment: Mapping[str, Any] | None,
        models: Sequence[api.InferenceService] = (),
    ) -> TickResult | None:
        """One control step for the ModelPool ``body``, at most one per ``0.9 * interval_seconds`` (the
        timers of its InferenceServices ask; the first one due ticks); ``deployment``: the pool's
        Deployment as last seen; ``models``: the InferenceServices it serves (their longest max queue
        delay is the policy's, held fixed: :func:`pool_max_queue_delay`). Returns ``None`` when nothing
        was due, autoscaling is off, the pool is being deleted or its spec is invalid (its reconcile
        reports that). API errors are logged, not raised: the next tick tries again.

        The same pure policy as an InferenceService's, on the pool's signals over all its models
        (:func:`signals.pool_queries`); replicas through the Deployment's scale subresource, an Event
        ``Autoscaled`` on the ModelPool, its ``status.lastDecision``, ``observed`` and AutoscalingActive
        as an InferenceService's. No max queue delay, no scale to zero, no quantization figures."""
        try:
            pool = api.ModelPool.from_body(body)
        except pydantic.ValidationError:
            return None
        if not pool.spec.autoscaling.enabled or (body.get("metadata") or {}).get("deletionTimestamp"):
            self.forget_pool(pool.namespace, pool.name)
            return None
        now = self.monotonic()
        mem = self._memory_for(pool, now)
        if mem.ticked_at is not None and now - mem.ticked_at < 0.9 * self.interval_seconds:
            return None
        mem.ticked_at = now
        try:
            return await self._tick_pool(pool, body, deployment, pool_max_queue_delay(models), mem, now)
        except k8s.KubeError as exc:
            logger.warning(
                "autoscale ModelPool %s/%s: API error, next tick retries: %s", pool.namespace, pool.name, exc
            )
            return None

    async def _tick_pool(
        self,
        pool: api.ModelPool,
        body: Mapping[str, Any],
        deployment: Mapping[str, Any] | None,
        delay: float,
        mem: _Memory,
        now: float,
    ) -> TickResult:
        spec = pool.spec.autoscaling
        ns, name = pool.namespace, pool.name
        wall = self.wall()
        when = rfc3339.format_time(wall)
        if deployment is None:
            no_deployment = status.ConditionState("False", conditions.NO_DEPLOYMENT, "no Deployment yet")
            await self._write_status(pool, body, {}, no_deployment, when)
            return TickResult(None, conditions.NO_DEPLOYMENT)
        if now < mem.retry_at:  # Prometheus was unavailable: wait out the back-off, read nothing
            return TickResult(None, mem.signal_problem or conditions.ACTIVE)
        queries = sig.pool_queries(
            ns,
            name,
            prom_duration(spec.window),
            spec.queries.model_dump(),
            arrival_window=prom_duration(2 * self.interval_seconds),
        )
        # the max queue delay is each model's: held at the longest, never a lever of the pool's policy
        policy = replace(
            policy_from_spec(spec, stale_after_seconds=spec.window),
            max_queue_delay_min_seconds=delay,
            max_queue_delay_max_seconds=delay,
        )
        reading, _, decision = await self._decide(
            pool, mem, queries, policy, deployment, delay, pool.spec.resources.gpus, now, wall
        )
        result = TickResult(decision, reading.condition_reason or conditions.ACTIVE)
        fields = decision_status(decision, reading.observation, when)
        if "lastDecision" in fields:  # the max queue delay is no decision of a pool's
            del fields["lastDecision"]["maxQueueDelay"]
        written = await self._write_status(
            pool, body, fields, condition_of(reading, decision), when, reading.observation
        )
        result.wrote_status = written.sent
        if decision.replicas_changed:
            await self._scale(ns, name, decision.replicas)
            result.scaled = True
            logger.info("autoscale ModelPool %s/%s: %s", ns, name, decision.reason)
            await self.kube.record_event(
                api.pool_reference(body), reason=conditions.AUTOSCALED, message=decision.reason
            )
        return result

    async def _decide(
        self,
        obj: _Scaled,
        mem: _Memory,
        queries: sig.Queries,
        policy: Policy,
        deployment: Mapping[str, Any],
        max_queue_delay: float,
        gpus: int,
        now: float,
        wall: dt.datetime,
    ) -> tuple[sig.Reading, Current, Decision]:
        """The step an InferenceService's tick and a ModelPool's share: read ``queries`` (the reason in
        the words of a pod with ``gpus`` GPUs), note the reading (:meth:`_note_reading`), read the arrival
        history back once, and the pure policy's decision for ``deployment`` (its replicas and Ready
        replicas) with ``max_queue_delay`` (float seconds) in force; ``mem.state`` becomes the decision's."""
        if self._signals is None:
            self._signals = self.signals_factory()
        reading = _worded(
            await asyncio.to_thread(self._signals.read, queries, policy.stale_after_seconds), gpus
        )
        self._note_reading(obj, mem, reading, now)
        if mem.history_pending and reading.condition_reason is None:
            await self._restore_history(obj, mem, queries.arrival_rate, policy, now, wall)
        dstatus = deployment.get("status") or {}
        current = Current(
            replicas=int((deployment.get("spec") or {}).get("replicas", 1)),
            max_queue_delay_seconds=max_queue_delay,
            ready_replicas=int(dstatus.get("readyReplicas") or 0),
        )
        decision = decide(reading.observation, current, policy, mem.state, now)
        decision = replace(decision, reason=wording.for_device(decision.reason, gpus=gpus))
        mem.state = decision.state
        return reading, current, decision

    async def _scale(self, namespace: str, name: str, replicas: int) -> None:
        """Set the replicas of Deployment ``namespace/name`` through its scale subresource (field manager
        ``kubeinfer-autoscaler``). Raises ``k8s.KubeError``."""
        await self.kube.patch_merge(
            k8s.DEPLOYMENT.path(namespace, name),
            {"spec": {"replicas": replicas}},
            field_manager=api.AUTOSCALER_FIELD_MANAGER,
            subresource="scale",
        )

    async def _read_quantization(
        self, isvc: api.InferenceService, reading: sig.Reading
    ) -> tuple[bool, dict[str, Any] | None]:
        """``(read, wanted)``: the service's deviation from fp32 from Prometheus
        (:func:`signals.quantization_query`) as ``status.quantization`` wants it
        (:func:`quantization_status`); ``read`` False when it was not read (Prometheus unavailable for
        the signals already, or this query failed: logged at DEBUG, status left as it is)."""
        if reading.condition_reason == conditions.PROMETHEUS_UNAVAILABLE or self._signals is None:
            return False, None
        promql = sig.quantization_query(isvc.namespace, isvc.name)
        try:
            result = await asyncio.to_thread(self._signals.query, promql)
        except sig.SignalError as exc:
            logger.debug("autoscale %s/%s: quantization figures not read: %s", isvc.namespace, isvc.name, exc)
            return False, None
        return True, quantization_status(sig.parse_quantization(result), isvc.spec.quantization.gate)

    async def _ready_for_zero(
        self,
        isvc: api.InferenceService,
        body: Mapping[str, Any],
        written: status.StatusWrite,
        on_zero: OnZero | None,
    ) -> bool:
        """Whether a decision to scale to 0 may be carried out: its moment was recorded
        (``status.scaledToZeroAt`` in ``written``; if the spec moved meanwhile it was not, and without it a
        demand could not be told from an old one), then ``on_zero`` (when given) says the Service routes
        to the activator, so that a request arriving while the last replica drains is held by the
        activator, not sent to a pod that is stopping."""
        if "scaledToZeroAt" not in written.patch:
            return False
        if on_zero is None or await on_zero(written.stored or body):
            return True
        logger.info(
            "autoscale %s/%s: not scaled to zero: the Service does not route to the activator (no Ready "
            "activator address, or its apply failed); the next tick decides again",
            isvc.namespace,
            isvc.name,
        )
        return False

    async def _restore_history(
        self,
        isvc: _Scaled,
        mem: _Memory,
        promql: str,
        policy: Policy,
        now: float,
        wall: dt.datetime,
    ) -> None:
        """Read back the arrival rate's last ``burst_memory_seconds`` (one sample per interval, up to
        one interval ago: this tick adds its own) into the policy state, once. ``now`` and ``wall`` are
        the tick's two clocks, read together (a sample's age is ``wall`` minus its timestamp)."""
        mem.history_pending = False
        if not promql or not policy.burst_headroom or self._signals is None:
            return
        if policy.burst_memory_seconds <= self.interval_seconds:
            return  # nothing older than this tick's own sample to read back
        end = wall - dt.timedelta(seconds=self.interval_seconds)
        start = wall - dt.timedelta(seconds=policy.burst_memory_seconds)
        # Prometheus answers at most 11,000 points per series: a short interval gets a coarser step.
        step = max(self.interval_seconds, policy.burst_memory_seconds / HISTORY_MAX_POINTS)
        try:
            samples = await asyncio.to_thread(self._signals.history, promql, start, end, step)
        except sig.SignalError as exc:
            logger.warning(
                "autoscale %s/%s: arrival-rate history not read (%s): the burst headroom relearns",
                isvc.namespace,
                isvc.name,
                exc,
            )
            return
        ages = [(wall.timestamp() - ts, rate) for ts, rate in samples]
        mem.state = restore_arrivals(mem.state, ages, now=now, policy=policy)
        logger.info(
            "autoscale %s/%s: %d arrival-rate samples of the last %.0f s read back from Prometheus",
            isvc.namespace,
            isvc.name,
            len(mem.state.arrivals),
            policy.burst_memory_seconds,
        )

    def _note_reading(self, isvc: _Scaled, mem: _Memory, reading: sig.Reading, now: float) -> None:
        """Log a signal problem once, on its transition (WARNING for a fault of Prometheus or of a
        query, INFO for missing or unusable values, INFO when the signals are readable again; the
        full error is at DEBUG in ``signals``), and back off while Prometheus is unavailable:
        ``interval · 2^(n-1)`` after the n-th failed read in a row, at most
        :data:`SIGNAL_RETRY_MAX_SECONDS`."""
        reason = reading.condition_reason
        if reason == conditions.PROMETHEUS_UNAVAILABLE:
            mem.failures += 1
            delay = min(self.interval_seconds * 2.0 ** min(mem.failures - 1, 20), SIGNAL_RETRY_MAX_SECONDS)
            mem.retry_at = now + delay
        else:
            mem.failures, mem.retry_at = 0, 0.0
        if reason != mem.signal_problem:
            kind = "ModelPool " if isinstance(isvc, api.ModelPool) else ""
            where = f"autoscale {kind}{isvc.namespace}/{isvc.name}"
            if reason is None:
                logger.info("%s: signals readable again", where)
            elif reason in (conditions.PROMETHEUS_UNAVAILABLE, conditions.QUERY_ERROR):
                logger.warning(
                    "%s: %s: %s; retrying with back-off, holding replicas and max queue delay",
                    where,
                    reason,
                    reading.observation.unknown_reason,
                )
            else:
                logger.info("%s: %s: %s", where, reason, reading.observation.unknown_reason)
        mem.signal_problem = reason

    async def _write_status(
        self,
        isvc: _Scaled,
        body: Mapping[str, Any],
        fields: Mapping[str, Any],
        condition: status.ConditionState,
        when: str,
        observation: Observation | None = None,
        quantization: tuple[bool, dict[str, Any] | None] = (False, None),
    ) -> status.StatusWrite:
        """Write ``fields`` plus ``AutoscalingActive`` when its kind changes (:func:`condition_after`;
        then also ``observed``, from ``observation``) and ``quantization`` when it was read and differs
        (:func:`quantization_patch`) through :attr:`status_writer`: only what differs, a 409
        re-reads the object and computes them again, unless its generation moved (the decision was for
        the old spec). Returns what was written (``sent``: a request was sent; ``stored``: the object
        as stored). A ModelPool's through :attr:`pool_status_writer`."""

        def desire(current: Mapping[str, Any]) -> dict[str, Any] | None:
            if status.generation_of(current) != isvc.generation:
                # the spec moved since this tick read it (autoscaling turned off, say: the operator
                # removed AutoscalingActive): a decision for the old spec writes nothing
                return None
            conds = condition_after(
                list((current.get("status") or {}).get("conditions") or []),
                condition.status,
                condition.reason,
                condition.message,
                when,
                isvc.generation,
            )
            full = dict(fields)
            read, wanted = quantization
            if read:
                full.update(quantization_patch(current.get("status") or {}, wanted, when))
            if conds is not None:
                full["conditions"] = conds
                if observation is not None and "observed" not in full:
                    full["observed"] = observed_status(observation, when)
            return full

        writer = self.pool_status_writer if isinstance(isvc, api.ModelPool) else self.status_writer
        return await writer.update(body, desire)


def pool_max_queue_delay(models: Sequence[api.InferenceService]) -> float:
    """The max queue delay a ModelPool's policy holds fixed, float seconds: the longest of its ``models``'
    ``spec.batching.maxQueueDelay`` (the worst a request of the pool may wait for its batch), the
    default's without models. The autoscaler does not tune a pool's: each model has its own."""
    default = float(api.BatchingSpec().max_queue_delay)
    return max((float(m.spec.batching.max_queue_delay) for m in models), default=default)


def from_settings(kube: k8s.Kube, settings: Settings) -> Autoscaler:
    """The operator's ``Autoscaler`` from its settings (``prometheus_*`` for the client it opens on
    the first read, ``autoscale_interval_seconds``, ``activator_enabled``)."""
    config = prometheus.PrometheusConfig.from_settings(settings)
    return Autoscaler(
        kube=kube,
        signals_factory=lambda: prometheus.PrometheusSignals(config),
        interval_seconds=settings.autoscale_interval_seconds,
        activator=settings.activator_enabled,
    )


def _worded(reading: sig.Reading, gpus: int) -> sig.Reading:
    """``reading`` with its unknown reason in the words of a pod with ``gpus`` GPUs (:mod:`wording`)."""
    unknown = reading.observation.unknown_reason
    if unknown is None:
        return reading
    worded = wording.for_device(unknown, gpus=gpus)
    return replace(reading, observation=replace(reading.observation, unknown_reason=worded))
