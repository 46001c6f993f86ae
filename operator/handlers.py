"""kopf handlers: kopf wiring only. Each handler parses kopf's arguments, calls one function of
:class:`kubeinfer.operator.controllers.Controllers`, returns.

Design (level-based, zero writes in steady state): no kopf *change* handlers (``on.create`` /
``on.update``), so kopf stores no last-handled configuration or progress on the objects. Every
watch event of an InferenceService — and of the objects it owns — runs the same reconcile, which
compares before it writes. kopf indexes keep the current owned objects in memory (kopf does not
run handlers until every index has been listed, so a restarted operator sees what exists before
it acts). A per-object kopf timer re-runs the reconcile every ``resync_seconds``, another one runs the
autoscaler every ``autoscale_interval_seconds`` (a timer needs kopf's finalizer on the object: one
write at creation, one at deletion).

Nothing is registered at import: :func:`register` registers the handlers with the settings read once
at startup (``kubeinfer.operator.main``), which also reach the startup handler through kopf's memo
(:data:`SETTINGS_MEMO_KEY`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
from kubeinfer.operator import api, k8s
from kubeinfer.operator.builders import ready_addresses
from kubeinfer.operator.builders.common import MANAGED_BY, MANAGED_BY_LABEL
from kubeinfer.operator.builders.endpointslice import slice_grpc_port
from kubeinfer.operator.controllers import Controllers
from kubeinfer.operator.reconcile.owned import BY_KIND, OWNED, OwnedKind
from kubeinfer.operator.reconcile.reconciler import Lookup
from kubeinfer.operator.settings import Settings

from kubeinfer.contract.activator import (
    ENDPOINTSLICE_MANAGED_BY,
    ISVC_LABEL,
    SERVICE_NAME_LABEL,
    SLICE_MANAGED_BY_LABEL,
    is_target_grpc_port,
)
from kubeinfer.contract.pool import POOL_LABEL

#: The label selecting the objects (and pods) the operator owns.
OWNED_LABELS = {MANAGED_BY_LABEL: MANAGED_BY}
#: The kopf memo key of the operator's :class:`Settings` (``kopf.run(memo=...)``).
SETTINGS_MEMO_KEY = "kubeinfer_settings"
#: The kopf memo key of the :class:`Controllers` (set by :func:`startup`).
CONTROLLERS_MEMO_KEY = "kubeinfer_controllers"
#: The kopf index (handler id) of the activator's EndpointSlices: slice name -> its Ready addresses.
ACTIVATOR_INDEX = "kubeinfer_activator_slices"
#: The kopf index (handler id) of the operator's activator EndpointSlices (of the Services at zero) by
#: their gRPC port: port -> (namespace, InferenceService name); only the per-service ports
#: (``kubeinfer.contract.activator.is_target_grpc_port``). The reconciler allocates no port found here.
GRPC_PORTS_INDEX = "kubeinfer_activator_grpc_ports"


#: The kopf index (handler id) of the ModelPools: (namespace, name) -> the pool as watched.
POOLS_INDEX = "kubeinfer_pools"
#: The kopf index (handler id) of the InferenceServices: (namespace, name) -> as watched.
ISVCS_INDEX = "kubeinfer_isvcs"


def _lookup(kwargs: Mapping[str, Any]) -> Lookup:
    """A :data:`Lookup` over the kopf indexes passed to a handler as keyword arguments (the owned kinds,
    and ``ModelPool``)."""

    def lookup(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        index = kwargs[POOLS_INDEX if kind == api.POOL_KIND else BY_KIND[kind].index]
        store = index.get((namespace, name))
        for value in store or ():
            found: Mapping[str, Any] = value
            return found
        return None

    return lookup


def _owner_body(kwargs: Mapping[str, Any], namespace: str | None, labels: Mapping[str, str]) -> Any:
    """The InferenceService (from the kopf index) that an object labelled ``labels`` belongs to."""
    owner = labels.get(ISVC_LABEL)
    store = kwargs[ISVCS_INDEX].get((namespace, owner)) if owner else None
    return next(iter(store or ()), None)


def _bodies(kwargs: Mapping[str, Any], index: str) -> list[Mapping[str, Any]]:
    """Every object of the kopf index ``index`` (``POOLS_INDEX``, ``ISVCS_INDEX``)."""
    return [body for store in kwargs[index].values() for body in store]


async def _pool_of(
    memo: Any, kwargs: Mapping[str, Any], namespace: str | None, labels: Mapping[str, str]
) -> None:
    """An object labelled with a pool's name (its Deployment, its pods) changed: reconcile that pool."""
    pool = labels.get(POOL_LABEL)
    store = kwargs[POOLS_INDEX].get((namespace, pool)) if pool else None
    body = next(iter(store or ()), None)
    if body is not None:
        await _controllers(memo).pool_event("MODIFIED", body, _bodies(kwargs, ISVCS_INDEX), _lookup(kwargs))


def _controllers(memo: Any) -> Controllers:
    controllers: Controllers = memo[CONTROLLERS_MEMO_KEY]
    return controllers


