"""Run a real ``kubeinfer-operator`` process against a test cluster (owned by the operator team).

::

    with OperatorProcess(cluster.kubeconfig, namespaces=[ns], log_dir=tmp_path) as op:
        op.wait_ready()
        op.reconciles()          # kubeinfer_operator_reconciles_total, summed over results
        op.metrics_text()        # the operator's /metrics
        op.peak_rss_bytes()      # VmHWM of the process
        op.log()                 # its stderr so far

``proxy=True`` sends all the process's API traffic (kopf's client and its own) through a
``kubectl proxy -v=6`` started for it: :meth:`OperatorProcess.proxy_writes` then lists every write
request THIS process made ("PATCH /apis/... 200 OK"), whatever other processes of the session write
to the same API server (``apiserver_request_total`` is cluster-wide, with no user or namespace label).

``namespaces=None`` watches all namespaces. ``peering=""`` (default) runs standalone; a name runs kopf
peering with ``priority`` (the KopfPeering/ClusterKopfPeering CRDs must be installed:
``crds/kopf-peering.yaml``). ``resync_seconds`` sets ``KUBEINFER_RESYNC_SECONDS``. Ports (metrics,
health) are free ports on 127.0.0.1. The process is terminated (SIGTERM, then SIGKILL after 10 s)
on exit, also when the test fails.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

from hack.cluster import DEFAULT_BIN_DIR

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_BIN = Path(sys.executable).parent / "kubeinfer-operator"


#: Environment for test operators: the autoscaler's timer ticks every 2 s against a closed port
#: (no Prometheus: no data, so no autoscaling action), so its transitions settle quickly.
TEST_ENV = {"KUBEINFER_PROMETHEUS_URL": "http://127.0.0.1:9", "KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": "2"}


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class OperatorProcess:
    """A ``kubeinfer-operator`` subprocess (see the module docstring)."""

    def __init__(
        self,
        kubeconfig: Path | str,
        *,
        log_dir: Path,
        namespaces: list[str] | None = None,
        peering: str = "",
        priority: int = 100,
        resync_seconds: float = 300.0,
        extra_env: dict[str, str] | None = None,
        name: str = "operator",
        proxy: bool = False,
    ) -> None:
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.log_path = Path(log_dir) / f"{name}-{self.metrics_port}.log"
        self.kubeconfig = Path(kubeconfig)
        self.proxy_log_path = Path(log_dir) / f"{name}-{self.metrics_port}-proxy.log"
        self.proxy_kubeconfig = Path(log_dir) / f"{name}-{self.metrics_port}-proxy.kubeconfig"
        self.proxy: subprocess.Popen[bytes] | None = None
        self.use_proxy = proxy
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "KUBEINFER_NAMESPACES": ",".join(namespaces or []),
            "KUBEINFER_PEERING": peering,
            "KUBEINFER_PEERING_PRIORITY": str(priority),
            "KUBEINFER_RESYNC_SECONDS": str(resync_seconds),
            "KUBEINFER_METRICS_PORT": str(self.metrics_port),
            "KUBEINFER_HEALTH_PORT": str(self.health_port),
            "KUBEINFER_BIND_ADDRESS": "127.0.0.1",
            "KUBEINFER_LOG_LEVEL": "DEBUG",
            "HF_HUB_OFFLINE": "1",
            **(extra_env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        """Start the process (returns at once; see :meth:`wait_ready`)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.use_proxy:
            self.env["KUBECONFIG"] = str(self._start_proxy())
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [str(OPERATOR_BIN)], env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        )
        log.close()
        return self

    def _start_proxy(self, timeout: float = 30.0) -> Path:
        """Start ``kubectl proxy`` (free port, request log at -v=6); return a kubeconfig that points at it."""
        kubectl = DEFAULT_BIN_DIR / "kubectl"
        log = self.proxy_log_path.open("wb")
        args = ["proxy", "--port=0", "--address=127.0.0.1", "--kubeconfig", str(self.kubeconfig), "-v=6"]
        self.proxy = subprocess.Popen(
            [str(kubectl if kubectl.exists() else "kubectl"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not (found := re.search(r"Starting to serve on 127\.0\.0\.1:(\d+)", self.proxy_log())):
            if self.proxy.poll() is not None or time.monotonic() > deadline:
                self._stop_proxy()
                raise RuntimeError(f"kubectl proxy did not start:\n{self.proxy_log()[-2000:]}")
            time.sleep(0.1)
        self.proxy_kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: proxy, cluster: {{server: 'http://127.0.0.1:{found.group(1)}'}}}}]\n"
            "users: [{name: proxy, user: {}}]\n"
            "contexts: [{name: proxy, context: {cluster: proxy, user: proxy}}]\n"
            "current-context: proxy\n"
        )
        return self.proxy_kubeconfig

    def _stop_proxy(self) -> None:
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.terminate()
            try:
                self.proxy.wait(5)
            except subprocess.TimeoutExpired:
                self.proxy.kill()
                self.proxy.wait(5)

    def proxy_log(self) -> str:
        """Everything ``kubectl proxy`` wrote so far ("" without ``proxy=True``)."""
        return self.proxy_log_path.read_text(errors="replace") if self.proxy_log_path.exists() else ""

    def proxy_writes(self) -> list[str]:
        """Every write request (POST, PUT, PATCH, DELETE) this process sent so far, in order, as
        ``"VERB /path STATUS"``, from the proxy's request log. Needs ``proxy=True`` (ValueError)."""
        if not self.use_proxy:
            raise ValueError("proxy_writes() needs OperatorProcess(proxy=True)")
        pattern = re.compile(r'"Response" verb="(\w+)" url="https?://[^/"]+([^"]*)" status="([^"]*)"')
        return [
            f"{verb} {path} {status}"
            for verb, path, status in pattern.findall(self.proxy_log())
            if verb in {"POST", "PUT", "PATCH", "DELETE"}
        ]

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the kopf liveness endpoint answers 200. Raises RuntimeError if the process died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"kubeinfer-operator exited early:\n{self.log()[-4000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"kubeinfer-operator not live after {timeout}s:\n{self.log()[-4000:]}")

    def metrics_text(self) -> str:
        """The operator's Prometheus exposition text."""
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5.0).text

    def reconciles(self) -> float:
        """``kubeinfer_operator_reconciles_total`` summed over results."""
        pattern = re.compile(r"^kubeinfer_operator_reconciles_total\{[^}]*\} ([0-9.e+]+)$", re.M)
        return sum(float(v) for v in pattern.findall(self.metrics_text()))

    def own_writes(self) -> float:
        """``kubeinfer_operator_api_writes_total`` summed: write requests of the operator's own client."""
        pattern = re.compile(r"^kubeinfer_operator_api_writes_total\{[^}]*\} ([0-9.e+]+)$", re.M)
        return sum(float(v) for v in pattern.findall(self.metrics_text()))

    def peak_rss_bytes(self) -> int:
        """Peak resident set size (``VmHWM``) of the process, bytes."""
        assert self.proc is not None
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(r"^VmHWM:\s+(\d+) kB", text, re.M)
        return int(match.group(1)) * 1024 if match else 0

    def log(self) -> str:
        """Everything the process wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds (then the proxy stops). Idempotent."""
        try:
            self._stop_process(timeout)
        finally:
            self._stop_proxy()

    def _stop_process(self, timeout: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "CREATE", "UPDATE"})


