"""A ModelPool and two pooled InferenceServices against a real API server (no kubelet: no pod runs): the
operator applies the pool's Deployment and its one ConfigMap with both models, each InferenceService
gets its Service selecting the pool's pods and no Deployment of its own; a model leaving changes the
ConfigMap and not the Deployment; the claims of pvc:// models are mounted, a second model on a claim
changing the ConfigMap only; the API server refuses a pooled InferenceService's resources and fetched or
image models, naming the field, and accepts a pvc:// model.

The pool's status from its replicas: a real runtime in model repository mode (a tiny ONNX model and a
broken one) behind a pod object labelled with the pool that the test marks Ready at 127.0.0.1 with the
runtime's port as its ``http`` port, and the Deployment's own pod (no kubelet runs it) marked Ready where
no runtime answers: the operator reads the first pod's repository index and logs the other once; the
broken model's InferenceService is ``Ready=False ModelLoadFailed`` naming the pod and the runtime's cause
while the other's model is loaded there, and the pool counts its bytes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubeinfer.operator import api, conditions
from kubeinfer.runtime.config import RuntimeConfig

from hack.devtools.operator_proc import OperatorProcess
from hack.devtools.runtime_proc import RuntimeProcess
from hack.devtools.runtime_tiny import simple_onnx
from kubeinfer.contract.pool import POOL_LABEL, REPOSITORY_DIR
from tests.support.cluster import Cluster, get_object, wait_until


def _pool(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.POOL_KIND,
        "metadata": {"name": name},
        "spec": {"memoryBudget": "2Gi", "resources": {"gpus": 0, "cpu": "1", "memory": "4Gi"}, **spec},
    }


def _pooled(name: str, pool: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {"pool": pool, "model": {"uri": f"/models/{name}", "format": "onnx"}, **spec},
    }


def _ready(cluster: Cluster, ns: str, kind: str, name: str) -> dict[str, Any]:
    obj = get_object(cluster, ns, kind, name) or {}
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "Ready"), {})


def test_pool_serves_its_models_through_their_own_services(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns = op_namespace
    cluster.apply(_pool("small", pinned=["alpha"]), "-n", ns)
    cluster.apply(_pooled("alpha", "small"), "-n", ns)
    cluster.apply(_pooled("beta", "small"), "-n", ns)

    def both_models() -> dict[str, Any] | None:
        cm = get_object(cluster, ns, "configmap", "small-repository")
        return cm if cm and sorted(cm.get("data") or {}) == ["alpha.yaml", "beta.yaml"] else None

    cm = wait_until(both_models, timeout=30, message="the pool's ConfigMap with both models")
    assert "source: /models/beta" in cm["data"]["beta.yaml"]
    dep = wait_until(
        lambda: get_object(cluster, ns, "deployment", "small"), timeout=30, message="Deployment small"
    )
    assert dep["metadata"]["ownerReferences"][0]["kind"] == api.POOL_KIND
    pod = dep["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["args"][:3] == ["serve", "--model-repository", REPOSITORY_DIR]
    assert container["args"][-2:] == ["--pin", "alpha"]
    (models,) = [v for v in pod["spec"]["volumes"] if v["name"] == "models"]
    assert models["configMap"]["name"] == "small-repository" and "items" not in models["configMap"]
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector[POOL_LABEL] == "small"

    for name in ("alpha", "beta"):
        svc = wait_until(
            lambda n=name: get_object(cluster, ns, "service", n), timeout=30, message=f"Service {name}"
        )
        assert svc["spec"]["selector"] == selector
        assert [p["port"] for p in svc["spec"]["ports"]] == [8080, 8081]
        assert get_object(cluster, ns, "deployment", name) is None
        assert get_object(cluster, ns, "configmap", f"{name}-runtime") is None
        # no kubelet here: the pool has no ready replica, and its models say so
        ready = wait_until(
            lambda n=name: (
                _ready(cluster, ns, "kisvc", n).get("reason") == conditions.POOL_NOT_READY
                and _ready(cluster, ns, "kisvc", n)
            ),
            timeout=30,
            message=f"{name} Ready=False PoolNotReady",
        )
        assert ready["message"] == "ModelPool small: 0/1 replicas ready"
    status = wait_until(
        lambda: (
            ((get_object(cluster, ns, "kpool", "small") or {}).get("status") or {}).get("models") == 2
            and get_object(cluster, ns, "kpool", "small")
        ),
        timeout=30,
        message="the pool's status counts 2 models",
    )["status"]
    assert (
        status["observedGeneration"] == 1 and status["conditions"][0]["reason"] == conditions.POOL_NOT_READY
    )

    # a model leaving changes the ConfigMap only: the Deployment (its pod template) is not written again
    generation = dep["metadata"]["generation"]
    cluster.kubectl("delete", "kisvc", "beta", "-n", ns, "--wait=false")
    wait_until(
        lambda: (
            sorted((get_object(cluster, ns, "configmap", "small-repository") or {}).get("data") or {})
            == ["alpha.yaml"]
        ),
        timeout=30,
        message="beta.yaml gone from the pool's ConfigMap",
    )
    assert (get_object(cluster, ns, "deployment", "small") or {})["metadata"]["generation"] == generation

    # an InferenceService naming a pool that does not exist says so, naming it
    cluster.apply(_pooled("gamma", "nowhere"), "-n", ns)
    missing = wait_until(
        lambda: (
            _ready(cluster, ns, "kisvc", "gamma").get("reason") == conditions.POOL_NOT_FOUND
            and _ready(cluster, ns, "kisvc", "gamma")
        ),
        timeout=30,
        message="gamma Ready=False PoolNotFound",
    )
    assert "ModelPool nowhere" in missing["message"]
    assert (get_object(cluster, ns, "service", "gamma") or {})["spec"]["selector"][POOL_LABEL] == "nowhere"


def test_a_pool_mounts_the_claims_its_models_name(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns = op_namespace
    cluster.apply(_pool("claims"), "-n", ns)
    cluster.apply(
        _pooled("first", "claims", model={"uri": "pvc://models/first.onnx", "format": "onnx"}), "-n", ns
    )

    def claim_volumes() -> list[dict[str, Any]]:
        dep = get_object(cluster, ns, "deployment", "claims") or {}
        volumes = (((dep.get("spec") or {}).get("template") or {}).get("spec") or {}).get("volumes") or []
        return [v for v in volumes if "persistentVolumeClaim" in v]

    wait_until(claim_volumes, timeout=30, message="the pool's Deployment mounts the claim")
    assert claim_volumes() == [
        {"name": "pvc-0", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    ]
    dep = get_object(cluster, ns, "deployment", "claims") or {}
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert {"name": "pvc-0", "mountPath": "/mnt/pvc/models", "readOnly": True} in container["volumeMounts"]

    # a second model on the same claim: the ConfigMap has it, the pod template is not written again
    generation = dep["metadata"]["generation"]
    cluster.apply(
        _pooled("second", "claims", model={"uri": "pvc://models/cv/second", "format": "onnx"}), "-n", ns
    )
    cm = wait_until(
        lambda: (
            (c := get_object(cluster, ns, "configmap", "claims-repository"))
            and sorted(c.get("data") or {}) == ["first.yaml", "second.yaml"]
            and c
        ),
        timeout=30,
        message="the pool's ConfigMap with both models",
    )
    assert "source: /mnt/pvc/models/cv/second" in cm["data"]["second.yaml"]
    assert "source: /mnt/pvc/models/first.onnx" in cm["data"]["first.yaml"]
    # the status is written after the Deployment is applied in the same pass
    wait_until(
        lambda: ((get_object(cluster, ns, "kpool", "claims") or {}).get("status") or {}).get("models") == 2,
        timeout=30,
        message="the pool's status counts 2 models",
    )
    assert (get_object(cluster, ns, "deployment", "claims") or {})["metadata"]["generation"] == generation


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("pooled-resources", _pooled("res", "small", resources={"cpu": "4"}), "spec.resources"),
    ("pooled-gpus", _pooled("gpus", "small", resources={"gpus": 2}), "spec.resources.gpus"),
    ("pooled-replicas", _pooled("reps", "small", replicas=3), "spec.replicas"),
    (
        "pooled-scale-to-zero",
        _pooled("zero", "small", autoscaling={"enabled": True, "minReplicas": 0}),
        "spec.autoscaling",
    ),
    ("pooled-fetched-model", _pooled("fetched", "small", model={"uri": "hf://org/model"}), "spec.model.uri"),
    (
        "pooled-oci-model",
        _pooled("image", "small", model={"uri": "oci://registry.example.com/m/bert:1"}),
        "spec.model.uri",
    ),
    (
        "pooled-auth",
        _pooled("auth", "small", server={"auth": {"bearerTokenSecretRef": {"name": "s", "key": "k"}}}),
        "spec.server.auth",
    ),
    ("pool-budget-over-memory", _pool("pool", memoryBudget="5Gi"), "spec.memoryBudget"),
    ("pool-zero-replicas", _pool("pool", replicas=0), "spec.replicas"),
    # what of spec.autoscaling does not apply to a pool (the max queue delay is each model's; no zero)
    (
        "pool-max-queue-delay",
        _pool("pool", autoscaling={"enabled": True, "maxQueueDelay": {"max": "20ms"}}),
        "spec.autoscaling.maxQueueDelay",
    ),
    (
        "pool-max-queue-delay-cooldown",
        _pool("pool", autoscaling={"maxQueueDelayCooldown": "30s"}),
        "spec.autoscaling.maxQueueDelayCooldown",
    ),
    (
        "pool-to-zero",
        _pool("pool", autoscaling={"enabled": True, "minReplicas": 0}),
        "spec.autoscaling.minReplicas",
    ),
    (
        "pool-autoscaling-bounds",
        _pool("pool", autoscaling={"minReplicas": 3, "maxReplicas": 2}),
        "spec.autoscaling.minReplicas",
    ),
]


@pytest.mark.parametrize("manifest, field", [(m, f) for _, m, f in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_the_api_server_refuses_naming_the_field(
    cluster: Cluster, op_namespace: str, manifest: dict[str, Any], field: str
) -> None:
    result = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        op_namespace,
        "-f",
        "-",
        input=yaml.safe_dump(manifest),
        check=False,
    )
    assert result.returncode != 0, f"accepted: {manifest}"
    assert field in result.stderr, result.stderr


@pytest.mark.parametrize(
    "manifest",
    [
        _pooled("ok", "small", resources={"gpus": 0, "cpu": "2", "memory": "8Gi"}, replicas=1),
        _pooled("claimed", "small", model={"uri": "pvc://models/bert", "format": "onnx"}),
        _pool(
            "scaled",
            autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 4, "targetP99": "300ms"},
        ),
        _pool("written-out", autoscaling={"maxQueueDelay": {"min": "1ms", "max": "50ms"}}),
    ],
    ids=["defaults-written-out", "pvc-model", "pool-autoscaling", "pool-refused-at-defaults"],
)
def test_a_pooled_isvc_is_accepted(cluster: Cluster, op_namespace: str, manifest: dict[str, Any]) -> None:
    result = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        op_namespace,
        "-f",
        "-",
        input=yaml.safe_dump(manifest),
        check=False,
    )
    assert result.returncode == 0, result.stderr


STATUS_MODEL = """\
model:
  source: {source}
  format: onnx
