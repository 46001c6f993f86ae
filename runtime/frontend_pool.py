"""The model process's side of ``server.http_workers`` > 1: it starts and supervises the HTTP front-end
processes (``kubeinfer.runtime.frontend``) and answers their messages (``kubeinfer.runtime.ipc``).

``FrontEndPool(server, workers)``, owned by ``RuntimeServer``:

- ``start``: reserves the HTTP port (a socket bound with ``SO_REUSEPORT`` and never listening: it
  holds the port, also a port-0 pick, and takes no connections), binds the ZeroMQ ROUTER on an
  abstract Unix socket (``ipc://@kubeinfer-PID-RANDOM``, nothing on disk), starts ``workers`` front
  ends (``python -m kubeinfer.runtime.frontend``, configuration on stdin, ``PR_SET_PDEATHSIG``: they
  die with this process) and waits until each says ``hello`` (listening).
- Supervision: a front end that exits while the pool runs is started again in its slot (at most once
  a second per slot); only the requests in flight on it fail (their connections close; the model
  process's replies to it are dropped by the ROUTER).
- ``stop``: SIGTERM to every front end (each closes its listener and finishes its requests in flight),
  waits for them (SIGKILL after ``timeout``), closes the ROUTER. ``RuntimeServer`` calls it after its
  drain, so every queued request has its reply by then.

Answers (``handle``): ``infer`` -> the batcher (same checks and errors as ``RuntimeServer.infer``; the
request's remaining ``timeout`` from ``ipc.remaining_timeout_us``), counted in the model process's
metrics (request duration from the front end's receipt to the reply); ``status`` -> readiness and
model metadata; ``metrics`` -> the exposition; ``count`` -> a response a front end gave itself.
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
from kubeinfer.runtime.errors import HTTPError, InferenceError

if TYPE_CHECKING:
    import zmq
    from kubeinfer.runtime.server import RuntimeServer

log = logging.getLogger("kubeinfer.runtime.frontend_pool")

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
    """The front-end processes of one ``RuntimeServer`` and the IPC endpoint they talk to.

    Args:
        server: the model process's server (its batcher, model, metrics, readiness).
        workers: how many front ends (``server.http_workers``).
    """

    def __init__(self, server: RuntimeServer, workers: int) -> None:
        self.server = server
        self.workers = workers
        self.address = f"ipc://@kubeinfer-{os.getpid()}-{secrets.token_hex(6)}"
        self.port = 0
        self._reserved: socket.socket | None = None
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
        """Reserve the port, start the endpoint and the front ends, wait for their ``hello``. Returns the
        HTTP port. Raises ``RuntimeError`` if a front end does not come up in time."""
        cfg = self.server.cfg
        self._reserved = reserve_port(cfg.server.host, cfg.server.port)
        self.port = self._reserved.getsockname()[1]
        self._endpoint = ipc.ModelEndpoint(self.address, self.handle)
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
        cfg = self.server.cfg.model_copy(deep=True)
        cfg.server.port = self.port
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
                self.server.metrics.frontend_restarts.labels(
                    self.server.cfg.model.name, str(slot.index)
                ).inc()
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
        keep-alive client that has just received its last answer and sends again meets a 503
        ("shutting down") instead of a connection that its front end closes, in its graceful shutdown,
        under the new request (seen as "connection closed" by a client, once in several runs of
        the SIGTERM-under-load test)."""
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
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None

    # ----- messages ---------------------------------------------------------------------------------
    async def handle(
        self, header: ipc.Header, frames: list[zmq.Frame]
    ) -> tuple[ipc.Header, Sequence[Any]] | None:
        """Answer one message from a front end (``ipc.Handler``)."""
        op = header.op
        if op == "infer":
            return await self._infer(header, frames)
        server = self.server
        if op == "status":
            return ipc.Header(op="reply", info=server.status_info()), []
        if op == "metrics":
            return ipc.Header(op="reply"), [server.metrics.exposition()]
        if op == "count":
            server.metrics.count_request(header.code, header.seconds)
        elif op == "hello":
            self._hello[header.code] = header.pid
            self._hello_changed.set()
        else:
            raise HTTPError(f"ipc: unknown operation {op!r}", 400)
        return None

    async def _infer(self, header: ipc.Header, frames: list[zmq.Frame]) -> tuple[ipc.Header, Sequence[Any]]:
        server = self.server
        server.metrics.inflight.inc()
        status = 500
        try:
            batcher = server.batcher
            if server.draining or batcher is None:
                raise HTTPError(
                    "shutting down" if server.draining else f"model '{server.model_name}' is not ready", 503
                )
            inputs = ipc.decode_tensors(header.tensors, frames)
            timeout_us = ipc.remaining_timeout_us(header.timeout_us, header.received, time.monotonic())
            outputs = await batcher.infer(inputs, priority=header.priority, timeout_us=timeout_us)
            specs, out = ipc.encode_tensors(outputs)
            status = 200
            return ipc.Header(op="reply", tensors=specs), out
        except InferenceError as exc:
            status = exc.status
            raise
        finally:
            server.metrics.inflight.dec()
            server.metrics.count_request(status, max(0.0, time.monotonic() - header.received))
