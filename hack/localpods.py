"""Run an InferenceService's runtime replicas as local processes (the local cluster has no kubelet).

The local control plane started by ``hack/cluster.py`` has an API server (and possibly a
kube-controller-manager) but no kubelet, so nothing ever runs the pods of the Deployment the
operator writes. ``LocalPods`` stands in for the kubelet, for one InferenceService:

- every ``poll_interval`` seconds (default 1 s) it reads the Deployment ``<name>``'s
  ``spec.replicas`` and the ConfigMap ``<name>-runtime``'s ``runtime.yaml`` key;
- it keeps that many ``kubeinfer-runtime serve --config FILE --port PORT --host 127.0.0.1``
  processes running. Where a kube-controller-manager runs (``hack/cluster.py`` starts one), the
  Deployment's ReplicaSet creates Pods that nothing runs; then it runs exactly one process per live
  Pod, like a kubelet (a rollout's new Pods get new processes, deleted Pods lose theirs). A crashed
  process is restarted with exponential back-off (a kubelet's ``CrashLoopBackOff``). A process that
  is no longer wanted gets SIGTERM (the runtime drains) and SIGKILL after
  ``termination_grace_seconds``;
- whenever the ConfigMap's ``runtime.yaml`` changes it rewrites each process's config file by
  atomic rename (write a temporary file, ``os.replace``), so the runtime's file-polling hot reload
  picks up the new ``batching`` section. Only ``server.host``/``server.port`` are overridden (each
  process needs its own free port on 127.0.0.1);
- it reports the scrape targets (``127.0.0.1:<port>`` of every started process that has been ready
  once and is not terminating) with labels ``namespace`` and ``inferenceservice`` to a callback
  and/or a Prometheus ``file_sd`` JSON file, so the autoscaler's default queries select them;
- optionally (``report_status=True``, the default) it makes the cluster see the replicas' readiness
  like a kubelet would: in Pod mode it patches each Pod's ``status`` (phase Running, the ``Ready``
  condition from the process's ``/v2/health/ready``; no podIP) and the controllers compute the
  Deployment status as on a real cluster; with no Pods (no controller-manager) it patches the
  Deployment's ``status`` (replicas, updatedReplicas, readyReplicas, availableReplicas and the
  ``Available`` condition) directly.

It logs, once, ``no kubelet: simulating pods as local processes`` so nobody mistakes this for a
real cluster. Use it as a context manager (processes are stopped on exit, also on exceptions), or
``start()``/``stop()``; ``run_forever()`` is for the command line::

    .venv/bin/python hack/localpods.py --kubeconfig KUBECONFIG --namespace NS --name ISVC \\
        [--file-sd targets.json]

Import it as ``hack.localpods`` (the repository root is on ``sys.path`` under pytest; run as a
script, it puts the root there itself).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

if __package__ in (None, ""):  # run as `python hack/localpods.py`: make `hack.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hack.procs import die_with_parent

log = logging.getLogger("kubeinfer.localpods")

#: Callback type for scrape targets: ``(targets, labels)`` with targets ``["127.0.0.1:PORT", ...]``
#: and labels ``{"namespace": ns, "inferenceservice": name}``.
TargetsCallback = Callable[[list[str], dict[str, str]], None]

NO_KUBELET_MESSAGE = "no kubelet: simulating pods as local processes"
LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that was free a moment ago (bind to port 0, ask the OS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def default_runtime_command() -> list[str]:
    """The ``kubeinfer-runtime`` console script next to this interpreter, else ``python -m``."""
    script = Path(sys.executable).parent / "kubeinfer-runtime"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "kubeinfer.runtime.cli"]


def render_local_config(runtime_yaml: str, port: int, host: str = LOOPBACK) -> str:
    """Return ``runtime_yaml`` with ``server.host``/``server.port`` replaced; everything else kept.

    Raises ``ValueError`` if the text is not a YAML mapping (names the ConfigMap key).
    """
    data = yaml.safe_load(runtime_yaml) or {}
    if not isinstance(data, dict):
        raise ValueError("ConfigMap key runtime.yaml is not a YAML mapping")
    server = data.get("server")
    server = dict(server) if isinstance(server, dict) else {}
    server["host"] = host
    server["port"] = port
    data["server"] = server
    return yaml.safe_dump(data, sort_keys=True)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` by writing a temporary file in the same folder and renaming it.

    A reader polling ``path`` sees either the old or the new content, never a partial file.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class LocalPod:
    """One simulated pod: a local runtime process. ``index`` is stable while the pod lives."""

    index: int
    port: int
    config_path: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    ready: bool = False
    ever_ready: bool = False
    restarts: int = 0
    next_start_at: float = 0.0  # back-off after a crash (monotonic seconds)
    terminating_since: float | None = None
    pod_name: str | None = None  # the Kubernetes Pod this process stands for (pod mode)
    log_file: Any = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``: the scrape target and the inference endpoint."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        """Base URL of the process's HTTP server."""
        return f"http://{self.address}"

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None