def _activator_addresses(index: Any) -> tuple[str, ...]:
    """The activator's Ready addresses over every slice in the index :data:`ACTIVATOR_INDEX`, sorted."""
    found: set[str] = set()
    for store in index.values():
        for addresses in store:
            found.update(addresses)
    return tuple(sorted(found))


async def _synced(memo: Any, kwargs: Mapping[str, Any]) -> Controllers:
    """The :class:`Controllers`, told first the activator's Ready addresses as the index has them now
    (with the activator enabled; see :meth:`Controllers.activator_seen`)."""
    controllers = _controllers(memo)
    index = kwargs.get(ACTIVATOR_INDEX)
    if index is not None:
        held = kwargs.get(GRPC_PORTS_INDEX)
        await controllers.activator_seen(_activator_addresses(index), _lookup(kwargs), grpc_ports=held)
    return controllers


#: Seconds a deletion waits for a running timer tick before it looks again (kopf's instant exit
#: timeout and cancellation polling).
TIMER_EXIT_SECONDS = 5.0


async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure kopf, then start the controllers (connect; make sure the peering object exists)."""
    settings.persistence.finalizer = f"{api.GROUP}/operator"
    settings.watching.server_timeout = 600
    settings.watching.client_timeout = 660
    settings.posting.enabled = False  # Events are posted by the reconciler, on transitions only
    # A deletion waits for the object's timers (resync, autoscale) to stop. A tick that is running then
    # is waited for in process up to 5 s, then re-checked every 5 s; kopf's default re-check, 60 s,
    # held `kubectl delete` for a minute whenever a tick was running at that moment.
    settings.background.instant_exit_timeout = TIMER_EXIT_SECONDS
    settings.background.cancellation_polling = TIMER_EXIT_SECONDS
    memo[CONTROLLERS_MEMO_KEY] = await Controllers.start(memo[SETTINGS_MEMO_KEY])


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Close the controllers (the autoscaler's Prometheus client, pending retries, the API client)."""
    await _controllers(memo).close()


