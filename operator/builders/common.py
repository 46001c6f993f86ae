"""Shared pieces of the builders: names, labels, owner references, hashing. Pure functions."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kubeinfer.operator import api

from kubeinfer.contract.activator import ISVC_LABEL
from kubeinfer.contract.pool import POOL_LABEL

#: Where a ``pvc://<claim>/<path>`` claim is mounted (read-only) in the runtime container.
PVC_MOUNT_ROOT = "/mnt/pvc"
#: Annotation on owned objects: hash of the last applied desired object (compare-before-patch).
APPLIED_HASH_ANNOTATION = "kubeinfer.io/applied-hash"
#: Pod-template annotation: hash of the non-batching runtime configuration (a change rolls the pods).
CONFIG_HASH_ANNOTATION = "kubeinfer.io/config-hash"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubeinfer"


def pool_selector_labels(pool: str) -> dict[str, str]:
    """The labels that select the pods of the ModelPool ``pool`` (its Deployment's selector, and the
    Service of every InferenceService on it). No :data:`ISVC_LABEL`: no InferenceService's own selector
    (nor the activator, nor the autoscaler's queries) takes a pool's pods for its own."""
    return {
        "app.kubernetes.io/name": "kubeinfer-runtime",
        "app.kubernetes.io/instance": pool,
        POOL_LABEL: pool,
    }


def selector_labels(isvc: api.InferenceService) -> dict[str, str]:
    """The labels that select an InferenceService's pods (Deployment selector, Service, PDB)."""
    return {
        "app.kubernetes.io/name": "kubeinfer-runtime",
        "app.kubernetes.io/instance": isvc.name,
        ISVC_LABEL: isvc.name,
    }


def labels(isvc: api.InferenceService) -> dict[str, str]:
    """All labels of owned objects and pods (see the common pod-label contract)."""
    return {
        **selector_labels(isvc),
        MANAGED_BY_LABEL: MANAGED_BY,
        "app.kubernetes.io/component": "inference",
    }


def selector_string(isvc: api.InferenceService) -> str:
    """``status.selector`` for the scale subresource: ``k=v,k=v`` sorted by key."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(isvc).items()))


def controller_reference(kind: str, name: str, uid: str) -> dict[str, Any]:
    """The controller owner reference to the kubeinfer.io object ``kind``/``name`` (garbage collection
    on its delete)."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owner_reference(isvc: api.InferenceService) -> dict[str, Any]:
    """The controller owner reference to the InferenceService (garbage collection on delete)."""
    return controller_reference(api.KIND, isvc.name, isvc.uid)


def owned_metadata(
    name: str, namespace: str, object_labels: dict[str, str], owner: dict[str, Any]
) -> dict[str, Any]:
    """``metadata`` of an object the operator owns: its name, namespace, labels and one controller
    owner reference (``controller_reference``)."""
    return {"name": name, "namespace": namespace, "labels": object_labels, "ownerReferences": [owner]}


def metadata(isvc: api.InferenceService, name: str) -> dict[str, Any]:
    """``metadata`` of an owned object."""
    return owned_metadata(name, isvc.namespace, labels(isvc), owner_reference(isvc))


def stable_hash(obj: Any) -> str:
    """First 16 hex digits of the SHA-256 of ``obj``'s canonical JSON (sorted keys)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def with_applied_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """Return ``obj`` with :data:`APPLIED_HASH_ANNOTATION` set to the hash of ``obj`` itself."""
    digest = stable_hash(obj)
    meta = dict(obj["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), APPLIED_HASH_ANNOTATION: digest}
    return {**obj, "metadata": meta}


def container_path(uri: str) -> str:
    """Where a spec URI is found inside the runtime container.

    ``pvc://<claim>/<path>`` → ``/mnt/pvc/<claim>/<path>``; ``default`` and absolute paths unchanged.
    """
    pvc = api.parse_pvc_uri(uri)
    if pvc is None:
        return uri
    claim, path = pvc
    return f"{PVC_MOUNT_ROOT}/{claim}/{path}"
