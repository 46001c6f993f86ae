"""``status.quantization`` end to end but for the pod: a tiny embedder loaded int8 and gated on the
user's texts as the runtime loads it, its figures exported as the runtime exports them
(``RuntimeMetrics.set_report``), scraped by a real Prometheus as the service's pod, read by the operator's
autoscaler (a real ``kubeinfer-operator`` process) and written to the InferenceService's status on the
real API server (whose CRD status schema must keep every field) with the gate's bars; turning autoscaling
off removes them. No pod runs at this tier: the exporter stands in for the runtime's ``/metrics``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.operator import api
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models import load_model
from prometheus_client import start_http_server

from hack.devtools.operator_proc import OperatorProcess
from hack.devtools.prom import PrometheusServer
from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir
from tests.support.cluster import Cluster, wait_until

pytestmark = pytest.mark.timeout(120)

NAME = "gated"
GATE = {"minCosine": 0.5, "minAgreement": 0.1, "texts": {"name": "held-out", "key": "texts.txt"}}


def _isvc(cluster: Cluster, ns: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(cluster.kubectl("get", "kisvc", NAME, "-n", ns, "-o", "json").stdout)
    return obj


def test_the_gates_figures_reach_status_while_the_service_serves(
    cluster: Cluster, crds: None, namespace: str, prometheus: PrometheusServer, tmp_path: Path
) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(f"a question our customers ask, number {i}" for i in range(40)))
    model_dir = tiny_hf_dir(tmp_path / "embedder")
    gate = {"min_cosine": 0.5, "min_agreement": 0.1, "texts_path": str(texts)}
    model = load_model(tiny_hf_config(model_dir, quantization={"mode": "int8-dynamic", "gate": gate}))
    report = model.report()
    metrics = RuntimeMetrics("tiny")
    metrics.set_report(report, model.measured_on)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    operator = OperatorProcess(
        cluster.kubeconfig,
        namespaces=[namespace],
        log_dir=tmp_path / "logs",
        extra_env={"KUBEINFER_PROMETHEUS_URL": prometheus.url, "KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": "1"},
    )
    try:
        target = f"127.0.0.1:{server.server_port}"
        prometheus.set_targets([(target, {"namespace": namespace, "inferenceservice": NAME})])
        cluster.kubectl("create", "configmap", "held-out", "-n", namespace, f"--from-file=texts.txt={texts}")
        manifest = {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": NAME},
            "spec": {
                "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
                "runtime": {"device": "cpu"},
                "quantization": {"mode": "int8-dynamic", "gate": GATE},
                "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 2},
            },
        }
        with operator:
            operator.wait_ready()
            cluster.apply(manifest, "-n", namespace)
            prometheus.wait_for_scrape(target, timeout=60)
            found = wait_until(
                lambda: _isvc(cluster, namespace).get("status", {}).get("quantization"),
                timeout=45,
                message="status.quantization",
            )
            assert {k: v for k, v in found.items() if k != "time"} == {
                "cosineMean": round(report["quantization_cosine_mean_ratio"], 6),
                "retrievalAgreement": round(report["quantization_retrieval_agreement_ratio"], 6),
                "minCosine": 0.5,
                "minAgreement": 0.1,
                "measuredOn": "gate texts",
                "texts": 40,
            }
            assert found["time"].endswith("Z")
            cluster.kubectl(
                "patch",
                "kisvc",
                NAME,
                "-n",
                namespace,
                "--type=merge",
                "-p",
                '{"spec":{"autoscaling":{"enabled":false}}}',
            )
            wait_until(
                lambda: "quantization" not in _isvc(cluster, namespace).get("status", {}),
                timeout=30,
                message="status.quantization removed with autoscaling off",
            )
    finally:
        print(operator.log()[-3000:])
        server.shutdown()
        thread.join(5)
