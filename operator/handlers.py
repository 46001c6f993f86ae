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
from kubeinfer.operator.builders.common import MANAGED_BY, MANAGED_BY_LABEL
from kubeinfer.operator.controllers import Controllers
from kubeinfer.operator.reconcile.owned import BY_KIND, OWNED, OwnedKind
from kubeinfer.operator.reconcile.reconciler import Lookup
from kubeinfer.operator.settings import Settings

from kubeinfer.contract.activator import ISVC_LABEL

#: The label selecting the objects (and pods) the operator owns.
OWNED_LABELS = {MANAGED_BY_LABEL: MANAGED_BY}
#: The kopf memo key of the operator's :class:`Settings` (``kopf.run(memo=...)``).
SETTINGS_MEMO_KEY = "kubeinfer_settings"
#: The kopf memo key of the :class:`Controllers` (set by :func:`startup`).
CONTROLLERS_MEMO_KEY = "kubeinfer_controllers"


def _lookup(kwargs: Mapping[str, Any]) -> Lookup:
    """A :data:`Lookup` over the kopf indexes passed to a handler as keyword arguments."""

    def lookup(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        index = kwargs[BY_KIND[kind].index]
        store = index.get((namespace, name))
        for value in store or ():
            found: Mapping[str, Any] = value
            return found
        return None

    return lookup


def _owner_body(kwargs: Mapping[str, Any], namespace: str | None, labels: Mapping[str, str]) -> Any:
    """The InferenceService (from the kopf index) that an object labelled ``labels`` belongs to."""
    owner = labels.get(ISVC_LABEL)
    store = kwargs["kubeinfer_isvcs"].get((namespace, owner)) if owner else None
    return next(iter(store or ()), None)


def _controllers(memo: Any) -> Controllers:
    controllers: Controllers = memo[CONTROLLERS_MEMO_KEY]
    return controllers


async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure kopf, then start the controllers (connect; make sure the peering object exists)."""
    settings.persistence.finalizer = f"{api.GROUP}/operator"
    settings.watching.server_timeout = 600
    settings.watching.client_timeout = 660
    settings.posting.enabled = False  # Events are posted by the reconciler, on transitions only
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
    """Any event of an InferenceService (including the initial listing)."""
    await _controllers(memo).isvc_event(type, dict(body), _lookup(kwargs))


async def owned_event(
    type: str | None,
    namespace: str | None,
    labels: kopf.Labels,
    memo: kopf.Memo,
    param: Any = None,
    **kwargs: Any,
) -> None:
    """An owned object of kind ``param`` changed (status, hand edit, deletion)."""
    owner = _owner_body(kwargs, namespace, labels)
    await _controllers(memo).owned_event(
        type, str(param), str(namespace), str(kwargs.get("name")), owner, _lookup(kwargs)
    )


async def pod_event(
    type: str | None, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A runtime pod changed (scheduled or not, pulling, crashed, ready)."""
    owner = _owner_body(kwargs, namespace, labels)
    await _controllers(memo).pod_event(type, owner, _lookup(kwargs))


async def resync(body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    """Periodic level-based resync, while the InferenceService is still in the index."""
    indexed = bool(kwargs["kubeinfer_isvcs"].get((namespace, name)))
    await _controllers(memo).resync(dict(body), _lookup(kwargs), indexed=indexed)


async def autoscale(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """The autoscaler's control step (``kubeinfer.operator.autoscale.loop``)."""
    await _controllers(memo).autoscale(dict(body), _lookup(kwargs))


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
    for owned in OWNED:
        _register_owned(owned, registry)
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
