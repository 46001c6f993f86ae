"""The operator-activator contract (kubeinfer.contract.activator): the operator's objects carry the names
the activator reads them by, and its API names are the contract's."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from kubeinfer.activator import kubestate
from kubeinfer.activator.targets import Endpoint
from kubeinfer.operator import api
from kubeinfer.operator.builders.deployment import build_deployment
from kubeinfer.operator.builders.endpointslice import build_activator_endpointslice
from kubeinfer.operator.builders.service import build_service
from kubeinfer.operator.reconcile.grpcports import preferred_port

from kubeinfer.contract import activator as contract

ROOT = Path(__file__).resolve().parents[3]


def _isvc(grpc_port: int) -> tuple[api.InferenceService, dict[str, Any]]:
    body = yaml.safe_load((ROOT / "examples" / "minilm.yaml").read_text())
    body["metadata"].update(namespace="ml", uid="00000000-0000-0000-0000-000000000001")
    body["spec"].setdefault("server", {})["grpcPort"] = grpc_port
    return api.InferenceService.from_body(copy.deepcopy(body)), body


def test_the_operators_api_names_and_ports_are_the_contracts() -> None:
    assert (api.GROUP, api.VERSION, api.KIND, api.PLURAL) == (
        contract.GROUP,
        contract.VERSION,
        contract.KIND,
        contract.PLURAL,
    )
    assert api.API_VERSION == "kubeinfer.io/v1alpha1" and api.RUNTIME_PORT == contract.RUNTIME_PORT == 8080
    assert api.RUNTIME_GRPC_PORT == contract.RUNTIME_GRPC_PORT == 8081


def test_the_activator_reads_the_operators_pod_and_service_by_the_contracts_names() -> None:
    isvc, body = _isvc(9001)
    template = build_deployment(isvc, replicas=1)["spec"]["template"]
    pod = {
        "metadata": {**template["metadata"], "name": "minilm-abc", "namespace": "ml"},
        "spec": template["spec"],
        "status": {
            "phase": "Running",
            "podIP": "10.1.2.3",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    service = build_service(isvc)
    service["spec"]["clusterIP"] = "10.96.7.7"
    assert kubestate.target_key_of_labelled(pod) == kubestate.target_key_of_labelled(service) == "ml/minilm"
    view = kubestate.target_view(body, service, [pod])
    assert view.state.key == "ml/minilm" and view.state.cluster_ip == "10.96.7.7"
    assert view.endpoints == (Endpoint("10.1.2.3", contract.RUNTIME_PORT, 9001),)


def test_the_activator_reads_its_port_for_a_service_from_the_operators_endpointslice() -> None:
    isvc, _ = _isvc(9001)
    port = preferred_port((isvc.namespace, isvc.name))
    assert contract.is_target_grpc_port(port)
    piece = build_activator_endpointslice(isvc, ("10.0.0.9",), port)
    assert kubestate.slice_target_port(piece) == ("ml/minilm", port)
    assert kubestate.port_targets([piece, build_activator_endpointslice(isvc, ("10.0.0.9",))]) == {
        port: "ml/minilm"
    }  # the shared port is no target's own
