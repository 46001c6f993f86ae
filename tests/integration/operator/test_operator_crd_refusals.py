"""Manifests the API server must refuse (bad quantities, durations, numbers, URIs), message naming the
field; complements tests/integration/operator/test_operator_validation.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from kubeinfer.operator import api

from kubeinfer.contract.instances import MAX_INSTANCES
from tests.integration.operator.test_operator_validation import BASE, _merge
from tests.support.cluster import Cluster

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    # these four passed the schema: -1 and a too-long gpuProduct got 422 from the Deployment, "1.2.3"
    # a 500 on every retry (no condition at all), "." and "0" a pod with a memory limit of 0
    ("negative-cpu", {"resources": {"cpu": "-1"}}, "spec.resources.cpu"),
    ("dotted-cpu", {"resources": {"cpu": "1.2.3"}}, "spec.resources.cpu"),
    ("dot-memory", {"resources": {"memory": "."}}, "spec.resources.memory"),
    ("zero-memory", {"resources": {"memory": "0"}}, "spec.resources.memory"),
    ("negative-replicas", {"replicas": -1}, "spec.replicas"),
    ("huge-replicas", {"replicas": 10**9}, "spec.replicas"),
    ("string-replicas", {"replicas": "3"}, "spec.replicas"),
    ("float-batch-size", {"batching": {"maxBatchSize": 1.5}}, "spec.batching.maxBatchSize"),
    ("negative-duration", {"batching": {"maxQueueDelay": "-5s"}}, "spec.batching.maxQueueDelay"),
    ("spaced-duration", {"batching": {"maxQueueDelay": "10 ms"}}, "spec.batching.maxQueueDelay"),
    ("empty-duration", {"batching": {"maxQueueDelay": ""}}, "spec.batching.maxQueueDelay"),
    ("pvc-without-path", {"model": {"uri": "pvc://claim"}}, "spec.model.uri"),
    ("pvc-empty-path", {"model": {"uri": "pvc://claim/"}}, "spec.model.uri"),
    ("negative-queue", {"batching": {"maxQueueSize": -1}}, "spec.batching.maxQueueSize"),
    # a PromQL range of 0 (every query an error); a skipModules prefix '' (names only the root module:
    # it passed the runtime's typo check and skipped nothing)
    ("zero-window", {"autoscaling": {"window": "0s"}}, "spec.autoscaling.window"),
    # a fleet planned at 0 %, 1 % or over 100 % of a replica's capacity (the schema's minimum let an
    # exact 0 through on this API server: a CEL rule refuses it)
    ("zero-plan-utilization", {"autoscaling": {"planUtilization": 0}}, "spec.autoscaling.planUtilization"),
    ("low-plan-utilization", {"autoscaling": {"planUtilization": 0.01}}, "spec.autoscaling.planUtilization"),
    ("over-plan-utilization", {"autoscaling": {"planUtilization": 1.5}}, "spec.autoscaling.planUtilization"),
    (
        "empty-skip-module",
        {"quantization": {"mode": "int8-dynamic", "skipModules": [""]}},
        "spec.quantization.skipModules[0]",
    ),
    # a model's instances out of the contract's bounds
    ("zero-instances", {"model": {"instances": 0}}, "spec.model.instances"),
    ("many-instances", {"model": {"instances": MAX_INSTANCES + 1}}, "spec.model.instances"),
    ("string-instances", {"model": {"instances": "2"}}, "spec.model.instances"),
    # a node-selector label value: these got a 422 on the Deployment (Ready=False ReconcileFailed)
    (
        "long-gpu-product",
        {"resources": {"gpus": 1, "gpuProduct": "x" * 64}, "runtime": {"device": "auto"}},
        "spec.resources.gpuProduct",
    ),
    (
        "spaced-gpu-product",
        {"resources": {"gpus": 1, "gpuProduct": "NVIDIA H100"}, "runtime": {"device": "auto"}},
        "spec.resources.gpuProduct",
    ),
]


@pytest.mark.parametrize("spec_patch, field", [(p, f) for _, p, f in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_manifest_is_refused_naming_the_field(
    cluster: Cluster, crds: None, namespace: str, spec_patch: dict[str, Any], field: str
) -> None:
    manifest = _merge(BASE, {"spec": spec_patch})
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert result.returncode != 0, f"accepted: {manifest}"
    assert field in result.stderr, result.stderr


@pytest.mark.parametrize("quantity", ["500m", "1.5", "8Gi", "1e3"])
def test_valid_quantities_are_accepted(cluster: Cluster, crds: None, namespace: str, quantity: str) -> None:
    manifest = _merge(BASE, {"spec": {"resources": {"cpu": quantity, "memory": quantity}}})
    # JSON: kubectl's YAML 1.2 would read an unquoted 1e3 as a number
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(manifest), check=False
    )
    assert result.returncode == 0, result.stderr


#: Bad durations that CEL rules also read: each must get the pattern's error alone, not also CEL's
#: "type conversion error from 'string' to 'google.protobuf.Duration'" from a rule parsing it.
ONE_ERROR: list[tuple[str, dict[str, Any], str]] = [
    ("spaced-queue-delay", {"batching": {"maxQueueDelay": "5 ms"}}, "spec.batching.maxQueueDelay"),
    ("unitless-target", {"autoscaling": {"targetP99": "200"}}, "spec.autoscaling.targetP99"),
    ("spaced-window", {"autoscaling": {"window": "1 m"}}, "spec.autoscaling.window"),
    (
        "bad-timeout-max",
        {"autoscaling": {"maxQueueDelay": {"max": "50 ms"}}},
        "spec.autoscaling.maxQueueDelay.max",
    ),
    (
        "bad-timeout-min",
        {"autoscaling": {"maxQueueDelay": {"min": "ms"}}},
        "spec.autoscaling.maxQueueDelay.min",
    ),
]


@pytest.mark.parametrize(
    "spec_patch, field", [(p, f) for _, p, f in ONE_ERROR], ids=[i for i, _, _ in ONE_ERROR]
)
def test_bad_duration_gets_one_error(
    cluster: Cluster, crds: None, namespace: str, spec_patch: dict[str, Any], field: str
) -> None:
    manifest = _merge(BASE, {"spec": spec_patch})
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert result.returncode != 0, f"accepted: {manifest}"
    assert field in result.stderr and "should match" in result.stderr, result.stderr
    assert "type conversion error" not in result.stderr, result.stderr
    # one error: kubectl lists several as "* field: ..." bullets, one without
    assert "\n* " not in result.stderr and not result.stderr.lstrip().startswith("* "), result.stderr


#: A value of each renamed field, as a manifest from before the rename wrote it.
_OLD_VALUES: dict[str, Any] = {"batchTimeout": {"min": "1ms", "max": "20ms"}, "batchTimeoutCooldown": "15s"}


@pytest.mark.parametrize(("old", "new"), sorted(api.RENAMED_AUTOSCALING_FIELDS.items()))
def test_a_renamed_field_is_refused_naming_the_new_one(
    cluster: Cluster, crds: None, namespace: str, old: str, new: str
) -> None:
    # --validate=false: a client without strict field validation, whose unknown field the API server
    # would prune without a word (the autoscaler then silently on its default bounds)
    manifest = _merge(BASE, {"spec": {"autoscaling": {"enabled": True, old: _OLD_VALUES[old]}}})
    result = cluster.kubectl(
        "apply",
        "--validate=false",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump(manifest),
        check=False,
    )
    assert result.returncode != 0, f"accepted: {manifest}"
    assert f"spec.autoscaling.{old} is now spec.autoscaling.{new}" in result.stderr, result.stderr


def _dry_run(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> Any:
    return cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False
    )


#: The API server's refusal of more than one GPU per replica: the field and why.
_GPUS_WHY = (
    "spec.resources.gpus must be 0 or 1: the runtime runs every instance of the model on one GPU (cuda:0)"
)


@pytest.mark.parametrize("pooled", [False, True], ids=["own", "pooled"])
@pytest.mark.parametrize("gpus", [2, 8])
def test_more_than_one_gpu_is_refused_saying_why(
    cluster: Cluster, crds: None, namespace: str, gpus: int, pooled: bool
) -> None:
    spec: dict[str, Any] = (
        # what a pooled InferenceService may write: the pool decides cpu and memory
        {"pool": "small", "model": {"uri": "/models/m", "format": "onnx"}, "resources": {"gpus": gpus}}
        if pooled
        else _merge(BASE["spec"], {"resources": {"gpus": gpus}, "runtime": {"device": "auto"}})
    )
    result = _dry_run(cluster, namespace, {**BASE, "spec": spec})
    assert result.returncode != 0, result.stdout
    assert _GPUS_WHY in result.stderr, result.stderr


def test_a_pool_of_more_than_one_gpu_is_refused_saying_why(
    cluster: Cluster, crds: None, namespace: str
) -> None:
    pool = {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "small"},
        "spec": {"memoryBudget": "1Gi", "resources": {"gpus": 2, "cpu": "1", "memory": "2Gi"}},
    }
    result = _dry_run(cluster, namespace, pool)
    assert result.returncode != 0, result.stdout
    assert _GPUS_WHY in result.stderr, result.stderr
    pool["spec"]["resources"]["gpus"] = 1
    accepted = _dry_run(cluster, namespace, pool)
    assert accepted.returncode == 0, accepted.stderr


def test_instances_and_one_gpu_are_accepted_and_unset_stays_unset(
    cluster: Cluster, crds: None, namespace: str
) -> None:
    one_gpu = _merge(
        BASE,
        {
            "spec": {
                "model": {"instances": MAX_INSTANCES},
                "resources": {"gpus": 1},
                "runtime": {"device": "cuda"},
            }
        },
    )
    result = _dry_run(cluster, namespace, {**one_gpu, "metadata": {"name": "ok"}})
    assert result.returncode == 0, result.stderr
    plain = cluster.kubectl(
        "apply", "--dry-run=server", "-o", "yaml", "-n", namespace, "-f", "-", input=yaml.safe_dump(BASE)
    )
    assert "instances" not in yaml.safe_load(plain.stdout)["spec"]["model"]