device: cpu
"""


def _patch_status(cluster: Cluster, ns: str, kind: str, name: str, status: dict[str, Any]) -> None:
    body = json.dumps({"status": status})
    cluster.kubectl("patch", kind, name, "-n", ns, "--subresource=status", "--type=merge", "-p", body)


def _mark_ready(cluster: Cluster, ns: str, pod: str) -> None:
    """What a kubelet reports of a pod whose readiness probe passes, at 127.0.0.1."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = [{"type": t, "status": "True", "lastTransitionTime": now} for t in ("PodScheduled", "Ready")]
    ip = {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}
    _patch_status(cluster, ns, "pod", pod, {"phase": "Running", **ip, "conditions": ready})


def _infer(rt: RuntimeProcess, model: str) -> httpx.Response:
    tensor = {"datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
    body = {"inputs": [{"name": n, **tensor} for n in ("INPUT0", "INPUT1")]}
    return httpx.post(f"{rt.url}/v2/models/{model}/infer", json=body, timeout=120)


def test_a_failed_load_is_its_own_isvcs_and_the_pool_counts_the_loaded_bytes(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns, pool = op_namespace, "st"
    root = tmp_path / "models"
    root.mkdir()
    simple_onnx(root / "good.onnx")
    (root / "bad.onnx").write_bytes(b"this is not an ONNX model")
    (root / "st-good.yaml").write_text(STATUS_MODEL.format(source="good.onnx"))
    (root / "st-broken.yaml").write_text(STATUS_MODEL.format(source="bad.onnx"))
    cfg = RuntimeConfig.model_validate({"repository": {"path": str(root), "memory_budget_bytes": 4 << 30}})
    with RuntimeProcess(cfg, ready_timeout=60) as rt:
        cluster.apply(_pool(pool, replicas=1, memoryBudget="1Gi"), "-n", ns)
        cluster.apply(_pooled("st-good", pool), "-n", ns)
        cluster.apply(_pooled("st-broken", pool), "-n", ns)
        wait_until(lambda: get_object(cluster, ns, "deployment", pool), timeout=30, message="Deployment st")
        ports = [{"name": "http", "containerPort": rt.port}, {"name": "grpc", "containerPort": rt.grpc_port}]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "st-0", "labels": {POOL_LABEL: pool}},
            "spec": {"containers": [{"name": "runtime", "image": "kubeinfer-runtime:test", "ports": ports}]},
        }
        cluster.apply(pod, "-n", ns)
        # the Deployment's own replica (kube-controller-manager made it; no kubelet runs it): Ready at an
        # address where no runtime answers, so that the Deployment has a ready replica and the operator
        # one pod that does not answer its index
        replica = wait_until(
            lambda: cluster.get_json("pods", "-n", ns, "-l", f"app.kubernetes.io/instance={pool}")["items"],
            timeout=30,
            message="the pool's Deployment's pod",
        )[0]["metadata"]["name"]
        _mark_ready(cluster, ns, "st-0")
        _mark_ready(cluster, ns, replica)
        assert _infer(rt, "st-good").status_code == 200
        failed = _infer(rt, "st-broken")
        assert failed.status_code == 503
        cause = failed.json()["error"].removeprefix("model 'st-broken' failed to load: ")
        assert cause and cause != failed.json()["error"]

        broken = wait_until(
            lambda: (
                _ready(cluster, ns, "kisvc", "st-broken").get("reason") == conditions.MODEL_LOAD_FAILED
                and _ready(cluster, ns, "kisvc", "st-broken")
            ),
            timeout=60,
            message="st-broken Ready=False ModelLoadFailed",
        )
        assert broken["status"] == "False"
        assert broken["message"] == f"model 'st-broken' failed to load on pod st-0 of ModelPool st: {cause}"
        good = wait_until(
            lambda: (
                (
                    ((get_object(cluster, ns, "kisvc", "st-good") or {}).get("status") or {}).get("model")
                    or {}
                ).get("loadedOn")
                == ["st-0"]
                and get_object(cluster, ns, "kisvc", "st-good")
            ),
            timeout=60,
            message="st-good's model loaded on st-0",
        )
        model = good["status"]["model"]
        assert model["residentBytes"] > 0 and model["loads"] == 1 and model["lastUsed"]
        assert _ready(cluster, ns, "kisvc", "st-good")["reason"] == conditions.POOL_READY
        broken_model = (get_object(cluster, ns, "kisvc", "st-broken") or {})["status"]["model"]
        assert broken_model["loadedOn"] == [] and broken_model["loadFailures"] == 1

        status = wait_until(
            lambda: (
                ((get_object(cluster, ns, "kpool", pool) or {}).get("status") or {}).get("loadedModels") == 1
                and get_object(cluster, ns, "kpool", pool)
            ),
            timeout=60,
            message="the pool counts one loaded model",
        )["status"]
        assert status["residentBytes"] == model["residentBytes"]
        assert status["memoryUsed"].endswith("/1Gi") and status["evictions"] == 0
        assert status["replicaModels"] == [
            {"pod": "st-0", "loaded": ["st-good"], "residentBytes": model["residentBytes"], "evictions": 0}
        ]
        columns = cluster.kubectl("get", "kpool", pool, "-n", ns).stdout
        assert status["memoryUsed"] in columns, columns
        # the replica that does not answer (nothing of a runtime at 127.0.0.1:8080): left out, and logged
        # once for the spell, not on every poll
        log = operator.log()
        assert log.count(f"pod {ns}/{replica}: no model repository index") == 1, log[-3000:]
        assert "Traceback" not in log
