#!/usr/bin/env python3
"""``make bench-cold-start``: repeated cold starts of the bundled MiniLM from zero replicas on the local
one-node cluster, stage by stage, from the demand that wakes the service to its first answer.

What runs: the one-node cluster of ``hack/cluster.py`` (real kubelet and containerd, the runtime image
already in containerd: nothing is pulled), the operator as a local process told that the activator is
installed (``KUBEINFER_ACTIVATOR_ENABLED``; its Service, ``KUBEINFER_ACTIVATOR_SERVICE``, is a Service
``activator`` of the bench's namespace whose EndpointSlice the bench writes), and one InferenceService:
the bundled MiniLM, int8-dynamic on ONNX Runtime, ``autoscaling.minReplicas: 0``, a graph cache volume
(``spec.server.graphCache``: a PersistentVolume on the node, hostPath) and the CPU of ``--cpu`` (the
example's 500m by default).

Each run takes the service to zero as the autoscaler does (``status.scaledToZeroAt``, then the scale
subresource), waits until its pod is gone, then writes the demand annotation as the activator does for
a held request (``t = 0``), and times, on this machine's clock, what follows: the operator's
``replicas 0 -> 1``, the pod created, scheduled, its sandbox, initialized, its container started (pod
watch); the runtime's own stages (fetched, loaded, warmed, first_answer: its
``kubeinfer_cold_start_stage_seconds``, seconds since its process started, placed on this clock by the
first answer); the first 200 to an infer request sent to the pod's IP every 50 ms from the moment it has
one, the pod's Ready condition, and the first 200 through the Service's ClusterIP (kube-proxy). The first
wake runs with the graph cache emptied (the runtime exports and quantizes the graph and compares it), the
others with it warm; their medians are the figures. The ColdStart Event the operator posts for each run
is kept beside. ``--origin request`` times the whole path instead: t = 0 is one request sent to the
Service at zero, which routes it to the activator (``kubeinfer-activator``, a process on the node address
on the activator's ports, its Service's EndpointSlice naming it Ready); the activator holds it, writes the
demand itself and forwards it to the first Ready replica: its answer is ``service_answer``.

Writes ``bench/results/cold_start.json`` (``--out``): every run, the medians, the command, the machine
and its load (``bench/quiet.py``: the bench lock, and a 1-minute load average at most 0.5 before the
cluster starts; the load at each wake is recorded too). Everything it starts is stopped at the end (also
on Ctrl-C and SIGTERM), and ``hack/cluster.py leftovers`` must find nothing. Needs root; about 6 to 10
minutes, the runtime image's import into containerd included when it changed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# ROOT for hack.*; bench/ for quiet
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import httpx  # noqa: E402
import quiet  # noqa: E402
import yaml  # noqa: E402

from hack import images  # noqa: E402
from hack import node as nodes  # noqa: E402
from hack.cluster import DEFAULT_BIN_DIR, ClusterError, ClusterInfo, check_binaries, leftovers, start, stop  # noqa: E402
from hack.devtools.activator_proc import ActivatorProcess  # noqa: E402
from hack.devtools.operator_proc import TEST_ENV, OperatorProcess  # noqa: E402
from hack.podnetwork import NODE_IP  # noqa: E402
from kubeinfer.contract.activator import (  # noqa: E402
    ACTIVATOR_GRPC_PORT,
    ACTIVATOR_PORT,
    DEMAND_ANNOTATION,
    ISVC_LABEL,
    demand_value,
)

NAME = "minilm"
NAMESPACE = "bench-cold-start"
WORKDIR = ROOT / ".cache" / "bench-cold-start"
PV_NAME = "bench-cold-start-graph-cache"
#: The activator's Service (``KUBEINFER_ACTIVATOR_SERVICE``): its EndpointSlice lists the activator process
#: on the node address (``--origin request``), or nothing (``--origin demand``).
ACTIVATOR = "activator"
CLAIM = "graph-cache"
#: The runtime image's user (runtime/Dockerfile): owns the graph cache directory on the node.
RUNTIME_UID = 65532
#: An infer request of one sentence (Open Inference Protocol, JSON).
REQUEST = {
    "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["How do I reset my password?"]}]
}
#: Seconds between two requests to the pod (and to the Service) while it starts.
PROBE_SECONDS = 0.05
#: The most a run may take from the demand to every stage seen, seconds.
RUN_TIMEOUT_SECONDS = 300.0
#: The stages of a run, in the order they happen (seconds from the demand).
STAGES = (
    "replicas_1",
    "pod_created",
    "pod_scheduled",
    "sandbox_ready",
    "initialized",
    "container_started",
    "runtime_process_started",
    "runtime_fetched",
    "runtime_loaded",
    "runtime_warmed",
    "first_answer",
    "pod_ready",
    "service_answer",
)
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


class Api:
    """The few API calls the benchmark makes, over one HTTP/1.1 client with the admin's token (no kubectl
    process in the timed part)."""

    def __init__(self, info: ClusterInfo) -> None:
        self.base = info.server
        self.client = httpx.Client(
            base_url=info.server,
            verify=str(info.ca_path),
            headers={"Authorization": f"Bearer {info.admin_token}"},
            timeout=30.0,
        )

    def get(self, path: str, **params: str) -> dict[str, Any]:
        r = self.client.get(path, params=params)
        r.raise_for_status()
        body: dict[str, Any] = r.json()
        return body

    def merge_patch(self, path: str, patch: dict[str, Any], **params: str) -> dict[str, Any]:
        r = self.client.patch(
            path, params=params, json=patch, headers={"Content-Type": "application/merge-patch+json"}
        )
        r.raise_for_status()
        body: dict[str, Any] = r.json()
        return body

    def watch(
        self, path: str, stop: threading.Event, on_event: Callable[[dict[str, Any]], None], **params: str
    ) -> None:
        """Stream the watch of ``path`` (from the ``resourceVersion`` in ``params``) into ``on_event``
        until ``stop`` is set (looked at on each event) or the server ends it."""
        query = {**params, "watch": "true", "timeoutSeconds": "900"}
        with (
            contextlib.suppress(httpx.HTTPError),
            self.client.stream("GET", path, params=query, timeout=None) as r,
        ):
            for line in r.iter_lines():  # the API server closing it at the end: suppressed
                if stop.is_set():
                    return
                if line:
                    on_event(json.loads(line))


def kubectl(info: ClusterInfo, *args: str, input: str | None = None) -> str:
    env = {**os.environ, "KUBECONFIG": str(info.kubeconfig)}
    cp = subprocess.run(
        [str(info.kubectl_path), *args], env=env, capture_output=True, text=True, input=input, timeout=120
    )
    if cp.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {cp.stderr.strip()}")
    return cp.stdout


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def manifests(cache_dir: Path, cpu: str, before_ready: str | None) -> list[dict[str, Any]]:
    """The namespace, the graph cache's PersistentVolume (hostPath on the node) and its claim, and the
    InferenceService."""
    warmup: dict[str, Any] = {"enabled": True, "steps": 1}
    if before_ready is not None:
        warmup["beforeReady"] = before_ready
    ports = [
        {"name": "http", "port": ACTIVATOR_PORT, "protocol": "TCP"},
        {"name": "grpc", "port": ACTIVATOR_GRPC_PORT, "protocol": "TCP"},
    ]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {  # no selector: its EndpointSlice is written here (the activator runs as a process on the node)
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": ACTIVATOR, "namespace": NAMESPACE},
            "spec": {"ports": ports},
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": PV_NAME},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(cache_dir), "type": "Directory"},
                "claimRef": {"namespace": NAMESPACE, "name": CLAIM},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM, "namespace": NAMESPACE},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": PV_NAME,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        {
            "apiVersion": "kubeinfer.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {
                "model": {"uri": "default", "format": "huggingface"},
                "quantization": {"mode": "int8-dynamic"},
                "batching": {"maxBatchSize": 32, "maxQueueDelay": "5ms"},
                "warmup": warmup,
                "resources": {"gpus": 0, "cpu": cpu, "memory": "1536Mi"},
                "runtime": {"device": "cpu", "engine": "onnxruntime"},
                "server": {"graphCache": {"claimName": CLAIM}},
                # no Prometheus here: the autoscaler holds; the runs scale to zero as it would
                "autoscaling": {
                    "enabled": True,
                    "minReplicas": 0,
                    "maxReplicas": 1,
                    "targetP99": "100ms",
                    "scaleToZero": {"idleAfter": "1h"},
                },
            },
        },
    ]


def runtime_figures(metrics_text: str) -> dict[str, Any]:
    """The runtime's cold-start stages (``kubeinfer_cold_start_stage_seconds``: one observation each,
    so the sum is the value), its graph cache label, and its load and warmup gauges, from ``/metrics``."""
    stages: dict[str, float] = {}
    cache = None
    for m in re.finditer(
        r"^kubeinfer_cold_start_stage_seconds_sum"
        r'\{graph_cache="([^"]+)",model="[^"]*",stage="([^"]+)"\} (\S+)$',
        metrics_text,
        re.M,
    ):
        cache, stages[m.group(2)] = m.group(1), float(m.group(3))
    out: dict[str, Any] = {"stages_since_process_start_s": stages, "graph_cache": cache}
    for gauge in ("kubeinfer_model_load_seconds", "kubeinfer_warmup_seconds"):
        m = re.search(rf"^{gauge}\{{[^}}]*\}} (\S+)$", metrics_text, re.M)
        if m:
            out[gauge.removeprefix("kubeinfer_")] = float(m.group(1))
    return out


class Run:
    """What one wake saw: each stage's first moment (``time.monotonic()``), filled by the watch threads
    and the request probes."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.seen: dict[str, float] = {}
        self.pod_ip: str | None = None
        self.pod_name: str | None = None
        self.lock = threading.Lock()
        self.done = threading.Event()

    def mark(self, stage: str, at: float | None = None) -> None:
        with self.lock:
            if stage not in self.seen:
                self.seen[stage] = time.monotonic() if at is None else at

    def seconds(self) -> dict[str, float]:
        return {k: round(v - self.t0, 3) for k, v in sorted(self.seen.items(), key=lambda kv: kv[1])}


