"""The operator killed (SIGKILL) mid-reconcile, and an InferenceService deleted while no operator runs:
the next operator finishes the job (every service gets its objects and a Ready condition; the deleted
one is finalized, its owned objects left to the garbage collector, not re-created)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.devtools.operator_proc import TEST_ENV, OperatorProcess
from tests.integration.operator.test_operator_reconcile import _isvc_manifest, _ready
from tests.support.cluster import Cluster, get_object, wait_until


@pytest.fixture
def ns(cluster: Cluster, crds: None, namespace: str) -> Iterator[str]:
    try:
        yield namespace
    finally:
        cluster.release_finalizers(namespace)  # if a test fails with no operator running


def _operator(cluster: Cluster, ns: str, log_dir: Path, name: str) -> OperatorProcess:
    return OperatorProcess(
        cluster.kubeconfig,
        namespaces=[ns],
        resync_seconds=2.0,
        log_dir=log_dir,
        extra_env=dict(TEST_ENV),
        name=name,
    )


def test_sigkill_mid_reconcile_then_restart_converges(cluster: Cluster, ns: str, tmp_path: Path) -> None:
    names = [f"svc{i}" for i in range(8)]
    with _operator(cluster, ns, tmp_path, "first") as first:
        first.wait_ready()
        for n in names:
            cluster.apply(_isvc_manifest(n), "-n", ns)
        # kill as soon as it has started writing: some services half-done
        wait_until(
            lambda: get_object(cluster, ns, "configmap", f"{names[0]}-runtime"), timeout=30, message="a write"
        )
        assert first.proc is not None
        first.proc.kill()
        first.proc.wait(10)
    with _operator(cluster, ns, tmp_path, "second") as second:
        second.wait_ready()
        for n in names:
            for kind, obj in (("deployment", n), ("service", n), ("configmap", f"{n}-runtime")):
                wait_until(
                    lambda k=kind, o=obj: get_object(cluster, ns, k, o), timeout=30, message=f"{kind} {obj}"
                )
            cond = wait_until(lambda n=n: _ready(cluster, ns, n), timeout=30, message=f"Ready of {n}")
            assert cond["status"] == "False" and cond["reason"] not in ("ReconcileFailed", "InvalidSpec"), (
                cond
            )
        assert second.proc is not None and second.proc.poll() is None
        assert "Traceback" not in second.log(), second.log()[-3000:]


def test_delete_while_operator_down_is_finalized_on_restart(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    with _operator(cluster, ns, tmp_path, "before") as before:
        before.wait_ready()
        cluster.apply(_isvc_manifest("gone"), "-n", ns)
        wait_until(
            lambda: get_object(cluster, ns, "deployment", "gone"), timeout=30, message="Deployment gone"
        )
        wait_until(
            lambda: (get_object(cluster, ns, "kisvc", "gone") or {}).get("metadata", {}).get("finalizers"),
            timeout=30,
            message="kopf's finalizer (for the resync timer)",
        )
    cluster.kubectl("delete", "kisvc", "gone", "-n", ns, "--wait=false")
    time.sleep(1.0)
    held = get_object(cluster, ns, "kisvc", "gone")
    assert held is not None and held["metadata"].get("deletionTimestamp"), "no finalizer held the delete"
    dep_uid = (get_object(cluster, ns, "deployment", "gone") or {})["metadata"]["uid"]
    with _operator(cluster, ns, tmp_path, "after") as after:
        after.wait_ready()
        wait_until(lambda: get_object(cluster, ns, "kisvc", "gone") is None, timeout=30, message="finalized")
        time.sleep(3.0)  # a resync period: nothing must re-create or re-own the children
        # what is left is the garbage collector's (its discovery of a new kind can take ~30 s here; the
        # operator team's GC test waits for it): the same Deployment, owned by the deleted service
        dep = get_object(cluster, ns, "deployment", "gone")
        if dep is not None:
            assert dep["metadata"]["uid"] == dep_uid, "the restarted operator re-created the Deployment"
            assert [o["uid"] for o in dep["metadata"]["ownerReferences"]] == [held["metadata"]["uid"]]
        assert "Traceback" not in after.log(), after.log()[-3000:]
