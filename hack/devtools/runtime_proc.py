"""Run ``kubeinfer-runtime serve`` as a subprocess for tests, demos and benchmarks (runtime team).

Usage::

    from hack.devtools.runtime_proc import RuntimeProcess, RuntimeConfig

    cfg = RuntimeConfig.model_validate({"batching": {"max_batch_size": 8}})
    with RuntimeProcess(cfg) as rt:              # starts on a free port, waits until ready
        client = tritonclient.http.InferenceServerClient(rt.address)   # "127.0.0.1:PORT"
        print(rt.url, rt.port, rt.pid, rt.metrics_text())
        rt.write_config(new_cfg)                 # hot reload (the runtime polls the file ~1 s)
    # leaving the block: SIGTERM, wait for exit (then SIGKILL after a bound)

The process binds ``--port 0`` and ``--grpc-port 0`` (the OS picks free ports; no race with other tests) and
the helper reads the real ports from its log lines ``grpc listening on HOST:PORT`` and
``listening on http://HOST:PORT`` (``grpc_port``, ``grpc_address``). Its stdout/stderr go to ``log_path``
(a temporary file unless given); ``log_text()`` returns it, and a failed start raises ``RuntimeError``
with the log's tail. On Linux the process gets SIGTERM when the thread that started it exits (also
when the test run is killed), so start it from a thread that outlives it (normally the main thread).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from kubeinfer.runtime.config import RuntimeConfig

from hack.procs import die_with_parent

__all__ = ["RuntimeConfig", "RuntimeProcess"]

_LISTENING = re.compile(r"listening on http://([^:\s]+):(\d+)")
_GRPC_LISTENING = re.compile(r"grpc listening on (\S+):(\d+)")


class RuntimeProcess:
    """One ``kubeinfer-runtime serve`` process.

    Args:
        config: a ``RuntimeConfig`` (written to ``config_path``) or the path of a runtime.yaml.
        args: extra command-line flags (e.g. ``["--max-batch-size", "4"]``).
        host: bind address (default loopback).
        ready_timeout: seconds to wait for ``/v2/health/ready`` in ``start``.
        env: extra environment variables.
        log_path: where the process's output goes (default: a temporary file).
        wait_ready: ``start`` waits for readiness (False: only for the port).
        die_with_parent: the child gets SIGTERM when the starting thread exits (a ``preexec_fn``). False
            spawns it without one (vfork): a parent with live gRPC threads (a grpc.aio client) must, as
            gRPC's fork handlers crash a child forked under them (SIGSEGV before exec).
    """

    def __init__(
        self,
        config: RuntimeConfig | str | Path | None = None,
        *,
        args: list[str] | None = None,
        host: str = "127.0.0.1",
        ready_timeout: float = 180.0,
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        wait_ready: bool = True,
        die_with_parent: bool = True,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="kubeinfer-runtime-")
        tmp = Path(self._tmp.name)
        if config is None:
            config = RuntimeConfig()
        if isinstance(config, RuntimeConfig):
            self.config_path = tmp / "runtime.yaml"
            self.config_path.write_text(config.to_yaml(), encoding="utf-8")
        else:
            self.config_path = Path(config)
        self.args = list(args or [])
        self.host = host
        self.ready_timeout = ready_timeout
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path else tmp / "runtime.log"
        self.wait_ready = wait_ready
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int = 0
        self.grpc_port: int = 0

    # ----- addresses -------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        """The process id (after ``start``)."""
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def address(self) -> str:
        """``host:port`` (what ``tritonclient.http.InferenceServerClient`` takes)."""
        return f"{self.host}:{self.port}"

    @property
    def grpc_address(self) -> str:
        """``host:port`` of the gRPC service (what ``tritonclient.grpc.InferenceServerClient`` takes)."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.address}"

    # ----- life cycle ------------------------------------------------------------------------------
    def start(self) -> RuntimeProcess:
        """Start the process; wait for its port and (unless ``wait_ready=False``) readiness.

        Raises ``RuntimeError`` with the log tail if it exits or does not become ready in time."""
        exe = Path(sys.executable).with_name("kubeinfer-runtime")
        cmd = [
            str(exe),
            "serve",
            "--config",
            str(self.config_path),
            "--host",
            self.host,
            "--port",
            "0",
            "--grpc-port",
            "0",
            *self.args,
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **self.env}
        # a restart (start after stop/kill) appends to the same log and gets a new port: look for the
        # "listening on" line only in what this process writes
        self.port = 0
        log_start = len(self.log_text()) if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" and self.die_with_parent else None,
            )
        finally:
            log.close()
        deadline = time.monotonic() + self.ready_timeout
        while not self.port:
            m = _LISTENING.search(self.log_text(), log_start)
            if m:
                self.port = int(m.group(2))
                g = _GRPC_LISTENING.search(self.log_text(), log_start)
                self.grpc_port = int(g.group(2)) if g else 0
                break
            self._check_alive()
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"kubeinfer-runtime did not listen within {self.ready_timeout} s:\n{self.tail()}"
                )
            time.sleep(0.05)
        if self.wait_ready:
            self.wait_until_ready(max(1.0, deadline - time.monotonic()))
        return self

    def wait_until_ready(self, timeout: float) -> None:
        """Poll ``/v2/health/ready`` until 200; ``RuntimeError`` after ``timeout`` seconds or on exit."""
        deadline = time.monotonic() + timeout
        while True:
            if self.get("/v2/health/ready")[0] == 200:
                return
            self._check_alive()
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"kubeinfer-runtime not ready within {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.2)

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"kubeinfer-runtime exited with {self.proc.returncode}:\n{self.tail()}")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (graceful drain) and wait; SIGKILL after ``timeout`` seconds. Returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.proc.returncode if self.proc.returncode is not None else -9)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        """Stop (if running) and remove the temporary directory."""
        try:
            self.stop()
        finally:
            self._tmp.cleanup()

    def __enter__(self) -> RuntimeProcess:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ----- helpers ---------------------------------------------------------------------------------
    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """``GET path``; returns (status, body); status 0 if the connection failed."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, b""

    def metrics_text(self) -> str:
        """The ``/metrics`` exposition text."""
        status, body = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        return body.decode()

    def write_config(self, config: RuntimeConfig | str) -> None:
        """Replace the watched config file atomically (as a ConfigMap update does)."""
        text = config.to_yaml() if isinstance(config, RuntimeConfig) else config
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.config_path)

    def log_text(self) -> str:
        """Everything the process logged so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log."""
        return "\n".join(self.log_text().splitlines()[-lines:])
