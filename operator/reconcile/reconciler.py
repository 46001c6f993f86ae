"""Level-based reconciliation of one InferenceService: read current state, plan, apply the difference.

A steady-state reconcile makes no write request at all: owned objects are compared (applied-hash +
subset, see :mod:`kubeinfer.operator.reconcile.diff`) against the operator's in-memory view (kopf
indexes fed by watches, overlaid with the responses of its own applies), status is patched only
when a field differs (:class:`kubeinfer.operator.status.StatusWriter`), and Events are posted only
on transitions (:mod:`kubeinfer.operator.reconcile.events`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic
from kubeinfer.operator import api, conditions, k8s, metrics, rfc3339
from kubeinfer.operator.builders.common import selector_string
from kubeinfer.operator.builders.endpointslice import (
    activator_slice_name,
    controller_slices_selector,
    ready_addresses,
    slice_grpc_port,
)
from kubeinfer.operator.reconcile import backoff, coldstart, diagnosis, events, pool, report
from kubeinfer.operator.reconcile.capabilities import ClusterCapabilities
from kubeinfer.operator.reconcile.diff import Action, plan_apply
from kubeinfer.operator.reconcile.grpcports import GrpcPorts
from kubeinfer.operator.reconcile.owned import BY_KIND, OWNED, OWNED_KINDS, BuildInputs
from kubeinfer.operator.reconcile.poolindex import PoolIndex
from kubeinfer.operator.reconcile.references import ReferencePolicy
from kubeinfer.operator.reconcile.replicas import Wake, desired_replicas, replica_floor, wake
from kubeinfer.operator.reconcile.rollout import rollout_of
from kubeinfer.operator.reconcile.routing import ready_replicas, routes_to_activator
from kubeinfer.operator.status import (
    ConditionState,
    StatusWrite,
    StatusWriter,
    conditions_of,
    generation_of,
    isvc_path,
    object_key,
    resource_version,
)

from kubeinfer.contract.activator import ACTIVATOR_GRPC_PORT, ISVC_LABEL

logger = logging.getLogger(__name__)

#: ``lookup(kind, namespace, name)`` → the current object as last seen, or ``None``.
Lookup = Callable[[str, str, str], Mapping[str, Any] | None]

__all__ = ["HAND_OVER_SECONDS", "OWNED_KINDS", "Lookup", "Reconciler", "apply_if_changed"]

#: While a Service that routed to the activator turns back to its Ready pods: how soon the reconcile
#: looks again for the EndpointSlice controller's slice of those pods (then the activator's slice goes).
HAND_OVER_SECONDS = 1.0


async def apply_if_changed(
    kube: k8s.Kube, desired: dict[str, Any], current: Mapping[str, Any] | None
) -> tuple[Action, dict[str, Any] | None]:
    """Server-side apply ``desired`` (field manager ``kubeinfer``) unless ``current`` already matches
    (:func:`kubeinfer.operator.reconcile.diff.plan_apply`; ``current`` ``None``: it applies).

    Returns:
        The action taken and the stored object (``None`` when nothing was sent).

    Raises:
        k8s.TransientError / k8s.PermanentError: the apply failed.
    """
    action = plan_apply(desired, current)
    if action == "none":
        return action, None
    stored = await kube.apply(desired, field_manager=api.FIELD_MANAGER, force=True)
    return action, stored


@dataclass
class Reconciler:
    """Reconciles InferenceServices; one instance per operator process.

    ``clock`` returns RFC 3339 UTC strings (injected in tests). ``retry_delay``: base of the retry
    back-off after a transient API error, seconds (see :func:`backoff.retry_delay`; at most
    ``max_retry_delay``); ``api_error_threshold``: consecutive failed reconciles of one
    InferenceService before ``Ready=False ApiServerError`` is written. ``scrapers``: the
    NetworkPolicy peers of the Prometheus that scrapes the runtime pods (admitted to their metrics
    port when there is a NetworkPolicy). ``default_deny``: every InferenceService gets a NetworkPolicy,
    even without ``spec.server.allowFrom`` (then admitting the scrapers only). ``references``: the
    Secrets and ServiceAccounts an InferenceService may name (one naming another is refused before
    anything is applied). ``capabilities``: what the cluster serves (an ``oci://`` model where image
    volumes are not is refused before anything is applied; the default refuses nothing). Status is
    written by ``status_writer`` (field manager ``kubeinfer``), made from ``kube``. ``activator``: the
    activator is installed, so ``autoscaling.minReplicas: 0`` may take a service to zero and the
    activator's demand brings it back (:func:`replicas.wake`); without it the floor stays 1.
    ``activator_addresses``: the activator's Ready addresses as last seen (kept up to date by the
    controllers, from the watch of the activator's EndpointSlices), which a Service routed to the
    activator is pointed at (:mod:`~kubeinfer.operator.reconcile.routing`); ``activator_peer``: the
    NetworkPolicy peer of the activator's pods (``None``: none admitted). ``routes``: by InferenceService,
    the routing the last reconcile applied (``True``: to the activator); absent when not known (never
    reconciled, or its Service or EndpointSlice failed to apply). ``grpc_ports``: the activator gRPC
    port allocated to each service routed to the activator (:mod:`~kubeinfer.operator.reconcile.grpcports`);
    ``held_grpc_ports``: port -> the InferenceServices whose activator EndpointSlice names it, as watched
    (the handlers hand in their kopf index; a port there is not given to another service).
    ``pool_indexes``: (namespace, pool) -> its replicas' model repository indexes (the pool poller's,
    :mod:`~kubeinfer.operator.reconcile.pool_poller`), for the status of a pooled InferenceService.
    """

    kube: k8s.Kube
    clock: Callable[[], str] = rfc3339.now
    scrapers: tuple[Mapping[str, Any], ...] = ()
    default_deny: bool = False
    references: ReferencePolicy = field(default_factory=ReferencePolicy)
    capabilities: ClusterCapabilities = field(default_factory=ClusterCapabilities)
    retry_delay: float = 5.0
    max_retry_delay: float = backoff.RETRY_DELAY_MAX_SECONDS
    api_error_threshold: int = backoff.API_ERROR_THRESHOLD
    activator: bool = False
    activator_addresses: tuple[str, ...] = ()
    activator_peer: Mapping[str, Any] | None = None
    routes: dict[tuple[str, str], bool] = field(default_factory=dict)
    grpc_ports: GrpcPorts = field(default_factory=GrpcPorts)
    held_grpc_ports: Mapping[int, Collection[tuple[str, str]]] = field(default_factory=dict)
    pool_indexes: Mapping[tuple[str, str], PoolIndex] = field(default_factory=dict)
    status_writer: StatusWriter = field(init=False)
    _locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    _applied: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    _retries: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)
    _events: dict[tuple[str, str], list[events.Event]] = field(default_factory=dict)
    _failures: dict[tuple[str, str], int] = field(default_factory=dict)
    _background: set[asyncio.Task[Any]] = field(default_factory=set)
    _replicasets_refused: bool = False
    _hand_overs: dict[tuple[str, str], int] = field(default_factory=dict)
    _on_shared_port: set[tuple[str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.status_writer = StatusWriter(self.kube, api.FIELD_MANAGER)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the memory of a deleted InferenceService (its pending retry is cancelled)."""
        self._locks.pop((namespace, name), None)
        self.bodies.pop((namespace, name), None)
        self._events.pop((namespace, name), None)
        self._failures.pop((namespace, name), None)
        self.routes.pop((namespace, name), None)
        self._hand_overs.pop((namespace, name), None)
        self._release_grpc_port((namespace, name))
        self.status_writer.forget(namespace, name)
        for owned in OWNED:
            self._applied.pop((owned.kind, namespace, owned.name_of(name)), None)
        task = self._retries.pop((namespace, name), None)
        if task is not None:
            task.cancel()

    async def close(self, grace_seconds: float = 5.0) -> None:
        """At shutdown: cancel the pending retries, give the Events still being posted up to
        ``grace_seconds`` to finish, then cancel them."""
        for task in self._retries.values():
            task.cancel()
        self._retries.clear()
        if self._background:
            _, pending = await asyncio.wait(set(self._background), timeout=grace_seconds)
            for task in pending:
                task.cancel()

    def forget_object(self, kind: str, namespace: str, name: str) -> None:
        """Drop the remembered apply response of an owned object (it was deleted)."""
        self._applied.pop((kind, namespace, name), None)

    def _current(self, lookup: Lookup, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The newer of the watched object and the response of our own last apply."""
        seen = lookup(kind, namespace, name)
        mine = self._applied.get((kind, namespace, name))
        if mine is not None and resource_version(mine) > resource_version(seen):
            return mine
        if mine is not None:
            del self._applied[(kind, namespace, name)]
        return seen

    def _schedule_retry(self, body: Mapping[str, Any], lookup: Lookup, delay: float) -> None:
        key = object_key(body)
        if key in self._retries and not self._retries[key].done():
            return

        async def _later() -> None:
            await asyncio.sleep(delay)
            self._retries.pop(key, None)
            await self.reconcile(body, lookup, latest=True)

        self._retries[key] = asyncio.get_running_loop().create_task(_later())

    #: ``bodies[(namespace, name)]`` → the latest InferenceService body seen (for retries).
    bodies: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)

    async def reconcile(self, body: Mapping[str, Any], lookup: Lookup, *, latest: bool = False) -> None:
        """Bring the owned objects and the status of one InferenceService in line with its spec.

        ``body``: the InferenceService as watched; ``lookup``: the current owned objects. Transient
        API errors schedule a retry with exponential back-off from ``retry_delay`` seconds (at least
        the server's Retry-After); after ``api_error_threshold`` consecutive ones the object shows
        ``Ready=False`` (reason ApiServerError, the API error as message; written once, with a
        Warning Event) until a reconcile succeeds. Permanent ones become ``Ready=False`` (reason
        ReconcileFailed) and a Warning Event. Never raises for API errors.
        """
        key = object_key(body)
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            known = self.bodies.get(key)
            if known is not None and (latest or resource_version(known) > resource_version(body)):
                body = known  # our own status patch may be newer than the watched body
            else:
                self.bodies[key] = body
            started = time.perf_counter()
            result = "ok"
            try:
                # a 409 is a stale resourceVersion (kopf's finalizer patch, the autoscaler): re-read, redo
                done = await self.kube.retry_on_conflict(
                    isvc_path(*key), body, lambda b: self._reconcile_body(b, lookup), attempts=3
                )
                if done is None:
                    return
                self._failures.pop(key, None)
            except k8s.TransientError as exc:
                result = "retry"
                body = self.bodies.get(key, body)  # a 409's re-read may have a newer one
                metrics.RECONCILE_ERRORS.labels(kind="transient").inc()
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                delay = backoff.retry_delay(
                    failures, base=self.retry_delay, cap=self.max_retry_delay, retry_after=exc.retry_after
                )
                logger.warning(
                    "reconcile %s/%s: transient error (%d in a row), retrying in %.0f s: %s",
                    *key,
                    failures,
                    delay,
                    exc,
                )
                await self._write_api_error(body, failures, str(exc))
                self._schedule_retry(body, lookup, delay)
            except k8s.NotFoundError:
                result = "gone"  # deleted while we worked: owner references clean up the rest
                self.forget(*key)
            except k8s.PermanentError as exc:
                result = "error"
                metrics.RECONCILE_ERRORS.labels(kind="permanent").inc()
                logger.error("reconcile %s/%s: %s", *key, exc)
            finally:
                metrics.RECONCILES.labels(result=result).inc()
                metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

    def _event_later(self, body: Mapping[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        """Post an Event in the background (best effort; the reconcile does not wait for it)."""
        event = self.kube.record_event(
            api.object_reference(body), reason=reason, message=message, type_=type_
        )
        task = asyncio.get_running_loop().create_task(event)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _reconcile_body(self, body: Mapping[str, Any], lookup: Lookup) -> bool:
        """One attempt of :meth:`_reconcile` on ``body``, remembered as the latest body (for retries)."""
        self._remember(body)
        await self._reconcile(body, lookup)
        return True

    def _remember(self, body: Mapping[str, Any]) -> None:
        """Keep ``body`` as the latest known InferenceService unless a newer one is known."""
        key = object_key(body)
        if resource_version(body) >= resource_version(self.bodies.get(key)):
            self.bodies[key] = body

    async def _reconcile(self, body: Mapping[str, Any], lookup: Lookup) -> None:
        meta = body.get("metadata") or {}
        namespace, name = str(meta["namespace"]), str(meta["name"])
        current_status: Mapping[str, Any] = body.get("status") or {}
        try:
            isvc = api.InferenceService.from_body(body)
        except pydantic.ValidationError as exc:
            message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            await self._write_fault(
                body,
                current_status,
                ConditionState("False", conditions.INVALID_SPEC, f"invalid spec: {message}"[:2000]),
            )
            return
        # Nothing is applied when refused: the pods never receive what it names, and the API server
        # never gets a pod spec it would refuse or strip (an image volume where they are off).
        refused = self.references.refusal(isvc) or self.capabilities.refusal(isvc)
        if refused is not None:
            await self._write_fault(body, current_status, refused)
            return

        deployment = self._current(lookup, "Deployment", namespace, name)
        # 0 -> 1 is ours: the activator's demand newer than the scale to zero
        woken = wake(body, isvc, deployment, activator=self.activator)
        seen = deployment  # as the routing rule reads it (the apply below may store a newer one)
        to_activator = routes_to_activator(
            body, isvc, seen, activator=self.activator, activator_ready=bool(self.activator_addresses)
        )
        # chosen and recorded with no await since the routing rule: see _grpc_port
        grpc_port = self._grpc_port(lookup, isvc) if to_activator else ACTIVATOR_GRPC_PORT
        to_zero_in_force = replica_floor(isvc, activator=self.activator) == 0
        inputs = BuildInputs(
            max_queue_delay_seconds=isvc.spec.max_queue_delay_in_force(isvc.status.max_queue_delay),
            replicas=desired_replicas(isvc, deployment, activator=self.activator, woken=woken is not None),
            scrapers=self.scrapers,
            default_deny=self.default_deny,
            activator_addresses=self.activator_addresses if to_activator else None,
            activator_grpc_port=grpc_port,
            # only a service that may go to zero admits the activator (it forwards what reaches it)
            activator_peer=self.activator_peer if to_zero_in_force else None,
        )
        built = {owned.kind: owned.build(isvc, inputs) for owned in OWNED}
        desired = [obj for obj in built.values() if obj is not None]
        currents = [self._current(lookup, o["kind"], namespace, o["metadata"]["name"]) for o in desired]
        outcomes = await asyncio.gather(
            *(apply_if_changed(self.kube, o, c) for o, c in zip(desired, currents, strict=True)),
            return_exceptions=True,
        )
        errors: list[str] = []
        # The max queue delay the ConfigMap was last rendered with (status) and the one it has now.
        max_queue_delay = (isvc.status.max_queue_delay, inputs.max_queue_delay_seconds)
        failed: set[str] = set()
        for obj, current, outcome in zip(desired, currents, outcomes, strict=True):
            stored = self._record_apply(body, isvc, obj, current, outcome, errors, max_queue_delay, woken)
            if stored is not None and obj["kind"] == "Deployment":
                deployment = stored
            if isinstance(outcome, BaseException):
                failed.add(obj["kind"])
        created = [
            f"{o['kind']} {o['metadata']['name']}"
            for o, out in zip(desired, outcomes, strict=True)
            if isinstance(out, tuple) and out[0] == "create" and out[1] is not None
        ]
        if created:
            self._event_later(body, conditions.CREATED, "created " + ", ".join(created))
        for kind in (k for k, obj in built.items() if obj is None and k != k8s.ENDPOINT_SLICE.kind):
            await self._delete_unwanted(body, lookup, kind)
        if isvc.spec.pool is not None:
            await self._write_pooled_status(body, lookup, isvc, current_status)
            return
        routed = await self._route(body, lookup, isvc, ready_replicas(seen) > 0, to_activator, failed)

        error = errors[-1] if errors else None
        state = await self._observe(isvc, deployment, error, current_status)
        desired_status = report.desired_status(
            isvc, deployment, state, current_status, self.clock(), activator=self.activator, routed=routed
        )
        await self._write_status(body, desired_status, note=state.note)

    async def _write_pooled_status(
        self,
        body: Mapping[str, Any],
        lookup: Lookup,
        isvc: api.InferenceService,
        current_status: Mapping[str, Any],
    ) -> None:
        """The status of an InferenceService on a pool (``spec.pool``): Ready from the ModelPool (as
        watched: absent, its Deployment's ready replicas), from whether another InferenceService of the
        pool took its served model name (among those this reconciler knows, :attr:`bodies`) and from its
        model's loads on the pool's replicas (:attr:`pool_indexes`), and ``status.model``."""
        namespace, pool_name = isvc.namespace, str(isvc.spec.pool)
        taken = pool.pool_members(pool_name, namespace, self.bodies.values()).taken.get(isvc.name)
        index = self.pool_indexes.get((namespace, pool_name))
        ready = pool.pooled_ready(
            isvc,
            lookup(api.POOL_KIND, namespace, pool_name),
            lookup(k8s.DEPLOYMENT.kind, namespace, pool_name),
            taken,
            index,
        )
        await self._write_status(body, pool.pooled_status(isvc, ready, current_status, self.clock(), index))

    def _grpc_port(self, lookup: Lookup, isvc: api.InferenceService) -> int:
        """The gRPC port of the activator EndpointSlice of ``isvc``, which routes to the activator: its
        own (:meth:`GrpcPorts.allocate`, keeping the one its slice names), else, with every port taken,
        the activator's shared one (logged once per service). Synchronous: the choice is recorded before
        another reconcile of this process can choose (one port, one service)."""
        key = (isvc.namespace, isvc.name)
        mine = self._current(lookup, k8s.ENDPOINT_SLICE.kind, isvc.namespace, activator_slice_name(isvc.name))
        port = self.grpc_ports.allocate(key, slice_grpc_port(mine), self.held_grpc_ports)
        if port is not None:
            if key in self._on_shared_port:
                self._on_shared_port.discard(key)
                logger.info("reconcile %s/%s: activator gRPC port %d (was the shared port)", *key, port)
            return port
        if key not in self._on_shared_port:
            self._on_shared_port.add(key)
            logger.warning(
                "reconcile %s/%s: every activator gRPC port (%d from %d) is taken: its gRPC calls go to the "
                "activator's shared port %d, routed by the model they name",
                *key,
                self.grpc_ports.count,
                self.grpc_ports.first,
                ACTIVATOR_GRPC_PORT,
            )
        return ACTIVATOR_GRPC_PORT

    def _release_grpc_port(self, key: tuple[str, str]) -> None:
        """Forget the activator gRPC port of ``key`` (its activator EndpointSlice is gone)."""
        self.grpc_ports.release(key)
        self._on_shared_port.discard(key)

    def _record_apply(
        self,
        body: Mapping[str, Any],
        isvc: api.InferenceService,
        obj: dict[str, Any],
        current: Mapping[str, Any] | None,
        outcome: tuple[Action, dict[str, Any] | None] | BaseException,
        errors: list[str],
        max_queue_delay: tuple[float | None, float],
        woken: Wake | None = None,
    ) -> dict[str, Any] | None:
        """Remember one apply's response and post its Events (DriftReverted; the update's, see
        :func:`events.update_events`, which ``max_queue_delay`` is passed to; for a Deployment taken from
        zero by ``woken``, ScaledFromZero in place of Scaled or DriftReverted). Returns the stored object
        (``None``: nothing was sent, or it failed). A permanent error is appended to ``errors``; any
        other exception is raised."""
        kind, obj_name = obj["kind"], obj["metadata"]["name"]
        if isinstance(outcome, k8s.PermanentError):
            errors.append(f"{kind} {obj_name}: {outcome}")
            return None
        if isinstance(outcome, BaseException):
            raise outcome
        action, stored = outcome
        if stored is None:
            return None
        self._applied[(kind, isvc.namespace, obj_name)] = stored
        if woken is not None and kind == "Deployment" and action in ("update", "revert"):
            self._event_later(body, conditions.SCALED_FROM_ZERO, woken.message())
            logger.info("reconcile %s/%s: %s", isvc.namespace, isvc.name, woken.message())
            if action == "revert":
                return stored
        if action == "revert":
            self._event_later(
                body, conditions.DRIFT_REVERTED, f"put back the fields of {kind} {obj_name}", "Warning"
            )
        elif action == "update":
            for type_, reason, message in events.update_events(
                obj, current, isvc, max_queue_delay=max_queue_delay
            ):
                if woken is not None and reason == conditions.SCALED:
                    continue  # said by ScaledFromZero
                self._event_later(body, reason, message, type_)
        return stored

    async def _replicasets(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The runtime's ReplicaSets; ``[]`` when the API refuses the list (an older chart's RBAC
        without ``replicasets: list``: the counts are then derived from the Deployment alone and every
        pod's problem counts, logged once)."""
        try:
            return await self.kube.list(k8s.REPLICASET.path(namespace), label_selector=selector)
        except k8s.PermanentError as exc:
            if not self._replicasets_refused:
                logger.warning(
                    "listing ReplicaSets refused, rollout counts from the Deployment only: %s", exc
                )
            self._replicasets_refused = True
            return []

    async def _observe(
        self,
        isvc: api.InferenceService,
        deployment: Mapping[str, Any] | None,
        error: str | None,
        current_status: Mapping[str, Any],
    ) -> diagnosis.Health:
        """:func:`diagnosis.health` from the PersistentVolumeClaims and, while a rollout is not complete,
        the ReplicaSets and pods (listed only then: a steady state reads nothing more; and once more as
        a fetched model's rollout completes, for what the fetch took, in the Ready Event)."""
        namespace = isvc.namespace
        missing: list[str] = []
        for claim in isvc.spec.pvc_claims():
            if await self.kube.get(k8s.PERSISTENT_VOLUME_CLAIM.path(namespace, claim)) is None:
                missing.append(claim)
        pods: list[dict[str, Any]] = []
        replicasets: list[dict[str, Any]] = []
        ready = (conditions_of({"status": current_status}).get(conditions.CONDITION_READY) or {}).get(
            "status"
        )
        becoming_ready = api.is_fetched(isvc.spec.model.uri) and ready != "True"
        if deployment is not None and not missing and (becoming_ready or not rollout_of(deployment).complete):
            selector = selector_string(isvc)
            replicasets, pods = await asyncio.gather(
                self._replicasets(namespace, selector),
                self.kube.list(k8s.POD.path(namespace), label_selector=selector),
            )
        return diagnosis.health(
            deployment,
            missing_pvcs=missing,
            error=error,
            namespace=namespace,
            pods=pods,
            replicasets=replicasets,
            model_image=api.oci_reference(isvc.spec.model.uri),
            at_zero=report.at_zero_words(isvc, activator=self.activator),
        )

    async def _write_status(
        self, body: Mapping[str, Any], desired: Mapping[str, Any], note: str | None = None
    ) -> None:
        """Write the ``desired`` status fields computed from ``body`` (the fields that differ; none: no
        request); a 409 goes up to :meth:`reconcile`, which re-reads the object and reconciles again.
        ``note``: words for the Event of Ready turning true (:attr:`diagnosis.Health.note`)."""
        self._after_status(await self.status_writer.write(body, desired), note)

    def _after_status(self, written: StatusWrite, note: str | None = None) -> None:
        """Keep the stored object as the latest body, then post the Events of the conditions'
        transitions (:func:`events.transition_events`, with ``note``), once per transition."""
        if not written.patch:
            return
        body, key = written.body, object_key(written.body)
        if written.stored is not None and resource_version(written.stored) > resource_version(
            self.bodies.get(key)
        ):
            self.bodies[key] = written.stored
        if "conditions" not in written.patch:
            return
        found = events.transition_events(
            written.before.get("conditions") or [], written.patch["conditions"], note
        )
        if found and self._events.get(key) != found:
            self._events[key] = found  # the watch may not show our patch yet
            for type_, reason, message in found:
                self._event_later(body, reason, message, type_)
        before = written.before.get("conditions") or []
        if coldstart.cold_start_due(before, written.patch["conditions"], body):
            task = asyncio.get_running_loop().create_task(self._cold_start_event(body))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _cold_start_event(self, body: Mapping[str, Any]) -> None:
        """Post the ``ColdStart`` Event of a woken service's first Ready replica (:mod:`.coldstart`): its
        pods listed once, the first Ready one since the scale to zero read. Best effort: an API error is
        logged."""
        namespace, name = object_key(body)
        try:
            pods = await self.kube.list(k8s.POD.path(namespace), label_selector=f"{ISVC_LABEL}={name}")
        except k8s.KubeError as exc:
            logger.warning("cold start of %s/%s: listing its pods failed: %s", namespace, name, exc)
            return
        since = (body.get("status") or {}).get("scaledToZeroAt")
        pod = coldstart.first_ready(pods, since if isinstance(since, str) else None)
        stages = coldstart.pod_stages(pod, coldstart.woken_demand(body)) if pod is not None else None
        if stages is None:
            return
        logger.info("reconcile %s/%s: %s", namespace, name, stages.message())
        await self.kube.record_event(
            api.object_reference(body), reason=conditions.COLD_START, message=stages.message()
        )

    async def _write_api_error(self, body: Mapping[str, Any], failures: int, error: str) -> None:
        """Write ``Ready=False ApiServerError`` when :func:`backoff.api_error_state` says so (best
        effort).

        A 409 (stale resourceVersion: the autoscaler wrote status) re-reads the object and tries once
        more; any other API error is logged (the API server may refuse this write too; the retry of
        the reconcile goes on).
        """

        def desire(current: Mapping[str, Any]) -> dict[str, Any] | None:
            self._remember(current)
            current_status: Mapping[str, Any] = current.get("status") or {}
            ready = backoff.api_error_state(
                current_status, failures, error, threshold=self.api_error_threshold
            )
            if ready is None:
                return None
            generation = generation_of(current)
            return {"conditions": report.ready_conditions(current_status, ready, self.clock(), generation)}

        try:
            written = await self.status_writer.update(body, desire)
        except k8s.KubeError as exc:
            logger.warning(
                "reconcile %s/%s: writing Ready=False ApiServerError failed: %s", *object_key(body), exc
            )
            return
        self._after_status(written)

    async def _write_fault(
        self, body: Mapping[str, Any], current_status: Mapping[str, Any], ready: ConditionState
    ) -> None:
        """Write a fault found before anything is applied (an invalid spec, a reference the policy
        refuses): ``Ready=False`` and ``Stalled=True`` with its reason (:func:`report.fault_conditions`)."""
        generation = generation_of(body)
        desired = {
            "observedGeneration": generation,
            "conditions": report.fault_conditions(current_status, ready, self.clock(), generation),
        }
        await self._write_status(body, desired)

    async def _route(
        self,
        body: Mapping[str, Any],
        lookup: Lookup,
        isvc: api.InferenceService,
        pods_ready: bool,
        to_activator: bool,
        failed: set[str],
    ) -> bool | None:
        """Finish the routing the applies started (:mod:`~kubeinfer.operator.reconcile.routing`) and
        remember it in :attr:`routes`; returns it (``True``: to the activator), ``None`` when the
        Service or the EndpointSlice failed to apply (the error is in the Ready condition).

        To the activator (the Service without selector and the activator EndpointSlice applied): the
        EndpointSlices the EndpointSlice controller made for the Service are deleted. That controller
        neither updates nor removes the slices of a Service that lost its selector, so their pod
        addresses would stay among the Service's endpoints; a slice it was writing as the selector went
        is caught by the next reconcile (each one at the activator lists them).

        To the pods (the Service with its selector applied): the activator EndpointSlice is deleted once
        the controller's slices list a Ready pod, so that the Service never has no endpoint between the
        two (then its gRPC port is released, :attr:`grpc_ports`); until then it stays (the activator
        forwards to the Ready pods), and while the Deployment has a Ready replica (``pods_ready``) the
        reconcile is tried again after :data:`HAND_OVER_SECONDS`, doubling each time (at most
        ``max_retry_delay``).
        """
        key = (isvc.namespace, isvc.name)
        if {k8s.SERVICE.kind, k8s.ENDPOINT_SLICE.kind} & failed:
            self.routes.pop(key, None)
            return None
        path = k8s.ENDPOINT_SLICE.path(isvc.namespace)
        if to_activator:
            for piece in await self.kube.list(path, label_selector=controller_slices_selector(isvc.name)):
                name = str((piece.get("metadata") or {}).get("name"))
                if await self.kube.delete(k8s.ENDPOINT_SLICE.path(isvc.namespace, name)):
                    logger.info(
                        "reconcile %s/%s: deleted EndpointSlice %s of the EndpointSlice controller "
                        "(the Service routes to the activator)",
                        *key,
                        name,
                    )
            self.routes[key] = True
            self._hand_overs.pop(key, None)
            return True
        self.routes[key] = False
        kind, name = k8s.ENDPOINT_SLICE.kind, activator_slice_name(isvc.name)
        if self._current(lookup, kind, isvc.namespace, name) is None:
            self._hand_overs.pop(key, None)
            self._release_grpc_port(key)
            return False
        pods = await self.kube.list(path, label_selector=controller_slices_selector(isvc.name))
        if ready_addresses(pods):
            self._hand_overs.pop(key, None)
            await self._delete_unwanted(body, lookup, kind)
            self._release_grpc_port(key)
        elif pods_ready:
            tries = self._hand_overs[key] = self._hand_overs.get(key, 0) + 1
            self._schedule_retry(
                body, lookup, min(HAND_OVER_SECONDS * 2 ** (tries - 1), self.max_retry_delay)
            )
        return False

    async def _delete_unwanted(self, body: Mapping[str, Any], lookup: Lookup, kind: str) -> None:
        """Delete the owned object of ``kind`` that the spec no longer wants (its builder gave ``None``:
        a PodDisruptionBudget at one replica, a NetworkPolicy without ``spec.server.allowFrom``), with
        a Normal Event."""
        meta = body.get("metadata") or {}
        namespace = str(meta["namespace"])
        owned = BY_KIND[kind]
        name = owned.name_of(str(meta["name"]))
        current = self._current(lookup, kind, namespace, name)
        if current is None:
            return
        if ((current.get("metadata") or {}).get("labels") or {}).get(ISVC_LABEL) != meta["name"]:
            return  # not this InferenceService's (a ModelPool's Deployment of the same name)
        if await self.kube.delete(owned.resource.path(namespace, name)):
            self._event_later(body, conditions.DELETED, f"deleted {kind} {name} ({owned.unwanted})")
        self._applied.pop((kind, namespace, name), None)
