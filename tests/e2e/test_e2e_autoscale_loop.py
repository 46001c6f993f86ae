"""The autoscaler end to end on the real node: the chart's operator pod, Prometheus on the node
discovering the runtime pods (the chart's PodMonitor relabelling), runtime pods run by the kubelet.

The model is the bundled MiniLM of ``examples/minilm.yaml`` (int8-dynamic), with a 400 ms batch
timeout and batches of at most 4. Each runtime pod is limited to 500m CPU (its cgroup) and runs one
torch thread (the runtime's default, CPUs - 1, on this 2-core node), so one replica's capacity is
bounded and a second one adds to it. Load goes through the Service's ClusterIP, one connection per
request (kube-proxy balances connections), so a new pod takes its share. The saturating load of
phase 2 is derived from one replica's capacity measured on the spot (a short closed-loop probe, as
``hack/demo.py`` does). The operator decides every 5 s (the session release's
``autoscaleIntervalSeconds``). Phases (each bounded in time):

1. light open-loop load with a 400 ms max queue delay -> P99 over the 150 ms target, executors idle ->
   ``status.maxQueueDelay`` falls and the running pod applies it (``kubeinfer_max_queue_delay_seconds``
   on its /metrics, from the ConfigMap volume, no restart);
2. closed-loop load, ``SATURATION`` x target x measured capacity clients -> executors busy, P99 over
   target -> replicas 1 -> 2, and the second pod turns Ready;
3. load gone -> after the (10 s) stabilization window replicas fall to 1 and the timeout grows back;
4. Prometheus stopped -> nothing changes, ``AutoscalingActive=False`` reason PrometheusUnavailable;
5. Prometheus back -> ``AutoscalingActive=True`` (reason Active or the kind of hold) and decisions resume.

Only one node runs per machine, so this shares the session's cluster, chart and Prometheus (phase 4
stops and restarts that Prometheus; it is restarted whatever happens).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import dashboard
from hack.devtools.prom import PrometheusServer
from tests.e2e.autoscaled import Load, ServiceView, gauge
from tests.e2e.conftest import OPERATOR_NAMESPACE, RELEASE, GraphCache, runtime_pods
from tests.support.cluster import Cluster, wait_until

ROOT = Path(__file__).resolve().parents[2]
NAME = "scaled"

pytestmark = [pytest.mark.timeout(900), pytest.mark.quiet_node]

#: Closed-loop clients in phase 2 = this x target P99 x one replica's measured capacity (requests/s):
#: by Little's law their mean wait is about this many times the target.
SATURATION = 3.0
TARGET_P99 = 0.15
MAX_QUEUE = 512


def isvc_manifest(namespace: str, graph_cache: str) -> dict[str, Any]:
    """The service, its graphs from the claim ``graph_cache`` (the session's)."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "minilm.yaml").read_text())
    doc["metadata"] = {"name": NAME, "namespace": namespace}
    spec = doc["spec"]
    spec["server"] = {"graphCache": {"claimName": graph_cache}}
    spec["batching"] = {"maxBatchSize": 4, "maxQueueDelay": "400ms", "maxQueueSize": MAX_QUEUE}
    spec["autoscaling"] = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 2,
        "targetP99": f"{TARGET_P99 * 1000:.0f}ms",
        "gpuUtilization": {"low": 0.3, "high": 0.6},
        "maxQueueDelay": {"min": "5ms", "max": "500ms"},
        "window": "10s",
        "scaleDownStabilization": "10s",
        "scaleUpCooldown": "4s",
        "scaleDownCooldown": "2s",
        "maxQueueDelayCooldown": "4s",
        "maxScaleUpStep": 1,
    }
    return doc


def _max_queue_delay_falls(s: ServiceView, url: str, target: str) -> None:
    """Phase 1: P99 over target with idle executors: the max queue delay falls, the running pod applies it."""
    with Load(url, rate=3.0):
        wait_until(
            lambda: (s.max_queue_delay_seconds() or 1.0) < 0.4,
            timeout=120,
            message="status.maxQueueDelay below 400ms",
        )
        wait_until(
            lambda: (gauge(target, "kubeinfer_max_queue_delay_seconds") or 1.0) < 0.4,
            timeout=90,
            message="the running pod's max queue delay below 400ms (ConfigMap volume update)",
        )
    assert s.replicas() == 1
    reason = (s.isvc()["status"].get("lastDecision") or {}).get("reason", "")
    assert "max queue delay" in reason, reason
    (pod,) = runtime_pods(s.cluster, s.namespace, NAME)
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0


