"""``build_configmap``: the runtime configuration (``runtime.yaml``) of an InferenceService."""

from __future__ import annotations

from typing import Any

from kubeinfer.operator import api
from kubeinfer.operator.builders.common import container_path, metadata, stable_hash, with_applied_hash
from kubeinfer.operator.builders.source import calibration_source_path, model_source_path
from kubeinfer.runtime.config import (
    CONFIG_FILE,
    BatchingConfig,
    CacheConfig,
    GateConfig,
    ModelConfig,
    QuantizationConfig,
    RuntimeConfig,
    ServerConfig,
    TensorConfig,
    WarmupConfig,
)

#: ``server.shutdown_delay_seconds`` of every runtime: on SIGTERM a pod keeps serving this long (not
#: ready) before it refuses new requests, so that the EndpointSlice update and kube-proxy stop
#: routing to it first (scale-in under load lost requests without it; the usual preStop sleep).
SHUTDOWN_DELAY_SECONDS = 5.0


#: Where ``spec.quantization.gate.texts`` (a ConfigMap key) is mounted in the runtime container.
GATE_TEXTS_DIR = "/mnt/gate"
#: The file name of the gate's texts in :data:`GATE_TEXTS_DIR` (the ConfigMap key is mapped to it).
GATE_TEXTS_FILE = "texts.txt"


def _gate(gate: api.GateSpec) -> GateConfig:
    """The runtime's quality gate: the bars, and the mounted texts' path when the spec names them."""
    path = None if gate.texts is None else f"{GATE_TEXTS_DIR}/{GATE_TEXTS_FILE}"
    return GateConfig(min_cosine=gate.min_cosine, min_agreement=gate.min_agreement, texts_path=path)


def _warmup_given(warmup: api.WarmupSpec) -> dict[str, Any]:
    """The warmup settings set only when given (the sizes, what warms up before readiness): left unset,
    runtime.yaml reads as it did before they existed."""
    given: dict[str, Any] = {}
    if warmup.dims is not None:
        given["dims"] = list(warmup.dims)
    if warmup.before_ready is not None:
        given["before_ready"] = warmup.before_ready
    return given


