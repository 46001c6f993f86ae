"""The autoscaler end to end, all real: control plane, operator process, Prometheus scraping real
``kubeinfer-runtime`` processes (one per Deployment replica, run by ``hack/localpods.py``).

The model is a small TorchScript stack of 256x256 matmuls whose depth is calibrated at test start so
that a batch of 4 takes ~40 ms on one CPU thread, and the runtime processes are pinned to one torch
thread (``KUBEINFER_TORCH_THREADS=1``; the runtime's own default is CPUs - 1): a real runtime process
whose service time we control. The saturating load of phase 2 is not a fixed figure either: it is
derived from one replica's capacity measured on the spot (a short closed-loop probe, as
``hack/demo.py`` does), so that a faster runtime still gets a queue whose wait exceeds the target.
Phases (each bounded in time):

1. light open-loop load with a 400 ms batch timeout → P99 over the 150 ms target, executors idle →
   ``status.batchTimeout`` falls and the running runtime applies it (``kubeinfer_max_queue_delay_seconds``);
2. closed-loop load, ``SATURATION`` x target x measured capacity clients → executors busy, P99 over
   target → replicas 1 → 2;
3. load gone → after the (10 s) stabilization window replicas fall to 1 and the timeout grows back;
4. Prometheus stopped → nothing changes, ``AutoscalingActive=False`` reason PrometheusUnavailable;
5. Prometheus back → ``AutoscalingActive=True`` (reason Active or the kind of hold) and decisions resume.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from kubeinfer.operator.api import parse_duration

from hack.localpods import LocalPods
from tests.support.cluster import Cluster, wait_until
from tests.support.operator_proc import OperatorProcess, api_write_counts
from tests.support.prom import PrometheusServer

ROOT = Path(__file__).resolve().parents[3]
DIM = 256
NAME = "scaled"
MODEL = "mm"

pytestmark = pytest.mark.timeout(420)

#: Closed-loop clients in phase 2 = this x target P99 x one replica's measured capacity (requests/s):
#: by Little's law their mean wait is about this many times the target.
SATURATION = 3.0
TARGET_P99 = 0.15
MAX_QUEUE = 512


class Stack(torch.nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(DIM, DIM) / math.sqrt(DIM), requires_grad=False)
        self.depth = depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.depth):
            x = torch.tanh(x @ self.w)
        return x


def make_model(path: Path, batch_seconds: float = 0.04) -> int:
    """Script a matmul stack whose batch-of-4 forward takes about ``batch_seconds`` on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        probe = torch.jit.script(Stack(50))
        x = torch.randn(4, DIM)
        probe(x)
        t0 = time.perf_counter()
        for _ in range(5):
            probe(x)
        per_layer = (time.perf_counter() - t0) / 5 / 50
    finally:
        torch.set_num_threads(threads)
    depth = max(20, min(5000, round(batch_seconds / per_layer)))
    torch.jit.script(Stack(depth)).save(str(path))
    return depth


def isvc_manifest(namespace: str, model_path: Path) -> dict[str, Any]:
    tensor = {"datatype": "FP32", "shape": [-1, DIM]}
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "model": {
                "uri": str(model_path),
                "format": "torchscript",
                "name": MODEL,
                "inputs": [{"name": "x", **tensor}],
                "outputs": [{"name": "out", **tensor}],
            },
            "batching": {"maxBatchSize": 4, "maxQueueDelay": "400ms", "maxQueueSize": MAX_QUEUE},
            "warmup": {"enabled": True, "steps": 1},
            "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
            "runtime": {"device": "cpu"},
            "autoscaling": {
                "enabled": True,
                "minReplicas": 1,
                "maxReplicas": 2,
                "targetP99": f"{TARGET_P99 * 1000:.0f}ms",
                "gpuUtilization": {"low": 0.3, "high": 0.6},
                "batchTimeout": {"min": "5ms", "max": "500ms"},
                "window": "10s",
                "scaleDownStabilization": "10s",
                "scaleUpCooldown": "4s",
                "scaleDownCooldown": "2s",
                "batchTimeoutCooldown": "4s",
                "maxScaleUpStep": 1,
            },
        },
    }