def on_pod_event(run: Run, event: dict[str, Any]) -> None:
    pod = event.get("object") or {}
    if event.get("type") not in ("ADDED", "MODIFIED") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return
    run.mark("pod_created")
    run.pod_name = pod["metadata"]["name"]
    status = pod.get("status") or {}
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    for type_, stage in (
        ("PodScheduled", "pod_scheduled"),
        ("PodReadyToStartContainers", "sandbox_ready"),
        ("Initialized", "initialized"),
        ("Ready", "pod_ready"),
    ):
        if conds.get(type_) == "True":
            run.mark(stage)
    for cs in status.get("containerStatuses") or []:
        if (cs.get("state") or {}).get("running"):
            run.mark("container_started")
    if status.get("podIP"):
        run.pod_ip = status["podIP"]


def on_deployment_event(run: Run, event: dict[str, Any]) -> None:
    dep = event.get("object") or {}
    if int((dep.get("spec") or {}).get("replicas", 0)) >= 1:
        run.mark("replicas_1")


def probe(run: Run, stage: str, url: Callable[[], str | None], stop: threading.Event) -> None:
    """POST the request to ``url()`` every ``PROBE_SECONDS`` (once it has one) until a 200: ``stage``."""
    with httpx.Client(timeout=httpx.Timeout(5.0, connect=0.5)) as client:
        while not stop.is_set():
            target = url()
            if target is not None:
                try:
                    if client.post(target, json=REQUEST).status_code == 200:
                        run.mark(stage)
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(PROBE_SECONDS)


