"""kopf handlers: decorators only. Each parses its arguments, calls one function, returns.

Design (level-based, zero writes in steady state): no kopf *change* handlers (``on.create`` /
``on.update``), so kopf stores no last-handled configuration or progress on the objects. Every
watch event of an InferenceService — and of the objects it owns — runs the same reconcile, which
compares before it writes. kopf indexes keep the current owned objects in memory (kopf does not
run handlers until every index has been listed, so a restarted operator sees what exists before
it acts). A per-object kopf timer re-runs the reconcile every ``KUBEINFER_RESYNC_SECONDS``
(a timer needs kopf's finalizer on the object: one write at creation, one at deletion).

The autoscaler appends its own ``@kopf.timer`` at the end of this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from kubeinfer.operator import api, k8s
from kubeinfer.operator.autoscale import loop as autoscale_loop
from kubeinfer.operator.build.common import ISVC_LABEL, MANAGED_BY, MANAGED_BY_LABEL
from kubeinfer.operator.reconcile import Reconciler
from kubeinfer.operator.reconcile.owned import BY_KIND, OWNED, OwnedKind
from kubeinfer.operator.reconcile.reconciler import Lookup
from kubeinfer.operator.settings import Settings

SETTINGS = Settings.from_env()
logger = logging.getLogger(__name__)
#: The label selecting the objects (and pods) the operator owns.
OWNED_LABELS = {MANAGED_BY_LABEL: MANAGED_BY}


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
    owner = labels.get(ISVC_LABEL)
    store = kwargs["kubeinfer_isvcs"].get((namespace, owner)) if owner else None
    return next(iter(store or ()), None)


def _reconciler(memo: Any) -> Reconciler:
    reconciler: Reconciler = memo.reconciler
    return reconciler


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure kopf, connect, and make sure the peering object exists."""
    settings.persistence.finalizer = f"{api.GROUP}/operator"
    settings.watching.server_timeout = 600
    settings.watching.client_timeout = 660
    settings.posting.enabled = False  # Events are posted by the reconciler, on transitions only
    kube = await k8s.Kube.from_environment(SETTINGS.kubeconfig)
    memo.reconciler = Reconciler(kube)
    if SETTINGS.peering:
        await _ensure_peering(kube, SETTINGS)


async def _ensure_peering(kube: k8s.Kube, settings: Settings) -> None:
    """Make sure the kopf peering object(s) named ``settings.peering`` exist (kopf does not create them).

    Deployed by the chart (``settings.helm_release`` set), the operator first waits up to
    ``settings.peering_wait_seconds`` for the object: Helm creates it right after the operator's
    Deployment, and an object the operator created in between fails ``helm install`` with "already
    exists" (Helm checks for existing objects before it creates any). Only an object still missing
    after the wait (deleted by hand, say) is created, with Helm's ownership metadata so that the next
    ``helm upgrade`` adopts it. Outside Helm a missing object is created at once.
    """
    targets: list[tuple[str | None, str, str]]
    if settings.namespaces:
        targets = [(ns, "kopfpeerings", "KopfPeering") for ns in settings.namespaces]
    else:
        targets = [(None, "clusterkopfpeerings", "ClusterKopfPeering")]
    for namespace, plural, kind in targets:
        path = k8s.resource_path("kopf.dev/v1", plural, namespace)
        if await _wait_for_object(kube, f"{path}/{settings.peering}", _peering_wait(settings), kind):
            continue
        meta: dict[str, Any] = {"name": settings.peering, **helm_ownership(settings)}
        if namespace:
            meta["namespace"] = namespace
        with contextlib.suppress(k8s.TransientError):  # 409: another operator created it first
            await kube.create(path, {"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": meta})
        logger.info("created the %s %s%s", kind, settings.peering, f" in {namespace}" if namespace else "")


def _peering_wait(settings: Settings) -> float:
    """Seconds to wait for a peering object someone else creates: the chart's, only under Helm."""
    return settings.peering_wait_seconds if settings.helm_release else 0.0


