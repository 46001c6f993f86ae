"""A ModelPool's objects (pure builders) and its planner: the Deployment runs the runtime over the one
ConfigMap mounted whole, a model joining changes the ConfigMap and never the pod template, a pooled
InferenceService owns only its Service (selecting the pool's pods), and the statuses say what the
pool and each of its InferenceServices is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubeinfer.operator import api, conditions
from kubeinfer.operator.builders import (
    build_pool_configmap,
    build_pool_deployment,
    build_service,
    runtime_config,
)
from kubeinfer.operator.reconcile import pool as planner
from kubeinfer.operator.reconcile.owned import OWNED, BuildInputs
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.repository import model_config

from kubeinfer.contract.activator import ISVC_LABEL
from kubeinfer.contract.pool import POOL_LABEL, REPOSITORY_DIR

NOW = "2026-12-05T12:00:00Z"


def _pool_body(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "small", "namespace": "ml", "uid": "u-pool", "generation": 2},
        "spec": {"memoryBudget": "3Gi", "resources": {"gpus": 0, "cpu": "4", "memory": "6Gi"}, **spec},
    }


def _isvc_body(name: str, pool: str | None = "small", namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"u-{name}", "generation": 1},
        "spec": {
            **({"pool": pool} if pool else {}),
            "model": {"uri": f"/models/{name}", "format": "onnx"},
            **spec,
        },
    }


def _isvc(name: str, **spec: Any) -> api.InferenceService:
    return api.InferenceService.from_body(_isvc_body(name, **spec))


POOL = api.ModelPool.from_body(_pool_body(pinned=["bert", "absent"]))


def test_the_deployment_runs_the_repository_mode_over_the_configmap() -> None:
    dep = build_pool_deployment(POOL, ["bert"])
    assert dep["metadata"]["name"] == "small" and dep["spec"]["replicas"] == 1
    assert dep["metadata"]["ownerReferences"][0]["kind"] == "ModelPool"
    pod = dep["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    budget = str(3 * 1024**3)
    assert container["args"] == [
        "serve",
        "--model-repository",
        REPOSITORY_DIR,
        "--memory-budget",
        budget,
        "--pin",
        "bert",
    ]
    assert container["image"] == api.DEFAULT_IMAGE
    assert container["resources"] == {
        "requests": {"cpu": "4", "memory": "6Gi"},
        "limits": {"cpu": "4", "memory": "6Gi"},
    }
    (models,) = [v for v in pod["spec"]["volumes"] if v["name"] == "models"]
    assert models == {"name": "models", "configMap": {"name": "small-repository"}}  # no items: no rollout
    assert {"name": "models", "mountPath": REPOSITORY_DIR, "readOnly": True} in container["volumeMounts"]
    labels = pod["metadata"]["labels"]
    assert labels[POOL_LABEL] == "small" and ISVC_LABEL not in labels
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pod["spec"]["automountServiceAccountToken"] is False and "tolerations" not in pod["spec"]


def test_a_model_joining_changes_the_configmap_only() -> None:
    one = [_isvc("bert")]
    two = [_isvc("bert"), _isvc("resnet", model={"uri": "/models/resnet", "format": "onnx", "name": "rn"})]
    members_one = planner.pool_members("small", "ml", [_isvc_body("bert")])
    assert build_pool_deployment(POOL, planner.pinned_in_force(POOL, members_one)) == build_pool_deployment(
        POOL, ["bert"]
    )
    cm_one, cm_two = build_pool_configmap(POOL, one), build_pool_configmap(POOL, two)
    assert sorted(cm_one["data"]) == ["bert.yaml"] and sorted(cm_two["data"]) == ["bert.yaml", "rn.yaml"]
    assert cm_two["metadata"]["name"] == "small-repository"
    # each key is the model's runtime.yaml as its own InferenceService would have it
    assert (
        cm_two["data"]["rn.yaml"]
        == runtime_config(two[1], two[1].spec.max_queue_delay_in_force(None)).to_yaml()
    )
    assert cm_one["metadata"]["annotations"] != cm_two["metadata"]["annotations"]  # the applied hash moved


def test_the_runtime_reads_the_configmaps_files(tmp_path: Path) -> None:
    isvc = _isvc("rn", model={"uri": "/models/resnet", "format": "onnx"})
    cm = build_pool_configmap(POOL, [isvc])
    (tmp_path / "rn.yaml").write_text(cm["data"]["rn.yaml"])
    cfg = model_config(tmp_path / "rn.yaml", "rn")
    assert cfg.model.name == "rn" and cfg.model.source == "/models/resnet" and cfg.model.format == "onnx"
    assert RuntimeConfig.from_yaml(cm["data"]["rn.yaml"]).repository is None


def test_a_pooled_isvc_owns_its_service_only_selecting_the_pools_pods() -> None:
    isvc = _isvc("bert")
    inputs = BuildInputs(max_queue_delay_seconds=0.005, replicas=1)
    built = {o.kind: o.build(isvc, inputs) for o in OWNED}
    assert {k for k, v in built.items() if v is not None} == {"Service"}
    service = build_service(isvc)
    assert service["metadata"]["name"] == "bert"
    assert service["spec"]["selector"] == build_pool_deployment(POOL, [])["spec"]["selector"]["matchLabels"]
    assert [p["port"] for p in service["spec"]["ports"]] == [8080, 8081]
    # an InferenceService of its own keeps its own pods
    own = api.InferenceService.from_body(_isvc_body("solo", pool=None))
    assert build_service(own)["spec"]["selector"][ISVC_LABEL] == "solo"


def test_members_of_a_pool() -> None:
    gone = _isvc_body("deleted")
    gone["metadata"]["deletionTimestamp"] = NOW
    bodies = [
        _isvc_body("b-second", model={"uri": "/models/x", "format": "onnx", "name": "shared"}),
        _isvc_body("a-first", model={"uri": "/models/y", "format": "onnx", "name": "shared"}),
        _isvc_body("c"),
        _isvc_body("elsewhere", pool="other"),
        _isvc_body("mine-in-other-ns", namespace="other-ns"),
        _isvc_body("solo", pool=None),
        _isvc_body("invalid", resources={"cpu": "8"}),  # refused by the API server; stored by an older CRD
        gone,
    ]
    members = planner.pool_members("small", "ml", bodies)
    assert [m.name for m in members.models] == ["a-first", "c"]
    assert members.served_names() == ["shared", "c"]
    assert members.taken == {"b-second": "a-first"}
    pool = api.ModelPool.from_body(_pool_body(pinned=["c", "shared", "absent"]))
    assert planner.pinned_in_force(pool, members) == ["c", "shared"]


def _deployment(ready: int, replicas: int = 1, pool: str | None = "small") -> dict[str, Any]:
    labels = {POOL_LABEL: pool} if pool else {ISVC_LABEL: "small"}
    return {
        "metadata": {"name": "small", "labels": labels},
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas, "readyReplicas": ready},
    }


def test_pooled_isvc_ready() -> None:
    isvc = _isvc("bert")
    pool_body = _pool_body()
    missing = planner.pooled_ready(isvc, None, None, None)
    assert (missing.status, missing.reason) == ("False", conditions.POOL_NOT_FOUND)
    assert missing.message == "ModelPool small not found in namespace ml"
    taken = planner.pooled_ready(isvc, pool_body, _deployment(1), "other")
    assert (taken.status, taken.reason) == ("False", conditions.MODEL_NAME_TAKEN) and "other" in taken.message
    starting = planner.pooled_ready(isvc, pool_body, _deployment(0), None)
    assert (starting.status, starting.reason, starting.message) == (
        "False",
        conditions.POOL_NOT_READY,
        "ModelPool small: 0/1 replicas ready",
    )
    ready = planner.pooled_ready(isvc, pool_body, _deployment(1, 2), None)
    assert (ready.status, ready.reason) == ("True", conditions.POOL_READY)
    # an InferenceService's Deployment of the pool's name is not the pool's
    other = planner.pooled_ready(isvc, pool_body, _deployment(1, pool=None), None)
    assert other.reason == conditions.POOL_NOT_READY


def test_pooled_status_drops_what_its_own_pods_would_say() -> None:
    isvc = _isvc("bert")
    current = {
        "conditions": [{"type": "Serving", "status": "True"}, {"type": "Reconciling", "status": "True"}],
        "replicas": 1,
    }
    ready = planner.pooled_ready(isvc, _pool_body(), _deployment(1), None)
    out = planner.pooled_status(isvc, ready, current, NOW)
    assert [c["type"] for c in out["conditions"]] == ["Ready"]
    assert out["replicas"] is None and out["url"] == "http://bert.ml.svc.cluster.local:8080"
    assert f"{POOL_LABEL}=small" in out["selector"] and out["observedGeneration"] == 1
    taken = planner.pooled_status(isvc, planner.pooled_ready(isvc, _pool_body(), None, "x"), {}, NOW)
    assert [(c["type"], c["reason"]) for c in taken["conditions"]] == [
        ("Ready", conditions.MODEL_NAME_TAKEN),
        ("Stalled", conditions.MODEL_NAME_TAKEN),
    ]


def test_pool_status() -> None:
    members = planner.pool_members("small", "ml", [_isvc_body("a"), _isvc_body("b")])
    out = planner.pool_status(POOL, _deployment(1), members, {}, NOW)
    assert out["models"] == 2 and out["observedGeneration"] == 2 and out["readyReplicas"] == 1
    (cond,) = out["conditions"]
    assert (cond["type"], cond["status"], cond["reason"], cond["message"]) == (
        "Ready",
        "True",
        conditions.POOL_READY,
        "1/1 replicas ready",
    )
    assert (
        planner.pool_status(POOL, None, members, {}, NOW)["conditions"][0]["reason"]
        == conditions.POOL_NOT_READY
    )
    taken = planner.pool_status(POOL, _deployment(1, pool=None), members, {}, NOW, name_taken=True)
    assert taken["conditions"][0]["reason"] == conditions.POOL_NAME_TAKEN and taken["readyReplicas"] == 0
    assert planner.is_pool_deployment(_deployment(1), "small") and not planner.is_pool_deployment(
        _deployment(1, pool=None), "small"
    )


def test_the_example_pool_renders() -> None:
    docs = list(
        yaml.safe_load_all((Path(__file__).resolve().parents[3] / "examples" / "pool.yaml").read_text())
    )
    (pool_body,) = [d for d in docs if d["kind"] == api.POOL_KIND]
    pool_body["metadata"].update(namespace="ml", uid="u")
    bodies = [{**d, "metadata": {**d["metadata"], "namespace": "ml"}} for d in docs if d["kind"] == api.KIND]
    pool = api.ModelPool.from_body(pool_body)
    members = planner.pool_members(pool.name, "ml", bodies)
    assert members.served_names() == ["minilm-a", "minilm-b"] and not members.taken
    assert sorted(build_pool_configmap(pool, members.models)["data"]) == ["minilm-a.yaml", "minilm-b.yaml"]
    (container,) = build_pool_deployment(pool, planner.pinned_in_force(pool, members))["spec"]["template"][
        "spec"
    ]["containers"]
    assert container["args"][-2:] == ["--pin", "minilm-a"]
