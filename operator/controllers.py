"""The operator's two controllers, the reconciler and the autoscaler, over one API client: created
together at startup, fed by the kopf handlers, closed together at cleanup.

``kubeinfer.operator.handlers`` turns each kopf call into one call of :class:`Controllers`, which
decides what the event means for both: a deleted InferenceService is forgotten by the reconciler and
by the autoscaler (its policy state, its remembered status), an owned object's change reconciles its
InferenceService, the autoscaler's timer runs one tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeinfer.operator import k8s, metrics
from kubeinfer.operator.autoscale import loop
from kubeinfer.operator.builders import activator_peer, scraper_peer
from kubeinfer.operator.peering import ensure_peering
from kubeinfer.operator.reconcile.capabilities import ClusterCapabilities
from kubeinfer.operator.reconcile.pool import pool_members
from kubeinfer.operator.reconcile.pool_poller import PoolPoller
from kubeinfer.operator.reconcile.pool_reconciler import PoolReconciler
from kubeinfer.operator.reconcile.reconciler import Lookup, Reconciler
from kubeinfer.operator.reconcile.references import ReferencePolicy
from kubeinfer.operator.settings import Settings
from kubeinfer.operator.status import object_key

__all__ = ["Controllers", "read_server_version", "scrapers"]

logger = logging.getLogger(__name__)


def scrapers(settings: Settings) -> tuple[dict[str, Any], ...]:
    """The NetworkPolicy peers of the Prometheus that scrapes the runtime pods
    (:meth:`Settings.prometheus_namespace_in_force`, ``prometheus_pod_labels``); none when its
    namespace is unknown (logged: a NetworkPolicy then admits no scraper but those in allowFrom, and a
    default-deny one no pod at all)."""
    namespace = settings.prometheus_namespace_in_force()
    if not namespace:
        logger.info(
            "NetworkPolicies of InferenceServices admit no Prometheus to /metrics: its namespace is "
            "not known from %s (set KUBEINFER_PROMETHEUS_NAMESPACE, or list it in spec.server.allowFrom)",
            settings.prometheus_url,
        )
        return ()
    return (scraper_peer(namespace, settings.prometheus_pod_labels),)


def _asks_scale_to_zero(body: Mapping[str, Any]) -> bool:
    """Whether an InferenceService body (as stored) asks for ``autoscaling.minReplicas: 0``."""
    scaling = (body.get("spec") or {}).get("autoscaling") or {}
    return bool(scaling.get("enabled")) and scaling.get("minReplicas") == 0


async def read_server_version(kube: k8s.Kube) -> str | None:
    """The API server's ``gitVersion`` (``GET /version``, e.g. ``v1.34.2``); ``None`` when the request
    fails or the answer has none (logged: the operator then assumes the cluster serves what it asks)."""
    try:
        answer = await kube.get("/version")
    except Exception as exc:  # an API error, no answer, an unreadable one: never fatal
        logger.warning("cannot read the API server's version (GET /version): %s", exc)
        return None
    version = (answer or {}).get("gitVersion")
    if not isinstance(version, str) or not version:
        logger.warning("the API server's GET /version has no gitVersion: %s", answer)
        return None
    return version


@dataclass
class Controllers:
    """The reconciler and the autoscaler of one operator process, and their API client ``kube``; the
    ModelPools' reconciler and the poller of their replicas' model repository indexes (at most once per
    ``pool_poll_seconds`` a pool), whose indexes both reconcilers read."""

    kube: k8s.Kube
    reconciler: Reconciler
    autoscaler: loop.Autoscaler
    pool_poll_seconds: float = 15.0
    pools: PoolReconciler = field(init=False)
    poller: PoolPoller = field(init=False)

    def __post_init__(self) -> None:
        self.poller = PoolPoller(self.kube, interval=self.pool_poll_seconds)
        self.pools = PoolReconciler(self.kube, clock=self.reconciler.clock, indexes=self.poller.indexes)
        self.reconciler.pool_indexes = self.poller.indexes

    @classmethod
    def create(cls, kube: k8s.Kube, settings: Settings, server_version: str | None = None) -> Controllers:
        """Both controllers over ``kube``, configured by ``settings`` (read once, at startup): the
        reconciler with the Prometheus scrapers, NetworkPolicy default-deny, the activator (scale to
        zero), the Secret / ServiceAccount
        reference policy and the cluster's capabilities (from ``server_version``, the API server's
        ``gitVersion``, ``None``: unknown, and the ``image_volumes`` setting)."""
        references = ReferencePolicy(
            secrets=tuple(settings.secret_references_allowed),
            service_accounts=tuple(settings.service_account_references_allowed),
        )
        logger.info("InferenceServices may reference %s", references.describe())
        capabilities = ClusterCapabilities(server_version, settings.image_volumes)
        logger.info("cluster capabilities: %s", capabilities.describe())
        if settings.network_policy_default_deny:
            logger.info("NetworkPolicy default-deny: every InferenceService gets one, allowFrom or not")
        reconciler = Reconciler(
            kube,
            scrapers=scrapers(settings),
            default_deny=settings.network_policy_default_deny,
            references=references,
            capabilities=capabilities,
            activator=settings.activator_enabled,
            activator_peer=activator_peer(settings.activator_namespace())
            if settings.activator_enabled
            else None,
        )
        if settings.activator_enabled:
            logger.info(
                "activator installed (Service %s): autoscaling.minReplicas 0 scales an idle service to zero",
                settings.activator_service,
            )
        return cls(
            kube,
            reconciler,
            loop.from_settings(kube, settings),
            pool_poll_seconds=settings.autoscale_interval_seconds,
        )

    @classmethod
    async def start(cls, settings: Settings) -> Controllers:
        """Connect to the API server (``settings.kubeconfig``, else in-cluster), read its version once
        (:func:`read_server_version`; a failure leaves it unknown), create both controllers and, with
        ``settings.peering`` set, make sure the kopf peering object exists.

        Raises:
            k8s.PermanentError: no usable Kubernetes configuration, or the peering object cannot be
                read or created (the API client is closed again).
            k8s.TransientError: the API server did not answer while the peering object was checked.
        """
        kube = await k8s.Kube.from_environment(settings.kubeconfig)
        try:
            if settings.peering:
                await ensure_peering(kube, settings)
        except BaseException:
            await kube.close()
            raise
        return cls.create(kube, settings, await read_server_version(kube))

    async def close(self) -> None:
        """Close the autoscaler (its Prometheus client), the reconciler (its pending retries), then the
        API client."""
        self.autoscaler.close()
        await self.reconciler.close()
        await self.poller.close()
        await self.kube.close()

    def forget(self, namespace: str, name: str) -> None:
        """Drop what both controllers remember of a deleted InferenceService, and its state metrics."""
        self.reconciler.forget(namespace, name)
        self.autoscaler.forget(namespace, name)
        metrics.INFERENCE_SERVICES.forget(namespace, name)

    async def isvc_event(self, event_type: str | None, body: Mapping[str, Any], lookup: Lookup) -> None:
        """An InferenceService watch event (``None``: the initial listing): ``DELETED`` forgets it,
        anything else updates its state metrics (the status as stored) and reconciles it."""
        if event_type == "DELETED":
            self.forget(*object_key(body))
            return
        metrics.INFERENCE_SERVICES.observe(body)
        await self.reconciler.reconcile(body, lookup)

    async def pool_event(
        self,
        event_type: str | None,
        body: Mapping[str, Any],
        isvcs: Iterable[Mapping[str, Any]],
        lookup: Lookup,
    ) -> None:
        """A ModelPool watch event (``None``: the initial listing), or an event of its Deployment or pods:
        reconcile the pool (``DELETED``: forget it), then the InferenceServices naming it that the
        reconciler knows, whose Ready follows the pool's (found, ready)."""
        namespace, name = object_key(body)
        isvcs = list(isvcs)
        if event_type == "DELETED":
            self.pools.forget(namespace, name)
            self.poller.forget(namespace, name)
            self.autoscaler.forget_pool(namespace, name)
        else:
            await self.pools.reconcile(body, isvcs, lookup)
        pooled = [
            b
            for b in isvcs
            if (b.get("metadata") or {}).get("namespace") == namespace
            and (b.get("spec") or {}).get("pool") == name
        ]
        await asyncio.gather(*(self.reconciler.reconcile(b, lookup) for b in pooled))

    async def poll_pool(
        self, body: Mapping[str, Any], isvcs: Iterable[Mapping[str, Any]], lookup: Lookup
    ) -> None:
        """Read the ready replicas' model repository indexes of the ModelPool ``body`` (as watched) unless
        it was read within ``pool_poll_seconds`` (the timers of its InferenceServices call this); when
        what they say changed, reconcile the pool and its InferenceServices (their statuses). Then the
        pool's autoscaler tick (:meth:`loop.Autoscaler.tick_pool`: at most one per interval, a no-op with
        its autoscaling off) over the models it serves."""
        namespace, name = object_key(body)
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return
        isvcs = list(isvcs)
        if await self.poller.poll_if_due(namespace, name):
            await self.pool_event("MODIFIED", body, isvcs, lookup)
        models = pool_members(name, namespace, isvcs).models
        await self.autoscaler.tick_pool(body, lookup("Deployment", namespace, name), models)

    async def pools_of_namespace(
        self,
        namespace: str,
        pools: Iterable[Mapping[str, Any]],
        isvcs: Iterable[Mapping[str, Any]],
        lookup: Lookup,
    ) -> None:
        """Reconcile every ModelPool of ``pools`` in ``namespace`` (after an InferenceService of that
        namespace changed: one joining, leaving or changing a pool re-renders its ConfigMap)."""
        isvcs = list(isvcs)
        for body in pools:
            if (body.get("metadata") or {}).get("namespace") == namespace:
                await self.pools.reconcile(body, isvcs, lookup)

    async def owned_event(
        self,
        event_type: str | None,
        kind: str,
        namespace: str,
        name: str,
        owner: Mapping[str, Any] | None,
        lookup: Lookup,
    ) -> None:
        """An owned object of ``kind`` changed (status, hand edit, deletion): reconcile its
        InferenceService ``owner`` (``None``: not known). The initial listing and our own creation
        (``None``, ``ADDED``) have nothing to compare yet; a ``DELETED`` object (deleted by hand) has
        the reconciler's last apply forgotten first, so that it is created again."""
        if event_type in (None, "ADDED"):
            return
        if event_type == "DELETED":
            self.reconciler.forget_object(kind, namespace, name)
        if owner is not None:
            await self.reconciler.reconcile(owner, lookup)

    async def pod_event(
        self, event_type: str | None, owner: Mapping[str, Any] | None, lookup: Lookup
    ) -> None:
        """A runtime pod changed (scheduled or not, pulling, crashed, ready): reconcile its
        InferenceService ``owner``, so that a lasting pod problem reaches the Ready condition when the
        kubelet or the scheduler reports it (the Deployment's status does not change then). The initial
        listing and deletions are left to the Deployment's events."""
        if event_type in (None, "DELETED") or owner is None:
            return
        await self.reconciler.reconcile(owner, lookup)

    async def resync(self, body: Mapping[str, Any], lookup: Lookup, *, indexed: bool) -> None:
        """The periodic level-based resync (writes nothing when nothing changed). Skipped when the
        InferenceService is no longer ``indexed``: kopf can leave a timer running for an object deleted
        right after its finalizer was released; such a timer must not write."""
        if indexed:
            await self.reconciler.reconcile(body, lookup)

    async def autoscale(self, body: Mapping[str, Any], lookup: Lookup) -> None:
        """The autoscaler's control step for one InferenceService (a no-op when autoscaling is off).
        A step that changed the max queue delay wrote it to ``status.maxQueueDelay`` only; the reconciler,
        the one writer of owned objects, then renders and applies the ConfigMap from the InferenceService
        as stored with it (the runtime reloads the file without a restart). A step that takes the
        service to zero has the reconciler route its Service to the activator first (``on_zero``): the
        autoscaler scales to 0 only once it does."""
        namespace, name = object_key(body)

        async def route_first(stored: Mapping[str, Any]) -> bool:
            await self.reconciler.reconcile(stored, lookup)
            return self.reconciler.routes.get((namespace, name)) is True

        result = await self.autoscaler.tick(body, lookup("Deployment", namespace, name), on_zero=route_first)
        if result is not None and result.stored is not None:
            await self.reconciler.reconcile(result.stored, lookup)

    async def activator_seen(
        self,
        addresses: tuple[str, ...],
        lookup: Lookup,
        *,
        grpc_ports: Mapping[int, Collection[tuple[str, str]]] | None = None,
    ) -> None:
        """The activator's Ready addresses as the watch of its EndpointSlices has them now (sorted):
        when they changed, every InferenceService whose Service routes to the activator is reconciled,
        so that its EndpointSlice lists them; when the activator gained its first Ready address or lost
        its last, every one that asks for scale to zero (whether a draining service may route to the
        activator depends on it, see ``reconcile.routing``). Called before each handler's work
        (whichever handler sees the change first acts on it). ``grpc_ports``, when given: the gRPC
        ports of the operator's activator EndpointSlices as watched (port -> the InferenceServices whose
        slice names it; the handlers' kopf index, a live view), handed to the reconciler, which
        allocates none of them to another service."""
        if grpc_ports is not None:
            self.reconciler.held_grpc_ports = grpc_ports
        before = self.reconciler.activator_addresses
        if addresses == before:
            return
        logger.info(
            "the activator's Ready addresses: %s (were %s)",
            ", ".join(addresses) or "none",
            ", ".join(before) or "none",
        )
        self.reconciler.activator_addresses = addresses
        if bool(before) != bool(addresses):
            keys = [k for k, b in self.reconciler.bodies.items() if _asks_scale_to_zero(b)]
        else:
            keys = [k for k, to_activator in self.reconciler.routes.items() if to_activator]
        bodies = [b for b in (self.reconciler.bodies.get(k) for k in keys) if b is not None]
        await asyncio.gather(*(self.reconciler.reconcile(b, lookup) for b in bodies))