async def _wait_for_object(kube: k8s.Kube, path: str, timeout: float, kind: str) -> bool:
    """True once the object at ``path`` exists; polls once a second for up to ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    logged = False
    while await kube.get(path) is None:
        if loop.time() >= deadline:
            return False
        if not logged:
            logger.info("waiting up to %.0f s for the chart's %s %s", timeout, kind, path.rsplit("/", 1)[-1])
            logged = True
        await asyncio.sleep(1.0)
    return True


def helm_ownership(settings: Settings) -> dict[str, Any]:
    """Helm 3's ownership metadata for an object the chart also renders (the peering object), from
    ``KUBEINFER_HELM_RELEASE``/``_NAMESPACE``: Helm adopts an existing object that carries it, and
    refuses one that does not ("exists and cannot be imported into the current release"). ``{}``
    outside a Helm release."""
    if not settings.helm_release:
        return {}
    return {
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {
            "meta.helm.sh/release-name": settings.helm_release,
            "meta.helm.sh/release-namespace": settings.helm_release_namespace,
        },
    }


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Close the API connection pool."""
    await _reconciler(memo).kube.close()


@kopf.index(api.GROUP, api.VERSION, api.PLURAL)
def kubeinfer_isvcs(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """InferenceServices by (namespace, name)."""
    return {(namespace, name): dict(body)}


def _index_owned(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Owned objects of one kind by (namespace, name)."""
    return {(namespace, name): dict(body)}


def _register_owned(owned: OwnedKind) -> None:
    """One kopf index (id ``owned.index``) and one watch of an owned kind (see ``reconcile.owned``)."""
    res = owned.resource
    kopf.index(res.group, res.version, res.plural, labels=OWNED_LABELS, id=owned.index)(_index_owned)
    kopf.on.event(
        res.group, res.version, res.plural, labels=OWNED_LABELS, id=f"{owned.index}_event", param=owned.kind
    )(owned_event)


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def isvc_event(
    type: str | None, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Any event of an InferenceService (including the initial listing): reconcile it."""
    if type == "DELETED":
        _reconciler(memo).forget(str(namespace), name)
        return
    await _reconciler(memo).reconcile(dict(body), _lookup(kwargs))


async def owned_event(
    type: str | None,
    namespace: str | None,
    labels: kopf.Labels,
    memo: kopf.Memo,
    param: Any = None,
    **kwargs: Any,
) -> None:
    """An owned object of kind ``param`` changed (status, hand edit, deletion): reconcile its
    InferenceService."""
    if type in (None, "ADDED"):  # initial listing / our own creation: nothing to compare yet
        return
    if type == "DELETED":  # deleted by hand: forget our last apply, so that it is created again
        _reconciler(memo).forget_object(str(param), str(namespace), str(kwargs.get("name")))
    owner = _owner_body(kwargs, namespace, labels)
    if owner is not None:
        await _reconciler(memo).reconcile(owner, _lookup(kwargs))


for _owned in OWNED:
    _register_owned(_owned)


@kopf.on.event(k8s.POD.group, k8s.POD.version, k8s.POD.plural, labels=OWNED_LABELS)
async def pod_event(
    type: str | None, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A runtime pod changed (scheduled or not, pulling, crashed, ready): reconcile its
    InferenceService, so that a lasting pod problem (ImagePullBackOff, CrashLoopBackOff,
    Unschedulable) reaches the Ready condition when the kubelet or the scheduler reports it; the
    Deployment's status does not change then. The initial listing and deletions are left to the
    Deployment's events."""
    if type in (None, "DELETED"):
        return
    owner = _owner_body(kwargs, namespace, labels)
    if owner is not None:
        await _reconciler(memo).reconcile(owner, _lookup(kwargs))


@kopf.timer(
    api.GROUP,
    api.VERSION,
    api.PLURAL,
    interval=SETTINGS.resync_seconds,
    initial_delay=SETTINGS.resync_seconds,
)
async def resync(body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    """Periodic level-based resync (writes nothing when nothing changed).

    Skipped when the InferenceService is no longer in the index: kopf can leave a timer running for
    an object deleted right after its finalizer was released (it logs "Patching was skipped: the
    object does not exist anymore"); such a timer must not write.
    """
    if not kwargs["kubeinfer_isvcs"].get((namespace, name)):
        return
    await _reconciler(memo).reconcile(dict(body), _lookup(kwargs))


@kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=SETTINGS.autoscale_interval_seconds)
async def autoscale(
    body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any
) -> None:
    """The autoscaler's control step (``kubeinfer.operator.autoscale.loop``); no-op when disabled."""
    lookup = _lookup(kwargs)
    ns = str(namespace)
    scaler = autoscale_loop.for_memo(memo, _reconciler(memo).kube, SETTINGS)
    await scaler.tick(
        dict(body), lookup("Deployment", ns, name), lookup("ConfigMap", ns, api.configmap_name(name))
    )
