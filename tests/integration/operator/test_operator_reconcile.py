"""The operator against a real control plane: owned objects, edits, status, GC, drift, zero-write resync,
restart, leader election. One ``kubeinfer-operator`` process serves the module (fixture ``operator``)."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeinfer.operator import api
from kubeinfer.operator.builders import build_configmap, build_deployment, build_pdb, build_service
from kubeinfer.operator.reconcile import diff, replicas
from kubeinfer.runtime.config import RuntimeConfig

from hack.devtools.operator_proc import TEST_ENV, WRITE_VERBS, OperatorProcess, api_write_series, series_diff
from tests.support.cluster import Cluster, get_object, wait_until

ROOT = Path(__file__).resolve().parents[3]
#: The examples of one InferenceService each (examples/pool.yaml, a ModelPool and its models, has its own
#: tests: tests/unit/operator/test_operator_pool.py).
EXAMPLES = [
    p
    for p in sorted((ROOT / "examples").glob("*.yaml"))
    if [d.get("kind") for d in yaml.safe_load_all(p.read_text())] == ["InferenceService"]
]
WATCHED = {"deployments", "services", "configmaps", "poddisruptionbudgets", "inferenceservices", "events"}


def _isvc_manifest(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
        "runtime": {"device": "cpu"},
        "replicas": 1,
    }
    base.update(spec)
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": base}


def _create(cluster: Cluster, ns: str, manifest: dict[str, Any]) -> dict[str, Any]:
    cluster.apply(manifest, "-n", ns)
    name = manifest["metadata"]["name"]
    return wait_until(
        lambda: get_object(cluster, ns, "deployment", name), timeout=30, message=f"Deployment {name}"
    )


def _ready(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    isvc = get_object(cluster, ns, "kisvc", name) or {}
    conds = (isvc.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "Ready"), None)


def _api_writes(cluster: Cluster) -> dict[str, float]:
    """API-server write series on the watched resources, DELETE excepted: the namespace controller
    deletes the content of other tests' namespaces in the background (the operator's own DELETEs are
    in its ``own_writes`` counter, checked too)."""
    return api_write_series(
        cluster.kubectl("get", "--raw", "/metrics").stdout, WATCHED, WRITE_VERBS - {"DELETE"}
    )


def _describe(diff: dict[str, float]) -> str:
    return "\n".join(f"  +{v:g} {k}" for k, v in sorted(diff.items()))


def _settle(cluster: Cluster) -> None:
    """Give terminating namespaces up to 20 s to go (their deletes are not ours)."""
    deadline = time.monotonic() + 20
    while (
        time.monotonic() < deadline
        and "Terminating" in cluster.kubectl("get", "namespaces", "--no-headers").stdout
    ):
        time.sleep(1.0)


def _quiet(operator: OperatorProcess, spell: float = 5.0, timeout: float = 60.0) -> None:
    """Wait until ``operator`` sends no write request for ``spell`` seconds (more than two resync periods
    of 2 s), at most ``timeout`` seconds: the module's other objects finish their transitions (Deployments
    rolling, status following them), which take longer on a busy machine. An operator that wrote on every
    resync would never be quiet for that long: the wait fails, naming its writes."""
    deadline = time.monotonic() + timeout
    sent = len(operator.proxy_writes())
    since = time.monotonic()
    while time.monotonic() - since < spell:
        time.sleep(0.5)
        now = len(operator.proxy_writes())
        if now != sent:
            sent, since = now, time.monotonic()
        assert time.monotonic() < deadline, (
            f"the operator kept writing for {timeout:.0f} s; its last writes:\n"
            + "\n".join(operator.proxy_writes()[-20:])
        )


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_produces_expected_objects(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess, example: Path
) -> None:
    ns = op_namespace
    manifest = yaml.safe_load(example.read_text())
    manifest["metadata"]["name"] = f"ex-{example.stem}"
    name = manifest["metadata"]["name"]
    isvc_spec = api.InferenceServiceSpec.from_k8s(manifest["spec"])
    for claim in isvc_spec.pvc_claims():
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim},
                "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}}},
            },
            "-n",
            ns,
        )
    _create(cluster, ns, manifest)
    body = wait_until(lambda: get_object(cluster, ns, "kisvc", name), timeout=10, message="isvc")
    isvc = api.InferenceService.from_body(body)
    svc = wait_until(lambda: get_object(cluster, ns, "service", name), timeout=30, message="Service")
    cm = wait_until(
        lambda: get_object(cluster, ns, "configmap", api.configmap_name(name)), timeout=30, message="CM"
    )
    dep = wait_until(lambda: get_object(cluster, ns, "deployment", name), timeout=30, message="Deployment")

    expected_dep = build_deployment(isvc, replicas=replicas.desired_replicas(isvc, None))
    assert diff.is_subset(expected_dep["spec"]["template"], dep["spec"]["template"])
    assert dep["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    assert dep["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubeinfer"
    assert diff.is_subset(build_service(isvc)["spec"], svc["spec"])
    cfg = RuntimeConfig.from_yaml(cm["data"]["runtime.yaml"])
    expected_cfg = build_configmap(isvc, isvc.spec.max_queue_delay_in_force(None))["data"]["runtime.yaml"]
    assert cfg == RuntimeConfig.from_yaml(expected_cfg)
    if build_pdb(isvc) is not None:
        wait_until(lambda: get_object(cluster, ns, "pdb", name), timeout=30, message="PodDisruptionBudget")
    # status: URL, selector, max queue delay in force, observed generation
    status = wait_until(
        lambda: (
            (get_object(cluster, ns, "kisvc", name) or {}).get("status", {}).get("url")
            and get_object(cluster, ns, "kisvc", name)["status"]
        ),
        timeout=30,
        message="status",
    )
    assert status["url"] == f"http://{name}.{ns}.svc.cluster.local:8080"
    assert status["selector"].count("=") == 3
    assert api.parse_duration(status["maxQueueDelay"]) > 0


def test_batching_edit_changes_configmap_only_model_edit_rolls(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "edit"
    _create(cluster, ns, _isvc_manifest(name, batching={"maxBatchSize": 32, "maxQueueDelay": "5ms"}))
    wait_until(lambda: get_object(cluster, ns, "configmap", "edit-runtime"), timeout=30, message="CM")
    dep_before = get_object(cluster, ns, "deployment", name)
    assert dep_before is not None
    cluster.kubectl(
        "patch",
        "kisvc",
        name,
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"batching": {"maxBatchSize": 16, "maxQueueDelay": "9ms"}}}),
    )

    def cm_updated() -> bool:
        cm = get_object(cluster, ns, "configmap", "edit-runtime") or {}
        cfg = RuntimeConfig.from_yaml(cm["data"]["runtime.yaml"])
        return cfg.batching.max_batch_size == 16 and abs(cfg.batching.max_queue_delay_seconds - 0.009) < 1e-9

    wait_until(cm_updated, timeout=30, message="ConfigMap with the new batching")
    time.sleep(1.0)
    dep_after = get_object(cluster, ns, "deployment", name)
    assert dep_after is not None
    assert dep_after["metadata"]["generation"] == dep_before["metadata"]["generation"]
    assert dep_after["spec"]["template"] == dep_before["spec"]["template"]

    cluster.kubectl(
        "patch", "kisvc", name, "-n", ns, "--type=merge", "-p", '{"spec":{"model":{"uri":"/models/other"}}}'
    )
    rolled = wait_until(
        lambda: (
            (d := get_object(cluster, ns, "deployment", name))
            and d["metadata"]["generation"] > dep_before["metadata"]["generation"]
            and d
        ),
        timeout=30,
        message="Deployment rolled",
    )
    key = "kubeinfer.io/config-hash"
    assert (
        rolled["spec"]["template"]["metadata"]["annotations"][key]
        != (dep_before["spec"]["template"]["metadata"]["annotations"][key])
    )


def test_status_follows_deployment_conditions(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "status"
    _create(cluster, ns, _isvc_manifest(name, replicas=0))
    # 0 replicas: the Deployment controller reports Available=True (MinimumReplicasAvailable)
    cluster.kubectl("wait", "--for=condition=Ready", f"kisvc/{name}", "-n", ns, "--timeout=60s")
    cond = _ready(cluster, ns, name)
    assert cond is not None and cond["reason"] == "MinimumReplicasAvailable"
    # no Pod may be created: the ReplicaSet reports ReplicaFailure (FailedCreate) -> Ready=False
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}},
    }
    cluster.apply(quota, "-n", ns)
    try:
        cluster.kubectl("patch", "kisvc", name, "-n", ns, "--type=merge", "-p", '{"spec":{"replicas":1}}')
        cond = wait_until(
            lambda: (
                (c := _ready(cluster, ns, name))
                and c["status"] == "False"
                and c["reason"] == "FailedCreate"
                and c
            ),
            timeout=60,
            message="Ready=False FailedCreate",
        )
        assert "forbidden" in cond["message"] or "quota" in cond["message"]
        # the Event is posted in the background (``Reconciler._event_later``: the reconcile does not
        # wait for it): on a busy machine it shows a moment after the condition, so it is waited for
        wait_until(
            lambda: (
                "FailedCreate"
                in cluster.kubectl(
                    "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
                ).stdout
            ),
            timeout=30,
            message="the FailedCreate Event",
        )
    finally:
        cluster.kubectl("delete", "resourcequota", "no-pods", "-n", ns, "--ignore-not-found")


def test_missing_pvc_is_a_condition(cluster: Cluster, op_namespace: str, operator: OperatorProcess) -> None:
    ns, name = op_namespace, "nopvc"
    _create(cluster, ns, _isvc_manifest(name, model={"uri": "pvc://absent-claim/model"}))
    cond = wait_until(
        lambda: (c := _ready(cluster, ns, name)) and c["reason"] == "PersistentVolumeClaimNotFound" and c,
        timeout=30,
        message="Ready=False PersistentVolumeClaimNotFound",
    )
    assert cond["status"] == "False" and "absent-claim" in cond["message"]


def test_hand_edit_is_reverted(cluster: Cluster, op_namespace: str, operator: OperatorProcess) -> None:
    ns, name = op_namespace, "drift"
    dep = _create(cluster, ns, _isvc_manifest(name))
    image = dep["spec"]["template"]["spec"]["containers"][0]["image"]
    wait_until(lambda: get_object(cluster, ns, "configmap", f"{name}-runtime"), timeout=30, message="CM")
    cluster.kubectl("set", "image", f"deployment/{name}", "runtime=evil:1", "-n", ns)
    wait_until(
        lambda: (
            get_object(cluster, ns, "deployment", name)["spec"]["template"]["spec"]["containers"][0]["image"]
            == image
        ),
        timeout=30,
        message="image put back",
    )
    cm = get_object(cluster, ns, "configmap", f"{name}-runtime")
    assert cm is not None
    original = cm["data"]["runtime.yaml"]
    cluster.kubectl(
        "patch",
        "configmap",
        f"{name}-runtime",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"data":{"runtime.yaml":"x: 1"}}',
    )
    wait_until(
        lambda: get_object(cluster, ns, "configmap", f"{name}-runtime")["data"]["runtime.yaml"] == original,
        timeout=30,
        message="ConfigMap put back",
    )
    svc = get_object(cluster, ns, "service", name)
    assert svc is not None
    cluster.kubectl("delete", "service", name, "-n", ns)
    wait_until(
        lambda: (
            (new := get_object(cluster, ns, "service", name))
            and new["metadata"]["uid"] != svc["metadata"]["uid"]
        ),
        timeout=30,
        message="Service created again",
    )


def test_delete_garbage_collects_owned_objects_only(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "gc"
    _create(cluster, ns, _isvc_manifest(name, replicas=2))
    wait_until(lambda: get_object(cluster, ns, "pdb", name), timeout=30, message="PDB")
    cluster.kubectl("create", "deployment", "bystander", "--image=registry.invalid/x:1", "-n", ns)
    cluster.kubectl("delete", "kisvc", name, "-n", ns, "--timeout=60s")
    for kind, obj in (
        ("deployment", name),
        ("service", name),
        ("configmap", f"{name}-runtime"),
        ("pdb", name),
    ):
        wait_until(
            lambda k=kind, o=obj: get_object(cluster, ns, k, o) is None,
            timeout=60,
            message=f"{kind} {obj} gone",
        )
    assert get_object(cluster, ns, "deployment", "bystander") is not None


def test_steady_state_resync_makes_zero_writes(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns = op_namespace
    _create(cluster, ns, _isvc_manifest("steady"))
    wait_until(lambda: _ready(cluster, ns, "steady"), timeout=30, message="status written")
    _settle(cluster)
    # the proxy sees this operator's writes (kopf's and its own): creating "steady" took some
    assert any("/deployments" in w for w in operator.proxy_writes()), operator.proxy_log()[-3000:]
    _quiet(operator)  # in-flight transitions of the other objects of the module finish
    writes0, reconciles0, own0 = _api_writes(cluster), operator.reconciles(), operator.own_writes()
    sent0 = len(operator.proxy_writes())
    time.sleep(7.0)  # >= 3 resync periods of 2 s
    writes1, reconciles1, own1 = _api_writes(cluster), operator.reconciles(), operator.own_writes()
    sent = operator.proxy_writes()[sent0:]
    writes_lines = [
        ln for ln in operator.metrics_text().splitlines() if ln.startswith("kubeinfer_operator_api_w")
    ]
    assert own1 - own0 == 0, (
        f"the operator sent {own1 - own0} write requests during a steady-state resync:\n"
        + "\n".join(writes_lines)
        + "\n"
        + operator.log()[-6000:]
    )
    count = len(cluster.get_json("kisvc", "-n", ns)["items"])
    assert reconciles1 - reconciles0 >= 2 * count, "the resync did not run"
    # every write request of the operator process, whatever other tests' processes write meanwhile
    assert not sent, (
        f"the operator process sent {len(sent)} write requests during a steady-state resync:\n"
        + "\n".join(sent)
        + f"\nall writes the API server counted (cluster-wide):\n{_describe(series_diff(writes0, writes1))}"
    )


def test_bad_image_is_a_condition(cluster: Cluster, op_namespace: str, operator: OperatorProcess) -> None:
    """A pod stuck in ImagePullBackOff (status written here as a kubelet would) → Ready=False, that reason."""
    ns, name = op_namespace, "badimage"
    _create(cluster, ns, _isvc_manifest(name, runtime={"image": "registry.invalid/nope:1", "device": "cpu"}))
    pod = wait_until(
        lambda: cluster.get_json("pods", "-n", ns, "-l", f"kubeinfer.io/inferenceservice={name}")["items"],
        timeout=30,
        message="a pod",
    )[0]
    waiting = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "registry.invalid/nope:1"'}
    status = {
        "containerStatuses": [
            {
                "name": "runtime",
                "image": "registry.invalid/nope:1",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": waiting},
            }
        ]
    }
    cluster.kubectl(
        "patch",
        "pod",
        pod["metadata"]["name"],
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )
    cond = wait_until(
        lambda: (c := _ready(cluster, ns, name)) and c["reason"] == "ImagePullBackOff" and c,
        timeout=30,
        message="Ready=False ImagePullBackOff",
    )
    assert cond["status"] == "False" and "registry.invalid/nope:1" in cond["message"]


def test_kubectl_scale_sets_replicas_when_autoscaling_is_off(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = op_namespace, "scaled"
    _create(cluster, ns, _isvc_manifest(name))
    cluster.kubectl("scale", f"kisvc/{name}", "--replicas=3", "-n", ns)
    wait_until(
        lambda: get_object(cluster, ns, "deployment", name)["spec"]["replicas"] == 3,
        timeout=30,
        message="Deployment scaled to 3",
    )


def test_restart_resumes_without_churn(
    cluster: Cluster, op_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = op_namespace
    _settle(cluster)
    time.sleep(3.0)
    operator.stop()
    writes0 = _api_writes(cluster)
    with OperatorProcess(
        cluster.kubeconfig,
        namespaces=[ns],
        resync_seconds=2.0,
        log_dir=tmp_path,
        extra_env=dict(TEST_ENV),
        name="restarted",
        proxy=True,
    ) as again:
        again.wait_ready()
        count = len(cluster.get_json("kisvc", "-n", ns)["items"])
        wait_until(
            lambda: again.reconciles() >= 2 * count, timeout=30, message="initial reconciles + a resync"
        )
        writes1 = _api_writes(cluster)
        own, sent = again.own_writes(), again.proxy_writes()
        assert "/inferenceservices" in again.proxy_log(), "the proxy saw none of the operator's requests"
    assert own == 0, f"the restarted operator sent {own} write requests"
    # every write request of the restarted process, whatever other tests' processes write meanwhile
    assert not sent, (
        f"the restarted operator process sent {len(sent)} write requests:\n"
        + "\n".join(sent)
        + f"\nall writes the API server counted (cluster-wide):\n{_describe(series_diff(writes0, writes1))}"
        + f"\n{again.log()[-3000:]}"
    )


def test_two_operators_only_one_acts_and_the_other_takes_over(
    cluster: Cluster, crds: None, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    peering = f"kubeinfer-{ns}"[:63]
    common: dict[str, Any] = {
        "namespaces": [ns],
        "peering": peering,
        "log_dir": tmp_path,
        "extra_env": dict(TEST_ENV),
    }
    with OperatorProcess(cluster.kubeconfig, priority=200, name="high", **copy.deepcopy(common)) as high:
        high.wait_ready()
        wait_until(lambda: get_object(cluster, ns, "kopfpeering", peering), timeout=30, message="KopfPeering")
        time.sleep(2.0)
        with OperatorProcess(cluster.kubeconfig, priority=100, name="low", **copy.deepcopy(common)) as low:
            low.wait_ready()
            wait_until(
                lambda: "Pausing the watch-stream for inferenceservices" in low.log(),
                timeout=30,
                message="low-priority operator paused",
            )
            time.sleep(3.0)  # it stays paused: the high-priority peer keeps its keep-alive fresh
            _create(cluster, ns, _isvc_manifest("leader"))
            wait_until(lambda: _ready(cluster, ns, "leader"), timeout=30, message="status written")
            time.sleep(2.0)
            assert high.reconciles() > 0
            assert low.reconciles() == 0, low.log()[-3000:]
            assert "Resuming the watch-stream for inferenceservices" not in low.log()
            # the leader exits (it leaves the peering object): the other one takes over
            high.stop()
            wait_until(
                lambda: "Resuming the watch-stream for inferenceservices" in low.log(),
                timeout=30,
                message="the remaining operator resumes",
            )
            _create(cluster, ns, _isvc_manifest("follower"))
            wait_until(
                lambda: _ready(cluster, ns, "follower"), timeout=30, message="status written by the other"
            )
            assert low.reconciles() > 0
            cluster.kubectl("delete", "kisvc", "--all", "-n", ns, "--timeout=60s")  # while an operator runs
