"""Run a real ``kubeinfer-operator`` process against a test cluster (owned by the operator team).

::

    with OperatorProcess(cluster.kubeconfig, namespaces=[ns], log_dir=tmp_path) as op:
        op.wait_ready()
        op.reconciles()          # kubeinfer_operator_reconciles_total, summed over results
        op.metrics_text()        # the operator's /metrics
        op.peak_rss_bytes()      # VmHWM of the process
        op.log()                 # its stderr so far

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
    ) -> None:
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.log_path = Path(log_dir) / f"{name}-{self.metrics_port}.log"
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
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [str(OPERATOR_BIN)], env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        )
        log.close()
        return self

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
        """SIGTERM, then SIGKILL after ``timeout`` seconds. Idempotent."""
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


def api_write_counts(metrics_text: str, resources: set[str], verbs: frozenset[str] = WRITE_VERBS) -> int:
    """Sum of ``apiserver_request_total`` write requests (``verbs``) on ``resources``.

    ``metrics_text``: the API server's ``/metrics`` (``kubectl get --raw /metrics``). Pass
    ``WRITE_VERBS - {"DELETE"}`` to ignore the namespace controller finishing other tests' namespaces.
    """
    total = 0.0
    for line in metrics_text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if (
            labels.get("verb") in {"POST", "PUT", "PATCH", "APPLY", "DELETE", "CREATE", "UPDATE"}
            and labels.get("resource") in resources
        ):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)