class Load:
    """Requests against the current runtime targets from an asyncio loop in a thread.

    ``rate`` > 0: open loop, that many requests per second; ``concurrency`` > 0: closed loop.
    """

    def __init__(self, targets: Callable[[], list[str]], *, rate: float = 0.0, concurrency: int = 0) -> None:
        self.targets = targets
        self.rate = rate
        self.concurrency = concurrency
        self.sent = 0
        self.ok = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._rr = itertools.count()
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, DIM], "data": [0.01] * DIM}]}
        self._body = body

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    async def _one(self, client: httpx.AsyncClient) -> None:
        targets = self.targets()
        if not targets:
            await asyncio.sleep(0.1)
            return
        target = targets[next(self._rr) % len(targets)]
        self.sent += 1
        try:
            r = await client.post(f"http://{target}/v2/models/{MODEL}/infer", json=self._body)
            self.ok += r.status_code == 200
        except httpx.HTTPError:
            await asyncio.sleep(0.05)

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=MAX_QUEUE, max_keepalive_connections=MAX_QUEUE)
        async with httpx.AsyncClient(timeout=10.0, limits=limits) as client:
            if self.concurrency:

                async def worker() -> None:
                    while not self._stop.is_set():
                        await self._one(client)

                await asyncio.gather(*(worker() for _ in range(self.concurrency)))
            else:
                tasks: set[asyncio.Task[None]] = set()
                while not self._stop.is_set():
                    task = asyncio.create_task(self._one(client))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    await asyncio.sleep(1.0 / self.rate)
                if tasks:
                    await asyncio.wait(tasks, timeout=10)


