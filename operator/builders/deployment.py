"""``build_deployment``: the runtime Deployment of an InferenceService. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kubeinfer.operator import api
from kubeinfer.operator.builders.common import (
    CONFIG_HASH_ANNOTATION,
    PVC_MOUNT_ROOT,
    labels,
    metadata,
    selector_labels,
    with_applied_hash,
)
from kubeinfer.operator.builders.configmap import (
    GATE_TEXTS_DIR,
    GATE_TEXTS_FILE,
    SHUTDOWN_DELAY_SECONDS,
    config_hash,
)
from kubeinfer.operator.builders.source import SourceParts, source_parts
from kubeinfer.runtime.config import CONFIG_DIR, CONFIG_FILE, DEFAULT_CONFIG_PATH

from kubeinfer.contract.activator import GRPC_PORT_NAME
from kubeinfer.contract.activator import RUNTIME_PORT_NAME as PORT_NAME

CONTAINER_NAME = "runtime"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
#: Size of the memory-backed /dev/shm (torch DataLoader / tokenizer workers use shared memory).
SHM_SIZE = "1Gi"
#: Startup-probe period, seconds: the readiness a replica reaches waits for the next probe, so a period
#: of 1 s adds at most 1 s to a cold start (5 s added 2.5 s on average to a replica woken from zero).
#: The kubelet runs the readinessProbe as soon as the startupProbe succeeds.
STARTUP_PERIOD_SECONDS = 1
#: Seconds to allow for model load before warmup: bundled model vs. a model from a path/PVC.
LOAD_BUDGET_SECONDS = {"default": 120, "other": 600}
#: Seconds of warmup allowed per warmup step (every batch-size bucket once).
WARMUP_STEP_BUDGET_SECONDS = 60
#: Drain allowance beyond the longest max queue delay: the runtime's shutdown delay
#: (:data:`SHUTDOWN_DELAY_SECONDS`, 5 s), its drain timeout
#: (``RuntimeConfig.server.drain_timeout_seconds``, 30 s) and 15 s for in-flight compute and exit.
DRAIN_SECONDS = math.ceil(SHUTDOWN_DELAY_SECONDS) + 30 + 15
#: The runtime image's non-root user and group (runtime/Dockerfile ``USER 65532:65532``).
RUNTIME_UID = 65532
#: Size limit of the writable /tmp (the root filesystem is read-only; HOME=/tmp in the image).
TMP_SIZE = "1Gi"
#: Pod and container security contexts: the Pod Security Standards' "restricted" profile.
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": RUNTIME_UID,
    "runAsGroup": RUNTIME_UID,
    "fsGroup": RUNTIME_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def startup_budget_seconds(isvc: api.InferenceService) -> int:
    """Seconds the startupProbe allows before the kubelet restarts a replica: load + warmup.

    Load: 120 s for the bundled model, 600 s for any other (a path, a PVC, fetched, an OCI image:
    large weights); warmup: 60 s per step (and per size of ``spec.warmup.dims``) when enabled. The
    budget counts from the runtime container's start: the fetch init containers run (and an image
    volume is pulled) before it, outside the budget; they are bounded by their own stall timeout and
    retries (``spec.model.fetch``).
    """
    spec = isvc.spec
    load = LOAD_BUDGET_SECONDS["default" if spec.model.uri == "default" else "other"]
    passes = spec.warmup.steps * len(spec.warmup.dims or [None])
    warmup = WARMUP_STEP_BUDGET_SECONDS * passes if spec.warmup.enabled else 0
    total: int = load + warmup
    return total


def termination_grace_seconds(isvc: api.InferenceService) -> int:
    """terminationGracePeriodSeconds: the longest possible max queue delay plus :data:`DRAIN_SECONDS`."""
    spec = isvc.spec
    longest = spec.batching.max_queue_delay
    if spec.autoscaling.enabled:
        longest = max(longest, spec.autoscaling.max_queue_delay.max)
    grace: int = DRAIN_SECONDS + math.ceil(longest)
    return grace


#: The runtime container's writable /tmp (HOME), shared with the fetch init containers.
TMP_MOUNT: dict[str, Any] = {"name": "tmp", "mountPath": "/tmp"}
#: Where ``spec.server.graphCache``'s claim is mounted: the runtime's ``KUBEINFER_CACHE_DIR``.
GRAPH_CACHE_DIR = "/var/cache/kubeinfer"
#: The runtime's variable naming the directory of its compiled graphs (``models.hf_onnx.cache_dir``).
GRAPH_CACHE_ENV = "KUBEINFER_CACHE_DIR"


def _volumes(
    isvc: api.InferenceService, sources: SourceParts
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {
            "name": "config",
            "configMap": {
                "name": api.configmap_name(isvc.name),
                "items": [{"key": CONFIG_FILE, "path": CONFIG_FILE}],
            },
        },
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
        {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        TMP_MOUNT,
    ]
    gate = isvc.spec.quantization.gate
    if gate is not None and gate.texts is not None:
        volumes.append(
            {
                "name": "gate-texts",
                "configMap": {
                    "name": gate.texts.name,
                    "items": [{"key": gate.texts.key, "path": GATE_TEXTS_FILE}],
                },
            }
        )
        mounts.append({"name": "gate-texts", "mountPath": GATE_TEXTS_DIR, "readOnly": True})
    cache = isvc.spec.server.graph_cache
    if cache is not None:
        volumes.append({"name": "graph-cache", "persistentVolumeClaim": {"claimName": cache.claim_name}})
        mounts.append({"name": "graph-cache", "mountPath": GRAPH_CACHE_DIR})
    claims, claim_mounts = claim_volumes(isvc.spec.pvc_claims())
    return volumes + claims + sources.volumes, mounts + claim_mounts + sources.mounts


def claim_volumes(claims: Sequence[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the runtime container's mounts of the PersistentVolumeClaims ``claims``
    (names, in the order given: sorted, for a stable template), each read-only at
    ``PVC_MOUNT_ROOT/<claim>`` (where ``common.container_path`` puts a ``pvc://<claim>/<path>``), as
    volumes ``pvc-0``, ``pvc-1``, ... (a claim's name may be too long to name a volume after it)."""
    volumes = [
        {"name": f"pvc-{i}", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        for i, claim in enumerate(claims)
    ]
    mounts = [
        {"name": f"pvc-{i}", "mountPath": f"{PVC_MOUNT_ROOT}/{claim}", "readOnly": True}
        for i, claim in enumerate(claims)
    ]
    return volumes, mounts


def container_resources(res: api.ResourcesSpec) -> dict[str, Any]:
    """The runtime container's ``resources``: CPU and memory as request and limit, ``nvidia.com/gpu``
    when ``gpus > 0``."""
    requests: dict[str, str] = {"cpu": res.cpu, "memory": res.memory}
    limits: dict[str, str] = {"cpu": res.cpu, "memory": res.memory}
    if res.gpus > 0:
        requests[GPU_RESOURCE] = str(res.gpus)
        limits[GPU_RESOURCE] = str(res.gpus)
    return {"requests": requests, "limits": limits}


def placement(res: api.ResourcesSpec) -> dict[str, Any]:
    """The pod spec's ``tolerations`` and ``nodeSelector`` (each left out when empty): the
    ``nvidia.com/gpu`` NoSchedule toleration and, with ``gpuProduct``, a node selector on
    ``nvidia.com/gpu.product`` when ``gpus > 0``, then the spec's own."""
    tolerations: list[dict[str, Any]] = []
    node_selector: dict[str, str] = dict(res.node_selector)
    if res.gpus > 0:
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
        if res.gpu_product:
            node_selector[GPU_PRODUCT_LABEL] = res.gpu_product
    tolerations.extend(t.model_dump(by_alias=True, exclude_none=True) for t in res.tolerations)
    out: dict[str, Any] = {}
    if tolerations:
        out["tolerations"] = tolerations
    if node_selector:
        out["nodeSelector"] = node_selector
    return out


def probes(startup_seconds: int) -> dict[str, Any]:
    """The runtime container's probes: a startupProbe on ``/v2/health/ready`` allowing
    ``startup_seconds``, then readiness on ``/v2/health/ready`` and liveness on ``/v2/health/live``."""
    return {
        "startupProbe": {
            "httpGet": {"path": "/v2/health/ready", "port": PORT_NAME},
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "failureThreshold": math.ceil(startup_seconds / STARTUP_PERIOD_SECONDS),
            "timeoutSeconds": 2,
        },
        "readinessProbe": {
            "httpGet": {"path": "/v2/health/ready", "port": PORT_NAME},
            "periodSeconds": 5,
            "failureThreshold": 2,
            "timeoutSeconds": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/v2/health/live", "port": PORT_NAME},
            "periodSeconds": 10,
            "failureThreshold": 3,
            "timeoutSeconds": 5,
        },
    }


#: The runtime container's environment in every pod: no download from the Hugging Face Hub at run time.
OFFLINE_ENV: tuple[dict[str, str], ...] = (
    {"name": "HF_HUB_OFFLINE", "value": "1"},
    {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
)
#: The pod template's annotations that have Prometheus scrape the runtime's ``/metrics``.
SCRAPE_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(api.RUNTIME_PORT),
    "prometheus.io/path": "/metrics",
}
#: The Deployment's update strategy: serving capacity never drops during a rollout.
ROLLING_UPDATE: dict[str, Any] = {
    "type": "RollingUpdate",
    "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
}


def _container(isvc: api.InferenceService, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    spec = isvc.spec
    env: list[dict[str, Any]] = [dict(e) for e in OFFLINE_ENV]
    auth = spec.server.auth
    if auth is not None:
        # the token reaches the runtime from the Secret through the kubelet: the operator never reads it
        ref = auth.bearer_token_secret_ref
        env.append(
            {
                "name": api.BEARER_TOKEN_ENV,
                "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key, "optional": False}},
            }
        )
    if spec.server.graph_cache is not None:
        env.append({"name": GRAPH_CACHE_ENV, "value": GRAPH_CACHE_DIR})
    for var in spec.runtime.env:
        env.append(var.model_dump(by_alias=True, exclude_none=True))
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.runtime.image,
        "command": ["kubeinfer-runtime"],
        "args": ["serve", "--config", DEFAULT_CONFIG_PATH, *spec.runtime.args],
        "ports": [
            {"name": PORT_NAME, "containerPort": api.RUNTIME_PORT, "protocol": "TCP"},
            {"name": GRPC_PORT_NAME, "containerPort": spec.server.grpc_port, "protocol": "TCP"},
        ],
        "env": env,
        "resources": container_resources(spec.resources),
        "securityContext": CONTAINER_SECURITY_CONTEXT,
        "volumeMounts": mounts,
        # The runtime writes its own one-line fatal error to /dev/termination-log (lastState.terminated.
        # message, read by the diagnosis); File: a log tail never becomes the message (nor the status).
        "terminationMessagePolicy": "File",
        **probes(startup_budget_seconds(isvc)),
    }
    if spec.runtime.image_pull_policy is not None:
        container["imagePullPolicy"] = spec.runtime.image_pull_policy
    return container


def build_deployment(isvc: api.InferenceService, *, replicas: int | None) -> dict[str, Any]:
    """The ``apps/v1`` Deployment ``<isvc>`` running the runtime.

    Args:
        isvc: the InferenceService.
        replicas: ``spec.replicas`` to apply, or ``None`` to leave the field out of the applied
            configuration (autoscaling on, once the autoscaler owns it through the scale subresource).

    Pod template: runtime container with ``nvidia.com/gpu`` requests/limits when ``gpus > 0`` (plus
    the ``nvidia.com/gpu`` NoSchedule toleration and, with ``gpuProduct``, a node selector on
    ``nvidia.com/gpu.product``), the ConfigMap mounted as ``/etc/kubeinfer/runtime.yaml``, a
    memory-backed ``/dev/shm``, a writable ``/tmp`` (the root filesystem is read-only: the "restricted"
    Pod Security profile of :data:`POD_SECURITY_CONTEXT` and :data:`CONTAINER_SECURITY_CONTEXT`),
    read-only PVC mounts for ``pvc://`` URIs, the model's source (:mod:`.source`: a ``fetch`` init
    container and an emptyDir for s3/https/http/hf, an image volume and imagePullSecrets for oci, both
    read-only at ``/mnt/models``), a startupProbe sized by :func:`startup_budget_seconds` (from the
    runtime container's start, after the init containers), readiness ``/v2/health/ready``, liveness
    ``/v2/health/live``, ``terminationMessagePolicy: File`` (the runtime's own one-line fatal error
    reaches the pod status, never a log tail), Prometheus scrape annotations and the
    :data:`CONFIG_HASH_ANNOTATION` (rolls the pods when the non-batching runtime config changes). No
    ServiceAccount token in the pods (``automountServiceAccountToken: false``) unless
    ``spec.serviceAccountName`` names one (then its token is mounted, as the ServiceAccount says, for
    workload identity). Rolling update with maxUnavailable 0 / maxSurge 1 so serving capacity never
    drops during a rollout.
    """
    spec = isvc.spec
    sources = source_parts(spec, CONTAINER_SECURITY_CONTEXT, TMP_MOUNT)
    volumes, mounts = _volumes(isvc, sources)
    pod_spec: dict[str, Any] = {
        "containers": [_container(isvc, mounts)],
        "volumes": volumes,
        "securityContext": POD_SECURITY_CONTEXT,
        "terminationGracePeriodSeconds": termination_grace_seconds(isvc),
    }
    if sources.init_containers:
        pod_spec["initContainers"] = sources.init_containers
    if sources.image_pull_secrets:
        pod_spec["imagePullSecrets"] = sources.image_pull_secrets
    if spec.service_account_name is not None:
        pod_spec["serviceAccountName"] = spec.service_account_name
    else:
        pod_spec["automountServiceAccountToken"] = False
    pod_spec.update(placement(spec.resources))
    dep_spec: dict[str, Any] = {
        "selector": {"matchLabels": selector_labels(isvc)},
        "strategy": ROLLING_UPDATE,
        "template": {
            "metadata": {
                "labels": labels(isvc),
                "annotations": {
                    **SCRAPE_ANNOTATIONS,
                    CONFIG_HASH_ANNOTATION: config_hash(isvc),
                },
            },
            "spec": pod_spec,
        },
    }
    if replicas is not None:
        dep_spec = {"replicas": replicas, **dep_spec}
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(isvc, isvc.name),
        "spec": dep_spec,
    }
    applied: dict[str, Any] = with_applied_hash(obj)
    return applied