def held_request(run: Run, url: str | None) -> None:
    """One request through the Service at zero, sent at ``run.t0``: the activator holds it, asks for a
    replica and forwards it once one is Ready; its 200 is ``service_answer``."""
    assert url is not None
    with httpx.Client(timeout=RUN_TIMEOUT_SECONDS) as client:
        try:
            if client.post(url, json=REQUEST).status_code == 200:
                run.mark("service_answer")
        except httpx.HTTPError as exc:
            say(f"  ! the held request: {type(exc).__name__}: {exc}")


class Bench:
    """Holds what the benchmark started, so ``close`` stops it in reverse order."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cleanups: list[tuple[str, Callable[[], object]]] = []
        self.info: ClusterInfo | None = None
        self.api: Api | None = None
        self.cache_dir = WORKDIR / "graph-cache"
        self.service_url: str | None = None
        self.activator: ActivatorProcess | None = None

    def close(self) -> None:
        while self.cleanups:
            what, fn = self.cleanups.pop()
            try:
                fn()
                say(f"stopped {what}")
            except Exception as exc:
                say(f"! stopping {what}: {type(exc).__name__}: {exc}")

    def up(self) -> None:
        """Images, the cluster, the CRD, the operator, the graph cache volume, the InferenceService."""
        check_binaries(DEFAULT_BIN_DIR)
        nodes.preflight(WORKDIR / "cluster", DEFAULT_BIN_DIR)
        say("building the images whose inputs changed (hack/images.py)")
        images.build(log=lambda m: say(f"  {m}"))
        cluster_dir = WORKDIR / "cluster"

        def stop_cluster() -> None:
            stop(cluster_dir, log=lambda _m: None)
            left = leftovers(cluster_dir)
            if left:
                raise RuntimeError("left behind on this machine:\n  " + "\n  ".join(left))
            say("nothing left behind by the cluster")

        self.cleanups.append(("the cluster", stop_cluster))
        say("starting the one-node cluster (hack/cluster.py; the images are loaded into containerd)")
        self.info = info = start(
            cluster_dir, node=True, die_with_parent=True, timeout=300.0, log=lambda m: say(f"  {m}")
        )
        self.api = Api(info)
        kubectl(info, "apply", "--server-side", "-f", str(ROOT / "crds"))
        kubectl(
            info, "wait", "--for=condition=Established", "crd/inferenceservices.kubeinfer.io", "--timeout=60s"
        )
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        os.chown(self.cache_dir, RUNTIME_UID, RUNTIME_UID)
        self.cleanups.append(("the graph cache directory", lambda: shutil.rmtree(self.cache_dir)))
        operator = OperatorProcess(
            info.kubeconfig,
            namespaces=[NAMESPACE],
            log_dir=WORKDIR,
            extra_env={
                **TEST_ENV,
                "KUBEINFER_ACTIVATOR_ENABLED": "true",
                "KUBEINFER_ACTIVATOR_SERVICE": f"{NAMESPACE}/{ACTIVATOR}",
            },
        )
        operator.__enter__()
        self.cleanups.append(("the operator", lambda: operator.__exit__(None, None, None)))
        operator.wait_ready()
        docs = manifests(self.cache_dir, self.args.cpu, self.args.before_ready)
        kubectl(info, "apply", "-f", "-", input=yaml.safe_dump_all(docs))
        if self.args.origin == "request":
            self.start_activator(info)
        say(
            f"applied {NAMESPACE}/{NAME}: MiniLM int8-dynamic on onnxruntime, cpu {self.args.cpu}, "
            f"graph cache {self.cache_dir}"
        )
        svc = self.wait(
            "the Service", lambda: self.api_get(f"/api/v1/namespaces/{NAMESPACE}/services/{NAME}"), 120
        )
        self.service_url = f"http://{svc['spec']['clusterIP']}:8080/v2/models/{NAME}/infer"

    def start_activator(self, info: ClusterInfo) -> None:
        """The activator as a process on the node address, on the activator's ports (a Service at zero
        sends there), its targets from the cluster; the EndpointSlice of its Service lists it Ready."""
        activator = ActivatorProcess(
            kubeconfig=info.kubeconfig,
            args=[
                "--host", NODE_IP, "--port", str(ACTIVATOR_PORT), "--grpc-port", str(ACTIVATOR_GRPC_PORT),
                "--namespaces", NAMESPACE,
            ],
        )  # fmt: skip
        activator.start()
        self.cleanups.append(("the activator", activator.stop))
        self.activator = activator
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{ACTIVATOR}-node",
                "namespace": NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": ACTIVATOR,
                    "endpointslice.kubernetes.io/managed-by": "bench.kubeinfer.io",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
            "ports": [
                {"name": "http", "port": ACTIVATOR_PORT, "protocol": "TCP"},
                {"name": "grpc", "port": ACTIVATOR_GRPC_PORT, "protocol": "TCP"},
            ],
        }
        kubectl(info, "apply", "-f", "-", input=json.dumps(slice_))
        say(f"the activator listens on {NODE_IP}:{ACTIVATOR_PORT} (its Service {NAMESPACE}/{ACTIVATOR})")

    def routes_to_activator(self) -> bool:
        """Whether the InferenceService's Service routes to the activator (no selector) and, with the
        activator running, its ``<name>-activator`` EndpointSlice lists it."""
        svc = self.api_get(f"/api/v1/namespaces/{NAMESPACE}/services/{NAME}") or {}
        if (svc.get("spec") or {}).get("selector"):
            return False
        if self.activator is None:
            return True
        found = self.api_get(
            f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices/{NAME}-activator"
        )
        return any(NODE_IP in e.get("addresses", []) for e in (found or {}).get("endpoints") or [])

    def api_get(self, path: str) -> dict[str, Any] | None:
        assert self.api is not None
        try:
            return self.api.get(path)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 404:
                return None
            raise

    @staticmethod
    def wait(what: str, pred: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = pred()
            if value:
                return value
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")

    def pods(self) -> list[dict[str, Any]]:
        found = self.api_get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={ISVC_LABEL}%3D{NAME}")
        return list((found or {}).get("items") or [])

    def first_pod_ready(self) -> None:
        """The pod the InferenceService's creation started (the image's first start on this node: its
        snapshot unpacked), until Ready."""

        def ready() -> bool:
            return any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for p in self.pods()
                for c in (p.get("status") or {}).get("conditions") or []
            )

        t = time.monotonic()
        self.wait("the first pod Ready", ready, 600, interval=1.0)
        say(f"first pod Ready {time.monotonic() - t:.1f} s after the InferenceService was applied")

    def to_zero(self) -> None:
        """What the autoscaler writes when it takes a service to zero, then wait until no pod is left."""
        assert self.api is not None
        base = f"/apis/kubeinfer.io/v1alpha1/namespaces/{NAMESPACE}/inferenceservices/{NAME}"
        self.api.merge_patch(
            f"{base}/status", {"status": {"scaledToZeroAt": utc_now()}}, fieldManager="kubeinfer-autoscaler"
        )
        if self.activator is not None:  # as the autoscaler: the scale once the Service routes to it
            self.wait("the Service routed to the activator", self.routes_to_activator, 60)
        self.api.merge_patch(
            f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{NAME}/scale",
            {"spec": {"replicas": 0}},
            fieldManager="kubeinfer-autoscaler",
        )
        self.wait("no pod left", lambda: not self.pods(), 180)

    def wake(self, label: str) -> dict[str, Any]:
        """One cold start: the demand at t = 0, then every stage until the first answers (pod and
        Service), the pod's /metrics and the operator's ColdStart Event."""
        assert self.api is not None and self.service_url is not None
        time.sleep(self.args.settle)  # let the scale-down's work fade
        load = os.getloadavg()
        pods_rv = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["metadata"]["resourceVersion"]
        deps_rv = self.api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments")["metadata"][
            "resourceVersion"
        ]
        stop = threading.Event()
        run = Run(time.monotonic())
        threads = [
            threading.Thread(
                target=self.api.watch,
                args=(f"/api/v1/namespaces/{NAMESPACE}/pods", stop, lambda e: on_pod_event(run, e)),
                kwargs={"resourceVersion": pods_rv, "labelSelector": f"{ISVC_LABEL}={NAME}"},
                daemon=True,
            ),
            threading.Thread(
                target=self.api.watch,
                args=(
                    f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
                    stop,
                    lambda e: on_deployment_event(run, e),
                ),
                kwargs={"resourceVersion": deps_rv, "fieldSelector": f"metadata.name={NAME}"},
                daemon=True,
            ),
            threading.Thread(
                target=probe,
                args=(
                    run,
                    "first_answer",
                    lambda: run.pod_ip and f"http://{run.pod_ip}:8080/v2/models/{NAME}/infer",
                    stop,
                ),
                daemon=True,
            ),
        ]
        if self.args.origin == "demand":  # a request through the Service every 50 ms
            threads.append(
                threading.Thread(
                    target=probe, args=(run, "service_answer", lambda: self.service_url, stop), daemon=True
                )
            )
        for t in threads:
            t.start()
        time.sleep(0.5)  # the watches are open
        isvc = f"/apis/kubeinfer.io/v1alpha1/namespaces/{NAMESPACE}/inferenceservices/{NAME}"
        run.t0 = time.monotonic()
        if self.args.origin == "request":  # one request to the Service: held by the activator, its demand
            threading.Thread(target=held_request, args=(run, self.service_url), daemon=True).start()
        else:
            demand = demand_value(dt.datetime.now(dt.UTC))
            self.api.merge_patch(isvc, {"metadata": {"annotations": {DEMAND_ANNOTATION: demand}}})
        wanted = {"first_answer", "pod_ready", "service_answer"}
        try:
            self.wait(
                "the first answers and Ready", lambda: wanted <= set(run.seen), RUN_TIMEOUT_SECONDS, 0.05
            )
        finally:
            stop.set()
        assert run.pod_ip is not None
        metrics = httpx.get(f"http://{run.pod_ip}:8080/metrics", timeout=10).text
        runtime = runtime_figures(metrics)
        since_start = runtime["stages_since_process_start_s"]
        if "first_answer" in since_start:
            # the runtime marks its first answer as it sends it: this clock's first answer, less it, is
            # the process's start here (within the answer's transit, milliseconds)
            started = run.seen["first_answer"] - since_start["first_answer"]
            run.mark("runtime_process_started", started)
            for stage in ("fetched", "loaded", "warmed"):
                if stage in since_start:
                    run.mark(f"runtime_{stage}", started + since_start[stage])
        try:
            event = self.wait("the ColdStart Event", lambda: self.cold_start_event(run.pod_name), 30)
        except TimeoutError:
            event = None
        stages = run.seconds()
        annotations = ((self.api.get(isvc).get("metadata") or {}).get("annotations")) or {}
        result = {
            "run": label,
            "demand": annotations.get(DEMAND_ANNOTATION),
            "pod": run.pod_name,
            "loadavg_at_demand": [round(x, 2) for x in load],
            "stages_s": {s: stages[s] for s in STAGES if s in stages},
            "runtime": runtime,
            "cold_start_event": event,
        }
        say(
            f"{label}: first answer {seconds(stages, 'first_answer')}, "
            f"pod Ready {seconds(stages, 'pod_ready')}, via the Service {seconds(stages, 'service_answer')} "
            f"(graph cache {runtime['graph_cache']}; load {load[0]:.2f})"
        )
        say("  " + ", ".join(f"{k} {v:.2f}" for k, v in result["stages_s"].items()))
        return result

    def cold_start_event(self, pod: str | None) -> str | None:
        found = self.api_get(
            f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=involvedObject.name%3D{NAME},reason%3DColdStart"
        )
        for item in (found or {}).get("items") or []:
            if pod and f"(pod {pod})" in item.get("message", ""):
                return str(item["message"])
        return None

    def empty_cache(self) -> list[str]:
        removed = sorted(p.name for p in self.cache_dir.iterdir())
        for p in self.cache_dir.iterdir():
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
        return removed


def seconds(stages: dict[str, float], stage: str) -> str:
    return f"{stages[stage]:.2f} s" if stage in stages else "-"


#: Where the time of a start goes: ``(name, from stage, to stage)``, seconds between two stages.
BREAKDOWN = (
    ("operator: demand to replicas 1", None, "replicas_1"),
    ("controllers: replicas 1 to pod created", "replicas_1", "pod_created"),
    ("kubelet: pod created to container started", "pod_created", "container_started"),
    (
        "runtime: interpreter and imports (process start to fetched)",
        "runtime_process_started",
        "runtime_fetched",
    ),
    ("runtime: model load (fetched to loaded)", "runtime_fetched", "runtime_loaded"),
    ("runtime: warmup before ready (loaded to warmed)", "runtime_loaded", "runtime_warmed"),
    ("kubelet: runtime ready to pod Ready (probes)", "runtime_warmed", "pod_ready"),
    ("kube-proxy: pod Ready to an answer through the Service", "pod_ready", "service_answer"),
)


def breakdown(stages: dict[str, float]) -> dict[str, float]:
    """``BREAKDOWN`` of one run's (or the medians') stages, seconds; a pair not seen is left out."""
    out: dict[str, float] = {}
    for name, first, last in BREAKDOWN:
        if last in stages and (first is None or first in stages):
            out[name] = round(stages[last] - (0.0 if first is None else stages[first]), 3)
    return out


def median_stages(runs: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for stage in STAGES:
        values = [r["stages_s"][stage] for r in runs if stage in r["stages_s"]]
        if values:
            out[stage] = round(statistics.median(values), 3)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=int, default=5, help="warm-cache runs after the empty-cache one (>= 3)"
    )
    parser.add_argument(
        "--cpu", default="500m", help="spec.resources.cpu of the replica (the example's 500m)"
    )
    parser.add_argument(
        "--before-ready",
        choices=("first", "all"),
        default=None,
        help="spec.warmup.beforeReady (unset: the default, first)",
    )
    parser.add_argument(
        "--origin",
        choices=("demand", "request"),
        default="demand",
        help="demand: t = 0 is the demand annotation written as the activator writes it, and a request goes "
        "to the Service every 50 ms; request: t = 0 is one request sent to the Service at zero, which the "
        "activator (a process on the node) holds, asks a replica for and forwards",
    )
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of rest at zero before each wake")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cold_start.json"))
    quiet.add_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench/cold_start.py runs a one-node cluster: it needs root", file=sys.stderr)
        return 2
    # SIGTERM as Ctrl-C: the cleanups run (cluster, operator, activator), nothing is left behind
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    with quiet.quiet_run("cold_start", args, log=say) as quiet_run:
        bench = Bench(args)
        try:
            bench.up()
            bench.first_pod_ready()
            bench.to_zero()
            removed = bench.empty_cache()
            say(f"graph cache emptied ({len(removed)} files): the first wake makes the graphs")
            runs = [bench.wake("empty-cache")]
            for i in range(args.runs):
                bench.to_zero()
                runs.append(bench.wake(f"warm-{i + 1}"))
        except ClusterError as exc:
            print(f"cannot run the cluster here: {exc}", file=sys.stderr)
            return 2
        finally:
            bench.close()
        warm = [r for r in runs if r["run"].startswith("warm")]
        result = {
            "benchmark": "cold_start",
            "command": ["bench/cold_start.py", *(sys.argv[1:] if argv is None else argv)],
            "setup": {
                "model": "bundled all-MiniLM-L6-v2, int8-dynamic, engine onnxruntime",
                "cpu": args.cpu,
                "memory": "1536Mi",
                "warmup_before_ready": args.before_ready or "first (default)",
                "graph_cache": "hostPath PersistentVolume on the node",
                "image": "present in containerd (imagePullPolicy IfNotPresent)",
                "origin": (
                    "t = 0: one request sent to the Service at zero (the activator, a process on the node, "
                    "holds it, writes the demand, forwards it to the first Ready replica)"
                    if args.origin == "request"
                    else "t = 0: the demand annotation written (as the activator does for a held request)"
                ),
            },
            "stages": list(STAGES),
            "empty_cache": runs[0]["stages_s"],
            "empty_cache_breakdown": breakdown(runs[0]["stages_s"]),
            "warm_cache_median": median_stages(warm),
            "warm_cache_median_breakdown": breakdown(median_stages(warm)),
            "runs": runs,
        }
        quiet_run.write(result, args.out, log=say)
        med = result["warm_cache_median"]
        say(
            f"warm cache (median of {len(warm)}): first answer {seconds(med, 'first_answer')}, pod Ready "
            f"{seconds(med, 'pod_ready')}, via the Service {seconds(med, 'service_answer')}; empty cache: "
            f"first answer {seconds(runs[0]['stages_s'], 'first_answer')}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