def kubeinfer_isvcs(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """InferenceServices by (namespace, name)."""
    return {(namespace, name): dict(body)}


def _index_owned(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Owned objects of one kind by (namespace, name)."""
    return {(namespace, name): dict(body)}


async def isvc_event(
    type: str | None, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Any event of an InferenceService (including the initial listing); then the ModelPools of its
    namespace (it may have joined, changed or left one)."""
    controllers = await _synced(memo, kwargs)
    await controllers.isvc_event(type, dict(body), _lookup(kwargs))
    await _namespace_pools(
        controllers, kwargs, namespace, gone=(namespace, name) if type == "DELETED" else None
    )


async def _namespace_pools(
    controllers: Controllers,
    kwargs: Mapping[str, Any],
    namespace: str | None,
    gone: tuple[Any, Any] | None = None,
) -> None:
    """Reconcile the ModelPools of ``namespace`` over the InferenceServices indexed (without ``gone``, a
    deleted one the index may still hold)."""
    pools = _bodies(kwargs, POOLS_INDEX)
    if not pools:
        return
    isvcs = [b for key, store in kwargs[ISVCS_INDEX].items() if key != gone for b in store]
    await controllers.pools_of_namespace(str(namespace), pools, isvcs, _lookup(kwargs))


def kubeinfer_pools(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """ModelPools by (namespace, name)."""
    return {(namespace, name): dict(body)}


async def pool_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """Any event of a ModelPool (including the initial listing)."""
    controllers = await _synced(memo, kwargs)
    await controllers.pool_event(type, dict(body), _bodies(kwargs, ISVCS_INDEX), _lookup(kwargs))


async def owned_event(
    type: str | None,
    namespace: str | None,
    labels: kopf.Labels,
    memo: kopf.Memo,
    param: Any = None,
    **kwargs: Any,
) -> None:
    """An owned object of kind ``param`` changed (status, hand edit, deletion); a ModelPool's: the pool."""
    if POOL_LABEL in labels:
        if type not in (None, "ADDED"):
            await _pool_of(memo, kwargs, namespace, labels)
        return
    owner = _owner_body(kwargs, namespace, labels)
    await (await _synced(memo, kwargs)).owned_event(
        type, str(param), str(namespace), str(kwargs.get("name")), owner, _lookup(kwargs)
    )


async def pod_event(
    type: str | None, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A runtime pod changed (scheduled or not, pulling, crashed, ready); a ModelPool's: the pool."""
    if POOL_LABEL in labels:
        return  # the pool's Deployment's status follows its pods' readiness
    owner = _owner_body(kwargs, namespace, labels)
    await (await _synced(memo, kwargs)).pod_event(type, owner, _lookup(kwargs))


async def resync(body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    """Periodic level-based resync, while the InferenceService is still in the index."""
    indexed = bool(kwargs[ISVCS_INDEX].get((namespace, name)))
    controllers = await _synced(memo, kwargs)
    await controllers.resync(dict(body), _lookup(kwargs), indexed=indexed)
    if indexed:
        await _namespace_pools(controllers, kwargs, namespace)


async def autoscale(body: kopf.Body, namespace: str | None, memo: kopf.Memo, **kwargs: Any) -> None:
    """The autoscaler's control step (``kubeinfer.operator.autoscale.loop``); for a pooled
    InferenceService, the poll of its pool's replicas (:meth:`Controllers.poll_pool`) instead."""
    controllers = await _synced(memo, kwargs)
    pool = (body.get("spec") or {}).get("pool")
    if pool:
        store = kwargs[POOLS_INDEX].get((namespace, pool))
        pool_body = next(iter(store or ()), None)
        if pool_body is not None:
            await controllers.poll_pool(pool_body, _bodies(kwargs, ISVCS_INDEX), _lookup(kwargs))
        return
    await controllers.autoscale(dict(body), _lookup(kwargs))


def _index_activator_slice(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """An EndpointSlice of the activator's Service by name: its Ready addresses."""
    return {name: ready_addresses([body])}


def _index_grpc_port(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """An activator EndpointSlice of the operator by its gRPC port (see :data:`GRPC_PORTS_INDEX`); none
    for the shared port."""
    port, owner = slice_grpc_port(body), labels.get(SERVICE_NAME_LABEL)
    if not is_target_grpc_port(port) or not owner:
        return {}
    return {port: (str(namespace), str(owner))}


async def activator_slice_event(memo: kopf.Memo, **kwargs: Any) -> None:
    """An EndpointSlice of the activator's Service changed (or went): the activator's Ready addresses
    may have changed."""
    await _synced(memo, kwargs)


def _register_activator(settings: Settings, registry: kopf.OperatorRegistry) -> None:
    """The index (:data:`ACTIVATOR_INDEX`) and the watch of the EndpointSlices of the activator's Service
    (``settings.activator_service``: ``kubernetes.io/service-name`` its name, in its namespace), and the
    index of the gRPC ports of the operator's own activator EndpointSlices (:data:`GRPC_PORTS_INDEX`)."""
    where, res = settings.activator_namespace(), k8s.ENDPOINT_SLICE
    kopf.index(
        res.group,
        res.version,
        res.plural,
        labels={SLICE_MANAGED_BY_LABEL: ENDPOINTSLICE_MANAGED_BY},
        id=GRPC_PORTS_INDEX,
        registry=registry,
    )(_index_grpc_port)

    def of_activator(namespace: str | None, **_: Any) -> bool:
        return namespace == where

    labels = {SERVICE_NAME_LABEL: settings.activator_name()}
    kopf.index(
        res.group,
        res.version,
        res.plural,
        labels=labels,
        when=of_activator,
        id=ACTIVATOR_INDEX,
        registry=registry,
    )(_index_activator_slice)
    kopf.on.event(
        res.group,
        res.version,
        res.plural,
        labels=labels,
        when=of_activator,
        id=f"{ACTIVATOR_INDEX}_event",
        registry=registry,
    )(activator_slice_event)


def _register_owned(owned: OwnedKind, registry: kopf.OperatorRegistry) -> None:
    """One kopf index (id ``owned.index``) and one watch of an owned kind (see ``reconcile.owned``)."""
    res = owned.resource
    kopf.index(res.group, res.version, res.plural, labels=OWNED_LABELS, id=owned.index, registry=registry)(
        _index_owned
    )
    kopf.on.event(
        res.group,
        res.version,
        res.plural,
        labels=OWNED_LABELS,
        id=f"{owned.index}_event",
        param=owned.kind,
        registry=registry,
    )(owned_event)


def register(settings: Settings, registry: kopf.OperatorRegistry | None = None) -> kopf.OperatorRegistry:
    """Register every handler in ``registry`` (default: kopf's default registry, which also holds
    kopf's login handlers), the timers at ``settings``' intervals (seconds). Returns the registry, for
    ``kopf.run(registry=...)``."""
    registry = registry if registry is not None else kopf.get_default_registry()
    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.index(api.GROUP, api.VERSION, api.PLURAL, registry=registry)(kubeinfer_isvcs)
    kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, registry=registry)(isvc_event)
    kopf.index(api.GROUP, api.VERSION, api.POOL_PLURAL, id=POOLS_INDEX, registry=registry)(kubeinfer_pools)
    kopf.on.event(api.GROUP, api.VERSION, api.POOL_PLURAL, registry=registry)(pool_event)
    for owned in OWNED:
        _register_owned(owned, registry)
    if settings.activator_enabled:
        _register_activator(settings, registry)
    kopf.on.event(k8s.POD.group, k8s.POD.version, k8s.POD.plural, labels=OWNED_LABELS, registry=registry)(
        pod_event
    )
    kopf.timer(
        api.GROUP,
        api.VERSION,
        api.PLURAL,
        interval=settings.resync_seconds,
        initial_delay=settings.resync_seconds,
        registry=registry,
    )(resync)
    kopf.timer(
        api.GROUP, api.VERSION, api.PLURAL, interval=settings.autoscale_interval_seconds, registry=registry
    )(autoscale)
    return registry
