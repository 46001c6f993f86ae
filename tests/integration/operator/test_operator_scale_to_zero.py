"""Scale to zero, the operator's side, against the real API server: the 0 -> 1 transition on the
activator's demand annotation (the reconciler's), an older demand doing nothing, the status at zero, and
``minReplicas: 0`` without the activator setting (accepted, kept at 1 replica, the condition saying why).

1 -> 0 needs the autoscaler's signals (Prometheus), which this tier does not have: the test writes what
the autoscaler writes when it scales to zero (``status.scaledToZeroAt`` first, then the Deployment's
scale subresource as ``kubeinfer-autoscaler``). No pod runs at this tier."""

from __future__ import annotations

import datetime as dt
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.operator import api, conditions, rfc3339

from hack.devtools.operator_proc import TEST_ENV, OperatorProcess
from kubeinfer.contract.activator import DEMAND_ANNOTATION, demand_value
from tests.integration.operator.test_operator_rollout import argocd_health
from tests.support.cluster import Cluster, wait_until
from tests.support.kstatus import compute as kstatus

ZERO = {"enabled": True, "minReplicas": 0, "maxReplicas": 2, "scaleToZero": {"idleAfter": "1s"}}


@pytest.fixture(scope="module")
def zero_operator(
    cluster: Cluster, op_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """A ``kubeinfer-operator`` told that the activator is installed. Its resync is 300 s: what it does
    within the tests' waits comes from watch events (the annotation's change), not from a resync."""
    proc = OperatorProcess(
        cluster.kubeconfig,
        namespaces=[op_namespace],
        resync_seconds=300.0,
        log_dir=tmp_path_factory.mktemp("operator-logs"),
        extra_env={**TEST_ENV, "KUBEINFER_ACTIVATOR_ENABLED": "true"},
    )
    with proc:
        proc.wait_ready()
        yield proc
        print(proc.log()[-5000:])


def _get(cluster: Cluster, ns: str, kind: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(cluster.kubectl("get", kind, name, "-n", ns, "-o", "json").stdout)
    return obj


def _manifest(name: str, autoscaling: dict[str, Any]) -> dict[str, Any]:
    spec = {
        "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
        "runtime": {"device": "cpu"},
        "autoscaling": autoscaling,
    }
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": spec}


def _condition(cluster: Cluster, ns: str, name: str, type_: str) -> dict[str, Any] | None:
    conds = (_get(cluster, ns, "kisvc", name).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), None)


def _replicas(cluster: Cluster, ns: str, name: str) -> int:
    return int(_get(cluster, ns, "deployment", name)["spec"].get("replicas", 1))


def _events(cluster: Cluster, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    found = cluster.kubectl(
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        f"involvedObject.name={name},reason={reason}",
        "-o",
        "json",
    ).stdout
    items: list[dict[str, Any]] = json.loads(found)["items"]
    return items


def _scale_to_zero_as_the_autoscaler(cluster: Cluster, ns: str, name: str, when: dt.datetime) -> str:
    """What the autoscaler writes when it takes a service to zero: the moment first, then the scale."""
    since = rfc3339.format_time(when)
    cluster.kubectl(
        "patch",
        "kisvc",
        name,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        f"--field-manager={api.AUTOSCALER_FIELD_MANAGER}",
        "-p",
        json.dumps({"status": {"scaledToZeroAt": since}}),
    )
    cluster.kubectl(
        "patch",
        "deployment",
        name,
        "-n",
        ns,
        "--subresource=scale",
        "--type=merge",
        f"--field-manager={api.AUTOSCALER_FIELD_MANAGER}",
        "-p",
        json.dumps({"spec": {"replicas": 0}}),
    )
    return since


def _demand(cluster: Cluster, ns: str, name: str, when: dt.datetime) -> None:
    """What the activator writes for a held request: a merge patch of the demand annotation."""
    patch = {"metadata": {"annotations": {DEMAND_ANNOTATION: demand_value(when)}}}
    cluster.kubectl("patch", "kisvc", name, "-n", ns, "--type=merge", "-p", json.dumps(patch))


def test_a_demand_newer_than_the_scale_to_zero_brings_one_replica_back(
    cluster: Cluster, op_namespace: str, zero_operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "zero"
    cluster.apply(_manifest(name, ZERO), "-n", ns)
    wait_until(lambda: _replicas(cluster, ns, name) == 1, timeout=30, message="Deployment at 1")
    enabled = wait_until(
        lambda: _condition(cluster, ns, name, conditions.CONDITION_SCALE_TO_ZERO),
        timeout=30,
        message="ScaleToZero",
    )
    assert (enabled["status"], enabled["reason"]) == ("True", conditions.SCALE_TO_ZERO_ENABLED)

    now = dt.datetime.now(dt.UTC)
    since = _scale_to_zero_as_the_autoscaler(cluster, ns, name, now)
    ready = wait_until(
        lambda: (
            (c := _condition(cluster, ns, name, conditions.CONDITION_READY))
            and c["reason"] == conditions.SCALED_TO_ZERO
            and c
        ),
        timeout=30,
        message="Ready=True ScaledToZero",
    )
    assert ready["status"] == "True" and "a request brings one back" in ready["message"]
    status = _get(cluster, ns, "kisvc", name)["status"]
    assert status["updatedReady"] == "0/0" and status["scaledToZeroAt"] == since
    assert _condition(cluster, ns, name, conditions.CONDITION_RECONCILING) is None
    assert _condition(cluster, ns, name, conditions.CONDITION_STALLED) is None
    # what Flux (kstatus, the real one) and Argo CD (the documented health check) read: healthy
    at_zero = _get(cluster, ns, "kisvc", name)
    assert kstatus(at_zero)[0] == "Current"
    assert argocd_health(at_zero)["status"] == "Healthy"

    # a demand older than the scale to zero (a request the last replica already answered): nothing
    _demand(cluster, ns, name, now - dt.timedelta(seconds=60))
    time.sleep(4.0)
    assert _replicas(cluster, ns, name) == 0
    assert _events(cluster, ns, name, conditions.SCALED_FROM_ZERO) == []

    # a held request's demand: the reconciler, the one writer, applies 1 at once (a watch event)
    asked = time.monotonic()
    _demand(cluster, ns, name, dt.datetime.now(dt.UTC))
    wait_until(lambda: _replicas(cluster, ns, name) == 1, timeout=15, message="Deployment back at 1")
    took = time.monotonic() - asked
    print(f"0 -> 1 took {took:.2f} s after the demand")
    assert took < 10.0, f"0 -> 1 took {took:.1f} s after the demand"
    (event,) = wait_until(
        lambda: _events(cluster, ns, name, conditions.SCALED_FROM_ZERO), timeout=15, message="Event"
    )
    assert event["type"] == "Normal" and "0 → 1" in event["message"] and since in event["message"]
    assert _events(cluster, ns, name, conditions.DRIFT_REVERTED) == []
    waking = wait_until(
        lambda: (
            (c := _condition(cluster, ns, name, conditions.CONDITION_READY))
            and c["reason"] != conditions.SCALED_TO_ZERO
            and c
        ),
        timeout=15,
        message="Ready leaves ScaledToZero",
    )
    assert (waking["status"], waking["reason"]) == ("False", conditions.PROGRESSING)


def test_without_the_activator_min_replicas_zero_keeps_one_replica_and_says_why(
    cluster: Cluster, tmp_path: Path
) -> None:
    ns = f"kisvc-zero-off-{secrets.token_hex(3)}"
    cluster.create_namespace(ns)
    try:
        with OperatorProcess(
            cluster.kubeconfig,
            namespaces=[ns],
            resync_seconds=300.0,
            log_dir=tmp_path,
            extra_env=dict(TEST_ENV),
        ) as proc:
            proc.wait_ready()
            name = "zero-off"
            cluster.apply(_manifest(name, ZERO), "-n", ns)  # accepted by the API server
            wait_until(lambda: _replicas(cluster, ns, name) == 1, timeout=30, message="Deployment at 1")
            off = wait_until(
                lambda: _condition(cluster, ns, name, conditions.CONDITION_SCALE_TO_ZERO),
                timeout=30,
                message="ScaleToZero",
            )
            assert (off["status"], off["reason"]) == ("False", conditions.SCALE_TO_ZERO_UNAVAILABLE)
            assert "activator" in off["message"]
            # a scale to zero (and a demand) changes nothing: the floor is 1 without the activator
            _scale_to_zero_as_the_autoscaler(cluster, ns, name, dt.datetime.now(dt.UTC))
            wait_until(lambda: _replicas(cluster, ns, name) == 1, timeout=15, message="put back at 1")
            assert _events(cluster, ns, name, conditions.SCALED_FROM_ZERO) == []
    finally:
        cluster.release_finalizers(ns)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def test_the_api_server_refuses_min_replicas_zero_without_autoscaling(
    cluster: Cluster, op_namespace: str
) -> None:
    text = json.dumps(_manifest("zero-bad", {"minReplicas": 0}))
    result = cluster.kubectl("apply", "-n", op_namespace, "-f", "-", input=text, check=False)
    assert result.returncode != 0
    assert "minReplicas 0 needs spec.autoscaling.enabled" in result.stderr
    only = json.dumps(_manifest("zero-bad2", {"enabled": True, "scaleToZero": {}}))
    result = cluster.kubectl("apply", "-n", op_namespace, "-f", "-", input=only, check=False)
    assert result.returncode != 0
    assert "scaleToZero applies only with spec.autoscaling.minReplicas 0" in result.stderr
