"""The InferenceService API: pydantic models of ``spec`` and ``status``.

``kubeinfer.io/v1alpha1``, kind ``InferenceService`` (plural ``inferenceservices``, short name
``kisvc``), namespaced. Field names are camelCase in YAML/JSON (pydantic alias generator); in Python
they are snake_case. Parse a custom resource with :meth:`InferenceServiceSpec.from_k8s` and
:meth:`InferenceServiceStatus.from_k8s`; render with ``model_dump(by_alias=True, exclude_none=True)``.

The CRD's ``openAPIV3Schema`` is generated from these models by ``kubeinfer.operator.crdgen``
(``make crds``). Rules that span fields are written twice, on purpose: as CEL
``x-kubernetes-validations`` (so ``kubectl apply`` refuses a bad manifest, message naming the field)
and as pydantic validators (so the operator and unit tests see the same rules). The format x engine x
task x quantization rules are written once, in ``kubeinfer.contract.formats``, and both forms derived from
it with the operator's paths of its fields (:data:`FORMAT_RULES_SIDE`).

Durations are Go/Kubernetes duration strings (``"10ms"``, ``"1.5s"``, ``"5m"``, ``"1h30m"``): the
CRD declares them ``type: string`` with :data:`DURATION_PATTERN`, CEL's ``duration()`` parses them,
and :func:`parse_duration` converts them to float seconds.

One module per concept; each imports only those below it (an import-linter contract):

- ``pool``: the ModelPool resource (:class:`ModelPool`: spec, status, the names derived from it), beside
  ``resource``;
- ``resource``: field managers (the group, version, kind and plural are ``kubeinfer.contract.activator``'s,
  re-exported here, like the runtime's ports); :class:`InferenceService`, the names derived from it;
- ``spec`` (:class:`InferenceServiceSpec`) | ``status`` (:class:`InferenceServiceStatus`);
- ``model`` (model, quantization, batching, warmup, cache) | ``autoscaling`` | ``server`` (ports, auth,
  NetworkPolicy peers) | ``workload`` (runtime container, resources);
- ``sources``: model and data URIs, the settings of a source and which scheme takes which;
- ``base``: the base models and the CEL helpers;
- ``formats``: durations, quantities, names, keys and labels.

Import the names from here (``from kubeinfer.operator import api``; ``api.NAME``).
"""

from kubeinfer.operator.api.autoscaling import (
    RENAMED_AUTOSCALING_FIELDS,
    AutoscalingSpec,
    GpuUtilizationBand,
    MaxQueueDelayBounds,
    PromQueries,
    ScaleToZeroSpec,
)
from kubeinfer.operator.api.base import FORMAT_RULES_SIDE
from kubeinfer.operator.api.formats import (
    CONFIGMAP_KEY_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    QUANTITY_PATTERN,
    SECRET_KEY_PATTERN,
    Duration,
    LabelKey,
    LabelValue,
    Quantity,
    Seconds,
    cpu_cores,
    format_duration,
)
from kubeinfer.operator.api.model import (
    DEFAULT_MODEL_NAME,
    MIN_CACHE_BYTES,
    BatchingSpec,
    CacheSpec,
    CalibrationSpec,
    ConfigMapKeyRef,
    GateSpec,
    ModelSpec,
    QuantizationSpec,
    TensorSpec,
    WarmupSpec,
)
from kubeinfer.operator.api.pool import (
    MODEL_NAME_PATTERN,
    ModelPool,
    ModelPoolSpec,
    ModelPoolStatus,
    PoolReplicaStatus,
    PoolRuntimeSpec,
    pool_configmap_name,
    pool_reference,
)
from kubeinfer.operator.api.resource import (
    AUTOSCALER_FIELD_MANAGER,
    FIELD_MANAGER,
    SHORT_NAMES,
    SINGULAR,
    InferenceService,
    configmap_name,
    object_reference,
    service_url,
)
from kubeinfer.operator.api.server import (
    BEARER_TOKEN_ENV,
    AuthSpec,
    GraphCacheSpec,
    LabelSelectorRequirement,
    NamespaceSelector,
    NetworkPeer,
    PodSelector,
    SecretKeyRef,
    ServerSpec,
)
from kubeinfer.operator.api.sources import (
    DATA_URI_PATTERN,
    ENDPOINT_PATTERN,
    FETCHED_SCHEMES,
    MODEL_URI_PATTERN,
    SHA256_PATTERN,
    CaBundleSpec,
    CredentialsSpec,
    FetchSpec,
    HuggingFaceSpec,
    S3Spec,
    is_fetched,
    is_pooled_uri,
    oci_reference,
    parse_pvc_uri,
    pooled_uri_cel,
    pooled_uri_message,
    uri_scheme,
)
from kubeinfer.operator.api.spec import (
    CPU_INSTANCES_MIN_CPUS,
    DEFAULT_CPU_INSTANCES,
    MAX_DEFAULT_HTTP_WORKERS,
    POOL_NAME_PATTERN,
    InferenceServiceSpec,
)
from kubeinfer.operator.api.status import (
    RENAMED_STATUS_FIELDS,
    AutoscalerDecisionStatus,
    Condition,
    ConditionStatus,
    InferenceServiceStatus,
    ObservedSignals,
    PooledModelStatus,
    QuantizationStatus,
)
from kubeinfer.operator.api.workload import DEFAULT_IMAGE, EnvVar, ResourcesSpec, RuntimeSpec, Toleration

