"""The activator as the chart installs it, against the real API server: the activator process runs with
the installed Deployment's arguments and environment and the token of the chart's ServiceAccount for it,
so the chart's RBAC (namespaced mode: a Role in the watched namespace) must let it list and watch what it
watches and write the demand annotation.

No node runs the chart's activator pods here; the process runs on this machine in their stead. Checked:
Ready (every kind listed in the namespace), an InferenceService created afterwards seen through the watch,
a pod of it through the pod watch (the stage names it), a request held for it writes the demand
annotation (read back from the API server) and gets its 504 past its own cold-start budget, and no
request of the activator was forbidden.
"""

from __future__ import annotations

import secrets
import threading
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import pytest

from hack.devtools.activator_proc import ActivatorProcess
from kubeinfer.contract.activator import ACTIVATOR_COMPONENT, API_VERSION, DEMAND_ANNOTATION, ISVC_LABEL, KIND
from tests.support.cluster import Cluster, wait_until
from tests.unit.chart.helm_render import CHART

pytestmark = pytest.mark.timeout(180)


def _ready(act: ActivatorProcess) -> bool:
    try:
        with urllib.request.urlopen(f"http://{act.address}/activator/readyz", timeout=5) as resp:
            return resp.status == 200
    except OSError:  # 503 until listed
        return False


def _isvc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": "default", "format": "huggingface"},
            # the budget of its held requests (the activator's flag applies to file targets only)
            "autoscaling": {
                "enabled": True,
                "minReplicas": 0,
                "maxReplicas": 1,
                "scaleToZero": {"coldStartTimeout": "2s"},
            },
        },
    }


def _pod(name: str, owner: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {ISVC_LABEL: owner}},
        "spec": {"containers": [{"name": "runtime", "image": "kubeinfer-runtime:test"}]},
    }


def test_activator_runs_under_the_charts_namespaced_rbac(
    cluster: Cluster, namespace: str, crds: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = f"ka-{secrets.token_hex(3)}"
    cluster.helm(
        "install", release, CHART, "--namespace", namespace, "--skip-crds",
        "--set", f"watchNamespaces={{{namespace}}}", "--set", f"peering.name={release}",
        "--set", "replicas=0", "--set", "activator.replicas=1",
    )  # fmt: skip
    try:
        dep = cluster.get_json("deployment", f"{release}-kubeinfer-activator", "-n", namespace)
        assert (
            dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
            == ACTIVATOR_COMPONENT
        )
        pod_spec = dep["spec"]["template"]["spec"]
        (c,) = pod_spec["containers"]
        kubeconfig = cluster.kubeconfig_for_service_account(
            namespace, pod_spec["serviceAccountName"], tmp_path / "activator.kubeconfig"
        )
        for e in c["env"]:
            monkeypatch.setenv(e["name"], e["value"])
        # the chart's arguments (--namespaces included), on ports free here, with the ServiceAccount's token
        args = [a for a in c["args"] if not a.startswith(("--port", "--grpc-port", "--targets-from"))]
        assert args == [f"--namespaces={namespace}"]
        with ActivatorProcess(args=args, kubeconfig=kubeconfig) as act:
            wait_until(lambda: _ready(act), timeout=30, message="the activator Ready (every kind listed)")
            cluster.apply([_isvc("late"), _pod("late-0", "late")], "-n", namespace)
            target = f"{namespace}/late"
            act.wait_for(lambda s: "late-0" in (s["targets"].get(target) or {}).get("stage", ""))
            # a request held: the demand annotation is written with the chart's RBAC
            answer: list[int] = []
            held = threading.Thread(
                target=lambda: answer.append(
                    httpx.post(
                        f"http://{act.address}/v2/models/late/infer",
                        headers={"Host": f"late.{namespace}.svc"},
                        json={"inputs": []},
                        timeout=60,
                    ).status_code
                ),
                daemon=True,
            )
            held.start()
            wait_until(
                lambda: (
                    DEMAND_ANNOTATION
                    in (
                        cluster.get_json("kisvc", "late", "-n", namespace)["metadata"].get("annotations")
                        or {}
                    )
                ),
                timeout=30,
                message="the demand annotation",
            )
            held.join(timeout=30)
            assert answer == [504]  # past the InferenceService's cold-start budget
            log = act.log_text()
            # a list or watch refused would be "... (retrying with backoff)", a patch "... not written"
            assert "forbidden" not in log.lower() and "retrying" not in log and "not written" not in log, log
    finally:
        cluster.helm("uninstall", release, "--namespace", namespace, check=False)
