"""The model process's side of ``server.http_workers`` > 1: it starts and supervises the HTTP front-end
processes (``kubeinfer.runtime.frontend``) and answers their messages (``kubeinfer.runtime.ipc``).

``FrontEndPool(server, workers)``, owned by ``RuntimeServer``:

- ``start``: reserves the HTTP and the gRPC port (sockets bound with ``SO_REUSEPORT`` and never
  listening: they hold the ports, also port-0 picks, and take no connections; every front end serves
  both), binds the ZeroMQ ROUTER on an
  abstract Unix socket (``ipc://@kubeinfer-PID-RANDOM``, nothing on disk), starts ``workers`` front
  ends (``python -m kubeinfer.runtime.frontend``, configuration on stdin, ``PR_SET_PDEATHSIG``: they
  die with this process) and waits until each says ``hello`` (listening).
- Supervision: a front end that exits while the pool runs is started again in its slot (at most once
  a second per slot); only the requests in flight on it fail (their connections close; the model
  process's replies to it are dropped by the ROUTER).
- ``stop``: SIGTERM to every front end (each closes its listener and finishes its requests in flight),
  waits for them (SIGKILL after ``timeout``), closes the ROUTER. ``RuntimeServer`` calls it after its
  drain, so every queued request has its reply by then.

The IPC endpoint (``handle``) is a transport like REST and gRPC: it decodes a front end's message,
calls the model process's data plane (``kubeinfer.runtime.dataplane.DataPlane``) and encodes the
answer. ``infer`` -> ``DataPlane.infer`` (the same admission, validation, deadline, metrics and errors
as a request served in this process; its duration counts from the front end's receipt);
``status`` -> readiness; ``model`` -> model metadata, ``config`` -> the model configuration,
``model_ready`` -> model readiness, ``stats`` ->
the statistics extension (errors such as 404 cross as ``Header.error``); ``metrics`` -> the
exposition; ``count`` -> an outcome a front end decided itself (``DataPlane.count``). A ``cancel`` (the
front end's client left) never reaches ``handle``: the endpoint cancels the handler of that call, and
``DataPlane.infer`` drops the request from the queue and counts it 499.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubeinfer.runtime import ipc
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.dataplane import DataPlane, InferCall, decode_off_loop
from kubeinfer.runtime.errors import HTTPError
from kubeinfer.runtime.protocol import RegionRef

if TYPE_CHECKING:
    import zmq

log = logging.getLogger(__name__)

#: Seconds ``start`` waits for every front end's ``hello``.
START_TIMEOUT_SECONDS = 60.0
#: Shortest time between two starts of one slot (a front end that dies at once does not spin).
RESTART_INTERVAL_SECONDS = 1.0
#: How often the supervisor looks at the front ends, seconds.
POLL_SECONDS = 0.2
_PR_SET_PDEATHSIG = 1


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` that never listens: it holds the port (the
    real one when ``port`` is 0) for the front ends, which bind it with ``SO_REUSEPORT`` too and listen.
    Linux spreads connections over listening sockets only. Raises ``OSError`` if the port is taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


#: Seconds the front ends stay up after the model process drained (``FrontEndPool.stop``).
DRAIN_LINGER_SECONDS = 0.5


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0


class FrontEndPool:
    """The front-end processes of one model process and the IPC endpoint they talk to.

    Args:
        plane: the model process's data plane (what the endpoint answers with; its metrics).
        cfg: the runtime configuration (each front end gets it, with the real port).
        workers: how many front ends (``server.http_workers``); 0: none, the endpoint only, and no port
            reserved (a model process of the model repository mode, whose parent is the front end).
        address: the endpoint's ZeroMQ address (default: a new abstract Unix socket).
    """

    def __init__(
        self, plane: DataPlane, cfg: RuntimeConfig, workers: int, address: str | None = None
    ) -> None:
        self.plane = plane
        self.cfg = cfg
        self.workers = workers
        self.address = address or f"ipc://@kubeinfer-{os.getpid()}-{secrets.token_hex(6)}"
        self.port = 0
        self.grpc_port = 0
        self._reserved: socket.socket | None = None
        self._reserved_grpc: socket.socket | None = None
        self._endpoint: ipc.ModelEndpoint | None = None
        self._slots = [_Slot(i) for i in range(workers)]
        self._hello: dict[int, int] = {}  # slot -> pid of its last hello
        self._hello_changed = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self.done = asyncio.Event()  # set when stop() finished

    @property
    def pids(self) -> list[int]:
        """The running front ends' process ids."""
        return [s.proc.pid for s in self._slots if s.proc is not None and s.proc.poll() is None]

    async def start(self) -> int:
        """Reserve the HTTP and gRPC ports, start the endpoint and the front ends (each serves REST and
        gRPC on them), wait for their ``hello``. Returns the HTTP port (the gRPC one is ``grpc_port``).
        Raises ``RuntimeError`` if a front end does not come up in time."""
        cfg = self.cfg
        if self.workers > 0:
            self._reserved = reserve_port(cfg.server.host, cfg.server.port)
            self.port = self._reserved.getsockname()[1]
            self._reserved_grpc = reserve_port(cfg.server.host, cfg.server.grpc_port)
            self.grpc_port = self._reserved_grpc.getsockname()[1]
        self._endpoint = ipc.ModelEndpoint(self.address, self.handle, closing=lambda: self.plane.closing)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._endpoint.run()))
        for slot in self._slots:
            self._spawn(slot)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while len(self._hello) < self.workers:
            self._hello_changed.clear()
            left = deadline - time.monotonic()
            if left <= 0 or any(s.proc is not None and s.proc.poll() is not None for s in self._slots):
                await self.stop(timeout=1.0)
                started = f"{len(self._hello)} of {self.workers} listening"
                raise RuntimeError(f"front ends did not start: {started}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hello_changed.wait(), min(left, POLL_SECONDS))
        self._tasks.append(loop.create_task(self._supervise()))
        return self.port

    def _spawn(self, slot: _Slot) -> None:
        cfg = self.cfg.model_copy(deep=True)
        cfg.server.port = self.port
        cfg.server.grpc_port = self.grpc_port
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        cmd = [sys.executable, "-m", "kubeinfer.runtime.frontend", "--ipc", self.address]
        cmd += ["--index", str(slot.index), "--log-level", str(level)]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        assert proc.stdin is not None
        proc.stdin.write(cfg.model_dump_json().encode())
        proc.stdin.close()
        slot.proc = proc
        slot.started = time.monotonic()
        log.info("front end %d started (pid %d)", slot.index, proc.pid)

    async def _supervise(self) -> None:
        """Start again every front end that exited (unless stopping)."""
        while not self._stopping:
            await asyncio.sleep(POLL_SECONDS)
            for slot in self._slots:
                proc = slot.proc
                if self._stopping or proc is None or proc.poll() is None:
                    continue
                if time.monotonic() - slot.started < RESTART_INTERVAL_SECONDS:
                    continue
                slot.restarts += 1
                self.plane.metrics.frontend_restarts.labels(self.cfg.model.name, str(slot.index)).inc()
                log.warning(
                    "front end %d (pid %d) exited with %s; starting it again (restart %d)",
                    slot.index,
                    proc.pid,
                    proc.returncode,
                    slot.restarts,
                )
                self._spawn(slot)

    async def stop(self, timeout: float = 30.0, linger: float = 0.0) -> None:
        """SIGTERM every front end after ``linger`` seconds, wait ``timeout`` seconds at most (then
        SIGKILL), close the endpoint.

        After a drain, ``linger`` (``DRAIN_LINGER_SECONDS``) keeps the listeners open a little: a
        client that has just received its last answer (with ``Connection: close``, as every response
        after the SIGTERM) and connects again meets a 503 ("shutting down") rather than a refused
        connection."""
        self._stopping = True
        if linger > 0:
            await asyncio.sleep(linger)
        procs = [s.proc for s in self._slots if s.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for proc in procs:
            if proc.poll() is None:
                log.warning("front end pid %d did not exit in %.0f s; killing it", proc.pid, timeout)
                proc.kill()
                proc.wait(5)
        self.close()
        self.done.set()

    def kill(self) -> None:
        """SIGKILL every front end at once (a second signal)."""
        self._stopping = True
        for slot in self._slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
        self.close()
        self.done.set()

    def close(self) -> None:
        """Stop the endpoint and release the port."""
        for task in self._tasks:
            task.cancel()
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
        for sock in (self._reserved, self._reserved_grpc):
            if sock is not None:
                sock.close()
        self._reserved = self._reserved_grpc = None

    # ----- messages ---------------------------------------------------------------------------------
    async def handle(
        self, header: ipc.Header, frames: list[zmq.Frame]
    ) -> tuple[ipc.Header, Sequence[Any]] | None:
        """Answer one message from a front end (``ipc.Handler``). Raises ``InferenceError`` (sent back
        as ``Header.error``)."""
        op = header.op
        plane = self.plane
        if op == "infer":
            return await self._infer(header, frames)
        if op == "status":
            return ipc.Header(op="reply", info={"reason": await plane.readiness()}), []
        if op in ("model", "config"):
            document = plane.model_metadata if op == "model" else plane.model_config
            return ipc.Header(op="reply", info=await document(header.model, header.version)), []
        if op == "model_ready":
            await plane.model_ready(header.model, header.version)
            return ipc.Header(op="reply"), []
        if op == "stats":
            stats = await plane.statistics(header.model, header.version)
            return ipc.Header(op="reply", info={"model_stats": stats}), []
        if op == "shm":
            info = header.info or {}
            regions = await plane.shared_memory(
                info["kind"], info["action"], info.get("name"), info.get("spec") or {}
            )
            return ipc.Header(op="reply", info={"regions": regions}), []
        if op == "metrics":
            return ipc.Header(op="reply"), [await plane.metrics_text()]
        if op == "count":
            plane.count(header.code, header.seconds)
        elif op == "hello":
            self._hello[header.code] = header.pid
            self._hello_changed.set()
        else:
            raise HTTPError(f"ipc: unknown operation {op!r}", 400)
        return None

    async def _infer(self, header: ipc.Header, frames: list[zmq.Frame]) -> tuple[ipc.Header, Sequence[Any]]:
        async def decode() -> InferCall:
            size = sum(len(frame) for frame in frames)
            inputs = await decode_off_loop(size, ipc.decode_tensors, header.tensors, frames)
            return InferCall(
                inputs,
                header.outputs,
                header.priority,
                header.timeout_us,
                header.usage,
                shm_inputs={
                    n: (d, list(shape), RegionRef(r, o, b)) for n, d, shape, r, o, b in header.shm_inputs
                },
                shm_outputs={n: RegionRef(r, o, b) for n, r, o, b in header.shm_outputs},
                cache=header.cache,
                split=header.split,
                overflow=header.overflow,
            )

        outputs = await self.plane.infer(header.received, header.model, header.version, decode)
        specs, out = ipc.encode_tensors(outputs)
        return ipc.Header(op="reply", tensors=specs), out
