"""The runtime's pods: ``spec.runtime`` (image, device, engine, env, args) and ``spec.resources``
(GPUs, CPU, memory and placement).
"""

from __future__ import annotations

from typing import Any, Literal

from kubeinfer.operator.api.base import _check_table, _Spec, _table_rules
from kubeinfer.operator.api.formats import Quantity
from kubeinfer.runtime.config import Device, Engine
from pydantic import ConfigDict, Field, model_validator

from kubeinfer import __version__

#: Default runtime image: the runtime image of this release (tag = the package version).
DEFAULT_IMAGE = f"ghcr.io/kubeinfer/runtime:{__version__}"


class Toleration(_Spec):
    """A pod toleration (subset of ``core/v1 Toleration``)."""

    key: str | None = Field(default=None, max_length=253)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=253)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class ResourcesSpec(_Spec):
    """Per-replica resources and placement."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [*_table_rules("resources")]})

    gpus: int = Field(
        default=1,
        ge=0,
        description="nvidia.com/gpu per replica: 0 (the CPU) or 1. The runtime runs every instance of a "
        "model on one GPU (cuda:0), so more is refused rather than left idle: scale out with replicas; "
        "more instances of a model share its GPU (an InferenceService's spec.model.instances).",
    )
    gpu_product: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",  # a label value: it is a nodeSelector
        description="Node selector on nvidia.com/gpu.product, e.g. NVIDIA-H100-80GB-HBM3.",
    )
    cpu: Quantity = Field(default="2", description="CPU request and limit.")
    memory: Quantity = Field(default="8Gi", description="Memory request and limit.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    node_selector: dict[str, str] = Field(default_factory=dict, max_length=32)

    @model_validator(mode="after")
    def _rules(self) -> ResourcesSpec:
        _check_table("resources", self)
        return self


class EnvVar(_Spec):
    """An environment variable of the runtime container (``valueFrom`` as in core/v1 EnvVar)."""

    name: str = Field(min_length=1, max_length=256)
    value: str | None = None
    value_from: dict[str, Any] | None = Field(
        default=None, description="core/v1 EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, ...)."
    )


class RuntimeSpec(_Spec):
    """The runtime container: image, device, extra env and args."""

    image: str = Field(default=DEFAULT_IMAGE, min_length=1, max_length=512)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    device: Device = Field(default="auto", description="auto | cpu | cuda")
    engine: Engine | None = Field(
        default=None,
        description="torch | onnxruntime. Unset: torch for huggingface, torchscript and pt2, onnxruntime for "
        "onnx. A huggingface model on onnxruntime (any task: the embedder with its pooling, a classifier's, "
        "tagger's or reranker's head) is exported to ONNX at load (cached in /tmp) and checked "
        "against the torch model; onnxruntime runs on the CPU, with quantization none, int8-dynamic "
        "or int8-static (ONNX Runtime's recipes, per channel; no skipModules), in this release.",
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    args: list[str] = Field(default_factory=list, max_length=64, description="Extra runtime CLI arguments.")
