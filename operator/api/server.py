"""``spec.server``: the runtime's front ends (REST and gRPC ports) and who may call the model (the
bearer token of ``auth``, the NetworkPolicy peers of ``allowFrom``).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from kubeinfer.operator.api.base import _cel, _Spec
from kubeinfer.operator.api.formats import (
    DNS_SUBDOMAIN_PATTERN,
    LABEL_KEY_PATTERN,
    SECRET_KEY_PATTERN,
    LabelKey,
    LabelValue,
)
from pydantic import ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from kubeinfer.contract.activator import RUNTIME_GRPC_PORT, RUNTIME_PORT

#: Environment variable of the runtime container holding the bearer token (``valueFrom.secretKeyRef``
#: from ``spec.server.auth.bearerTokenSecretRef``); runtime.yaml names it, never the token.
BEARER_TOKEN_ENV = "KUBEINFER_BEARER_TOKEN"
#: :data:`LABEL_KEY_PATTERN`, compiled (the pydantic side of the ``matchLabels`` key rule).
_LABEL_KEY_RE = re.compile(LABEL_KEY_PATTERN)


class SecretKeyRef(_Spec):
    """A key of a Secret in the InferenceService's namespace (the operator never reads it: the pod
    spec references it)."""

    name: str = Field(
        min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Name of the Secret."
    )
    key: str = Field(
        default="token",
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        description="Key in the Secret's data whose value is the token.",
    )


class AuthSpec(_Spec):
    """Authentication of the runtime's v2, OpenAI and gRPC routes (health and /metrics stay open)."""

    bearer_token_secret_ref: SecretKeyRef = Field(
        description="The Secret key holding the bearer token every request must carry as "
        "'Authorization: Bearer <token>' (else 401; gRPC UNAUTHENTICATED). A pod does not start "
        "until the Secret and key exist.",
    )


class GraphCacheSpec(_Spec):
    """A PersistentVolumeClaim where the runtime keeps the graphs it compiles from the model (the ONNX
    export, the int8 graphs), read by every later pod of the model instead of compiling again."""

    claim_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of a PersistentVolumeClaim in the InferenceService's namespace, mounted "
        "read-write at /var/cache/kubeinfer (the runtime's KUBEINFER_CACHE_DIR). Pods on several nodes "
        "need a ReadWriteMany claim. A graph is keyed by the model's config and weights (contents), "
        "torch's and transformers' versions and the graph's kind, and written under a temporary name "
        "then renamed, so pods of different models and versions share a claim safely.",
    )


class LabelSelectorRequirement(_Spec):
    """A matchExpressions entry of a label selector (metav1.LabelSelectorRequirement)."""

    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[LabelValue] | None = Field(
        default=None, max_length=64, description="Required for In and NotIn; empty for Exists, DoesNotExist."
    )


def _selector_rules(field: str) -> JsonDict:
    """The CEL rules of the label selector at ``field`` (its messages name it): label keys in
    ``matchLabels`` (the schema cannot constrain a map's keys), ``values`` against ``operator``."""
    return {
        "x-kubernetes-validations": [
            _cel(
                f"!has(self.matchLabels) || self.matchLabels.all(k, k.matches(r'{LABEL_KEY_PATTERN}'))",
                f"{field}.matchLabels keys must be label keys ([prefix/]name, the name at most 63 "
                "characters)",
                ".matchLabels",
                "FieldValueInvalid",
            ),
            _cel(
                "!has(self.matchExpressions) || self.matchExpressions.all(r, "
                "r.operator in ['In', 'NotIn'] ? (has(r.values) && size(r.values) > 0) : "
                "(!has(r.values) || size(r.values) == 0))",
                f"{field}.matchExpressions: values must be set for operator In and NotIn, and empty for "
                "Exists and DoesNotExist",
                ".matchExpressions",
                "FieldValueInvalid",
            ),
        ]
    }


class _LabelSelector(_Spec):
    """A label selector (metav1.LabelSelector); ``{}`` selects everything."""

    #: The selector's field, in the messages of its rules.
    _field: ClassVar[str] = "selector"

    match_labels: dict[str, LabelValue] | None = Field(default=None, max_length=32)
    match_expressions: list[LabelSelectorRequirement] | None = Field(default=None, max_length=16)

    @model_validator(mode="after")
    def _rules(self) -> _LabelSelector:
        bad = sorted(k for k in self.match_labels or {} if len(k) > 317 or not _LABEL_KEY_RE.match(k))
        if bad:
            raise ValueError(
                f"{self._field}.matchLabels keys must be label keys ([prefix/]name, the name at most 63 "
                f"characters): {bad}"
            )
        for req in self.match_expressions or []:
            if (req.operator in ("In", "NotIn")) != bool(req.values):
                raise ValueError(
                    f"{self._field}.matchExpressions: values must be set for operator In and NotIn, and "
                    "empty for Exists and DoesNotExist"
                )
        return self


