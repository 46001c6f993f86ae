"""Level-based reconciliation of one ModelPool: apply its Deployment and its model repository
ConfigMap (server-side apply, field manager ``kubeinfer``, compared before they are sent, as the
InferenceService's objects are) and write its status when it changed. What it serves and what its
status says is planned by :mod:`kubeinfer.operator.reconcile.pool` (pure).

The InferenceServices naming the pool are handed in as watched (the handlers' kopf index); the pool is
reconciled on every event of the pool, of its Deployment and pods, and of any InferenceService of its
namespace (one joining, changing, moving to another pool or being deleted re-renders the ConfigMap).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic
from kubeinfer.operator import api, conditions, k8s, rfc3339, status
from kubeinfer.operator.builders import build_pool_configmap, build_pool_deployment, pool_claims
from kubeinfer.operator.reconcile.pool import (
    PoolMembers,
    is_pool_deployment,
    pinned_in_force,
    pool_members,
    pool_status,
)
from kubeinfer.operator.reconcile.poolindex import PoolIndex
from kubeinfer.operator.reconcile.reconciler import Lookup, apply_if_changed
from kubeinfer.operator.reconcile.replicas import pool_replicas
from kubeinfer.operator.reconcile.report import ready_conditions
from kubeinfer.operator.status import ConditionState, generation_of, object_key, resource_version

logger = logging.getLogger(__name__)

__all__ = ["PoolReconciler"]


@dataclass
class PoolReconciler:
    """Reconciles ModelPools; one instance per operator process. ``clock`` returns RFC 3339 UTC strings."""

    kube: k8s.Kube
    clock: Callable[[], str] = rfc3339.now
    #: (namespace, pool) -> its replicas' model repository indexes (the pool poller's)
    indexes: Mapping[tuple[str, str], PoolIndex] = field(default_factory=dict)
    _applied: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    _locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the memory of a deleted ModelPool (owner references delete its objects)."""
        self._locks.pop((namespace, name), None)
        for kind, obj_name in (("Deployment", name), ("ConfigMap", api.pool_configmap_name(name))):
            self._applied.pop((kind, namespace, obj_name), None)

    def _current(self, lookup: Lookup, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The newer of the watched object and the response of our own last apply."""
        seen = lookup(kind, namespace, name)
        mine = self._applied.get((kind, namespace, name))
        if mine is not None and resource_version(mine) > resource_version(seen):
            return mine
        self._applied.pop((kind, namespace, name), None)
        return seen

    async def reconcile(
        self, body: Mapping[str, Any], isvcs: Iterable[Mapping[str, Any]], lookup: Lookup
    ) -> PoolMembers | None:
        """Bring the pool's Deployment, ConfigMap and status in line with ``body`` (the ModelPool as
        watched) and ``isvcs`` (the InferenceServices of any namespace, as watched); ``lookup``: the
        current owned objects. Returns what the pool serves (``None``: being deleted, or invalid).
        A Deployment of the pool's name that is not the pool's is left alone (``PoolNameTaken``).
        Never raises for API errors: they are logged, and the next event or resync tries again."""
        key = object_key(body)
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        async with self._locks.setdefault(key, asyncio.Lock()):
            try:
                return await self._reconcile(body, list(isvcs), lookup)
            except k8s.KubeError as exc:
                logger.warning("reconcile ModelPool %s/%s: %s", *key, exc)
                return None

    async def _reconcile(
        self, body: Mapping[str, Any], isvcs: list[Mapping[str, Any]], lookup: Lookup
    ) -> PoolMembers | None:
        namespace, name = object_key(body)
        current_status: Mapping[str, Any] = body.get("status") or {}
        try:
            pool = api.ModelPool.from_body(body)
        except pydantic.ValidationError as exc:
            message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            logger.warning("ModelPool %s/%s: invalid spec: %s", namespace, name, message)
            invalid = ConditionState("False", conditions.INVALID_SPEC, f"invalid spec: {message}"[:2000])
            generation = generation_of(body)
            desired = {
                "observedGeneration": generation,
                "conditions": ready_conditions(current_status, invalid, self.clock(), generation),
            }
            await self._write_status(body, desired)
            return None
        members = pool_members(name, namespace, isvcs)
        deployment = self._current(lookup, "Deployment", namespace, name)
        name_taken = deployment is not None and not is_pool_deployment(deployment, name)
        if name_taken:
            logger.warning(
                "ModelPool %s/%s: Deployment %s exists and is not the pool's: nothing applied",
                namespace,
                name,
                name,
            )
        else:
            desired_objects = [
                build_pool_configmap(pool, members.models),
                build_pool_deployment(
                    pool,
                    pinned_in_force(pool, members),
                    claims=pool_claims(members.models),
                    replicas=pool_replicas(pool, deployment),
                ),
            ]
            for obj in desired_objects:
                kind, obj_name = obj["kind"], obj["metadata"]["name"]
                action, stored = await apply_if_changed(
                    self.kube, obj, self._current(lookup, kind, namespace, obj_name)
                )
                if stored is None:
                    continue
                self._applied[(kind, namespace, obj_name)] = stored
                if kind == "Deployment":
                    deployment = stored
                logger.info("ModelPool %s/%s: %s %s %s", namespace, name, action, kind, obj_name)
        desired = pool_status(
            pool,
            deployment,
            members,
            current_status,
            self.clock(),
            name_taken=name_taken,
            index=self.indexes.get((namespace, name)),
        )
        await self._write_status(body, desired)
        return members

    async def _write_status(self, body: Mapping[str, Any], desired: Mapping[str, Any]) -> None:
        """Merge-patch the ``desired`` status fields that differ from ``body``'s (none: no request;
        ``resourceVersion`` pinned when conditions are sent; a 409 leaves it to the next reconcile).

        Raises:
            k8s.KubeError: the API server refused or failed the write (409 aside).
        """
        patch = status.status_patch(desired, body.get("status") or {})
        if not patch:
            return
        namespace, name = object_key(body)
        # conditions are a list replaced whole: pinned to the version read (status.merge_patch), so the
        # autoscaler's AutoscalingActive written meanwhile is not lost. A 409 means a newer pool, whose
        # watch event reconciles it again: not worth a warning.
        try:
            await self.kube.patch_merge(
                k8s.MODEL_POOL.path(namespace, name),
                status.merge_patch(patch, body),
                field_manager=api.FIELD_MANAGER,
                subresource="status",
            )
        except k8s.TransientError as exc:
            if exc.status != 409:
                raise
            logger.debug(
                "ModelPool %s/%s: status not written (a newer version exists): %s", namespace, name, exc
            )
