"""Run ``kubeinfer-activator`` as a subprocess, driven by its targets file (tests, benchmarks).

Usage::

    from hack.devtools.activator_proc import ActivatorProcess

    with ActivatorProcess(args=["--max-held-requests", "4"]) as act:
        act.write_targets([{"name": "simple", "namespace": "ml", "grpc_port": 0}])   # no replica yet
        act.wait_for(lambda s: s["targets"]["ml/simple"]["grpc_port"])            # its gRPC listener
        ...   # requests to act.address (Host: simple.ml) / act.target_grpc_address("ml/simple") are held
        act.write_targets([{..., "endpoint": {"host": "127.0.0.1", "http_port": P, "grpc_port": G}}])

With ``kubeconfig`` the activator takes its targets from that cluster instead
(``--targets-from kubernetes``): the test writes InferenceServices, Services and pods to the API server,
and the targets file is not read.

The process binds ``--port 0`` and ``--grpc-port 0`` and the helper reads the ports from its log lines
(``listening on http://HOST:PORT``, ``grpc listening on HOST:PORT``). The targets file is replaced
atomically on each ``write_targets`` (the activator polls it every 50 ms). ``status()`` is the
activator's ``GET /activator/status``; ``wait_for(predicate)`` polls it until ``predicate`` holds.
On Linux the process gets SIGTERM when the thread that started it exits (unless ``die_with_parent``
is False).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from hack.procs import die_with_parent

__all__ = ["ActivatorProcess"]

_LISTENING = re.compile(r"listening on http://([^:\s]+):(\d+)")
_GRPC_LISTENING = re.compile(r"grpc listening on (\S+):(\d+)$", re.MULTILINE)


class ActivatorProcess:
    """One ``kubeinfer-activator`` process.

    Args:
        args: extra command-line flags (e.g. ``["--cold-start-timeout", "0.5"]``).
        targets: the targets file's first content (a list of target objects; default none).
        start_timeout: seconds to wait for both ports in ``start``.
        die_with_parent: as ``RuntimeProcess``'s (False where the parent runs gRPC threads).
        kubeconfig: targets from the Kubernetes API of this kubeconfig (``--targets-from kubernetes``)
            instead of the targets file.
    """

    def __init__(
        self,
        *,
        args: list[str] | None = None,
        targets: list[dict[str, Any]] | None = None,
        start_timeout: float = 60.0,
        die_with_parent: bool = True,
        kubeconfig: Path | None = None,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="kubeinfer-activator-")
        tmp = Path(self._tmp.name)
        self.targets_path = tmp / "targets.json"
        self.log_path = tmp / "activator.log"
        self.args = list(args or [])
        self.start_timeout = start_timeout
        self.die_with_parent = die_with_parent
        self.kubeconfig = kubeconfig
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.grpc_port = 0
        self.write_targets(targets or [])

    @property
    def address(self) -> str:
        """``127.0.0.1:port`` of the REST front."""
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_address(self) -> str:
        """``127.0.0.1:port`` of the shared gRPC listener."""
        return f"127.0.0.1:{self.grpc_port}"

    def target_grpc_address(self, target: str) -> str:
        """``127.0.0.1:port`` of ``target``'s own gRPC listener (``KeyError`` if it has none yet)."""
        port = self.status()["targets"][target]["grpc_port"]
        if not port:
            raise KeyError(f"{target} has no gRPC listener")
        return f"127.0.0.1:{port}"

    def write_targets(self, targets: list[dict[str, Any]]) -> None:
        """Replace the targets file (atomically) with ``{"targets": targets}``."""
        tmp = self.targets_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"targets": targets}), encoding="utf-8")
        os.replace(tmp, self.targets_path)

    def start(self) -> ActivatorProcess:
        """Start the process and wait for its ports; ``RuntimeError`` with the log if it does not listen."""
        cmd = [
            sys.executable,
            "-m",
            "kubeinfer.activator.cli",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--grpc-port",
            "0",
            *(
                ["--targets-from", "kubernetes", "--kubeconfig", str(self.kubeconfig)]
                if self.kubeconfig
                else ["--targets-file", str(self.targets_path)]
            ),
            *self.args,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" and self.die_with_parent else None,
            )
        deadline = time.monotonic() + self.start_timeout
        while not (self.port and self.grpc_port):
            text = self.log_text()
            http, grpc = _LISTENING.search(text), _GRPC_LISTENING.search(text)
            if http and grpc:
                self.port, self.grpc_port = int(http.group(2)), int(grpc.group(2))
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"kubeinfer-activator did not listen:\n{text[-3000:]}")
            time.sleep(0.02)
        return self

    def log_text(self) -> str:
        """The process's output so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def status(self) -> dict[str, Any]:
        """``GET /activator/status``."""
        with urllib.request.urlopen(f"http://{self.address}/activator/status", timeout=10) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
        return doc

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], object], timeout: float = 30.0
    ) -> dict[str, Any]:
        """Poll ``status()`` until ``predicate(status)`` is truthy; returns that status.

        Raises ``TimeoutError`` (with the last status and the log's tail) after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if predicate(status):
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"activator status never matched: {status}\n{self.log_text()[-2000:]}")
            time.sleep(0.02)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait (SIGKILL after ``timeout`` seconds); returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)

    def __enter__(self) -> ActivatorProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self._tmp.cleanup()