def api_write_series(
    metrics_text: str, resources: set[str], verbs: frozenset[str] = WRITE_VERBS
) -> dict[str, float]:
    """``apiserver_request_total`` write series (``verbs``) on ``resources``: ``{labels: count}``.

    ``metrics_text``: the API server's ``/metrics`` (``kubectl get --raw /metrics``). The key is the
    series' label text (verb, resource, subresource, scope, code ...), so two snapshots can be diffed
    with :func:`series_diff` to say which writes happened.
    """
    series: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        label_text, value = line.rsplit(" ", 1)
        labels = dict(re.findall(r'(\w+)="([^"]*)"', label_text.split("}", 1)[0]))
        if labels.get("verb") in verbs and labels.get("resource") in resources:
            series[label_text] = series.get(label_text, 0.0) + float(value)
    return series


def series_diff(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The series of ``after`` whose count grew since ``before``, with the increase."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def api_write_counts(metrics_text: str, resources: set[str], verbs: frozenset[str] = WRITE_VERBS) -> int:
    """Sum of ``apiserver_request_total`` write requests (``verbs``) on ``resources``.

    ``metrics_text``: the API server's ``/metrics`` (``kubectl get --raw /metrics``). Pass
    ``WRITE_VERBS - {"DELETE"}`` to ignore the namespace controller finishing other tests' namespaces.
    """
    return int(sum(api_write_series(metrics_text, resources, verbs).values()))
