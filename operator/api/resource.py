"""The InferenceService resource: its group, version and names, the field managers that write it,
the parsed object (:class:`InferenceService`: identity, spec, status) and the names derived from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeinfer.operator.api.base import _identity
from kubeinfer.operator.api.spec import InferenceServiceSpec
from kubeinfer.operator.api.status import InferenceServiceStatus
from pydantic import BaseModel, ConfigDict, Field

# The group, version, kind and plural live in the contract (the activator watches and patches
# InferenceServices by them); re-exported here, where they were defined before.
from kubeinfer.contract.activator import API_VERSION as API_VERSION
from kubeinfer.contract.activator import GROUP as GROUP
from kubeinfer.contract.activator import KIND as KIND
from kubeinfer.contract.activator import PLURAL as PLURAL
from kubeinfer.contract.activator import RUNTIME_PORT
from kubeinfer.contract.activator import VERSION as VERSION

SINGULAR = "inferenceservice"
SHORT_NAMES = ("kisvc",)

#: Server-side-apply field manager of the operator (Deployment, Service, ConfigMap, PDB, status).
FIELD_MANAGER = "kubeinfer"
#: Field manager of the autoscaler (``Deployment.spec.replicas`` through the scale subresource).
AUTOSCALER_FIELD_MANAGER = "kubeinfer-autoscaler"


def object_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """The InferenceService ``body`` as the ``involved`` object of an Event (apiVersion, kind, metadata)."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": body.get("metadata") or {}}


def service_url(name: str, namespace: str) -> str:
    """In-cluster URL of an InferenceService's v2 endpoint."""
    return f"http://{name}.{namespace}.svc.cluster.local:{RUNTIME_PORT}"


def configmap_name(name: str) -> str:
    """Name of an InferenceService's runtime ConfigMap (``<isvc>-runtime``)."""
    return f"{name}-runtime"


class InferenceService(BaseModel):
    """A parsed InferenceService: identity (name, namespace, uid, generation) + spec + status.

    Build it from a watch/GET body with :meth:`from_body`; the builders in ``kubeinfer.operator.builders``
    take it as their input.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    uid: str = ""
    generation: int = 0
    spec: InferenceServiceSpec = Field(default_factory=InferenceServiceSpec)
    status: InferenceServiceStatus = Field(default_factory=InferenceServiceStatus)

    @classmethod
    def from_body(cls, body: Any) -> InferenceService:
        """Parse a custom-resource mapping (``metadata``/``spec``/``status``).

        Raises:
            pydantic.ValidationError: the spec breaks a rule (the message names the field).
        """
        return cls(
            **_identity(body),
            spec=InferenceServiceSpec.from_k8s(body.get("spec")),
            status=InferenceServiceStatus.from_k8s(body.get("status")),
        )
