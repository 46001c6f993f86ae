"""The objects a ModelPool owns: its Deployment (the runtime in its model repository mode) and its one
ConfigMap (every pooled model's ``runtime.yaml``). Pure.

The ConfigMap is mounted without ``items`` at ``kubeinfer.contract.pool.REPOSITORY_DIR``, so a model
joining or leaving the pool changes the ConfigMap only, never the pod template: no rollout; the kubelet
refreshes the mounted files (within about a minute) and the runtime finds a new model on its first
request. A pooled InferenceService owns no Deployment: its Service selects the pool's pods
(``builders.service``).

The PersistentVolumeClaims the pool's models name (``pvc://<claim>/<path>``) are volumes of the pod
template, mounted read-only where an InferenceService's own pod mounts them: a claim named for the first
time (or no longer named by any model) changes the template, one rollout of the pool; a model joining on
a claim already mounted changes the ConfigMap only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from kubeinfer.operator import api
from kubeinfer.operator.builders.common import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    controller_reference,
    owned_metadata,
    pool_selector_labels,
    with_applied_hash,
)
from kubeinfer.operator.builders.configmap import runtime_config
from kubeinfer.operator.builders.deployment import (
    CONTAINER_NAME,
    CONTAINER_SECURITY_CONTEXT,
    DRAIN_SECONDS,
    LOAD_BUDGET_SECONDS,
    OFFLINE_ENV,
    POD_SECURITY_CONTEXT,
    ROLLING_UPDATE,
    SCRAPE_ANNOTATIONS,
    SHM_SIZE,
    TMP_MOUNT,
    TMP_SIZE,
    claim_volumes,
    container_resources,
    placement,
    probes,
)

from kubeinfer.contract.activator import GRPC_PORT_NAME, RUNTIME_GRPC_PORT
from kubeinfer.contract.activator import RUNTIME_PORT_NAME as PORT_NAME
from kubeinfer.contract.batching import MAX_QUEUE_DELAY_LIMIT_SECONDS
from kubeinfer.contract.pool import REPOSITORY_DIR, model_file


def pool_labels(pool: api.ModelPool) -> dict[str, str]:
    """All labels of a pool's objects and pods."""
    return {
        **pool_selector_labels(pool.name),
        MANAGED_BY_LABEL: MANAGED_BY,
        "app.kubernetes.io/component": "inference",
    }


def pool_owner_reference(pool: api.ModelPool) -> dict[str, Any]:
    """The controller owner reference to the ModelPool (garbage collection on delete)."""
    return controller_reference(api.POOL_KIND, pool.name, pool.uid)


def _metadata(pool: api.ModelPool, name: str) -> dict[str, Any]:
    return owned_metadata(name, pool.namespace, pool_labels(pool), pool_owner_reference(pool))


def build_pool_configmap(pool: api.ModelPool, models: Sequence[api.InferenceService]) -> dict[str, Any]:
    """The ConfigMap ``<pool>-repository``: one key per model, ``<served model name>.yaml``, its
    ``runtime.yaml`` as an InferenceService of its own would have it (``builders.configmap``; the
    max queue delay is ``spec.batching.maxQueueDelay``: a pooled InferenceService has no autoscaling).

    Args:
        pool: the ModelPool.
        models: the InferenceServices it serves, their served model names distinct (the planner,
            ``reconcile.pool``, leaves out the ones whose name another took).
    """
    data = {
        model_file(isvc.spec.served_model_name(isvc.name)): runtime_config(
            isvc, isvc.spec.max_queue_delay_in_force(None)
        ).to_yaml()
        for isvc in models
    }
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(pool, api.pool_configmap_name(pool.name)),
        "data": dict(sorted(data.items())),
    }
    applied: dict[str, Any] = with_applied_hash(obj)
    return applied


def pool_claims(models: Sequence[api.InferenceService]) -> list[str]:
    """The PersistentVolumeClaims the pool's pods mount: every claim the ``models`` name
    (``spec.pvc_claims()``: model and calibration URIs), each once, sorted (a stable pod template)."""
    return sorted({claim for isvc in models for claim in isvc.spec.pvc_claims()})