class LocalPods:
    """Keep the runtime processes of one InferenceService in step with its Deployment and ConfigMap.

    Args:
        kubeconfig: path of the kubeconfig to read the Deployment/ConfigMap with.
        namespace: namespace of the InferenceService.
        name: InferenceService name (Deployment ``<name>``, ConfigMap ``<name>-runtime``).
        workdir: where config files and process logs go (a temporary folder if None, removed on stop).
        on_targets: called with ``(targets, labels)`` whenever the scrape targets change.
        file_sd_path: if set, a Prometheus ``file_sd`` JSON file written (atomically) on change.
        prometheus: an object with ``set_targets([(address, labels), ...])`` such as
            ``tests.support.prom.PrometheusServer``; its targets are REPLACED by this service's on
            change (use ``on_targets`` to merge several services into one Prometheus).
        report_status: patch pod or Deployment status from the processes' readiness (see module doc).
        poll_interval: seconds between reconciliations (default 1 s).
        termination_grace_seconds: SIGTERM→SIGKILL delay on scale-down/stop (default 30 s, like a pod).
        max_replicas: refuse to start more local processes than this (protects a small machine).
        runtime_command: argv prefix of the runtime (default: ``kubeinfer-runtime``).
        extra_args: appended to every runtime command line (e.g. ``["--device", "cpu"]``).
        env: extra environment for the processes (``HF_HUB_OFFLINE=1`` is always set).
        threads_per_pod: sets ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` unless ``env`` sets them; None
            leaves them alone.
    """

    def __init__(
        self,
        kubeconfig: str | os.PathLike[str],
        namespace: str,
        name: str,
        *,
        workdir: str | os.PathLike[str] | None = None,
        on_targets: TargetsCallback | None = None,
        file_sd_path: str | os.PathLike[str] | None = None,
        prometheus: Any = None,
        report_status: bool = True,
        poll_interval: float = 1.0,
        termination_grace_seconds: float = 30.0,
        max_replicas: int = 8,
        runtime_command: Sequence[str] | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        threads_per_pod: int | None = 1,
    ) -> None:
        from kubernetes import client, config

        self.namespace = namespace
        self.name = name
        self.configmap_name = f"{name}-runtime"
        self.labels = {"namespace": namespace, "inferenceservice": name}
        self._api_client = config.new_client_from_config(config_file=str(kubeconfig))
        self._apps = client.AppsV1Api(self._api_client)
        self._core = client.CoreV1Api(self._api_client)
        self._ApiException = client.ApiException
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"localpods-{name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.on_targets = on_targets
        self.file_sd_path = Path(file_sd_path) if file_sd_path else None
        self.prometheus = prometheus
        self.report_status = report_status
        self.poll_interval = poll_interval
        self.termination_grace_seconds = termination_grace_seconds
        self.max_replicas = max_replicas
        self.runtime_command = list(runtime_command or default_runtime_command())
        self.extra_args = list(extra_args)
        self.env = dict(os.environ)
        self.env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
        if threads_per_pod is not None:
            for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                self.env[var] = str(threads_per_pod)
        self.env.update(env or {})

        self._lock = threading.RLock()
        self._pods: list[LocalPod] = []  # live, not terminating; index order
        self._terminating: list[LocalPod] = []
        self._next_index = 0
        self._desired = 0
        self._runtime_yaml: str | None = None
        self._last_targets: list[str] | None = None
        self._last_status: Any = None
        self._http = httpx.Client(timeout=0.5)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._announced = False
        self._pod_mode = False  # True once the Deployment has Pods (a kube-controller-manager runs)
        self.errors: list[str] = []  # last errors seen talking to the API server (bounded)

    # ------------------------------------------------------------------ public API
    def start(self) -> LocalPods:
        """Start the background reconcile thread (idempotent). Returns self."""
        if self._thread is None:
            self._announce()
            self._thread = threading.Thread(target=self._run, name=f"localpods-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop reconciling and terminate every process (SIGTERM, then SIGKILL after the grace).

        ``timeout`` bounds the whole stop (default: ``termination_grace_seconds`` + 5 s).
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 3 * self.poll_interval))
            self._thread = None
        deadline = time.monotonic() + (timeout if timeout is not None else self.termination_grace_seconds + 5)
        with self._lock:
            pods = self._pods + self._terminating
            self._pods, self._terminating = [], []
        for p in pods:
            self._signal(p, signal.SIGTERM)
        for p in pods:
            self._reap(p, deadline)
        self._publish_targets()
        self._http.close()
        self._api_client.close()
        if self._own_workdir:
            import shutil

            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalPods:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run_forever(self) -> None:
        """Reconcile in the calling thread until SIGINT/SIGTERM, then stop every process."""
        self._announce()

        def _handler(signum: int, frame: object) -> None:
            self._stop.set()

        signal.signal(signal.SIGINT, _handler)
        signal.signal(signal.SIGTERM, _handler)
        try:
            self._run()
        finally:
            self.stop()

    @property
    def desired_replicas(self) -> int:
        """The Deployment's ``spec.replicas`` last seen (0 before the Deployment exists)."""
        return self._desired

    def pods(self) -> list[LocalPod]:
        """A snapshot of the live (not terminating) local pods."""
        with self._lock:
            return list(self._pods)

    def ready_addresses(self) -> list[str]:
        """``127.0.0.1:<port>`` of every ready, not terminating, process."""
        with self._lock:
            return [p.address for p in self._pods if p.ready]

    def ready_urls(self) -> list[str]:
        """``http://127.0.0.1:<port>`` of every ready, not terminating, process."""
        return [f"http://{a}" for a in self.ready_addresses()]

    def wait_ready(self, count: int | None = None, timeout: float = 120.0) -> list[str]:
        """Wait until ``count`` processes are ready (default: the Deployment's replicas, at least 1).

        Returns their addresses. Raises ``TimeoutError`` (with the processes' log tails) after
        ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            want = count if count is not None else max(1, self._desired)
            ready = self.ready_addresses()
            with self._lock:
                n_live = len(self._pods)
            if len(ready) >= want and (count is not None or n_live == want):
                return ready
            time.sleep(0.2)
        raise TimeoutError(
            f"localpods {self.namespace}/{self.name}: {len(self.ready_addresses())} ready, wanted "
            f"{count if count is not None else self._desired} after {timeout:.0f}s\n{self.log_tails()}"
        )

    def log_tails(self, lines: int = 20) -> str:
        """The last ``lines`` lines of every process's log, for error messages."""
        out = []
        with self._lock:
            pods = self._pods + self._terminating
        for p in pods:
            try:
                tail = p.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
            except OSError:
                tail = []
            out.append(f"--- pod {p.index} ({p.address}, restarts {p.restarts}) {p.log_path}")
            out.extend(tail)
        return "\n".join(out)

    # ------------------------------------------------------------------ loop
    def _announce(self) -> None:
        if not self._announced:
            self._announced = True
            log.warning("%s (%s/%s, workdir %s)", NO_KUBELET_MESSAGE, self.namespace, self.name, self.workdir)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.reconcile_once()
            except Exception as e:  # keep going: transient API errors must not kill the simulation
                self._error(f"reconcile: {type(e).__name__}: {e}")
            self._stop.wait(max(0.05, self.poll_interval - (time.monotonic() - t0)))

    def _error(self, msg: str) -> None:
        log.warning("localpods %s/%s: %s", self.namespace, self.name, msg)
        self.errors.append(msg)
        del self.errors[:-50]

    def reconcile_once(self) -> None:
        """One pass: read the API, converge processes and configs, probe, publish targets/status."""
        deployment = self._read_deployment()
        runtime_yaml = self._read_runtime_yaml()
        if deployment is None:
            desired = 0
        else:
            spec_replicas = (deployment.get("spec") or {}).get("replicas")
            desired = 1 if spec_replicas is None else int(spec_replicas)
        if desired > self.max_replicas:
            self._error(f"spec.replicas={desired} > max_replicas={self.max_replicas}: capped")
            desired = self.max_replicas
        if desired != self._desired:
            log.info("localpods %s/%s: replicas %d -> %d", self.namespace, self.name, self._desired, desired)
        self._desired = desired

        if runtime_yaml is not None and runtime_yaml != self._runtime_yaml:
            self._runtime_yaml = runtime_yaml
            with self._lock:
                pods = list(self._pods)
            for p in pods:
                self._write_config(p)
            if pods:
                log.info(
                    "localpods %s/%s: ConfigMap changed, rewrote %d config file(s)",
                    self.namespace,
                    self.name,
                    len(pods),
                )

        now = time.monotonic()
        k8s_pods = self._list_pods(deployment) if (self.report_status and deployment is not None) else []
        if k8s_pods and not self._pod_mode:
            self._pod_mode = True
            log.info(
                "localpods %s/%s: the Deployment has Pods (kube-controller-manager): one process per Pod",
                self.namespace,
                self.name,
            )
        with self._lock:
            if self._pod_mode:
                self._converge_to_pods(k8s_pods, now)
            else:
                # scale down: highest index first (like a ReplicaSet removing the newest pods)
                while len(self._pods) > desired:
                    self._begin_termination(self._pods.pop(), now)
                # scale up, once there is a config to run with
                while len(self._pods) < desired and self._runtime_yaml is not None:
                    self._pods.append(self._new_pod())

        for p in self.pods():
            if not p.alive():
                self._handle_not_running(p, now)
        self._probe()
        self._reap_terminating()
        self._publish_targets()
        if self.report_status and deployment is not None:
            if self._pod_mode:
                self._patch_pods(k8s_pods)
            else:
                self._patch_deployment_status(deployment)

    def _converge_to_pods(self, k8s_pods: list[dict[str, Any]], now: float) -> None:
        """Pod mode (caller holds the lock): exactly one process per live Pod, like a kubelet.

        Processes started before the Pods existed are adopted by the oldest unassigned Pods; a
        process whose Pod is gone (scale-down, rollout) is terminated; a new Pod gets a process.
        """
        names = [p["name"] for p in k8s_pods]
        wanted = set(names)
        for p in list(self._pods):
            if p.pod_name is not None and p.pod_name not in wanted:
                self._pods.remove(p)
                self._begin_termination(p, now)
        assigned = {p.pod_name for p in self._pods if p.pod_name is not None}
        free = [n for n in names if n not in assigned]
        for p in list(self._pods):
            if p.pod_name is None:
                if free:
                    p.pod_name = free.pop(0)
                else:
                    self._pods.remove(p)
                    self._begin_termination(p, now)
        if self._runtime_yaml is None:
            return
        for n in free:
            if len(self._pods) >= self.max_replicas:
                self._error(f"{len(names)} Pods > max_replicas={self.max_replicas}: not starting {n}")
                break
            pod = self._new_pod()
            pod.pod_name = n
            self._pods.append(pod)

    # ------------------------------------------------------------------ API reads
    def _read_deployment(self) -> dict[str, Any] | None:
        try:
            obj = self._apps.read_namespaced_deployment(self.name, self.namespace)
        except self._ApiException as e:
            if e.status == 404:
                return None
            raise
        result: dict[str, Any] = self._api_client.sanitize_for_serialization(obj)
        return result

    def _list_pods(self, deployment: dict[str, Any]) -> list[dict[str, Any]]:
        """The Deployment's live Pods (selector match, not deleting), oldest first.

        Each: ``{"name", "ready": bool, "ready_condition": bool (a Ready condition exists),
        "start_time": bool}``.
        """
        selector = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if not selector:
            return []
        label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        listed = self._core.list_namespaced_pod(self.namespace, label_selector=label_selector)
        items = [p for p in listed.items if p.metadata.deletion_timestamp is None]
        items.sort(key=lambda p: (p.metadata.creation_timestamp, p.metadata.name))
        out = []
        for p in items:
            conds = {c.type: c.status for c in ((p.status.conditions if p.status else None) or [])}
            out.append(
                {
                    "name": p.metadata.name,
                    "ready": conds.get("Ready") == "True",
                    "ready_condition": "Ready" in conds,
                    "start_time": bool(p.status and p.status.start_time),
                    "containers": [(c.name, c.image) for c in (p.spec.containers or [])],
                }
            )
        return out

    def _read_runtime_yaml(self) -> str | None:
        try:
            cm = self._core.read_namespaced_config_map(self.configmap_name, self.namespace)
        except self._ApiException as e:
            if e.status == 404:
                return None
            raise
        data = cm.data or {}
        text = data.get("runtime.yaml")
        return text if isinstance(text, str) else None

    # ------------------------------------------------------------------ processes
    def _new_pod(self) -> LocalPod:
        idx = self._next_index
        self._next_index += 1
        pod = LocalPod(
            index=idx,
            port=free_port(),
            config_path=self.workdir / f"pod-{idx}-runtime.yaml",
            log_path=self.workdir / f"pod-{idx}.log",
        )
        self._write_config(pod)
        self._spawn(pod)
        return pod

    def _write_config(self, pod: LocalPod) -> None:
        assert self._runtime_yaml is not None
        try:
            text = render_local_config(self._runtime_yaml, pod.port)
        except (ValueError, yaml.YAMLError) as e:
            self._error(f"cannot use ConfigMap {self.configmap_name}: {e}")
            return
        write_atomic(pod.config_path, text)

    def _spawn(self, pod: LocalPod) -> None:
        argv = [
            *self.runtime_command,
            "serve",
            "--config",
            str(pod.config_path),
            "--port",
            str(pod.port),
            "--host",
            LOOPBACK,
            *self.extra_args,
        ]
        if pod.log_file is not None:
            pod.log_file.close()
        pod.log_file = open(pod.log_path, "ab")  # noqa: SIM115 - closed in _reap / on restart
        pod.log_file.write(f"\n### localpods: starting {' '.join(argv)}\n".encode())
        pod.log_file.flush()
        pod.proc = subprocess.Popen(
            argv,
            stdout=pod.log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,  # a Ctrl-C at the terminal reaches us, we stop them in order
            # if this process dies without stopping them (SIGKILL), they get SIGTERM, not orphaned
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        pod.started_at = time.monotonic()
        pod.ready = False
        log.info(
            "localpods %s/%s: pod %d started (pid %d, %s)",
            self.namespace,
            self.name,
            pod.index,
            pod.proc.pid,
            pod.address,
        )

    def _handle_not_running(self, pod: LocalPod, now: float) -> None:
        if pod.proc is not None:
            rc = pod.proc.returncode
            pod.proc = None
            pod.ready = False
            pod.restarts += 1
            backoff = min(30.0, 1.0 * 2 ** min(pod.restarts - 1, 5))
            pod.next_start_at = now + backoff
            tail = pod.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-5:]
            self._error(
                f"pod {pod.index} exited with {rc}; restart {pod.restarts} in {backoff:.0f}s: "
                + " | ".join(tail)
            )
            return
        if now >= pod.next_start_at:
            # a fresh port: the old one may have been taken meanwhile (that could be why it died)
            pod.port = free_port()
            if self._runtime_yaml is not None:
                self._write_config(pod)
            self._spawn(pod)

    def _probe(self) -> None:
        for p in self.pods():
            if not p.alive():
                p.ready = False
                continue
            try:
                r = self._http.get(f"{p.url}/v2/health/ready")
                ready = r.status_code == 200
            except httpx.HTTPError:
                ready = False
            if ready and not p.ready:
                log.info(
                    "localpods %s/%s: pod %d ready after %.1fs (%s)",
                    self.namespace,
                    self.name,
                    p.index,
                    time.monotonic() - p.started_at,
                    p.address,
                )
            p.ready = ready
            p.ever_ready = p.ever_ready or ready

    def _signal(self, pod: LocalPod, sig: int) -> None:
        if pod.alive():
            assert pod.proc is not None
            with contextlib.suppress(ProcessLookupError):
                pod.proc.send_signal(sig)

    def _begin_termination(self, pod: LocalPod, now: float) -> None:
        pod.terminating_since = now
        pod.ready = False
        self._signal(pod, signal.SIGTERM)
        self._terminating.append(pod)
        log.info("localpods %s/%s: pod %d terminating (SIGTERM, drain)", self.namespace, self.name, pod.index)

    def _reap_terminating(self) -> None:
        now = time.monotonic()
        with self._lock:
            remaining = []
            for p in self._terminating:
                if p.alive():
                    assert p.terminating_since is not None
                    if now - p.terminating_since > self.termination_grace_seconds:
                        self._signal(p, signal.SIGKILL)
                    remaining.append(p)
                else:
                    self._reap(p, now)
            self._terminating = remaining

    def _reap(self, pod: LocalPod, deadline: float) -> None:
        if pod.proc is not None:
            try:
                pod.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(pod, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    pod.proc.wait(timeout=5)
        if pod.log_file is not None:
            pod.log_file.close()
            pod.log_file = None
        with contextlib.suppress(OSError):
            pod.config_path.unlink()

    # ------------------------------------------------------------------ targets
    def _publish_targets(self) -> None:
        with self._lock:
            targets = [p.address for p in self._pods if p.ever_ready and p.alive()]
        if targets == self._last_targets:
            return
        self._last_targets = targets
        if self.file_sd_path is not None:
            self.file_sd_path.parent.mkdir(parents=True, exist_ok=True)
            groups = [{"targets": targets, "labels": self.labels}] if targets else []
            write_atomic(self.file_sd_path, json.dumps(groups, indent=1))
        try:
            if self.on_targets is not None:
                self.on_targets(list(targets), dict(self.labels))
            if self.prometheus is not None:
                self.prometheus.set_targets([(a, dict(self.labels)) for a in targets])
        except Exception as e:
            self._error(f"publishing targets: {type(e).__name__}: {e}")

    # ------------------------------------------------------------------ status
    def _patch_pods(self, k8s_pods: list[dict[str, Any]]) -> None:
        """Pod mode: write each Pod's status from its process's readiness, like a kubelet."""
        with self._lock:
            by_pod = {p.pod_name: p for p in self._pods if p.pod_name is not None}
        now = _now_rfc3339()
        for pod in k8s_pods:
            local = by_pod.get(pod["name"])
            want_ready = local is not None and local.ready
            if want_ready == pod["ready"] and (want_ready or not pod["ready_condition"]):
                continue
            flag = "True" if want_ready else "False"
            # No podIP: the process listens on 127.0.0.1:<its own port>, which Endpoints may not
            # carry (loopback is refused there); clients use LocalPods.ready_addresses().
            status: dict[str, Any] = {
                "phase": "Running",
                "conditions": [
                    {"type": t, "status": v, "lastTransitionTime": now}
                    for t, v in (
                        ("PodScheduled", "True"),
                        ("Initialized", "True"),
                        ("ContainersReady", flag),
                        ("Ready", flag),
                    )
                ],
            }
            if not pod["start_time"]:
                status["startTime"] = now
            status["containerStatuses"] = [
                {
                    "name": name,
                    "image": image,
                    "imageID": "",
                    "ready": want_ready,
                    "started": local is not None and local.alive(),
                    "restartCount": local.restarts if local is not None else 0,
                    "state": {"running": {"startedAt": now}},
                }
                for name, image in pod.get("containers") or []
            ]
            try:
                self._core.patch_namespaced_pod_status(pod["name"], self.namespace, {"status": status})
            except self._ApiException as e:
                if e.status != 404:
                    self._error(f"patch pod {pod['name']} status: {e.status} {e.reason}")

    def _patch_deployment_status(self, deployment: dict[str, Any]) -> None:
        """No controller-manager: write the Deployment status a deployment controller would write."""
        desired = self._desired
        with self._lock:
            n_live = len(self._pods) + len(self._terminating)
            n_ready = sum(1 for p in self._pods if p.ready)
        available = n_ready >= desired  # maxUnavailable 0 semantics; 0 replicas is available
        status = {
            "observedGeneration": (deployment.get("metadata") or {}).get("generation"),
            "replicas": n_live,
            "updatedReplicas": len(self._pods),
            "readyReplicas": n_ready,
            "availableReplicas": n_ready,
            "unavailableReplicas": max(0, desired - n_ready),
        }
        key = (tuple(sorted(status.items(), key=lambda kv: kv[0])), available)
        current = deployment.get("status") or {}
        current_available = next(
            (c.get("status") for c in current.get("conditions") or [] if c.get("type") == "Available"), None
        )
        if key == self._last_status and current_available == ("True" if available else "False"):
            return
        now = _now_rfc3339()
        status["conditions"] = [
            {
                "type": "Available",
                "status": "True" if available else "False",
                "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                "message": f"{n_ready}/{desired} local processes ready ({NO_KUBELET_MESSAGE})",
                "lastUpdateTime": now,
                "lastTransitionTime": now,
            }
        ]
        try:
            self._apps.patch_namespaced_deployment_status(self.name, self.namespace, {"status": status})
            self._last_status = key
        except self._ApiException as e:
            if e.status != 404:
                self._error(f"patch deployment status: {e.status} {e.reason}")


@contextlib.contextmanager
def local_pods(
    kubeconfig: str | os.PathLike[str], namespace: str, name: str, **kwargs: Any
) -> Iterator[LocalPods]:
    """Context manager form: ``with local_pods(kc, ns, name, on_targets=...) as lp: lp.wait_ready()``."""
    lp = LocalPods(kubeconfig, namespace, name, **kwargs)
    lp.start()
    try:
        yield lp
    finally:
        lp.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run the local pods of one InferenceService until Ctrl-C."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kc = os.environ.get("KUBECONFIG")
    ap.add_argument("--kubeconfig", default=kc, required=kc is None)
    ap.add_argument("--namespace", "-n", default="default")
    ap.add_argument("--name", required=True, help="InferenceService name")
    ap.add_argument("--file-sd", help="write Prometheus file_sd targets to this JSON file")
    ap.add_argument("--workdir", help="config files and process logs (default: a temporary folder)")
    ap.add_argument("--no-status", action="store_true", help="do not patch pod/Deployment status")
    ap.add_argument("--max-replicas", type=int, default=8)
    ap.add_argument("runtime_args", nargs="*", help="extra runtime arguments (after --)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one readiness probe per process per second
    LocalPods(
        args.kubeconfig,
        args.namespace,
        args.name,
        workdir=args.workdir,
        file_sd_path=args.file_sd,
        report_status=not args.no_status,
        max_replicas=args.max_replicas,
        extra_args=args.runtime_args,
    ).run_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