def gauge(target: str, metric: str) -> float | None:
    text = httpx.get(f"http://{target}/metrics", timeout=5).text
    m = re.search(rf"^{metric}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_autoscale_closes_the_loop(
    cluster: Cluster, namespace: str, prometheus: PrometheusServer, tmp_path: Path
) -> None:
    cluster.kubectl(
        "apply", "--server-side", "-f", str(ROOT / "crds" / "inferenceservices.kubeinfer.io.yaml")
    )
    model_path = tmp_path / "stack.pt"
    depth = make_model(model_path)

    targets: list[str] = []
    labels = {"namespace": namespace, "inferenceservice": NAME}

    def on_targets(new: list[str], _labels: dict[str, str]) -> None:
        targets[:] = list(new)
        prometheus.set_targets([(t, labels) for t in new])

    def isvc() -> dict[str, Any]:
        obj: dict[str, Any] = cluster.get_json("inferenceservices.kubeinfer.io", NAME, "-n", namespace)
        return obj

    def replicas() -> int:
        return int(cluster.get_json("deployment", NAME, "-n", namespace)["spec"]["replicas"])

    def batch_timeout() -> float | None:
        text = (isvc().get("status") or {}).get("batchTimeout")
        return parse_duration(text) if text else None

    def writes() -> tuple[int, int]:
        """(API writes to InferenceServices and ConfigMaps, Autoscaled Events in the namespace)."""
        text = cluster.kubectl("get", "--raw", "/metrics").stdout
        events = cluster.get_json("events", "-n", namespace, "--field-selector", "reason=Autoscaled")
        return api_write_counts(text, {"inferenceservices", "configmaps"}), len(events["items"])

    def condition() -> tuple[str, str]:
        for c in (isvc().get("status") or {}).get("conditions") or []:
            if c.get("type") == "AutoscalingActive":
                return str(c.get("status")), str(c.get("reason"))
        return "", ""

    env = {"KUBEINFER_PROMETHEUS_URL": prometheus.url, "KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": "2"}
    with (
        OperatorProcess(cluster.kubeconfig, log_dir=tmp_path, namespaces=[namespace], extra_env=env) as op,
        LocalPods(
            cluster.kubeconfig,
            namespace,
            NAME,
            workdir=tmp_path / "pods",
            on_targets=on_targets,
            termination_grace_seconds=5.0,
            max_replicas=2,
            extra_args=["--device", "cpu"],
            env={"KUBEINFER_TORCH_THREADS": "1"},
        ),
    ):
        op.wait_ready()
        cluster.apply(isvc_manifest(namespace, model_path))
        try:
            wait_until(lambda: len(targets) == 1, timeout=120, message="one ready runtime process")
            prometheus.wait_for_scrape(targets[0], timeout=30)
            assert gauge(targets[0], "kubeinfer_max_queue_delay_seconds") == pytest.approx(0.4)

            # 1. P99 over target with idle executors: the batch timeout falls, the runtime applies it.
            with Load(lambda: targets, rate=3.0):
                wait_until(
                    lambda: (batch_timeout() or 1.0) < 0.4,
                    timeout=90,
                    message="status.batchTimeout below 400ms",
                )
                wait_until(
                    lambda: (gauge(targets[0], "kubeinfer_max_queue_delay_seconds") or 1.0) < 0.4,
                    timeout=30,
                    message="the running runtime's max queue delay below 400ms",
                )
            assert replicas() == 1
            reason = (isvc()["status"].get("lastDecision") or {}).get("reason", "")
            assert "batch timeout" in reason, reason

            # 2. Saturated: replicas rise.
            with Load(lambda: targets, concurrency=8) as probe:
                time.sleep(3.0)
                capacity = probe.ok / 3.0
            clients = min(MAX_QUEUE // 2, max(16, math.ceil(SATURATION * TARGET_P99 * capacity)))
            print(f"one replica completes {capacity:.0f} requests/s (closed loop, 3 s); {clients} clients")
            with Load(lambda: targets, concurrency=clients):
                wait_until(
                    lambda: replicas() >= 2,
                    timeout=90,
                    message=f"scale-up to 2 replicas ({clients} clients, capacity {capacity:.0f}/s)",
                )
                wait_until(lambda: len(targets) == 2, timeout=120, message="a second runtime process")
            timeout_after_load = batch_timeout()
            assert timeout_after_load is not None

            # 3. Load gone: after the stabilization window replicas fall, the timeout grows back.
            wait_until(lambda: replicas() == 1, timeout=90, message="scale-in to 1 replica")
            wait_until(
                lambda: (batch_timeout() or 0.0) > timeout_after_load,
                timeout=60,
                message="the batch timeout growing back",
            )

            # 4. Prometheus stopped: nothing changes, the condition says why.
            prometheus.stop()
            wait_until(
                lambda: condition() == ("False", "PrometheusUnavailable"),
                timeout=30,
                message="AutoscalingActive=False PrometheusUnavailable",
            )
            held = (replicas(), batch_timeout(), (isvc()["status"].get("lastDecision") or {}).get("time"))
            time.sleep(8)  # four ticks
            assert (
                replicas(),
                batch_timeout(),
                (isvc()["status"].get("lastDecision") or {}).get("time"),
            ) == held

            # 5. Prometheus back: control resumes.
            prometheus.start()
            # True with reason Active (a tick that acts) or the kind of hold (e.g. BatchTimeoutCoolingDown).
            wait_until(lambda: condition()[0] == "True", timeout=60, message="AutoscalingActive=True")
            wait_until(
                lambda: (isvc()["status"].get("lastDecision") or {}).get("time") != held[2],
                timeout=60,
                message="a new decision after Prometheus came back",
            )
        except BaseException:
            print(f"model depth {depth}; operator log tail:\n{op.log()[-6000:]}")
            print(f"isvc status: {isvc().get('status')}")
            raise
