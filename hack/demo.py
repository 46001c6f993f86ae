#!/usr/bin/env python3
"""``make demo``: kubeinfer's main job, end to end, on a one-node Kubernetes cluster with the bundled model.

Steps (each printed with its elapsed time):

1. build the images that changed (``hack/images.py``: pause, operator, runtime; seconds when none
   did), start the one-node cluster (``hack/cluster.py``: control plane, containerd, kubelet,
   kube-proxy, CoreDNS on the pod bridge; the images are loaded into the node's containerd), run
   Debian's Prometheus on the node address discovering pods with kubernetes_sd and the chart's
   PodMonitor relabelling, and ``helm install`` the chart: the operator runs as a pod from the local
   image, under the chart's ServiceAccount, with the autoscaler's period shortened through a chart
   value (printed);
2. ``kubectl apply`` of ``examples/minilm.yaml`` (bundled all-MiniLM-L6-v2, int8-dynamic, 500m CPU
   per replica, autoscaling on), with the autoscaler's windows shortened so it acts within a demo's
   minutes (printed);
3. wait until the runtime pod is Ready (model load + quantization + warmup, gated by the readiness
   probe) and the InferenceService says Ready; ``kubectl get pods -o wide`` shows the real pod;
4. send real sentences through ``tritonclient.http`` to the Service's ClusterIP (kube-proxy) and
   print which pairs are paraphrases (cosine similarity of the embeddings);
5. measure what one replica serves (a short closed-loop probe), wait with no load until the probe's
   requests have left the autoscaler's window (else the warm phase's P99 counts them and the
   autoscaler scales out before the burst), then drive a warm phase, a load burst and a cool phase
   through the Service and print, every few seconds, the offered rate, P99 (from Prometheus), the
   replicas and the max queue delay as the autoscaler acts; the burst goes on until the pod it adds
   is Ready (``kubectl get pods -o wide`` again); then ``kubectl get kisvc`` and a summary;
6. stop everything it started (pods, node, control plane, Prometheus) and check that nothing is left
   on the machine, also on Ctrl-C / SIGTERM.

The node needs root and cgroups (``hack.node.preflight``); where it cannot run, the demo says why
and stops. Options: ``--keep`` leaves everything running (prints KUBECONFIG; Ctrl-C stops it),
``--burst-rate`` (default: one replica's capacity measured on the spot) and ``--burst-seconds`` size
the load. Everything lives under ``.cache/demo/``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

from hack import images  # noqa: E402
from hack import node as nodes  # noqa: E402
from hack.cluster import (  # noqa: E402
    DEFAULT_BIN_DIR,
    ClusterError,
    ClusterInfo,
    check_binaries,
    leftovers,
    start,
    stop,
)
from hack.devtools.prom import NODE_PROMETHEUS_BIN, PrometheusServer, podmonitor_scrape_config  # noqa: E402
from hack.podnetwork import NODE_IP  # noqa: E402

NAMESPACE = "demo"
ISVC = "minilm"
RELEASE = "kubeinfer"
RELEASE_NS = "kubeinfer-system"
EXAMPLE = ROOT / "examples" / "minilm.yaml"
CHART = ROOT / "charts" / "kubeinfer"
T0 = time.monotonic()

#: The autoscaler settings the demo uses instead of the example's production-sized windows.
DEMO_AUTOSCALING = {
    # 500m per replica on a 2-core node: a second replica adds real capacity; a third would compete
    # with the load generator (same two cores) and cost another ~45 s pod start
    "maxReplicas": 2,
    "window": "10s",
    "scaleUpCooldown": "5s",
    "scaleDownCooldown": "10s",
    "scaleDownStabilization": "20s",
    "maxQueueDelayCooldown": "3s",
}

#: The operator's autoscaler period for the demo (chart value ``autoscaleIntervalSeconds``, default 15).
AUTOSCALE_INTERVAL_SECONDS = 3
#: The runtime pods' label selector in PromQL, as the autoscaler's default queries write it.
SELECTOR = f'namespace="{NAMESPACE}",inferenceservice="{ISVC}"'
#: The table's P99: the autoscaler's default P99 query over the demo's window.
P99_QUERY = (
    "histogram_quantile(0.99, sum by (le) (rate(kubeinfer_request_duration_seconds_bucket"
    f"{{{SELECTOR}}}[{DEMO_AUTOSCALING['window']}])))"
)
#: The autoscaler's request rate over its window: 0 once the capacity probe's requests have left it.
REQUEST_RATE_QUERY = f"sum(rate(kubeinfer_requests_total{{{SELECTOR}}}[{DEMO_AUTOSCALING['window']}]))"

SENTENCES = [
    "The cat sat on the mat.",
    "A cat was sitting on the rug.",
    "How do I reset my password?",
    "I forgot my password, how can I change it?",
    "The stock market fell sharply today.",
    "Share prices dropped steeply this afternoon.",
    "I love hiking in the mountains.",
]
PARAPHRASE_THRESHOLD = 0.6

#: The load: paragraphs of about 100 tokens (support-ticket sized), so the model, not the Python
#: load generator, is what saturates.
LOAD_TEXTS = [" ".join(SENTENCES[i:] + SENTENCES[:i]) * 2 for i in range(len(SENTENCES))]
#: Burst = this many times the measured capacity of one replica (see ``Demo.capacity``).
BURST_FACTOR = 1.0
#: A request the load generator could not send within this many seconds of its schedule is dropped
#: (counted in the "late" column): an open-loop client must not turn into a backlog.
LATE_SECONDS = 2.0
#: The burst goes on (at most this many seconds past ``--burst-seconds``) until the pod the
#: autoscaler added is Ready: a pod start (image, model load, quantization, warmup) takes ~45 s here.
BURST_EXTENSION_SECONDS = 150.0
#: How long past the autoscaler's window the demo waits, at most, for the capacity probe's requests
#: to leave it (Prometheus scrapes every second; more means the scrapes are late).
PROBE_CLEAR_MARGIN_SECONDS = 20.0


def _seconds(duration: str) -> float:
    """Go duration string -> seconds (for sorting what the status shows); unknown text sorts last."""
    from kubeinfer.operator.api import parse_duration

    try:
        return parse_duration(duration)
    except ValueError:
        return math.inf


def say(msg: str = "") -> None:
    print(msg, flush=True)


def wait_window_clear(
    request_rate: Callable[[], float | None],
    timeout: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    interval: float = 1.0,
) -> float | None:
    """Wait, sending nothing, until ``request_rate()`` (the autoscaler's request rate over its
    window) reads 0 or no series: every request sent before has left the window, so the P99 the
    autoscaler reads from then on is the next phase's alone. Returns the seconds waited, or None
    when ``timeout`` passed first.

    Why idle: while the probe's latencies are still in the window the P99 is over target, and only
    with nothing in flight does the autoscaler read that as a drained backlog and hold; at the warm
    phase's 5 requests/s it would scale out on the probe's own P99."""
    t0 = clock()
    while True:
        try:
            rate = request_rate()
        except Exception:
            rate = math.nan  # Prometheus did not answer: not known to be clear
        if rate is None or rate == 0.0:
            return clock() - t0
        if clock() - t0 >= timeout:
            return None
        sleep(interval)


def step(n: int, msg: str) -> None:
    say(f"\n[{n}/6] {msg}  (+{time.monotonic() - T0:.0f}s)")


def indented(text: str, prefix: str = "  ") -> str:
    return prefix + text.strip().replace("\n", "\n" + prefix)


class CannotRun(Exception):
    """This machine cannot run the one-node cluster (not root, no cgroups, a node already running)."""


def pod_state(pod: dict[str, Any]) -> str:
    """One line saying where a pod is in its life (what ``kubectl get pods`` would say, spelled out)."""
    st = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return "Pending (not scheduled yet)"
    cs = (st.get("containerStatuses") or [{}])[0]
    state = cs.get("state") or {}
    if "waiting" in state:
        return f"{state['waiting'].get('reason', 'Waiting')} on {node}"
    if "running" in state:
        if cs.get("ready"):
            return f"Ready on {node}, pod IP {st.get('podIP')}"
        return f"Running on {node}, pod IP {st.get('podIP')}; not Ready (model load, quantization, warmup)"
    if "terminated" in state:
        return f"container terminated ({state['terminated'].get('reason')})"
    return str(st.get("phase", "?"))


class _Load:
    """The burst's requests: ``one`` POSTs a text on its thread's client (``Connection: close``: a new
    connection each, which kube-proxy balances) and counts the answer in ``stats``; a request whose
    send time is LATE_SECONDS past is dropped (counted ``late``), so a busy client does not pile up."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stats = {"sent": 0, "ok": 0, "rejected": 0, "errors": 0, "late": 0}
        self.latencies: deque[float] = deque(maxlen=5000)
        self._lock = threading.Lock()
        self._local = threading.local()

    def count_sent(self) -> None:
        with self._lock:
            self.stats["sent"] += 1

    def one(self, text: bytes, scheduled: float) -> None:
        if time.monotonic() - scheduled > LATE_SECONDS:  # the client fell behind: drop, do not pile up
            with self._lock:
                self.stats["late"] += 1
            return
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(timeout=10, headers={"Connection": "close"})
        body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text.decode()]}]}
        t = time.monotonic()
        try:
            code = client.post(self.url, json=body).status_code
        except httpx.HTTPError:
            code = -1
        dt = time.monotonic() - t
        with self._lock:
            if code == 200:
                self.stats["ok"] += 1
                self.latencies.append(dt)
            elif code == 429:
                self.stats["rejected"] += 1
            else:
                self.stats["errors"] += 1


