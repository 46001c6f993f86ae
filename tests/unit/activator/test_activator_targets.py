"""Target resolution (activator/targets.py) and the request parameters the fronts read before a hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubeinfer.activator.grpc_proxy import infer_parameters, model_of
from kubeinfer.activator.rest import rest_parameters
from kubeinfer.activator.targets import Endpoint, InMemoryTargets, TargetState, load_targets_file, split_host
from tritonclient.grpc import service_pb2


@pytest.fixture
def targets() -> InMemoryTargets:
    t = InMemoryTargets()
    t.put(TargetState("simple", "ml", cluster_ip="10.96.0.12"))
    t.put(TargetState("minilm", "ml", cluster_ip="fd00::12"))
    t.put(TargetState("minilm", "team-b"))
    return t


@pytest.mark.parametrize(
    ("host", "target"),
    [
        ("simple", "ml/simple"),  # a bare name: the only target of that name
        ("simple:8080", "ml/simple"),
        ("simple.ml", "ml/simple"),
        ("simple.ml:8080", "ml/simple"),
        ("simple.ml.svc", "ml/simple"),
        ("simple.ml.svc.cluster.local", "ml/simple"),
        ("Simple.ML.svc.cluster.local.:8080", "ml/simple"),
        ("10.96.0.12", "ml/simple"),
        ("10.96.0.12:8080", "ml/simple"),
        ("[fd00::12]:8080", "ml/minilm"),
        ("minilm", None),  # two namespaces have one: ambiguous
        ("minilm.team-b", "team-b/minilm"),
        ("simple.other", None),
        ("simple.ml.svc.example.org", None),
        ("simple.ml.pod", None),
        ("10.96.0.13", None),
        ("", None),
    ],
)
def test_resolve(targets: InMemoryTargets, host: str, target: str | None) -> None:
    assert targets.resolve(host) == target


@pytest.mark.parametrize(
    ("host", "part"),
    [("a.b:80", "a.b"), ("[::1]:80", "::1"), ("[::1]", "::1"), ("fd00::1", "fd00::1"), ("A.B.", "a.b")],
)
def test_split_host(host: str, part: str) -> None:
    assert split_host(host) == part


def test_listeners_hear_of_changes_and_sync_reports_only_what_changed(targets: InMemoryTargets) -> None:
    heard: list[str] = []
    targets.subscribe(heard.append)
    ep = Endpoint("10.0.0.7", 8080, 8081)
    targets.set_endpoint("ml/simple", ep, stage="ready")
    assert heard == ["ml/simple"] and targets.endpoint("ml/simple") == ep
    assert targets.stage("ml/simple") == "ready"
    heard.clear()
    states = targets.states()
    targets.sync([s for s in states if s.key != "team-b/minilm"])
    assert heard == ["team-b/minilm"] and targets.resolve("minilm") == "ml/minilm"
    assert ep.http == "10.0.0.7:8080" and Endpoint("fd00::7", 1, 2).grpc == "[fd00::7]:2"


def test_load_targets_file(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    doc = {
        "targets": [
            {"name": "a"},
            {
                "name": "b",
                "namespace": "ns",
                "cluster_ip": "10.0.0.1",
                "stage": "loading model",
                "grpc_port": 0,
                "endpoint": {"host": "127.0.0.1", "http_port": 1, "grpc_port": 2},
            },
        ]
    }
    path.write_text(json.dumps(doc))
    a, b = load_targets_file(path)
    assert a == TargetState("a")
    assert b == TargetState("b", "ns", "10.0.0.1", Endpoint("127.0.0.1", 1, 2), "loading model", 0)
    path.write_text('{"targets": {}}')
    with pytest.raises(ValueError):
        load_targets_file(path)


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({}, b'{"inputs": [], "parameters": {"priority": 1, "timeout": 2000000}}', (1, 2.0)),
        ({}, b'{"inputs": []}', (None, None)),
        ({}, b'{"parameters": {"timeout": 0}}', (None, None)),
        ({}, b"not json", (None, None)),
        ({}, b"[1, 2]", (None, None)),
        ({"inference-header-content-length": "29"}, b'{"parameters":{"priority":2}}\x00\x01\x02', (2, None)),
    ],
)
def test_rest_parameters(headers: dict[str, str], body: bytes, expected: tuple[object, float | None]) -> None:
    assert rest_parameters(headers, body) == expected


def test_grpc_parameters_and_model() -> None:
    request = service_pb2.ModelInferRequest(model_name="simple")
    request.parameters["priority"].int64_param = 1
    request.parameters["timeout"].int64_param = 500_000
    infer = "/inference.GRPCInferenceService/ModelInfer"
    assert infer_parameters(infer, request.SerializeToString()) == (1, 0.5)
    assert model_of(infer, request.SerializeToString()) == "simple"
    ready = service_pb2.ModelReadyRequest(name="minilm").SerializeToString()
    assert model_of("/inference.GRPCInferenceService/ModelReady", ready) == "minilm"
    assert model_of("/inference.GRPCInferenceService/ServerLive", b"") is None
    assert infer_parameters(infer, b"\xff\xff") == (None, None)
