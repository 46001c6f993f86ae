#!/usr/bin/env python3
"""``make demo``: kubeinfer's main job, end to end, on a local control plane with the bundled model.

Steps (each printed with its elapsed time):

1. start the local control plane (``hack/cluster.py``: etcd, kube-apiserver,
   kube-controller-manager) and a real Prometheus (``tests/support/prom.py``), ``helm install`` the
   chart (CRDs, RBAC, the operator's ServiceAccount and peering object; the in-cluster operator
   Deployment at 0 replicas because nothing can run pods here), then start the operator as a local
   process authenticated as the chart's ServiceAccount (so the chart's RBAC is what it runs with);
2. apply ``examples/minilm.yaml`` (bundled all-MiniLM-L6-v2, int8-dynamic, autoscaling on), with
   the autoscaler's windows shortened so it acts within a demo's minutes (printed);
3. run the runtime for the Deployment's replicas as local processes (``hack/localpods.py``: there is
   no kubelet) and wait for the InferenceService to be Ready;
4. send real sentences through ``tritonclient.http`` and print which pairs are paraphrases (cosine
   similarity of the embeddings);
5. drive a load burst and print, every few seconds, the offered rate, P99 (from Prometheus), the
   replicas and the batch timeout as the autoscaler acts; then ``kubectl get kisvc`` and a summary;
6. clean up everything it started, also on Ctrl-C / SIGTERM.

Options: ``--keep`` leaves everything running (prints how to reach it; Ctrl-C stops it),
``--burst-rate`` (default: one replica's capacity measured on the spot) and ``--burst-seconds`` size the
load. Everything lives under ``.cache/demo/``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

from hack.cluster import ClusterInfo, kubeconfig_for_service_account, start, stop  # noqa: E402
from hack.localpods import LocalPods  # noqa: E402
from tests.support.prom import PrometheusServer  # noqa: E402

NAMESPACE = "demo"
ISVC = "minilm"
RELEASE = "kubeinfer"
RELEASE_NS = "kubeinfer-system"
EXAMPLE = ROOT / "examples" / "minilm.yaml"
CHART = ROOT / "charts" / "kubeinfer"
T0 = time.monotonic()

#: The autoscaler settings the demo uses instead of the example's production-sized windows.
DEMO_AUTOSCALING = {
    "maxReplicas": 2,  # two cores here: a third replica would only share them
    "window": "10s",
    "scaleUpCooldown": "5s",
    "scaleDownCooldown": "10s",
    "scaleDownStabilization": "20s",
    "batchTimeoutCooldown": "3s",
}

#: The operator's autoscaler period for the demo (the chart's default is 15 s).
AUTOSCALE_INTERVAL_SECONDS = 3

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


def _seconds(duration: str) -> float:
    """Go duration string -> seconds (for sorting what the status shows); unknown text sorts last."""
    from kubeinfer.operator.api import parse_duration

    try:
        return parse_duration(duration)
    except ValueError:
        return math.inf


def say(msg: str = "") -> None:
    print(msg, flush=True)


def step(n: int, msg: str) -> None:
    say(f"\n[{n}/6] {msg}  (+{time.monotonic() - T0:.0f}s)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Demo:
    """Holds what the demo started, so ``close()`` can stop it in reverse order."""

    def __init__(self, workdir: Path, args: argparse.Namespace) -> None:
        self.workdir = workdir
        self.args = args
        self.cleanups: list[tuple[str, Callable[[], object]]] = []
        self.cluster: ClusterInfo | None = None
        self.env: dict[str, str] = {}
        self.prom: PrometheusServer | None = None
        self.pods: LocalPods | None = None
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

    # ------------------------------------------------------------------ step 1
    def start_platform(self) -> None:
        step(1, "starting the local control plane, Prometheus, the chart and the operator")
        self.cluster = start(self.workdir / "cluster", die_with_parent=True, log=lambda m: say(f"  {m}"))
        info = self.cluster
        self.on_close("control plane", lambda: stop(info, log=lambda _m: None))
        self.env = {
            **os.environ,
            "KUBECONFIG": str(info.kubeconfig),
            "HELM_CACHE_HOME": str(self.workdir / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "helm" / "config"),
            "HELM_DATA_HOME": str(self.workdir / "helm" / "data"),
        }
        say(f"  API server {info.server}   (export KUBECONFIG={info.kubeconfig})")

        self.prom = PrometheusServer(self.workdir / "prometheus", scrape_interval=1.0).start()
        prom = self.prom
        self.on_close("Prometheus", prom.stop)
        say(f"  Prometheus {prom.url} (scrapes the runtime processes every 1 s)")

        cp = subprocess.run(
            [
                str(info.helm_path),
                "install",
                RELEASE,
                str(CHART),
                "--namespace",
                RELEASE_NS,
                "--create-namespace",
                "--set",
                "replicas=0",
                "--set",
                f"prometheus.url={prom.url}",
                "--wait",
                "--timeout",
                "2m",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if cp.returncode != 0:
            raise RuntimeError(f"helm install failed: {cp.stderr.strip()}")
        say(f"  helm install {RELEASE} charts/kubeinfer -n {RELEASE_NS}: CRDs, RBAC, ServiceAccount, peering")
        say("  (the chart's operator Deployment is scaled to 0: no kubelet here, it runs as a local process)")
        self.kubectl(
            "wait", "--for=condition=Established", "crd/inferenceservices.kubeinfer.io", "--timeout=60s"
        )

        sa = self.get("serviceaccount", "-n", RELEASE_NS, "-l", f"app.kubernetes.io/instance={RELEASE}")
        sa_name = sa["items"][0]["metadata"]["name"]
        sa_kubeconfig = kubeconfig_for_service_account(
            info, RELEASE_NS, sa_name, self.workdir / "operator.kubeconfig"
        )
        health = free_port()
        op_env = {
            **os.environ,
            "KUBECONFIG": str(sa_kubeconfig),
            "KUBEINFER_HEALTH_PORT": str(health),
            "KUBEINFER_METRICS_PORT": str(free_port()),
            "KUBEINFER_PROMETHEUS_URL": prom.url,
            "KUBEINFER_PEERING": RELEASE,
            "KUBEINFER_LOG_FORMAT": "plain",
            "KUBEINFER_BIND_ADDRESS": "127.0.0.1",
            "KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": str(AUTOSCALE_INTERVAL_SECONDS),
            "HF_HUB_OFFLINE": "1",
        }
        op_log = open(self.workdir / "operator.log", "ab")  # noqa: SIM115 - closed at cleanup
        op = subprocess.Popen(
            [str(Path(sys.executable).parent / "kubeinfer-operator")],
            env=op_env,
            stdout=op_log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

        def stop_operator() -> None:
            op.terminate()
            try:
                op.wait(15)
            except subprocess.TimeoutExpired:
                op.kill()
                op.wait(5)
            op_log.close()

        self.on_close("operator", stop_operator)

        def healthy() -> bool:
            if op.poll() is not None:
                raise RuntimeError(f"operator exited {op.returncode}; see {self.workdir / 'operator.log'}")
            try:
                return httpx.get(f"http://127.0.0.1:{health}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        self.wait("the operator's /healthz", healthy, timeout=60)
        say(
            f"  operator running as ServiceAccount {RELEASE_NS}/{sa_name} "
            f"(log: {self.workdir / 'operator.log'})"
        )

    # ------------------------------------------------------------------ step 2
    def apply_example(self) -> None:
        step(2, f"applying examples/minilm.yaml in namespace {NAMESPACE}")
        self.kubectl("create", "namespace", NAMESPACE)
        doc = yaml.safe_load(EXAMPLE.read_text())
        doc["metadata"]["namespace"] = NAMESPACE
        doc["spec"].setdefault("autoscaling", {}).update(DEMO_AUTOSCALING)
        say(
            "  demo-sized autoscaler windows (the example keeps production values): "
            + json.dumps(DEMO_AUTOSCALING)
            + f", decisions every {AUTOSCALE_INTERVAL_SECONDS}s"
        )
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
        spec = doc["spec"]
        say(
            f"  {ISVC}: model {spec['model']['uri']} ({spec['quantization']['mode']}), "
            f"maxBatchSize {spec['batching']['maxBatchSize']}, "
            f"maxQueueDelay {spec['batching']['maxQueueDelay']}, autoscaling "
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
    def run_pods(self) -> None:
        step(3, "running the Deployment's replicas as local processes (no kubelet here)")
        assert self.cluster is not None and self.prom is not None
        say("  no kubelet: simulating pods as local processes (hack/localpods.py) that follow the")
        say("  Deployment's spec.replicas and the ConfigMap's runtime.yaml (hot reload), and mark pods Ready")
        self.pods = LocalPods(
            self.cluster.kubeconfig,
            NAMESPACE,
            ISVC,
            workdir=self.workdir / "pods",
            prometheus=self.prom,
            max_replicas=4,
            termination_grace_seconds=10,
        ).start()
        pods = self.pods
        self.on_close("runtime processes", lambda: pods.stop(timeout=20))
        t = time.monotonic()
        pods.wait_ready(timeout=180)
        say(
            f"  {len(pods.ready_addresses())} runtime process(es) ready after {time.monotonic() - t:.0f}s "
            "(model load + int8 quantization + warmup)"
        )

        def isvc_ready() -> bool:
            st = self.get("inferenceservice", ISVC, "-n", NAMESPACE).get("status") or {}
            return any(
                c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []
            )

        self.wait("InferenceService Ready=True", isvc_ready, timeout=60)
        say("  " + self.kubectl("get", "kisvc", "-n", NAMESPACE).strip().replace("\n", "\n  "))

    # ------------------------------------------------------------------ step 4
    def paraphrases(self) -> None:
        step(4, "real sentences through tritonclient.http (Open Inference Protocol v2)")
        import tritonclient.http as httpclient

        assert self.pods is not None
        addr = self.pods.ready_addresses()[0]
        client = httpclient.InferenceServerClient(url=addr)
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
        assert self.pods is not None
        addr = self.pods.ready_addresses()[0]
        done = [0]
        lock = threading.Lock()
        deadline = time.monotonic() + seconds

        def worker(k: int) -> None:
            with httpx.Client(timeout=30) as client:
                i = k
                while time.monotonic() < deadline:
                    text = LOAD_TEXTS[i % len(LOAD_TEXTS)]
                    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}
                    if client.post(f"http://{addr}/v2/models/minilm/infer", json=body).status_code == 200:
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
            5, "load burst: the autoscaler reads P99 from Prometheus and sets replicas and the batch timeout"
        )
        assert self.pods is not None and self.prom is not None
        burst_rate = self.args.burst_rate
        if burst_rate is None:
            capacity = self.capacity()
            burst_rate = max(2 * self.args.base_rate, round(BURST_FACTOR * capacity))
            say(
                f"  one replica serves about {capacity:.0f} requests/s of ~100-token texts here "
                f"(4 s closed-loop probe); the burst offers {BURST_FACTOR}x that: {burst_rate:.0f}/s"
            )
        self.summary["burst_rate"] = burst_rate
        phases = [
            ("warm", self.args.base_rate, 15.0),
            ("burst", burst_rate, self.args.burst_seconds),
            ("cool", self.args.base_rate, self.args.cool_seconds),
        ]
        texts = [t.encode() for t in LOAD_TEXTS]
        pods = self.pods
        stats = {"sent": 0, "ok": 0, "rejected": 0, "errors": 0, "late": 0}
        lock = threading.Lock()
        latencies: deque[float] = deque(maxlen=5000)
        rr = [0]
        local = threading.local()

        def one(text: bytes, scheduled: float) -> None:
            if time.monotonic() - scheduled > LATE_SECONDS:  # the client fell behind: drop, do not pile up
                with lock:
                    stats["late"] += 1
                return
            addrs = pods.ready_addresses()
            if not addrs:
                with lock:
                    stats["errors"] += 1
                return
            with lock:
                rr[0] += 1
                addr = addrs[rr[0] % len(addrs)]
            client = getattr(local, "client", None)
            if client is None:
                client = local.client = httpx.Client(timeout=10)
            body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text.decode()]}]}
            t = time.monotonic()
            try:
                r = client.post(f"http://{addr}/v2/models/minilm/infer", json=body)
                code = r.status_code
            except httpx.HTTPError:
                code = -1
            dt = time.monotonic() - t
            with lock:
                if code == 200:
                    stats["ok"] += 1
                    latencies.append(dt)
                elif code == 429:
                    stats["rejected"] += 1
                else:
                    stats["errors"] += 1

        p99_query = (
            "histogram_quantile(0.99, sum by (le) (rate(kubeinfer_request_duration_seconds_bucket"
            f'{{namespace="{NAMESPACE}",inferenceservice="{ISVC}"}}[10s])))'
        )
        say(f"  P99 = {p99_query}")
        say(
            f"  {'t':>5} {'phase':<6} {'offered/s':>9} {'ok/s':>6} {'429':>4} {'late':>4} {'P99':>8} "
            f"{'ready/want':>10} {'timeout':>8} {'in pods':>8}  autoscaler"
        )
        stop_evt = threading.Event()
        history: list[dict[str, Any]] = []
        with ThreadPoolExecutor(max_workers=256) as pool:
            t_start = time.monotonic()
            next_print = t_start + self.args.print_every
            last = {"t": t_start, "sent": 0, "ok": 0}
            for name, rate, seconds in phases:
                phase_end = time.monotonic() + seconds
                interval = 1.0 / rate
                next_send = time.monotonic()
                k = 0
                while time.monotonic() < phase_end and not stop_evt.is_set():
                    now = time.monotonic()
                    if now >= next_send:
                        pool.submit(one, texts[k % len(texts)], now)
                        k += 1
                        with lock:
                            stats["sent"] += 1
                        next_send += interval
                        if now - next_send > 1.0:  # fell behind (machine busy): do not catch up in a burst
                            next_send = now
                    if now >= next_print:
                        row = self._observe(p99_query, stats, last, now - t_start, name)
                        history.append(row)
                        next_print += self.args.print_every
                    time.sleep(max(0.0, min(next_send, next_print) - time.monotonic()))
        self.summary["history"] = history

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
        # what the runtime processes apply (hot-reloaded from the ConfigMap), as they export it
        sel = f'namespace="{NAMESPACE}",inferenceservice="{ISVC}"'
        try:
            lo = self.prom.query_value(f"min(kubeinfer_max_queue_delay_seconds{{{sel}}})")
            hi = self.prom.query_value(f"max(kubeinfer_max_queue_delay_seconds{{{sel}}})")
        except Exception:
            lo = hi = None
        if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
            in_pods = "n/a"
        elif abs(hi - lo) < 1e-9:
            in_pods = f"{hi * 1000:.3g}ms"
        else:
            in_pods = f"{lo * 1000:.2g}-{hi * 1000:.2g}ms"
        try:
            dep = self.get("deployment", ISVC, "-n", NAMESPACE)
            replicas = f"{(dep.get('status') or {}).get('readyReplicas') or 0}/{dep['spec'].get('replicas')}"
            isvc = self.get("inferenceservice", ISVC, "-n", NAMESPACE)
            st = isvc.get("status") or {}
            bt = st.get("batchTimeout") or isvc["spec"]["batching"].get("maxQueueDelay", "?")
            # the reason reads "<signals>: <action>"; the table shows a new decision's action once
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
            replicas, bt, reason = "?", "?", f"({type(e).__name__})"
        p99_txt = "n/a" if p99 is None or math.isnan(p99) else f"{p99 * 1000:.0f}ms"
        say(
            f"  {t:5.0f} {phase:<6} {offered:9.1f} {ok_rate:6.1f} {stats['rejected']:4d} {stats['late']:4d} "
            f"{p99_txt:>8} {replicas:>10} {bt:>8} {in_pods:>8}  {reason}"
        )
        return {
            "t": t,
            "phase": phase,
            "offered": offered,
            "ok_rate": ok_rate,
            "p99": p99,
            "replicas": replicas,
            "batch_timeout": bt,
        }

    def report(self) -> None:
        say("\n  kubectl get kisvc -n demo")
        say("  " + self.kubectl("get", "kisvc", "-n", NAMESPACE, "-o", "wide").strip().replace("\n", "\n  "))
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
        bts = sorted({h["batch_timeout"] for h in hist if h["batch_timeout"] != "?"}, key=_seconds)
        say("\n  Summary")
        say(f"  - {self.summary.get('paraphrases', 0)} paraphrase pairs among {len(SENTENCES)} sentences")
        if replicas:
            say(f"  - replicas: started {replicas[0]}, peaked at {max(replicas)}, ended {replicas[-1]}")
        for ph, vals in p99s.items():
            if vals:
                say(
                    f"  - P99 during {ph}: median {statistics.median(vals) * 1000:.0f}ms, "
                    f"max {max(vals) * 1000:.0f}ms"
                )
        if bts:
            say(f"  - batch timeout in force ranged from {bts[0]} to {bts[-1]} ({len(bts)} values)")
        say(
            "  - note: here every replica shares the same 2 CPU cores (and the load generator), so extra\n"
            "    replicas add little capacity; on a cluster each replica brings its own GPU or cores"
        )
        say(f"  - demo took {time.monotonic() - T0:.0f}s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="kubeinfer demo on a local control plane")
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

    workdir: Path = args.workdir.resolve()
    if workdir.exists():
        stop(workdir / "cluster", log=lambda _m: None)  # a previous demo killed hard
        shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    demo = Demo(workdir, args)
    rc = 0
    say(
        "kubeinfer demo: an InferenceService on a real API server, a real model, real load, "
        "the autoscaler acting"
    )
    try:
        demo.start_platform()
        demo.apply_example()
        demo.run_pods()
        demo.paraphrases()
        demo.burst()
        demo.report()
        if args.keep:
            say(
                "\n--keep: everything is running. export KUBECONFIG="
                f"{demo.cluster.kubeconfig if demo.cluster else ''}"
            )
            say("Ctrl-C to stop and clean up.")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    except KeyboardInterrupt:
        say("\ninterrupted")
        rc = 130
    except Exception as e:
        say(f"\ndemo failed: {type(e).__name__}: {e}")
        if demo.pods is not None:
            say(demo.pods.log_tails(10))
        say(f"logs under {workdir}")
        rc = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the cleanup
        demo.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if rc == 0:
        shutil.rmtree(workdir / "cluster", ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