from kubeinfer.contract.activator import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    RUNTIME_GRPC_PORT,
    RUNTIME_PORT,
    VERSION,
)
from kubeinfer.contract.durations import DURATION_PATTERN, parse_duration
from kubeinfer.contract.pool import POOL_KIND, POOL_PLURAL, POOL_SHORT_NAMES, POOL_SINGULAR

__all__ = [
    "API_VERSION",
    "AUTOSCALER_FIELD_MANAGER",
    "BEARER_TOKEN_ENV",
    "CONFIGMAP_KEY_PATTERN",
    "CPU_INSTANCES_MIN_CPUS",
    "DATA_URI_PATTERN",
    "DEFAULT_CPU_INSTANCES",
    "DEFAULT_IMAGE",
    "DEFAULT_MODEL_NAME",
    "DNS_SUBDOMAIN_PATTERN",
    "DURATION_PATTERN",
    "ENDPOINT_PATTERN",
    "FETCHED_SCHEMES",
    "FIELD_MANAGER",
    "FORMAT_RULES_SIDE",
    "GROUP",
    "KIND",
    "LABEL_KEY_PATTERN",
    "LABEL_VALUE_PATTERN",
    "MAX_DEFAULT_HTTP_WORKERS",
    "MIN_CACHE_BYTES",
    "MODEL_NAME_PATTERN",
    "MODEL_URI_PATTERN",
    "PLURAL",
    "POOL_KIND",
    "POOL_NAME_PATTERN",
    "POOL_PLURAL",
    "POOL_SHORT_NAMES",
    "POOL_SINGULAR",
    "QUANTITY_PATTERN",
    "RENAMED_AUTOSCALING_FIELDS",
    "RENAMED_STATUS_FIELDS",
    "RUNTIME_GRPC_PORT",
    "RUNTIME_PORT",
    "SECRET_KEY_PATTERN",
    "SHA256_PATTERN",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "AuthSpec",
    "AutoscalerDecisionStatus",
    "AutoscalingSpec",
    "BatchingSpec",
    "CaBundleSpec",
    "CacheSpec",
    "CalibrationSpec",
    "Condition",
    "ConditionStatus",
    "ConfigMapKeyRef",
    "CredentialsSpec",
    "Duration",
    "EnvVar",
    "FetchSpec",
    "GateSpec",
    "GpuUtilizationBand",
    "GraphCacheSpec",
    "HuggingFaceSpec",
    "InferenceService",
    "InferenceServiceSpec",
    "InferenceServiceStatus",
    "LabelKey",
    "LabelSelectorRequirement",
    "LabelValue",
    "MaxQueueDelayBounds",
    "ModelPool",
    "ModelPoolSpec",
    "ModelPoolStatus",
    "ModelSpec",
    "NamespaceSelector",
    "NetworkPeer",
    "ObservedSignals",
    "PodSelector",
    "PoolReplicaStatus",
    "PoolRuntimeSpec",
    "PooledModelStatus",
    "PromQueries",
    "Quantity",
    "QuantizationSpec",
    "QuantizationStatus",
    "ResourcesSpec",
    "RuntimeSpec",
    "S3Spec",
    "ScaleToZeroSpec",
    "Seconds",
    "SecretKeyRef",
    "ServerSpec",
    "TensorSpec",
    "Toleration",
    "WarmupSpec",
    "configmap_name",
    "cpu_cores",
    "format_duration",
    "is_fetched",
    "is_pooled_uri",
    "object_reference",
    "oci_reference",
    "parse_duration",
    "parse_pvc_uri",
    "pool_configmap_name",
    "pool_reference",
    "pooled_uri_cel",
    "pooled_uri_message",
    "service_url",
    "uri_scheme",
]
