"""The activator's own readiness route (activator/rest.py): 503 until its targets are known."""

from __future__ import annotations

from kubeinfer.activator.gate import Gate
from kubeinfer.activator.rest import rest_app
from kubeinfer.activator.targets import InMemoryTargets
from starlette.testclient import TestClient

from kubeinfer.shared.hold import HoldLimits


def test_readyz_follows_the_ready_callable_and_defaults_to_ready() -> None:
    listed = {"done": False}
    gate = Gate(InMemoryTargets(), HoldLimits())
    with TestClient(rest_app(gate, ready=lambda: listed["done"])) as client:
        first = client.get("/activator/readyz")
        assert (first.status_code, first.json()) == (503, {"ready": False})
        listed["done"] = True
        assert client.get("/activator/readyz").status_code == 200
        assert client.get("/activator/healthz").status_code == 200  # alive all along
    with TestClient(rest_app(gate)) as client:
        assert client.get("/activator/readyz").status_code == 200