class NamespaceSelector(_LabelSelector):
    """Namespaces whose pods may connect (label kubernetes.io/metadata.name is a namespace's name)."""

    model_config = ConfigDict(json_schema_extra=_selector_rules("spec.server.allowFrom[].namespaceSelector"))
    _field: ClassVar[str] = "spec.server.allowFrom[].namespaceSelector"


class PodSelector(_LabelSelector):
    """Pods that may connect, in the namespaces namespaceSelector chooses (else in this one)."""

    model_config = ConfigDict(json_schema_extra=_selector_rules("spec.server.allowFrom[].podSelector"))
    _field: ClassVar[str] = "spec.server.allowFrom[].podSelector"


class NetworkPeer(_Spec):
    """Who may connect (networking.k8s.io/v1 NetworkPolicyPeer): namespaceSelector, podSelector or both."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "has(self.namespaceSelector) || has(self.podSelector)",
                    "spec.server.allowFrom: each peer sets namespaceSelector, podSelector or both",
                    reason="FieldValueRequired",
                )
            ]
        }
    )

    namespace_selector: NamespaceSelector | None = Field(
        default=None,
        description="Namespaces whose pods may connect (matchLabels kubernetes.io/metadata.name: NAME picks "
        "one by name). Unset: the InferenceService's namespace only; {}: every namespace.",
    )
    pod_selector: PodSelector | None = Field(
        default=None,
        description="Pods that may connect, in the namespaces namespaceSelector picks. Unset: every pod of "
        "those namespaces; {}: every pod.",
    )

    @model_validator(mode="after")
    def _rules(self) -> NetworkPeer:
        if self.namespace_selector is None and self.pod_selector is None:
            raise ValueError("spec.server.allowFrom: each peer sets namespaceSelector, podSelector or both")
        return self

    def to_k8s(self) -> dict[str, Any]:
        """The NetworkPolicyPeer (camelCase; an empty selector stays ``{}``)."""
        peer: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        return peer


class ServerSpec(_Spec):
    """The runtime's front ends: REST on 8080 (fixed), the Open Inference Protocol's gRPC service."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    f"self.grpcPort != {RUNTIME_PORT}",
                    f"spec.server.grpcPort must differ from the REST port {RUNTIME_PORT}",
                    ".grpcPort",
                    "FieldValueInvalid",
                )
            ]
        }
    )

    grpc_port: int = Field(
        default=RUNTIME_GRPC_PORT,
        ge=1024,
        le=65535,
        description="Port of the gRPC service (inference.GRPCInferenceService) on the pods and the Service.",
    )
    http_workers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="HTTP front-end processes per pod in front of the one model process (runtime "
        "server.http_workers). Unset: one per 2 CPUs of resources.cpu, at most 8; 1 below 4 CPUs "
        "(one process, no IPC).",
    )
    auth: AuthSpec | None = Field(
        default=None,
        description="Bearer-token authentication by the runtime (unset: none, every route open). Health "
        "(/v2/health/*, gRPC ServerLive/ServerReady) and /metrics stay open.",
    )
    graph_cache: GraphCacheSpec | None = Field(
        default=None,
        description="Where compiled graphs are kept between pods (unset: in the pod's /tmp, made again "
        "by every pod). Applies to engine onnxruntime on a Hugging Face model directory.",
    )
    allow_from: list[NetworkPeer] | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="Peers admitted to the REST and gRPC ports by a NetworkPolicy the operator owns "
        "(the Prometheus the operator reads is admitted to the REST port, for /metrics). Unset: no "
        "NetworkPolicy, unless the operator's NetworkPolicy default-deny setting is on (the chart's "
        "networkPolicy.defaultDeny): then one admitting that Prometheus only. Enforced only where the "
        "cluster's network plugin enforces NetworkPolicy.",
    )

    @model_validator(mode="after")
    def _distinct(self) -> ServerSpec:
        if self.grpc_port == RUNTIME_PORT:
            raise ValueError(f"spec.server.grpcPort must differ from the REST port {RUNTIME_PORT}")
        return self