@dataclass
class _Ticks:
    """The burst's table clock: its start, the next row's time, and the counters at the last row."""

    start: float
    next_print: float
    last: dict[str, float]


class Demo:
    """Holds what the demo started, so ``close()`` can stop it in reverse order."""

    def __init__(self, workdir: Path, args: argparse.Namespace) -> None:
        self.workdir = workdir
        self.cluster_dir = workdir / "cluster"
        self.args = args
        self.cleanups: list[tuple[str, Callable[[], object]]] = []
        self.cluster: ClusterInfo | None = None
        self.env: dict[str, str] = {}
        self.prom: PrometheusServer | None = None
        self.url = ""  # the Service's ClusterIP:port
        self.summary: dict[str, Any] = {}

    # ------------------------------------------------------------------ helpers
    def on_close(self, what: str, fn: Callable[[], object]) -> None:
        self.cleanups.append((what, fn))

    def close(self) -> None:
        say(f"\n[6/6] cleaning up  (+{time.monotonic() - T0:.0f}s)")
        while self.cleanups:
            what, fn = self.cleanups.pop()
            try:
                fn()
                say(f"  stopped {what}")
            except Exception as e:
                say(f"  ! stopping {what}: {type(e).__name__}: {e}")

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        assert self.cluster is not None
        cp = subprocess.run(
            [str(self.cluster.kubectl_path), *args],
            env=self.env,
            capture_output=True,
            text=True,
            input=input,
            timeout=60,
        )
        if check and cp.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {cp.stderr.strip()}")
        return cp.stdout

    def get(self, *args: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json"))
        return out

    def wait(self, what: str, pred: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                v = pred()
                if v:
                    return v
            except Exception as e:
                last = e
            time.sleep(interval)
        raise TimeoutError(
            f"timed out after {timeout:.0f}s waiting for {what}" + (f" ({last})" if last else "")
        )

    def show(self, *args: str) -> None:
        """Print ``kubectl ARGS`` and its output, as a user would see them."""
        say(f"\n  $ kubectl {' '.join(args)}")
        say(indented(self.kubectl(*args)))

    def runtime_pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get(
            "pods", "-n", NAMESPACE, "-l", f"kubeinfer.io/inferenceservice={ISVC}"
        )["items"]
        return items

    def isvc_ready(self) -> bool:
        st = self.get("inferenceservice", ISVC, "-n", NAMESPACE).get("status") or {}
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])

    def diagnose(self) -> None:
        """After a failure: where the pods are, and the tails of the operator's and runtime's logs."""
        if self.cluster is None:
            return
        for args in (
            ("get", "pods", "-A", "-o", "wide"),
            ("logs", "-n", RELEASE_NS, f"deployment/{RELEASE}", "--tail=20"),
            ("logs", "-n", NAMESPACE, "-l", f"kubeinfer.io/inferenceservice={ISVC}", "--tail=10", "--prefix"),
            ("get", "events", "-n", NAMESPACE, "--field-selector", "type=Warning"),
        ):
            with contextlib.suppress(Exception):
                out = self.kubectl(*args, check=False).strip()
                if out:
                    say(f"\n  $ kubectl {' '.join(args)}\n{indented(out)}")

    # ------------------------------------------------------------------ step 1
    def start_platform(self) -> None:
        step(1, "images, the one-node cluster, Prometheus on the node, helm install of the chart")
        try:
            check_binaries(DEFAULT_BIN_DIR)
            nodes.preflight(self.cluster_dir, DEFAULT_BIN_DIR)
        except ClusterError as e:
            raise CannotRun(str(e)) from e

        t = time.monotonic()
        say("  building the images whose inputs changed (hack/images.py, buildah; seconds when none did)")
        try:
            images.build(log=lambda m: say(f"    {m}"))
        except images.ImageError as e:
            raise CannotRun(f"the images could not be built: {e}") from e
        say(f"  images ready after {time.monotonic() - t:.0f}s")

        t = time.monotonic()
        say("  starting the one-node cluster (hack/cluster.py: control plane, containerd, kubelet,")
        say("  kube-proxy, CoreDNS; first start loads the 6.4 GB runtime image into containerd: ~3.5 min)")
        cluster_dir = self.cluster_dir

        def stop_cluster() -> None:
            stop(cluster_dir, log=lambda _m: None)
            left = leftovers(cluster_dir)
            if left:
                raise RuntimeError("left behind on this machine:\n    " + "\n    ".join(left))
            say("  nothing left behind (processes, mounts, network namespaces, bridge, rules, cgroups)")

        self.on_close("the cluster (pods, node, control plane, pod network)", stop_cluster)
        self.cluster = start(
            cluster_dir, node=True, die_with_parent=True, timeout=180.0, log=lambda m: say(f"    {m}")
        )
        info = self.cluster
        self.env = {
            **os.environ,
            "KUBECONFIG": str(info.kubeconfig),
            "HELM_CACHE_HOME": str(self.workdir / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "helm" / "config"),
            "HELM_DATA_HOME": str(self.workdir / "helm" / "data"),
        }
        say(f"  cluster up after {time.monotonic() - t:.0f}s: API server {info.server}")
        say(f"  (export KUBECONFIG={info.kubeconfig})")
        self.show("get", "nodes", "-o", "wide")

        podmonitor = self._chart_podmonitor()
        job = podmonitor_scrape_config(
            podmonitor,
            api_server=info.server,
            tls_config={
                "ca_file": str(info.ca_path),
                "cert_file": str(info.client_cert),
                "key_file": str(info.client_key),
            },
        )
        # a Prometheus built with kubernetes_sd (make setup, when it builds one) or Debian's
        self.prom = PrometheusServer(
            self.workdir / "prometheus",
            host=NODE_IP,
            scrape_interval=1.0,
            scrape_configs=[job],
            binary=NODE_PROMETHEUS_BIN,
        ).start()
        prom = self.prom
        self.on_close("Prometheus", prom.stop)
        say(
            f"\n  Prometheus {prom.url} ({prom.binary}) on the node address, where pods reach it:\n"
            "  kubernetes_sd finds the runtime pods, the chart's PodMonitor relabelling names them\n"
            "  (namespace, inferenceservice); scraped every 1 s"
        )

        t = time.monotonic()
        cp = subprocess.run(
            [
                str(info.helm_path), "install", RELEASE, str(CHART),
                "--namespace", RELEASE_NS, "--create-namespace",
                "--set", f"prometheus.url={prom.url}",
                "--set", f"autoscaleIntervalSeconds={AUTOSCALE_INTERVAL_SECONDS}",
                "--set", "logFormat=plain",
                "--wait", "--timeout", "5m",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=330,
        )  # fmt: skip
        if cp.returncode != 0:
            raise RuntimeError(f"helm install failed: {cp.stderr.strip()}")
        say(
            f"\n  helm install {RELEASE} charts/kubeinfer -n {RELEASE_NS} --set prometheus.url={prom.url} "
            f"--set autoscaleIntervalSeconds={AUTOSCALE_INTERVAL_SECONDS} --wait   "
            f"({time.monotonic() - t:.0f}s)"
        )
        say(
            f"  the operator runs as a pod from the local image, as ServiceAccount {RELEASE_NS}/{RELEASE} "
            "(the chart's RBAC);\n"
            f"  demo setting: the autoscaler decides every {AUTOSCALE_INTERVAL_SECONDS}s "
            "(chart value autoscaleIntervalSeconds, default 15)"
        )
        self.show("get", "pods", "-n", RELEASE_NS, "-o", "wide")

    def _chart_podmonitor(self) -> dict[str, Any]:
        """The chart's runtime PodMonitor, as helm renders it with monitoring enabled."""
        assert self.cluster is not None
        cp = subprocess.run(
            [
                str(self.cluster.helm_path), "template", RELEASE, str(CHART), "-n", RELEASE_NS,
                "--set", "monitoring.enabled=true",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )  # fmt: skip
        (pm,) = [d for d in yaml.safe_load_all(cp.stdout) if d and d.get("kind") == "PodMonitor"]
        return dict(pm)

    # ------------------------------------------------------------------ step 2
    def apply_example(self) -> None:
        step(2, f"kubectl apply -f examples/minilm.yaml -n {NAMESPACE}")
        self.kubectl("create", "namespace", NAMESPACE)
        doc = yaml.safe_load(EXAMPLE.read_text())
        doc["metadata"]["namespace"] = NAMESPACE
        doc["spec"].setdefault("autoscaling", {}).update(DEMO_AUTOSCALING)
        say(
            "  demo-sized autoscaler windows (the example keeps production values): "
            + json.dumps(DEMO_AUTOSCALING)
        )
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
        spec = doc["spec"]
        say(
            f"  {ISVC}: model {spec['model']['uri']} ({spec['quantization']['mode']}), "
            f"{spec['resources']['cpu']} CPU and {spec['resources']['memory']} per replica, "
            f"maxBatchSize {spec['batching']['maxBatchSize']}, "
            f"maxQueueDelay {spec['batching']['maxQueueDelay']},\n  autoscaling "
            f"{spec['autoscaling']['minReplicas']}..{spec['autoscaling']['maxReplicas']} replicas "
            f"at P99 <= {spec['autoscaling']['targetP99']}"
        )
        self.wait(
            "the operator to create the Deployment", lambda: self.get("deployment", ISVC, "-n", NAMESPACE), 60
        )
        owned = self.kubectl(
            "get", "deployment,service,configmap,pdb", "-n", NAMESPACE, "-o", "name",
            "-l", "app.kubernetes.io/managed-by=kubeinfer",
        ).split()  # fmt: skip
        say("  the operator created: " + ", ".join(owned))

    # ------------------------------------------------------------------ step 3
    def wait_ready(self) -> None:
        step(3, "the scheduler places the runtime pod, the kubelet runs it; Ready after model load + warmup")
        t = time.monotonic()
        seen: dict[str, str] = {}

        def ready() -> bool:
            for pod in self.runtime_pods():
                name, state = pod["metadata"]["name"], pod_state(pod)
                if seen.get(name) != state:
                    seen[name] = state
                    say(f"  +{time.monotonic() - t:3.0f}s  pod {name}: {state}")
            return self.isvc_ready()

        self.wait("the InferenceService's Ready condition", ready, timeout=420, interval=1.0)
        self.summary["first_ready_s"] = time.monotonic() - t
        say(f"  InferenceService Ready after {time.monotonic() - t:.0f}s (the readiness probe gates traffic)")
        self.show("get", "pods", "-n", NAMESPACE, "-o", "wide")
        self.show("get", "kisvc", "-n", NAMESPACE)
        svc = self.get("service", ISVC, "-n", NAMESPACE)
        port = next(p["port"] for p in svc["spec"]["ports"] if p.get("name") == "http")
        self.url = f"{svc['spec']['clusterIP']}:{port}"
        self.show("get", "service,endpointslices", "-n", NAMESPACE)

    # ------------------------------------------------------------------ step 4
    def paraphrases(self) -> None:
        step(4, "real sentences through tritonclient.http to the ClusterIP (Open Inference Protocol)")
        import tritonclient.http as httpclient

        say(f"  InferenceServerClient(url={self.url!r}): kube-proxy routes the ClusterIP to a ready pod")
        client = httpclient.InferenceServerClient(url=self.url, network_timeout=60.0)
        try:
            inp = httpclient.InferInput("text", [len(SENTENCES)], "BYTES")
            inp.set_data_from_numpy(np.array([s.encode() for s in SENTENCES], dtype=np.object_))
            res = client.infer("minilm", [inp], outputs=[httpclient.InferRequestedOutput("embedding")])
            emb = res.as_numpy("embedding").astype(np.float64)
        finally:
            client.close()
        say(
            f"  {len(SENTENCES)} sentences -> embedding {emb.shape} {res.get_output('embedding')['datatype']}"
        )
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        sim = emb @ emb.T
        pairs = sorted(
            ((float(sim[i, j]), i, j) for i in range(len(SENTENCES)) for j in range(i + 1, len(SENTENCES))),
            reverse=True,
        )
        found = []
        for cos, i, j in pairs:
            if cos >= PARAPHRASE_THRESHOLD:
                found.append((SENTENCES[i], SENTENCES[j], cos))
                say(f"  paraphrase (cosine {cos:.2f}): {SENTENCES[i]!r} ~ {SENTENCES[j]!r}")
        best_other = next(((c, i, j) for c, i, j in pairs if c < PARAPHRASE_THRESHOLD), None)
        if best_other:
            c, i, j = best_other
            say(f"  most similar non-paraphrase (cosine {c:.2f}): {SENTENCES[i]!r} / {SENTENCES[j]!r}")
        self.summary["paraphrases"] = len(found)

    # ------------------------------------------------------------------ step 5
    def capacity(self, seconds: float = 4.0, concurrency: int = 8) -> float:
        """Requests/s one replica completes when never idle (closed loop), with the load's texts."""
        done = [0]
        lock = threading.Lock()
        deadline = time.monotonic() + seconds
        url = self.url

        def worker(k: int) -> None:
            with httpx.Client(timeout=30) as client:
                i = k
                while time.monotonic() < deadline:
                    text = LOAD_TEXTS[i % len(LOAD_TEXTS)]
                    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}
                    if client.post(f"http://{url}/v2/models/minilm/infer", json=body).status_code == 200:
                        with lock:
                            done[0] += 1
                    i += 1

        t0 = time.monotonic()
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 35)
        return done[0] / max(1e-6, time.monotonic() - t0)

    def burst(self) -> None:
        step(
            5,
            "load burst through the Service: the autoscaler reads P99 from Prometheus and sets replicas "
            "and the max queue delay",
        )
        assert self.prom is not None
        burst_rate = self._burst_rate()
        self.summary["burst_rate"] = burst_rate
        if self.args.burst_rate is None:
            self._let_probe_leave_window()
        say(
            f"  every request opens its own connection to {self.url}: kube-proxy balances connections,\n"
            "  so a pod the autoscaler adds gets its share as soon as it is Ready"
        )
        phases = [
            ("warm", self.args.base_rate, 15.0),
            ("burst", burst_rate, self.args.burst_seconds),
            ("cool", self.args.base_rate, self.args.cool_seconds),
        ]
        load = _Load(f"http://{self.url}/v2/models/minilm/infer")
        self.summary["stats"] = load.stats
        p99_query = P99_QUERY
        say(f"  P99 = {p99_query}")
        say(
            f"  {'t':>5} {'phase':<6} {'offered/s':>9} {'ok/s':>6} {'429':>4} {'late':>4} {'P99':>8} "
            f"{'ready/want':>10} {'timeout':>8} {'in pods':>8}  autoscaler"
        )
        self.summary["history"] = []
        self.summary["initial_ready"] = len([p for p in self.runtime_pods() if "Ready on" in pod_state(p)])
        with ThreadPoolExecutor(max_workers=256) as pool:
            t_start = time.monotonic()
            self.summary["t_start"] = t_start
            ticks = _Ticks(t_start, t_start + self.args.print_every, {"t": t_start, "sent": 0, "ok": 0})
            for name, rate, seconds in phases:
                self._offer(pool, load, ticks, p99_query, name, rate, seconds)

    def _burst_rate(self) -> float:
        """``--burst-rate``, else BURST_FACTOR x one replica's measured capacity (at least twice the base)."""
        if self.args.burst_rate is not None:
            return float(self.args.burst_rate)
        capacity = self.capacity()
        burst_rate = max(2 * self.args.base_rate, round(BURST_FACTOR * capacity))
        say(
            f"  one replica (500m CPU) serves about {capacity:.0f} requests/s of ~100-token texts "
            f"(4 s closed-loop probe); the burst offers {BURST_FACTOR}x that: {burst_rate:.0f}/s"
        )
        return float(burst_rate)

    def _let_probe_leave_window(self) -> None:
        """Send nothing until the capacity probe's requests have left the autoscaler's window, so the
        warm phase's P99 is the warm phase's (see ``wait_window_clear``)."""
        assert self.prom is not None
        prom = self.prom
        window = DEMO_AUTOSCALING["window"]
        say(
            f"  no load until the probe's requests have left the autoscaler's {window} window\n"
            "  (its P99 would otherwise count them during the warm phase)"
        )
        waited = wait_window_clear(
            lambda: prom.query_value(REQUEST_RATE_QUERY),
            _seconds(window) + PROBE_CLEAR_MARGIN_SECONDS,
        )
        if waited is None:
            say(f"  the request rate over {window} did not reach 0 in time: the P99 may count the probe")
        else:
            say(f"  the window is clear after {waited:.0f}s")

    def _offer(
        self,
        pool: ThreadPoolExecutor,
        load: _Load,
        ticks: _Ticks,
        p99_query: str,
        name: str,
        rate: float,
        seconds: float,
    ) -> None:
        """One phase: ``rate`` requests/s for ``seconds`` (the burst goes on, at most
        BURST_EXTENSION_SECONDS more, until the pod the autoscaler adds is Ready), a table row every
        ``--print-every`` seconds."""
        texts = [t.encode() for t in LOAD_TEXTS]
        phase_end = time.monotonic() + seconds
        hard_end = phase_end + (BURST_EXTENSION_SECONDS if name == "burst" else 0.0)
        extended = False
        interval = 1.0 / rate
        next_send = time.monotonic()
        k = 0
        while True:
            now = time.monotonic()
            if now >= phase_end:
                if now >= hard_end or "added_ready_t" in self.summary:
                    break
                if not extended:
                    extended = True
                    say(f"  (burst goes on until the pod the autoscaler adds is Ready, at most "
                        f"{BURST_EXTENSION_SECONDS:.0f}s more)")  # fmt: skip
            if now >= next_send:
                pool.submit(load.one, texts[k % len(texts)], now)
                k += 1
                load.count_sent()
                next_send += interval
                if now - next_send > 1.0:  # fell behind (machine busy): do not catch up in a burst
                    next_send = now
            if now >= ticks.next_print:
                row = self._observe(p99_query, load.stats, ticks.last, now - ticks.start, name)
                self.summary["history"].append(row)
                ticks.next_print += self.args.print_every
            time.sleep(max(0.0, min(next_send, ticks.next_print) - time.monotonic()))

    def _observe(
        self, p99_query: str, stats: dict[str, int], last: dict[str, float], t: float, phase: str
    ) -> dict[str, Any]:
        assert self.prom is not None
        now = time.monotonic()
        span = max(1e-6, now - last["t"])
        offered = (stats["sent"] - last["sent"]) / span
        ok_rate = (stats["ok"] - last["ok"]) / span
        last.update(t=now, sent=stats["sent"], ok=stats["ok"])
        try:
            p99 = self.prom.query_value(p99_query)
        except Exception:
            p99 = None
        in_pods = self._queue_delay_in_pods()
        ready, want, replicas, bt, reason = self._service_state()
        p99_txt = "n/a" if p99 is None or math.isnan(p99) else f"{p99 * 1000:.0f}ms"
        say(
            f"  {t:5.0f} {phase:<6} {offered:9.1f} {ok_rate:6.1f} {stats['rejected']:4d} {stats['late']:4d} "
            f"{p99_txt:>8} {replicas:>10} {bt:>8} {in_pods:>8}  {reason}"
        )
        self._note_scaling(t, ready, want)
        return {
            "t": t,
            "phase": phase,
            "offered": offered,
            "ok_rate": ok_rate,
            "p99": p99,
            "replicas": replicas,
            "max_queue_delay": bt,
        }

    def _queue_delay_in_pods(self) -> str:
        """What the runtime pods apply (hot-reloaded from the ConfigMap volume), as they export it."""
        assert self.prom is not None
        sel = f'namespace="{NAMESPACE}",inferenceservice="{ISVC}"'
        try:
            lo = self.prom.query_value(f"min(kubeinfer_max_queue_delay_seconds{{{sel}}})")
            hi = self.prom.query_value(f"max(kubeinfer_max_queue_delay_seconds{{{sel}}})")
        except Exception:
            lo = hi = None
        if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
            return "n/a"
        if abs(hi - lo) < 1e-9:
            return f"{hi * 1000:.3g}ms"
        return f"{lo * 1000:.2g}-{hi * 1000:.2g}ms"

    def _service_state(self) -> tuple[int | None, int | None, str, str, str]:
        """``(ready, wanted replicas, "ready/want", max queue delay, reason)`` from the Deployment and
        the InferenceService's status; the reason reads "<signals>: <action>" and the table shows a
        new decision's action once, or why the autoscaler holds."""
        ready = want = None
        try:
            dep = self.get("deployment", ISVC, "-n", NAMESPACE)
            ready = int((dep.get("status") or {}).get("readyReplicas") or 0)
            want = int(dep["spec"].get("replicas") or 0)
            isvc = self.get("inferenceservice", ISVC, "-n", NAMESPACE)
            st = isvc.get("status") or {}
            bt = st.get("maxQueueDelay") or isvc["spec"]["batching"].get("maxQueueDelay", "?")
            decision = st.get("lastDecision") or {}
            reason = ""
            if decision.get("time") and decision.get("time") != self.summary.get("last_decision_time"):
                self.summary["last_decision_time"] = decision.get("time")
                reason = (decision.get("reason") or "").rsplit(": ", 1)[-1]
            active = next(
                (c for c in st.get("conditions") or [] if c.get("type") == "AutoscalingActive"), None
            )
            if active is not None and active.get("status") != "True":
                unknown = (st.get("observed") or {}).get("unknownReason") or active.get("message") or ""
                reason = f"holding ({active.get('reason')}: {unknown[:70]})"
        except Exception as e:
            return ready, want, "?", "?", f"({type(e).__name__})"
        return ready, want, f"{ready}/{want}", bt, reason

    def _note_scaling(self, t: float, ready: int | None, want: int | None) -> None:
        """Record when the autoscaler first raised replicas and when the pod it added was Ready."""
        initial = self.summary.get("initial_ready", 1)
        if want is not None and want > initial and "scale_up_t" not in self.summary:
            self.summary["scale_up_t"] = t
        if ready is not None and ready > initial and "added_ready_t" not in self.summary:
            self.summary["added_ready_t"] = t
            since = t - self.summary.get("scale_up_t", t)
            say(f"  -> the pod the autoscaler added is Ready ({since:.0f}s after it raised replicas):")
            with contextlib.suppress(Exception):
                say(indented(self.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide"), "     "))

    def _scaling_summary(self) -> str:
        """When the autoscaler raised replicas and when the pod it added was Ready (or that it did not)."""
        if "scale_up_t" not in self.summary:
            return "the autoscaler did not add a replica during the burst (see the table's reasons)"
        up = self.summary["scale_up_t"]
        if "added_ready_t" not in self.summary:
            return f"the autoscaler raised replicas at t={up:.0f}s; its pod was not Ready in time"
        return (
            f"the autoscaler raised replicas at t={up:.0f}s; the new pod was Ready at "
            f"t={self.summary['added_ready_t']:.0f}s (pod start, model load, quantization, warmup)"
        )

    def report(self) -> None:
        self.show("get", "pods", "-n", NAMESPACE, "-o", "wide")
        self.show("get", "kisvc", "-n", NAMESPACE, "-o", "wide")
        events = (
            self.kubectl(
                "get",
                "events",
                "-n",
                NAMESPACE,
                "--field-selector",
                f"involvedObject.name={ISVC}",
                "--sort-by=.lastTimestamp",
                check=False,
            )
            .strip()
            .splitlines()
        )
        if events:
            say("\n  Events of the InferenceService (last 8):")
            for line in events[:1] + events[-8:]:
                say("  " + line)
        hist = self.summary.get("history") or []
        replicas = [
            int(str(h["replicas"]).split("/")[-1])
            for h in hist
            if "/" in str(h["replicas"]) and str(h["replicas"]).split("/")[-1].isdigit()
        ]
        p99s = {
            ph: [
                h["p99"]
                for h in hist
                if h["phase"] == ph and h["p99"] is not None and not math.isnan(h["p99"])
            ]
            for ph in ("warm", "burst", "cool")
        }
        bts = sorted({h["max_queue_delay"] for h in hist if h["max_queue_delay"] != "?"}, key=_seconds)
        say("\n  Summary")
        say(f"  - {self.summary.get('paraphrases', 0)} paraphrase pairs among {len(SENTENCES)} sentences")
        if "first_ready_s" in self.summary:
            say(f"  - first runtime pod Ready {self.summary['first_ready_s']:.0f}s after kubectl apply")
        if replicas:
            say(f"  - replicas: started {replicas[0]}, peaked at {max(replicas)}, ended {replicas[-1]}")
        say(f"  - {self._scaling_summary()}")
        for ph, vals in p99s.items():
            if vals:
                say(
                    f"  - P99 during {ph}: median {statistics.median(vals) * 1000:.0f}ms, "
                    f"max {max(vals) * 1000:.0f}ms"
                )
        if bts:
            say(f"  - max queue delay in force ranged from {bts[0]} to {bts[-1]} ({len(bts)} values)")
        st = self.summary.get("stats")
        if st:
            say(
                f"  - requests through the Service: {st['sent']} sent, {st['ok']} ok, {st['rejected']} "
                f"rejected (429), {st['errors']} failed, {st['late']} dropped by the client (late)"
            )
        say(
            "  - note: each replica is held to 500m CPU by its cgroup (the pod's limit), so a second one\n"
            "    adds real capacity; the load generator shares the node's 2 cores with them"
        )
        say(f"  - demo took {time.monotonic() - T0:.0f}s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="kubeinfer demo on a one-node Kubernetes cluster")
    ap.add_argument("--workdir", type=Path, default=ROOT / ".cache" / "demo")
    ap.add_argument("--keep", action="store_true", help="leave everything running until Ctrl-C")
    ap.add_argument("--base-rate", type=float, default=5.0, help="requests/s before and after the burst")
    ap.add_argument(
        "--burst-rate",
        type=float,
        default=None,
        help=f"requests/s during the burst (default: {BURST_FACTOR}x one replica's measured capacity)",
    )
    ap.add_argument("--burst-seconds", type=float, default=75.0)
    ap.add_argument("--cool-seconds", type=float, default=45.0)
    ap.add_argument("--print-every", type=float, default=3.0, help="seconds between progress lines")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    workdir = _fresh_workdir(args.workdir.resolve())

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    demo = Demo(workdir, args)
    say(
        "kubeinfer demo: an InferenceService on a one-node Kubernetes cluster, a real model in real pods, "
        "real load, the autoscaler acting"
    )
    try:
        rc = _run(demo, args.keep, workdir)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the cleanup
        demo.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if rc == 0:
        shutil.rmtree(workdir / "cluster", ignore_errors=True)
    return rc


def _fresh_workdir(workdir: Path) -> Path:
    """``workdir``, emptied: a previous demo's cluster (killed hard) stopped first."""
    if (workdir / "cluster").exists():
        stop(workdir / "cluster", log=lambda _m: None)
    if workdir.exists():
        shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


def _run(demo: Demo, keep: bool, workdir: Path) -> int:
    """The demo's steps; the exit status (2: no node possible here, 130: interrupted, 1: failed)."""
    try:
        demo.start_platform()
        demo.apply_example()
        demo.wait_ready()
        demo.paraphrases()
        demo.burst()
        demo.report()
        if keep:
            assert demo.cluster is not None and demo.prom is not None
            say(f"\n--keep: everything is running.\n  export KUBECONFIG={demo.cluster.kubeconfig}")
            say(f"  the Service: http://{demo.url}   Prometheus: {demo.prom.url}")
            say("Ctrl-C to stop and clean up.")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    except CannotRun as e:
        say(f"\nthe demo needs a one-node cluster, which cannot run on this machine:\n  {e}")
        return 2
    except KeyboardInterrupt:
        say("\ninterrupted")
        return 130
    except Exception as e:
        say(f"\ndemo failed: {type(e).__name__}: {e}")
        demo.diagnose()
        say(f"logs under {workdir}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