def pool_args(pool: api.ModelPool, pinned: Sequence[str]) -> list[str]:
    """The runtime's arguments: ``serve`` in its model repository mode over the mounted ConfigMap, the
    pool's memory budget in bytes, each of ``pinned`` (the pool's pinned models that it serves)."""
    args = [
        "serve",
        "--model-repository",
        REPOSITORY_DIR,
        "--memory-budget",
        str(pool.spec.memory_budget_bytes()),
    ]
    for name in pinned:
        args += ["--pin", name]
    return args


def build_pool_deployment(
    pool: api.ModelPool,
    pinned: Sequence[str],
    *,
    claims: Sequence[str] = (),
    replicas: int | Literal["spec"] | None = "spec",
) -> dict[str, Any]:
    """The ``apps/v1`` Deployment ``<pool>``: ``replicas`` pods (``"spec"``: ``spec.replicas``; the
    reconciler passes ``reconcile.replicas.pool_replicas``'s count, ``None`` leaving the field out of the
    apply for the autoscaler that owns it) of the runtime (``spec.runtime.image``)
    serving the model repository ``<pool>-repository`` mounted whole (no ``items``: see the module's
    docstring) at ``REPOSITORY_DIR``, under ``spec.memoryBudget``, with ``pinned`` loaded at start and
    the PersistentVolumeClaims ``claims`` (:func:`pool_claims`) mounted read-only as an
    InferenceService's own pod mounts them (``deployment.claim_volumes``).

    Its pods carry :func:`pool_labels` (selected by ``kubeinfer.io/pool: <pool>``), the pool's resources
    and placement as an InferenceService's pods would (``builders.deployment``), the same probes (the
    startupProbe allowing the 600 s of a model from a path: a pinned model loads before readiness), the
    same restricted security contexts, memory-backed ``/dev/shm`` and writable ``/tmp``, no
    ServiceAccount token, the REST port 8080 and gRPC port 8081 by name.
    """
    spec = pool.spec
    if replicas == "spec":
        replicas = spec.replicas
    claim_vols, claim_mounts = claim_volumes(claims)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.runtime.image,
        "command": ["kubeinfer-runtime"],
        "args": pool_args(pool, pinned),
        "ports": [
            {"name": PORT_NAME, "containerPort": api.RUNTIME_PORT, "protocol": "TCP"},
            {"name": GRPC_PORT_NAME, "containerPort": RUNTIME_GRPC_PORT, "protocol": "TCP"},
        ],
        "env": [dict(e) for e in OFFLINE_ENV],
        "resources": container_resources(spec.resources),
        "securityContext": CONTAINER_SECURITY_CONTEXT,
        "volumeMounts": [
            {"name": "models", "mountPath": REPOSITORY_DIR, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
            TMP_MOUNT,
            *claim_mounts,
        ],
        "terminationMessagePolicy": "File",
        **probes(LOAD_BUDGET_SECONDS["other"]),
    }
    if spec.runtime.image_pull_policy is not None:
        container["imagePullPolicy"] = spec.runtime.image_pull_policy
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [
            # no items: a model joining or leaving changes the ConfigMap, not the pod template
            {"name": "models", "configMap": {"name": api.pool_configmap_name(pool.name)}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
            {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}},
            *claim_vols,
        ],
        "securityContext": POD_SECURITY_CONTEXT,
        "terminationGracePeriodSeconds": DRAIN_SECONDS + MAX_QUEUE_DELAY_LIMIT_SECONDS,
        "automountServiceAccountToken": False,
        **placement(spec.resources),
    }
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(pool, pool.name),
        "spec": {
            **({} if replicas is None else {"replicas": replicas}),
            "selector": {"matchLabels": pool_selector_labels(pool.name)},
            "strategy": ROLLING_UPDATE,
            "template": {
                "metadata": {"labels": pool_labels(pool), "annotations": dict(SCRAPE_ANNOTATIONS)},
                "spec": pod_spec,
            },
        },
    }
    applied: dict[str, Any] = with_applied_hash(obj)
    return applied