def runtime_config(isvc: api.InferenceService, max_queue_delay_seconds: float) -> RuntimeConfig:
    """Render the spec into the runtime's :class:`~kubeinfer.runtime.config.RuntimeConfig`.

    ``model.source`` is where the runtime container finds the model: ``/mnt/models`` for a fetched
    (s3, https, http, hf) or oci source, the PVC mount for ``pvc://``, else the URI as written;
    ``quantization.calibration_path`` likewise (a fetched file under ``/mnt/calibration``).

    Args:
        isvc: the InferenceService.
        max_queue_delay_seconds: the max queue delay in force, seconds (see
            :meth:`~kubeinfer.operator.api.InferenceServiceSpec.max_queue_delay_in_force`: already within
            the spec's bounds, which the API keeps within the runtime's).

    Raises:
        pydantic.ValidationError: ``max_queue_delay_seconds`` outside the runtime's bounds.
    """
    spec = isvc.spec
    calibration = spec.quantization.calibration
    cfg = RuntimeConfig(
        model=ModelConfig(
            name=spec.served_model_name(isvc.name),
            source=model_source_path(spec.model.uri, container_path(spec.model.uri)),
            format=spec.model.format,
            inputs=[
                TensorConfig(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in spec.model.inputs
            ],
            outputs=[
                TensorConfig(name=t.name, datatype=t.datatype, shape=list(t.shape))
                for t in spec.model.outputs
            ],
        ),
        quantization=QuantizationConfig(
            mode=spec.quantization.mode,
            calibration_path=(
                calibration_source_path(calibration.uri, container_path(calibration.uri))
                if calibration is not None
                else None
            ),
            skip_modules=list(spec.quantization.skip_modules),
            # set only when given: left unset, runtime.yaml reads as it did before the gate existed
            **({} if spec.quantization.gate is None else {"gate": _gate(spec.quantization.gate)}),
        ),
        batching=BatchingConfig.model_validate(
            {
                "max_batch_size": spec.batching.max_batch_size,
                "max_queue_delay_seconds": max_queue_delay_seconds,
                "max_queue_size": spec.batching.max_queue_size,
                "preferred_batch_sizes": list(spec.batching.preferred_batch_sizes),
                # set only when given: left unset, runtime.yaml reads as it did before the share existed
                **(
                    {}
                    if spec.batching.priority_min_share is None
                    else {"priority_min_share": spec.batching.priority_min_share}
                ),
                **(
                    {}
                    if spec.batching.max_batch_tokens is None
                    else {"max_batch_tokens": spec.batching.max_batch_tokens}
                ),
            }
        ),
        warmup=WarmupConfig(
            enabled=spec.warmup.enabled,
            steps=spec.warmup.steps,
            **_warmup_given(spec.warmup),
        ),
        server=ServerConfig(
            host="0.0.0.0",
            port=api.RUNTIME_PORT,
            grpc_port=spec.server.grpc_port,
            http_workers=spec.http_workers_in_force(),
            shutdown_delay_seconds=SHUTDOWN_DELAY_SECONDS,
        ),
        device=spec.runtime.device,
    )
    if spec.runtime.engine is not None:  # unset: the format's default, runtime.yaml reads as before
        cfg.model = cfg.model.model_copy(update={"engine": spec.runtime.engine})
    if spec.model.task is not None:  # unset: detected by the runtime from config.json
        cfg.model = cfg.model.model_copy(update={"task": spec.model.task})
    if spec.model.aggregation_strategy is not None:  # unset: the token classifier's default
        cfg.model = cfg.model.model_copy(update={"aggregation_strategy": spec.model.aggregation_strategy})
    if spec.model.overflow is not None:  # unset: refuse
        cfg.model = cfg.model.model_copy(update={"overflow": spec.model.overflow})
    instances = spec.instances_in_force()
    if spec.model.instances is not None or instances != 1:  # a default one: runtime.yaml as before the field
        cfg = cfg.model_copy(update={"instances": instances})  # within the same contract bound
    if spec.model.max_text_tokens is not None:  # unset: the runtime's default
        cfg.limits = cfg.limits.model_copy(update={"max_text_tokens": spec.model.max_text_tokens})
    if spec.cache.enabled:  # left off, runtime.yaml reads as it did before the cache existed
        cfg.cache = CacheConfig(enabled=True, max_bytes=int(api.cpu_cores(spec.cache.max_bytes)))
    if spec.server.auth is not None:
        # set only with auth: left unset, runtime.yaml reads as it did before authentication existed
        cfg.server = cfg.server.model_copy(update={"bearer_token_env": api.BEARER_TOKEN_ENV})
    return cfg


#: The key of the instance count in the data :func:`config_hash` hashes: ``runtime.yaml``'s former name
#: for it, with which every file had it.
_INSTANCES_HASH_KEY = "executors"


def config_hash(isvc: api.InferenceService) -> str:
    """Hash of the runtime configuration WITHOUT its ``batching`` section.

    It goes into a pod-template annotation: a model / quantization / warmup / device change rolls
    the pods, a batching change (hot-reloaded by the runtime) does not.
    """
    # the file's data: a field left at its default is not in it, so a pod from before that field
    # existed keeps its hash and an operator upgrade rolls no pod
    data: dict[str, Any] = runtime_config(isvc, 0.0).file_data()
    data.pop("batching", None)
    # the instance count under the key the file had for it before it was named instances (and always
    # wrote): the pods of a service from before the rename keep their hash
    data[_INSTANCES_HASH_KEY] = data.pop("instances", 1)
    digest: str = stable_hash(data)
    return digest


def build_configmap(isvc: api.InferenceService, max_queue_delay_seconds: float) -> dict[str, Any]:
    """The ``<isvc>-runtime`` ConfigMap with key ``runtime.yaml``.

    Args:
        isvc: the InferenceService.
        max_queue_delay_seconds: the max queue delay in force, seconds: with autoscaling on the
            autoscaler's ``status.maxQueueDelay`` clamped to the spec's bounds, else
            ``spec.batching.maxQueueDelay`` (compute it with ``isvc.spec.max_queue_delay_in_force``).

    Returns:
        A ConfigMap manifest (dict) for server-side apply, with the applied-hash annotation.
    """
    text = runtime_config(isvc, max_queue_delay_seconds).to_yaml()
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(isvc, api.configmap_name(isvc.name)),
        "data": {CONFIG_FILE: text},
    }
    applied: dict[str, Any] = with_applied_hash(obj)
    return applied