def _saturated_scales_up(s: ServiceView, url: str) -> float:
    """Phase 2: saturated, replicas rise and the new pod turns Ready. Returns the max queue delay then."""
    with Load(url, concurrency=8) as probe:
        time.sleep(3.0)
        capacity = probe.ok / 3.0
    clients = min(MAX_QUEUE // 2, max(16, math.ceil(SATURATION * TARGET_P99 * capacity)))
    print(f"one replica completes {capacity:.0f} requests/s (closed loop, 3 s); {clients} clients")
    with Load(url, concurrency=clients):
        wait_until(
            lambda: s.replicas() >= 2,
            timeout=120,
            message=f"scale-up to 2 replicas ({clients} clients, capacity {capacity:.0f}/s)",
        )
        wait_until(
            lambda: len(s.ready_targets()) == 2, timeout=300, interval=2.0, message="a second ready pod"
        )
    timeout_after_load = s.max_queue_delay_seconds()
    assert timeout_after_load is not None
    return timeout_after_load


def _prometheus_outage_holds(s: ServiceView) -> Any:
    """Phase 4: Prometheus stopped, nothing changes and the condition says why; phase 5: it is
    started again (whatever happens). Returns the last decision's time before the outage."""
    s.prometheus.stop()
    try:
        wait_until(
            lambda: s.condition() == ("False", "PrometheusUnavailable"),
            timeout=45,
            message="AutoscalingActive=False PrometheusUnavailable",
        )
        held = (s.replicas(), s.max_queue_delay_seconds(), s.decision_time())
        time.sleep(12)  # two ticks of the operator (5 s)
        assert (s.replicas(), s.max_queue_delay_seconds(), s.decision_time()) == held
    finally:
        # 5. Prometheus back: control resumes.
        s.prometheus.start()
    return held[2]


def _every_dashboard_panel_has_data(s: ServiceView) -> None:
    """Every panel of the chart's Grafana dashboard, its variables set to this InferenceService and
    its rate window to 5 minutes (the load of phases 1-2 and the decisions of 1-3 within it), has at
    least one query that returns a number from the node's Prometheus (runtime pods and operator)."""
    board = json.loads(dashboard.OUT.read_text())

    def values(expr: str) -> list[float]:
        promql = (
            expr.replace("$namespace", s.namespace)
            .replace("$inferenceservice", s.name)
            .replace("$__rate_interval", "5m")
        )
        return [float(r["value"][1]) for r in s.prometheus.query(promql)]

    def missing() -> list[str]:
        by_panel: dict[str, list[float]] = {}
        for title, expr in dashboard.queries(board):
            by_panel.setdefault(title, []).extend(v for v in values(expr) if not math.isnan(v))
        return sorted(title for title, found in by_panel.items() if not found)

    # The operator's series arrive with its next scrape after the status it reflects.
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: not missing(), timeout=30, interval=2.0, message="data in every dashboard panel")
    assert missing() == [], "dashboard panels without data"
    assert len({title for title, _ in dashboard.queries(board)}) == len(dashboard.PANELS)


def test_autoscale_closes_the_loop(
    cluster: Cluster,
    operator_release: str,
    node_prometheus: PrometheusServer,
    namespace: str,
    graph_cache: GraphCache,
) -> None:
    s = ServiceView(cluster, namespace, node_prometheus, NAME)
    cluster.apply(isvc_manifest(namespace, graph_cache.claim(namespace)))
    try:
        targets = wait_until(s.ready_targets, timeout=240, interval=1.0, message="one ready runtime pod")
        assert len(targets) == 1
        wait_until(lambda: s.scraped(targets[0]), timeout=60, interval=1.0, message=f"{targets[0]} scraped")
        # the ConfigMap's 400 ms reached the pod (an idle service's timeout may have grown a step or two:
        # a measured request rate of 0 is idle, and the policy acts on it)
        assert gauge(targets[0], "kubeinfer_max_queue_delay_seconds") == pytest.approx(0.4, abs=0.02)
        url = s.url()

        _max_queue_delay_falls(s, url, targets[0])  # 1.
        timeout_after_load = _saturated_scales_up(s, url)  # 2.

        # 3. Load gone: after the stabilization window replicas fall, the timeout grows back.
        wait_until(lambda: s.replicas() == 1, timeout=120, message="scale-in to 1 replica")
        wait_until(
            lambda: (s.max_queue_delay_seconds() or 0.0) > timeout_after_load,
            timeout=90,
            message="the max queue delay growing back",
        )

        _every_dashboard_panel_has_data(s)
        held_time = _prometheus_outage_holds(s)  # 4. and 5.
        # True with reason Active (a tick that acts) or the kind of hold (e.g. MaxQueueDelayCoolingDown).
        wait_until(lambda: s.condition()[0] == "True", timeout=90, message="AutoscalingActive=True")
        wait_until(
            lambda: s.decision_time() != held_time,
            timeout=90,
            message="a new decision after Prometheus came back",
        )
    except BaseException:
        print("operator log tail:")
        with contextlib.suppress(Exception):
            log = cluster.kubectl(
                "logs", "-n", OPERATOR_NAMESPACE, f"deployment/{RELEASE}", "--tail=80", check=False
            ).stdout
            print(log)
            print(f"isvc status: {s.isvc().get('status')}")
            print(cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout)
        raise
    finally:
        if not node_prometheus.running:
            node_prometheus.start()
