"""kopf's peering object(s): made sure to exist at startup (kopf does not create them).

With ``KUBEINFER_PEERING`` set, two operators elect one that acts (the higher priority) through a
``ClusterKopfPeering`` (all namespaces) or one ``KopfPeering`` per watched namespace. The chart renders
the object; an operator started without the chart, or whose object was deleted by hand, creates it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from kubeinfer.operator import k8s
from kubeinfer.operator.settings import Settings

logger = logging.getLogger(__name__)

__all__ = ["ensure_peering", "helm_ownership"]


async def ensure_peering(kube: k8s.Kube, settings: Settings) -> None:
    """Make sure the kopf peering object(s) named ``settings.peering`` exist.

    Deployed by the chart (``settings.helm_release`` set), the operator first waits up to
    ``settings.peering_wait_seconds`` for the object: Helm creates it right after the operator's
    Deployment, and an object the operator created in between fails ``helm install`` with "already
    exists" (Helm checks for existing objects before it creates any). Only an object still missing
    after the wait (deleted by hand, say) is created, with Helm's ownership metadata so that the next
    ``helm upgrade`` adopts it. Outside Helm a missing object is created at once.

    Raises:
        k8s.TransientError / k8s.PermanentError: reading or creating the object failed (a 409 on
            creation, another operator having created it first, is not an error).
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
