"""Front-end benchmark: server CPU per request and the highest rate at P99 <= 100 ms, per protocol.

``make bench-frontend`` (or ``.venv/bin/python bench/frontend_bench.py``) -> ``bench/results/frontend.json``.

What runs, in ONE run on this machine (side by side, so the ratios share the machine's noise):

- the **floor**: the same HTTP stack as ``kubeinfer-runtime`` (uvicorn + httptools + uvloop +
  Starlette, the same socket options) answering every ``POST .../infer`` with a fixed 100-byte JSON
  response, no model, no decoding (``--floor-server``, started as its own process);
- ``kubeinfer-runtime serve`` with the tiny 2-layer BERT of ``hack/devtools/runtime_tiny.py`` (the
  model costs almost nothing: what is measured is the serving path), then with the bundled
  all-MiniLM-L6-v2 (fp32), each with its default batching settings;
- per server, three request encodings of one text row (a random held-out sentence): **json** (JSON
  input and output), **binary** (tritonclient's binary tensor extension for input and output, the
  body made by ``tritonclient.http.InferenceServerClient.generate_request_body``) and **grpc**
  (``ModelInfer`` with ``raw_input_contents``, when the runtime serves gRPC).

- **granian beside uvicorn** (``--granian``, ``parse_granian_settings``): the floor's fixed response
  served by granian 2.8.7 (``GranianSettings``: ASGI with the same Starlette app, RSGI with no
  framework, one worker, uvloop, HTTP/1), from its own venv ``.cache/bench-granian``
  (``hack/setup.sh --bench-granian``) that reads this .venv's packages, measured like the floor in
  ``floor_granian``; and (``--granian-runtime``) the tiny runtime's own app served by granian
  (``bench/granian_runtime.py``), JSON and binary, in ``tiny[encoding]["granian"]``.

Per (server, encoding): open-loop Poisson arrivals at rising rates (x ``--rate-factor``), latency from
each request's *scheduled* arrival (a slow client cannot hide queueing); a rate meets the SLO when P99
<= 100 ms and >= 99 % of requests got 200. After the first two failing rates, ``--refine`` bisection
rounds between the highest passing and the lowest failing rate. ``max_slo_rps`` is the highest passing
offered rate. ``cpu_us_per_request`` is the server process's CPU time (user + system, all threads, from
``/proc`` via psutil) over the requests it answered, at the highest passing rate (the most loaded
point inside the SLO; at lower rates batches are smaller and the per-request share of a batch larger).

The client is this process: a minimal HTTP/1.1 keep-alive client on asyncio protocols (pre-encoded
requests, one request per connection at a time, connections opened on demand) and grpc.aio with
pre-serialized messages; its own CPU per request is reported (it shares the cores with the server).

Profile (``--no-profile`` skips it), tiny model, every encoding and front-end count, at one rate
(``--profile-rate``, default 1000/s, at most 70 % of the configuration's max): two loads of
``--profile-seconds``; during the first, the CPU of every thread of every process of the pod from
``/proc`` (exact: main threads, executor threads, ZeroMQ's I/O threads, grpc's); during the second,
``cProfile`` on the main thread of every process (started and stopped by signals from a
``sitecustomize`` the bench puts on the runtime's ``PYTHONPATH``; dormant otherwise), its own-time
shares by category (HTTP/ASGI framework, JSON parse, JSON encode, tensor codec, IPC, gRPC, data plane,
batcher hand-off, metrics, logging, event loop) applied to the main threads' µs per request. The
floor is measured at the same rate. And the **plane baseline** (``plane_baseline``, its own process):
the tiny model's ``DataPlane`` with no transport, waves of 1, 4, 16 and 32 concurrent one-row requests
straight into ``DataPlane.infer``: what admission, validation, the batcher, tokenization, the model
and the metrics cost per request at each batch size, before any HTTP, gRPC or IPC. Everything is
in ``profile`` of the JSON (``profile.method`` says what the figures can and cannot see), and per
configuration under ``...["profile"]``.

Front-end processes (``server.httpWorkers``): every runtime is measured with each
count of ``--workers`` (default ``1,2``) in the same run, one after the other: ``workers["1"]`` is the
one-process runtime, ``workers["2"]`` two front-end processes in front of the model process, each
serving REST and gRPC (both ports shared with ``SO_REUSEPORT``), so gRPC is measured behind the front
ends too. ``cpu_us_per_request`` is then the CPU of every process of the pod (the model process and its
front ends, ``psutil`` children) over the requests answered; ``frontend_cpu_us_per_request`` the front
ends' share; ``main_thread_*`` stays the model process's event loop.

Like every benchmark that measures, it runs under ``bench/quiet.py``: the machine-wide bench lock, and
no measurement while the 1-minute load average is over 0.5 unless ``--noisy`` (the JSON then says
``"noisy": true``); ``machine`` in the JSON records the CPU, the cores and the load before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import quiet
from frontend_floor import starlette_app

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for hack.devtools

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SLO_P99_SECONDS = 0.100
#: granian's venv (``hack/setup.sh --bench-granian``): granian alone, reading this .venv's packages after its
#: own through ``KUBEINFER_BENCH_SITE_PACKAGES`` (hack/lock.py OVERLAYS).
GRANIAN_VENV = ROOT / ".cache" / "bench-granian"
#: The granian floors measured by default (``--granian``): ``parse_granian_settings``'s syntax.
DEFAULT_GRANIAN = "asgi/1,asgi/2,rsgi/1,rsgi/2"


def progress(message: str) -> None:
    """A progress line on stdout."""
    print(f"[frontend_bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- the floor server -----------------------------------------------------------------------------


def floor_server(host: str) -> int:
    """Serve the fixed response on the runtime's HTTP stack until SIGTERM (``--floor-server``)."""
    import uvicorn
    from kubeinfer.runtime.process import event_loop_factory

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, 0))
    sock.listen(2048)
    sock.setblocking(False)
    print(f"listening on http://{host}:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(starlette_app(), lifespan="off", log_level=logging.WARNING, access_log=False)
    server = uvicorn.Server(config)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(server.serve(sockets=[sock]))
    return 0


@dataclasses.dataclass(frozen=True)
class GranianSettings:
    """One granian floor server: its interface and threads, the rest fixed at what granian documents
    for a small machine (one worker: the runtime's one process; uvloop, as the runtime's loop; HTTP/1
    only, as the clients speak; no websockets; one blocking thread, the only value granian takes on
    ASGI and RSGI; the runtime's backlog, 2048).

    ``interface`` ``asgi`` serves ``frontend_floor.starlette_app`` (the uvicorn floor's app), ``rsgi``
    ``frontend_floor.rsgi_app`` (no framework). ``runtime_threads``: granian's Rust I/O threads per
    worker; ``runtime_mode``: ``auto`` (granian picks: ``st`` for RSGI on one thread, else ``mt``),
    ``st`` or ``mt``."""

    interface: str
    runtime_threads: int = 1
    runtime_mode: str = "auto"
    loop: str = "uvloop"
    http: str = "1"
    blocking_threads: int = 1
    backlog: int = 2048
    workers: int = 1

    @property
    def label(self) -> str:
        """``asgi t1``, ``rsgi t2 st``: the key of its figures in the JSON."""
        mode = "" if self.runtime_mode == "auto" else f" {self.runtime_mode}"
        return f"{self.interface} t{self.runtime_threads}{mode}"

    def argv(self, host: str, port: int, target: str | None = None) -> list[str]:
        """granian's command-line arguments (after ``python -m granian``) serving on ``host:port``:
        ``target`` (in bench/: an app factory for ``asgi``, an app for ``rsgi``; default the floor's app
        of the interface)."""
        if target is None:
            target = "frontend_floor:starlette_app" if self.interface == "asgi" else "frontend_floor:rsgi_app"
        return [
            "--interface", self.interface, "--host", host, "--port", str(port),
            "--workers", str(self.workers), "--runtime-threads", str(self.runtime_threads),
            "--runtime-mode", self.runtime_mode, "--loop", self.loop, "--http", self.http, "--no-ws",
            "--blocking-threads", str(self.blocking_threads), "--backlog", str(self.backlog),
            "--log-level", "warning", "--no-access-log", "--working-dir", str(Path(__file__).parent),
            *(["--factory"] if self.interface == "asgi" else []), target,
        ]  # fmt: skip


def parse_granian_settings(text: str) -> list[GranianSettings]:
    """``--granian``: comma-separated ``INTERFACE[/THREADS[/MODE]]`` (``asgi/1,asgi/2,rsgi/1``): interface
    ``asgi`` or ``rsgi``, runtime threads (default 1, an integer >= 1), runtime mode ``auto`` (default),
    ``st`` or ``mt``. Empty (or only commas): no granian floor. Raises ``ValueError`` naming the item
    and the field that is wrong, or a setting given twice."""
    out: list[GranianSettings] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        fields = item.split("/")
        if len(fields) > 3:
            raise ValueError(f"--granian {item!r}: at most INTERFACE/THREADS/MODE")
        interface = fields[0]
        if interface not in ("asgi", "rsgi"):
            raise ValueError(f"--granian {item!r}: interface {interface!r} is not asgi or rsgi")
        threads = 1
        if len(fields) > 1:
            if not fields[1].isdigit() or int(fields[1]) < 1:
                raise ValueError(f"--granian {item!r}: runtime threads {fields[1]!r} is not an integer >= 1")
            threads = int(fields[1])
        mode = fields[2] if len(fields) > 2 else "auto"
        if mode not in ("auto", "st", "mt"):
            raise ValueError(f"--granian {item!r}: runtime mode {mode!r} is not auto, st or mt")
        settings = GranianSettings(interface, threads, mode)
        if settings in out:
            raise ValueError(f"--granian {item!r}: given twice")
        out.append(settings)
    return out


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the OS's pick; granian binds by number, so another process may
    take it before granian does: then granian fails to start, with its message)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def plane_baseline(model_dir: str, requests: int) -> int:
    """The tiny model's ``DataPlane`` with no transport (``--plane-baseline DIR``, its own process): waves of
    1, 4, 16 and 32 concurrent one-row requests straight into ``DataPlane.infer`` (admission,
    validation, the batcher and its default settings, tokenization, the model, metrics), the process's
    CPU per request and its main thread's share; prints one JSON line ``{"concurrency N": {...}}``."""
    import uvloop
    from kubeinfer.runtime.batching import BatchSettings
    from kubeinfer.runtime.dataplane import DataPlane, InferCall
    from kubeinfer.runtime.metrics import RuntimeMetrics
    from kubeinfer.runtime.models import load_model
    from kubeinfer.runtime.models.huggingface import heldout_sentences

    from hack.devtools.runtime_tiny import tiny_hf_config

    cfg = tiny_hf_config(Path(model_dir))
    model = load_model(cfg)
    model.warmup(cfg.batching.max_batch_size, cfg.warmup.steps)
    texts = [t.encode() for t in heldout_sentences()[:256]]
    out: dict[str, Any] = {}

    async def run() -> None:
        plane = DataPlane(cfg.model.name, RuntimeMetrics(cfg.model.name), cfg.instances, cfg.cache)
        plane.attach(model, BatchSettings.from_config(cfg.batching))

        async def one(i: int) -> None:
            async def decode() -> InferCall:
                return InferCall({"text": np.array([texts[i % len(texts)]], dtype=object)}, ["embedding"])

            await plane.infer(time.monotonic(), cfg.model.name, None, decode)

        for concurrency in (1, 4, 16, 32):
            waves = max(1, requests // concurrency)
            await asyncio.gather(*(one(k) for k in range(concurrency)))  # warm
            cpu0, main0 = time.process_time(), time.thread_time()
            for w in range(waves):
                await asyncio.gather(*(one(w * concurrency + k) for k in range(concurrency)))
            cpu, main = time.process_time() - cpu0, time.thread_time() - main0
            n = waves * concurrency
            out[f"concurrency {concurrency}"] = {
                "cpu_us_per_request": round(cpu / n * 1e6, 1),
                "main_thread_us_per_request": round(main / n * 1e6, 1),
                "other_threads_us_per_request": round((cpu - main) / n * 1e6, 1),
            }
        plane.close()

    uvloop.run(run())
    print(json.dumps(out), flush=True)
    return 0


class FloorProcess:
    """The uvicorn floor server as a subprocess (``pid``, ``url``; ``main_pid``: the process whose main
    thread runs the event loop, itself)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __enter__(self) -> FloorProcess:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--floor-server"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"floor server did not start: {line!r}")
        self.port = int(m.group(1))
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def main_pid(self) -> int:
        return self.pid

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def granian_env(site_packages: str) -> dict[str, str]:
    """The environment of a process of granian's venv: this one's, plus ``KUBEINFER_BENCH_SITE_PACKAGES``
    (the overlay's .pth adds that directory after the venv's own packages: Starlette, uvloop and
    kubeinfer come from the .venv this bench runs from) and ``PYTHONSAFEPATH`` (the working directory is
    not put on ``sys.path``: the repository root's ``operator/`` would shadow the standard library's)."""
    return {**os.environ, "KUBEINFER_BENCH_SITE_PACKAGES": site_packages, "PYTHONSAFEPATH": "1"}


class GranianServer:
    """A granian server (``GranianSettings``) as a subprocess of granian's venv (``GRANIAN_VENV``): ``pid``
    granian's supervisor, ``main_pid`` its one worker (the process serving; its main thread runs the
    event loop), ``port``. ``target``: ``GranianSettings.argv``'s (default: the floor); ``env``: more
    environment; ``ready_path``: started once ``GET ready_path`` answers 200 (default: once the port
    accepts). Raises ``FileNotFoundError`` when the venv is missing, ``RuntimeError`` (with granian's
    output) when it is not started within ``start_timeout`` seconds."""

    def __init__(
        self,
        settings: GranianSettings,
        host: str = "127.0.0.1",
        start_timeout: float = 30.0,
        target: str | None = None,
        env: dict[str, str] | None = None,
        ready_path: str | None = None,
    ) -> None:
        self.settings = settings
        self.host = host
        self.start_timeout = start_timeout
        self.target = target
        self.env = env or {}
        self.ready_path = ready_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.main_pid = 0
        self._log = tempfile.TemporaryFile()  # noqa: SIM115  # granian's output; closed in __exit__

    def _started(self) -> bool:
        if self.ready_path is None:
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=0.5):
                return True
            return False
        url = f"http://{self.host}:{self.port}{self.ready_path}"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2.0) as response:
            return bool(response.status == 200)
        return False

    def __enter__(self) -> GranianServer:
        import sysconfig

        import psutil

        python = GRANIAN_VENV / "bin" / "python"
        if not python.exists():
            raise FileNotFoundError(
                f"{GRANIAN_VENV} is missing: `bash hack/setup.sh --bench-granian` installs it"
            )
        self.port = free_port(self.host)
        self.proc = subprocess.Popen(
            [str(python), "-m", "granian", *self.settings.argv(self.host, self.port, self.target)],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir(),
            env={**granian_env(sysconfig.get_path("purelib")), **self.env},
        )  # fmt: skip
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self._started():
                children = psutil.Process(self.proc.pid).children()
                if children:
                    self.main_pid = children[0].pid
                    return self
            time.sleep(0.1)
        tail = self.log_text()[-3000:]
        self.__exit__()
        raise RuntimeError(f"granian {self.settings.label} did not start: {tail}")

    def log_text(self) -> str:
        """granian's output so far (its workers' and the app's logs)."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __exit__(self, *exc: object) -> None:
        """SIGTERM to the supervisor (it stops its worker); after 10 s SIGKILL to both."""
        import psutil

        if self.proc is not None and self.proc.poll() is None:
            workers = psutil.Process(self.proc.pid).children(recursive=True)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            for worker in workers:
                with contextlib.suppress(psutil.NoSuchProcess):
                    worker.kill()
        self._log.close()


# --- clients --------------------------------------------------------------------------------------


class _HTTPConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one request at a time; responses need Content-Length."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.need = -1
        self.status = 0
        self.waiter: asyncio.Future[int] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.need < 0:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            self.status = int(head[9:12])
            m = re.search(rb"\r\ncontent-length: *(\d+)", head)
            self.need = end + 4 + (int(m.group(1)) if m else 0)
        if len(self.buf) >= self.need:
            del self.buf[: self.need]
            self.need = -1
            waiter, self.waiter = self.waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_result(self.status)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError("connection closed"))

    def request(self, payload: bytes) -> asyncio.Future[int]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self.waiter


class HTTPClient:
    """Open-loop HTTP client: a pool of keep-alive connections to ``host:port`` (opened on demand)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[_HTTPConnection] = []
        self.all: list[_HTTPConnection] = []

    async def call(self, payload: bytes) -> int:
        """Send one pre-encoded request; return the status (raises ``ConnectionError``)."""
        conn = self.idle.pop() if self.idle else None
        if conn is None or conn.closed:
            loop = asyncio.get_running_loop()
            _, conn = await loop.create_connection(_HTTPConnection, self.host, self.port)
            self.all.append(conn)
        status = await conn.request(payload)
        self.idle.append(conn)
        return status

    def close(self) -> None:
        for conn in self.all:
            if conn.transport is not None:
                conn.transport.close()


def http_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """A pre-encoded ``POST`` request."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def request_payloads(host: str, port: int, model: str, encoding: str, sentences: list[str]) -> list[bytes]:
    """Pre-encoded infer requests (one text row each) in ``json`` or ``binary`` encoding."""
    import tritonclient.http as httpclient

    path = f"/v2/models/{model}/infer"
    out = []
    for text in sentences:
        if encoding == "json":
            body = json.dumps(
                {
                    "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}],
                    "outputs": [{"name": "embedding", "parameters": {"binary_data": False}}],
                }
            ).encode()
            out.append(http_request(host, port, path, body, {"Content-Type": "application/json"}))
            continue
        inp = httpclient.InferInput("text", [1], "BYTES")
        inp.set_data_from_numpy(np.array([text.encode()], dtype=object), binary_data=True)
        outputs = [httpclient.InferRequestedOutput("embedding", binary_data=True)]
        body, json_size = httpclient.InferenceServerClient.generate_request_body([inp], outputs=outputs)
        headers = {"Content-Type": "application/octet-stream"}
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        out.append(http_request(host, port, path, body, headers))
    return out


class GRPCClient:
    """Open-loop gRPC client: pre-serialized ``ModelInferRequest`` bytes over grpc.aio channels."""

    def __init__(self, address: str, channels: int = 2) -> None:
        import grpc

        self.grpc = grpc
        self.channels = [grpc.aio.insecure_channel(address) for _ in range(channels)]
        self.calls = [ch.unary_unary("/inference.GRPCInferenceService/ModelInfer") for ch in self.channels]
        self.next = 0

    async def call(self, payload: bytes) -> int:
        """Send one serialized request; 200 on OK, else 500 + the gRPC code's value."""
        self.next = (self.next + 1) % len(self.calls)
        try:
            await self.calls[self.next](payload, timeout=10.0)
        except self.grpc.aio.AioRpcError as exc:
            return 500 + exc.code().value[0]
        return 200

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        for ch in self.channels:
            await ch.close()


def grpc_payloads(model: str, sentences: list[str]) -> list[bytes]:
    """Serialized ``ModelInferRequest`` messages, one text row in ``raw_input_contents`` each."""
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import serialize_byte_tensor

    out = []
    for text in sentences:
        req = service_pb2.ModelInferRequest(model_name=model)
        inp = req.inputs.add()
        inp.name, inp.datatype = "text", "BYTES"
        inp.shape.append(1)
        req.outputs.add().name = "embedding"
        raw = serialize_byte_tensor(np.array([text.encode()], dtype=object))
        req.raw_input_contents.append(raw.item() if raw.size else b"")  # a 0-d object array of the bytes
        out.append(req.SerializeToString())
    return out


# --- load -----------------------------------------------------------------------------------------


def pod_cpu(proc: Any) -> tuple[float, float]:
    """CPU seconds (user + system) of ``proc`` and of its child processes (the front ends of
    ``server.http_workers``; none for one process)."""
    own = sum(proc.cpu_times()[:2])
    children = 0.0
    for child in proc.children(recursive=True):
        with contextlib.suppress(Exception):  # a child that exited meanwhile
            children += sum(child.cpu_times()[:2])
    return float(own), children


def main_thread_cpu(proc: Any) -> float:
    """CPU seconds (user + system) of a process's main thread: the event loop, where the front end
    runs (HTTP, gRPC, decoding, validation, the batcher's queue, encoding, metrics); the other threads
    run tokenization and the model (executors) and grpc's own threads."""
    for thread in proc.threads():
        if thread.id == proc.pid:
            return float(thread.user_time + thread.system_time)
    return 0.0


async def run_rate(
    call: Callable[[bytes], Awaitable[int]],
    payloads: list[bytes],
    rate: float,
    duration: float,
    seed: int,
    pid: int,
    main_pid: int | None = None,
) -> dict[str, float]:
    """Open-loop Poisson arrivals at ``rate``/s for ``duration`` s; server CPU from /proc: of ``pid`` and
    its children, and of the main thread of ``main_pid`` (default ``pid``: the process running the
    event loop; granian's worker, a child of its supervisor). The client's garbage collector is paused
    for the point (``quiet.collector_paused``)."""
    import psutil

    proc = psutil.Process(pid)
    main_proc = proc if main_pid is None else psutil.Process(main_pid)
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * duration * 1.5) + 20))
    arrivals = arrivals[arrivals < duration]
    latencies: list[float] = []
    errors: collections.Counter[int] = collections.Counter()
    loop = asyncio.get_running_loop()

    async def one(index: int, at: float) -> None:
        try:
            status = await asyncio.wait_for(call(payloads[index % len(payloads)]), 10.0)
        except (TimeoutError, ConnectionError, OSError):
            status = 0
        if status == 200:
            latencies.append(loop.time() - at)
        else:
            errors[status] += 1

    with quiet.collector_paused():  # a collection during the point would read as the server's latency
        t_server0, t_front0 = pod_cpu(proc)
        t_main0 = main_thread_cpu(main_proc)
        t_client0 = time.process_time()
        start = loop.time() + 0.02
        tasks = []
        for i, offset in enumerate(arrivals.tolist()):
            at = start + offset
            delay = at - loop.time()
            if delay > 0.0005:
                await asyncio.sleep(delay)
            tasks.append(loop.create_task(one(i, at)))
        await asyncio.gather(*tasks)
        t_server1, t_front1 = pod_cpu(proc)
        main_cpu = main_thread_cpu(main_proc) - t_main0
        client_cpu = time.process_time() - t_client0
    front_cpu = t_front1 - t_front0
    server_cpu = t_server1 - t_server0 + front_cpu
    n, ok = len(arrivals), len(latencies)
    lat = np.array(latencies) if latencies else np.array([float("inf")])
    return {
        "offered_rps": rate,
        "requests": float(n),
        "ok": float(ok),
        "errors": dict(errors),
        "p50_seconds": float(np.percentile(lat, 50)),
        "p99_seconds": float(np.percentile(lat, 99)),
        "server_cpu_us_per_request": server_cpu / max(ok, 1) * 1e6,
        "main_thread_cpu_us_per_request": main_cpu / max(ok, 1) * 1e6,
        "frontend_cpu_us_per_request": front_cpu / max(ok, 1) * 1e6,
        "client_cpu_us_per_request": client_cpu / max(n, 1) * 1e6,
        "meets_slo": bool(np.percentile(lat, 99) <= SLO_P99_SECONDS and ok >= 0.99 * n),
    }


async def find_max_rate(
    label: str,
    call: Callable[[bytes], Awaitable[int]],
    payloads: list[bytes],
    pid: int,
    args: argparse.Namespace,
    start_rate: float,
    main_pid: int | None = None,
) -> dict[str, Any]:
    """Rising rates until two fail, then ``args.refine`` bisection rounds; the figures of the best
    (``main_pid``: ``run_rate``'s)."""
    points: list[dict[str, Any]] = []
    await run_rate(
        call, payloads, min(start_rate, 100.0), 0.5, args.seed, pid, main_pid
    )  # connections, caches
    # every server and encoding at the same rate too: CPU per request depends on the rate (batch sizes,
    # idle overheads), so the ratios to the floor are taken at this one
    ref_rate = args.ref_rate if start_rate >= args.start_rate else args.ref_rate / 10  # MiniLM: a tenth
    ref = await run_rate(call, payloads, ref_rate, max(3.0, args.step_seconds), args.seed, pid, main_pid)
    cpu, main_cpu = ref["server_cpu_us_per_request"], ref["main_thread_cpu_us_per_request"]
    progress(
        f"{label:>14} {ref_rate:7.0f}/s (reference rate): server {cpu:5.0f} µs/req "
        f"(main thread {main_cpu:4.0f}), P99 {ref['p99_seconds'] * 1e3:.1f} ms"
    )

    async def measure(rate: float, note: str) -> bool:
        point = await run_rate(
            call, payloads, rate, args.step_seconds, args.seed + len(points), pid, main_pid
        )
        points.append(point)
        progress(
            f"{label:>14} {rate:7.0f}/s{note}: P50 {point['p50_seconds'] * 1e3:6.1f} ms, P99 "
            f"{point['p99_seconds'] * 1e3:7.1f} ms, errors {sum(point['errors'].values())}, server "
            f"{point['server_cpu_us_per_request']:5.0f} µs/req (main thread "
            f"{point['main_thread_cpu_us_per_request']:4.0f}), client "
            f"{point['client_cpu_us_per_request']:4.0f} µs/req{'' if point['meets_slo'] else '  (over SLO)'}"
        )
        return bool(point["meets_slo"])

    rate, fails, lo, hi = start_rate, 0, 0.0, 0.0
    while (fails < 2 or (not lo and fails < 4)) and rate < args.max_rate:  # noise: 4 tries for a first pass
        if await measure(rate, ""):
            lo = rate
        else:
            fails += 1
            hi = hi or rate
        rate *= args.rate_factor
    if lo and hi:
        for round_ in range(args.refine):
            mid = (lo * hi) ** 0.5
            if await measure(mid, f" (refine {round_ + 1})"):
                lo = mid
            else:
                hi = mid
    best = max((p for p in points if p["meets_slo"]), key=lambda p: p["offered_rps"], default=None)
    return {
        "cpu_us_per_request": best["server_cpu_us_per_request"] if best else None,
        "main_thread_cpu_us_per_request": best["main_thread_cpu_us_per_request"] if best else None,
        "frontend_cpu_us_per_request": best["frontend_cpu_us_per_request"] if best else None,
        "max_slo_rps": best["offered_rps"] if best else 0.0,
        "client_cpu_us_per_request": best["client_cpu_us_per_request"] if best else None,
        "ref_rate_rps": ref_rate,
        "cpu_us_per_request_at_ref_rate": ref["server_cpu_us_per_request"],
        "main_thread_cpu_us_per_request_at_ref_rate": ref["main_thread_cpu_us_per_request"],
        "ref_point": ref,
        "points": points,
    }


# --- profile --------------------------------------------------------------------------------------

#: Put on the runtime's ``PYTHONPATH`` by ``profile_env`` (a ``sitecustomize`` module, imported at
#: start by every Python process of the pod, front ends included): SIGUSR1 starts ``cProfile`` on the
#: main thread (the event loop: the whole serving path but the executor threads), SIGUSR2 stops it and
#: writes ``<dir>/<pid>.prof``. Dormant (two signal handlers) until then.
PROFILE_SITE = """
import os, signal
_dir = os.environ.get("KUBEINFER_BENCH_PROFILE_DIR")
if _dir:
    import cProfile
    _profile = cProfile.Profile()
    def _start(signum, frame):
        _profile.enable()
    def _stop(signum, frame):
        _profile.disable()
        _profile.dump_stats(os.path.join(_dir, f"{os.getpid()}.prof"))
        _profile.clear()
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
"""


def profile_env(directory: Path) -> dict[str, str]:
    """Environment for a runtime whose main threads ``profile_load`` can profile (``PROFILE_SITE``)."""
    site = directory / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(PROFILE_SITE, encoding="utf-8")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "KUBEINFER_BENCH_PROFILE_DIR": str(directory)}


#: (category, substrings of a pstats function key "file:line(function)"); the first category one of
#: whose substrings occurs names a function's own time (``tottime``); no match is "other".
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("metrics", ("prometheus_client", "runtime/metrics.py", "runtime/statistics.py", "service_time.py")),
    ("logging", ("logging/",)),
    ("IPC (ZeroMQ)", ("zmq", "runtime/ipc.py", "runtime/frontend_pool.py")),
    ("gRPC (grpcio, protobuf)", ("grpc", "protobuf", "service_pb2", "SerializeToString", "FromString",
                                 "ParseFromString", "upb", "message.Message", "RepeatedScalar",
                                 "RepeatedComposite", "'add' of", "'extend' of", "'append' of google")),
    ("JSON encode", ("encode_json", "_json_data", "encode_response", "'encode' of 'msgspec")),
    ("JSON parse", ("decode_request", "(_header)", "(_input)", "(_output)", "(_shape)", "(_from_json",
                    "'decode' of 'msgspec", "cache_parameter", "region_ref")),
    ("tensor codec", ("raw_buffer", "tensor_from_raw", "serialize_bytes", "deserialize_bytes",
                      "as_declared", "datatype_of", "numpy", "runtime/dtypes.py", "runtime/protocol.py")),
    ("HTTP/ASGI framework (uvicorn, httptools, starlette)", ("uvicorn/", "httptools", "starlette/",
                                                            "runtime/rest.py", "runtime/auth.py")),
    ("data plane + validation", ("runtime/dataplane.py", "runtime/models/", "runtime/cache.py",
                                 "runtime/frontend.py", "runtime/errors.py", "runtime/grpc_server.py")),
    ("batcher (queue, futures, executor hand-off)", ("runtime/batching.py", "runtime/executor.py",
                                                     "concurrent/futures", "threading.py", "queue")),
    ("event loop (uvloop/libuv, socket system calls)", ("uvloop", "asyncio/", "'run_until_complete'",
                                                       "'run_forever'", "transport", "socket",
                                                       "'call_soon", "'create_future'",
                                                       "'create_task'", "'set_result'")),
    ("profiler", ("cProfile", "'disable' of '_lsprof")),
]  # fmt: skip


def _category(key: str) -> str:
    for name, needles in CATEGORIES:
        if any(n in key for n in needles):
            return name
    return "other"


def summarize_profile(prof_files: list[Path]) -> dict[str, Any]:
    """Main-thread ``cProfile`` stats (``PROFILE_SITE``) of every process of the pod summarised:
    ``main_thread_seconds`` (the sum of the functions' own times), ``share_by_category``
    (``CATEGORIES``, largest first) and ``top_self`` (the 20 functions with the most own time, share)."""
    import pstats

    categories: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    for path in prof_files:
        stats = pstats.Stats(str(path))
        for (file, line, func), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
            key = f"{file}:{line}({func})"
            short = re.sub(r".*/site-packages/|.*/kubeinfer/", "", key)
            categories[_category(key)] += tottime
            functions[short] += tottime
    total = sum(categories.values())
    return {
        "main_thread_seconds": round(total, 4),
        "share_by_category": {k: round(v / total, 4) for k, v in categories.most_common()} if total else {},
        "top_self": [[k, round(v / total, 4)] for k, v in functions.most_common(20)] if total else [],
    }


def thread_cpu(proc: Any) -> dict[str, float]:
    """CPU seconds (user + system) per thread of ``proc`` and its children, keyed ``"model process
    <thread name>"`` or ``"front ends <thread name>"`` (threads of one name summed; names from
    ``/proc/<pid>/task/<tid>/comm``, 15 characters; the main thread is ``main``)."""
    out: collections.Counter[str] = collections.Counter()
    procs = [("model process", proc)]
    with contextlib.suppress(Exception):
        procs += [("front ends", child) for child in proc.children(recursive=True)]
    for kind, p in procs:
        with contextlib.suppress(Exception):
            comm = Path(f"/proc/{p.pid}/comm").read_text().strip()
            for thread in p.threads():
                try:
                    name = Path(f"/proc/{p.pid}/task/{thread.id}/comm").read_text().strip()
                except OSError:
                    name = "?"
                if thread.id == p.pid:
                    name = "main"
                elif name == comm:  # Python 3.11 names no OS thread: the executor threads, grpc's own
                    name = "python threads"
                else:
                    name = re.sub(r"_?\d+$", "", re.sub(r"^Thread-\d+ ", "", name)) or "?"
                out[f"{kind} {name}"] += thread.user_time + thread.system_time
    return dict(out)


async def profile_load(
    label: str,
    call: Callable[[bytes], Awaitable[int]],
    payloads: list[bytes],
    pid: int,
    rate: float,
    seconds: float,
    outdir: Path,
) -> dict[str, Any]:
    """Where the server CPU of a load of ``rate``/s for ``seconds`` goes: per thread of every process of
    the pod (``thread_cpu``, from /proc: exact) in µs per request, from one load; and, from a second
    load at the same rate, inside the main threads (the event loops) by ``cProfile``
    (``summarize_profile``; the runtime must run with ``profile_env(outdir)``), its shares applied to
    the main threads' µs per request of the first load (``main_thread_us_per_request_by_category``:
    the profiler's own overhead is left out by taking shares, not its times)."""
    import psutil

    proc = psutil.Process(pid)
    before = thread_cpu(proc)
    point = await run_rate(call, payloads, rate, seconds, 7, pid)
    after = thread_cpu(proc)
    ok = max(point["ok"], 1.0)
    threads = {k: round((after[k] - before.get(k, 0.0)) / ok * 1e6, 1) for k in after}
    threads = dict(sorted(((k, v) for k, v in threads.items() if v >= 0.5), key=lambda kv: -kv[1]))
    pids = [pid, *(c.pid for c in proc.children(recursive=True))]
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGUSR1)
    await run_rate(call, payloads, rate, seconds, 8, pid)
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGUSR2)
    files = [outdir / f"{p}.prof" for p in pids]
    for _ in range(50):
        if all(f.exists() for f in files):
            break
        await asyncio.sleep(0.1)
    summary: dict[str, Any] = {
        "rate_rps": rate,
        "server_cpu_us_per_request": round(point["server_cpu_us_per_request"], 1),
        "thread_us_per_request": threads,
    }
    present = [f for f in files if f.exists()]
    if present:
        main_us = sum(v for k, v in threads.items() if k.endswith(" main"))
        prof = summarize_profile(present)
        summary["main_thread_us_per_request"] = round(main_us, 1)
        summary["main_thread_us_per_request_by_category"] = {
            k: round(v * main_us, 1) for k, v in prof["share_by_category"].items()
        }
        summary["main_thread_profile"] = prof
        for f in present:
            f.unlink()
    top = ", ".join(f"{k} {v:.0f}" for k, v in list(threads.items())[:5])
    progress(f"profile {label} at {rate:.0f}/s: µs/request by thread: {top}")
    if "main_thread_us_per_request_by_category" in summary:
        cats = ", ".join(f"{k.split(' (')[0]} {v:.0f}" for k, v in
                         list(summary["main_thread_us_per_request_by_category"].items())[:8])  # fmt: skip
        progress(f"profile {label}: main threads, µs/request: {cats}")
    return summary


# --- runs -----------------------------------------------------------------------------------------


async def bench_server(
    name: str, host: str, port: int, grpc_port: int | None, pid: int, model: str, args: argparse.Namespace,
    start_rate: float, sentences: list[str], profile_dir: Path | None, encodings: tuple[str, ...],
    main_pid: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Every encoding of ``encodings`` against one runtime: ``{encoding: figures}`` (``main_pid``:
    ``run_rate``'s)."""
    result: dict[str, Any] = {}
    for encoding in encodings:
        if encoding == "grpc" and grpc_port is None:
            result[encoding] = {"absent": "this runtime serves no gRPC port"}
            continue
        client: Any
        if encoding == "grpc":
            client = GRPCClient(f"{host}:{grpc_port}")
            payloads = grpc_payloads(model, sentences)
        else:
            client = HTTPClient(host, port)
            payloads = request_payloads(host, port, model, encoding, sentences)
        try:
            figures = await find_max_rate(
                f"{name} {encoding}", client.call, payloads, pid, args, start_rate, main_pid
            )
            if profile_dir is not None:
                # at most 70 % of the max; at the reference rate when no rate met the SLO (a busy machine)
                rate = min(args.profile_rate, 0.7 * figures["max_slo_rps"]) or figures["ref_rate_rps"]
                figures["profile"] = await profile_load(
                    f"{name} {encoding}", client.call, payloads, pid, rate, args.profile_seconds, profile_dir
                )
        finally:
            client.close()
            if isinstance(client, GRPCClient):
                await client.aclose()
        result[encoding] = figures
    return result


async def plane_baseline_run(tiny_dir: Path) -> dict[str, Any] | None:
    """``plane_baseline`` in its own process (``--plane-baseline``): its figures, None if it failed."""
    progress("plane baseline: the tiny model's data plane, batcher and model, no transport")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--plane-baseline", str(tiny_dir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    stdout, _ = await proc.communicate()
    lines = stdout.decode().strip().splitlines()
    if proc.returncode == 0 and lines:
        figures: dict[str, Any] = json.loads(lines[-1])
        cells = ", ".join(f"{k} {v['cpu_us_per_request']:.0f}" for k, v in figures.items())
        progress(f"plane baseline, µs/request: {cells}")
        return figures
    progress(f"plane baseline failed (exit {proc.returncode})")
    return None


async def measure_floor(
    label: str, server: FloorProcess | GranianServer, args: argparse.Namespace, sentences: list[str]
) -> dict[str, Any]:
    """One floor server's figures: ``find_max_rate``'s (``cpu_us_per_request`` and ``max_rps`` at the
    highest rate meeting the SLO, the reference rate's), and at ``--profile-rate`` the CPU per request
    of its processes and of each thread (``thread_cpu``: granian's Rust threads apart from the event
    loop's)."""
    import psutil

    client = HTTPClient("127.0.0.1", server.port)
    payloads = request_payloads("127.0.0.1", server.port, "floor", "json", sentences)
    try:
        figures = await find_max_rate(
            label, client.call, payloads, server.pid, args, args.start_rate, server.main_pid
        )
        proc = psutil.Process(server.pid)
        before = thread_cpu(proc)
        at_profile = await run_rate(
            client.call, payloads, args.profile_rate, args.profile_seconds, 7, server.pid, server.main_pid
        )
        after = thread_cpu(proc)
    finally:
        client.close()
    ok = max(at_profile["ok"], 1.0)
    # thread_cpu names the runtime's processes; here the floor's own: uvicorn's one, granian's two
    names = (
        (("model process", "supervisor"), ("front ends", "worker"))
        if isinstance(server, GranianServer)
        else (("model process", "server"),)
    )
    threads = {}
    for key in after:
        shown = key
        for old, new in names:
            shown = shown.replace(old, new, 1) if shown.startswith(old) else shown
        threads[shown] = round((after[key] - before.get(key, 0.0)) / ok * 1e6, 1)
    return {
        "cpu_us_per_request": figures["cpu_us_per_request"],
        "max_rps": figures["max_slo_rps"],
        **{k: v for k, v in figures.items() if k not in ("cpu_us_per_request", "max_slo_rps")},
        "profile_rate_rps": args.profile_rate,
        "cpu_us_per_request_at_profile_rate": at_profile["server_cpu_us_per_request"],
        "main_thread_cpu_us_per_request_at_profile_rate": at_profile["main_thread_cpu_us_per_request"],
        "p99_seconds_at_profile_rate": at_profile["p99_seconds"],
        "thread_us_per_request_at_profile_rate": dict(sorted(threads.items(), key=lambda kv: -kv[1])),
    }


async def measure_floors(args: argparse.Namespace, sentences: list[str]) -> dict[str, Any]:
    """uvicorn's floor (``floor``), then each of ``args.granian`` (``floor_granian``, by label, with its
    settings): ``measure_floor``'s figures of each."""
    out: dict[str, Any] = {}
    progress("floor: the runtime's HTTP stack, fixed response, no model")
    with FloorProcess() as floor:
        out["floor"] = await measure_floor("floor", floor, args, sentences)
    granian: dict[str, Any] = {}
    for settings in args.granian:
        progress(f"floor under granian {settings.label}: the same fixed response")
        with GranianServer(settings) as server:
            figures = await measure_floor(f"granian {settings.label}", server, args, sentences)
        granian[settings.label] = {"settings": dataclasses.asdict(settings), **figures}
    if granian:
        out["floor_granian"] = granian
    return out


async def run_all(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from kubeinfer.runtime.config import RuntimeConfig
    from kubeinfer.runtime.models.huggingface import heldout_sentences

    from hack.devtools.runtime_proc import RuntimeProcess
    from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir

    sentences = heldout_sentences()
    rng = np.random.default_rng(args.seed)
    sentences = [sentences[int(i)] for i in rng.choice(len(sentences), size=256)]
    profile_dir = None if args.no_profile else workdir / "profiles"
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}

    tiny_dir = tiny_hf_dir(workdir / "tiny") if "tiny" in args.models else None
    if tiny_dir is not None:
        result["plane_baseline"] = await plane_baseline_run(tiny_dir)

    result.update(await measure_floors(args, sentences))

    models: list[tuple[str, RuntimeConfig, float]] = []
    if tiny_dir is not None:
        models.append(("tiny", tiny_hf_config(tiny_dir), args.start_rate))
    if "minilm" in args.models:
        models.append(("minilm", RuntimeConfig.model_validate({"device": "cpu"}), args.start_rate / 10))
    for name, base, start in models:
        entry: dict[str, Any] = result.setdefault(name, {})
        for workers in args.workers:
            cfg = base.model_copy(deep=True)
            cfg.server.http_workers = workers
            # gRPC is served by the model process with one process, by the front ends with more
            encodings = ("json", "binary", "grpc")
            progress(f"{name}: starting kubeinfer-runtime, http_workers {workers} (load + warmup)")
            profiled = None if profile_dir is None or name != "tiny" else profile_dir / f"{name}-w{workers}"
            env = profile_env(profiled) if profiled is not None else None
            with RuntimeProcess(cfg, env=env) as rt:
                gport = rt.grpc_port or None  # 0: this checkout's runtime serves no gRPC
                progress(f"{name}: ready at {rt.url} (pid {rt.pid}), gRPC port {gport}")
                figures = await bench_server(
                    f"{name} w{workers}", rt.host, rt.port, gport, rt.pid, cfg.model.name, args, start,
                    sentences, profiled, encodings,
                )  # fmt: skip
            file_figures(entry, figures, str(workers))
    if tiny_dir is not None and args.granian_runtime is not None:
        label = args.granian_runtime.label
        for encoding, fig in (await granian_runtime_run(tiny_hf_config(tiny_dir), args, sentences)).items():
            result["tiny"].setdefault(encoding, {"workers": {}})["granian"] = {label: fig}
    return result


def file_figures(entry: dict[str, Any], figures: dict[str, Any], workers: str) -> None:
    """``bench_server``'s figures into a model's ``{encoding: {"workers": {workers: figures}}}``; an
    absent encoding's note (``{"absent": why}``) beside ``workers``."""
    for encoding, fig in figures.items():
        if "absent" in fig:
            entry.setdefault(encoding, {"workers": {}}).update(fig)
        else:
            entry.setdefault(encoding, {"workers": {}})["workers"][workers] = fig


async def granian_runtime_run(cfg: Any, args: argparse.Namespace, sentences: list[str]) -> dict[str, Any]:
    """The tiny runtime (``cfg``, one process) with its ASGI app served by granian
    (``bench/granian_runtime.py``, ``args.granian_runtime``'s settings): JSON and binary, as
    ``bench_server`` measures them (gRPC is the runtime's own grpc.aio server either way)."""
    cfg = cfg.model_copy(deep=True)
    cfg.server.http_workers = 1
    cfg.server.shutdown_delay_seconds = 0  # leave at once: nothing routes to it
    # as RuntimeProcess's --host/--port 0/--grpc-port 0: loopback, free ports (no uvicorn binds the
    # HTTP one here; granian serves on its own)
    cfg.server.host, cfg.server.port, cfg.server.grpc_port = "127.0.0.1", 0, 0
    settings = args.granian_runtime
    with tempfile.TemporaryDirectory(prefix="kubeinfer-granian-") as tmp:
        path = Path(tmp) / "runtime.yaml"
        path.write_text(cfg.to_yaml(), encoding="utf-8")
        progress(f"tiny: starting the runtime's app under granian {settings.label} (load + warmup)")
        server = GranianServer(
            settings, start_timeout=300.0, target="granian_runtime:app",
            env={"KUBEINFER_BENCH_RUNTIME_CONFIG": str(path)}, ready_path="/v2/health/ready",
        )  # fmt: skip
        with server:
            progress(f"tiny: ready under granian at port {server.port} (worker pid {server.main_pid})")
            figures = await bench_server(
                f"tiny granian {settings.label}", server.host, server.port, None, server.pid, cfg.model.name,
                args, args.start_rate, sentences, None, ("json", "binary"), server.main_pid,
            )  # fmt: skip
            errors = [
                line for line in server.log_text().splitlines() if "Traceback" in line or " ERROR " in line
            ]
    for fig in figures.values():
        fig["settings"] = dataclasses.asdict(settings)
        fig["server_errors_logged"] = len(errors)
    return figures


def granian_floor_ratios(
    floor: dict[str, Any], granian: dict[str, dict[str, Any]]
) -> dict[str, float | None]:
    """Each granian floor (``{label: measure_floor's figures}``) over uvicorn's (``floor``), same run:
    ``granian_<label>_cpu_over_uvicorn`` (server CPU per request, each at its own highest rate meeting
    the SLO), ``..._cpu_over_uvicorn_at_ref_rate`` and ``..._at_profile_rate`` (both servers at one
    offered rate), ``..._max_rps_over_uvicorn``; labels with spaces joined by ``_``. None where a
    figure is missing or zero (no rate met the SLO)."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    out: dict[str, float | None] = {}
    for label, fig in granian.items():
        key = "granian_" + label.replace(" ", "_")
        out[f"{key}_cpu_over_uvicorn"] = ratio(fig["cpu_us_per_request"], floor["cpu_us_per_request"])
        out[f"{key}_cpu_over_uvicorn_at_ref_rate"] = (
            ratio(fig["cpu_us_per_request_at_ref_rate"], floor["cpu_us_per_request_at_ref_rate"])
            if fig["ref_rate_rps"] == floor["ref_rate_rps"]
            else None
        )
        out[f"{key}_cpu_over_uvicorn_at_profile_rate"] = (
            ratio(fig["cpu_us_per_request_at_profile_rate"], floor["cpu_us_per_request_at_profile_rate"])
            if fig["profile_rate_rps"] == floor["profile_rate_rps"]
            else None
        )
        out[f"{key}_max_rps_over_uvicorn"] = ratio(fig["max_rps"], floor["max_rps"])
    return out


def granian_runtime_ratios(figures: dict[str, Any]) -> dict[str, float | None]:
    """The tiny runtime under granian (``figures["tiny"][encoding]["granian"][label]``) against the floor
    under granian with the same settings (``figures["floor_granian"][label]``, when measured) and against
    the runtime under uvicorn (one process, ``["workers"]["1"]``), same run:
    ``tiny_<enc>_granian_<label>_cpu_over_granian_floor`` (each at its highest rate meeting the SLO),
    ``..._cpu_over_granian_floor_at_ref_rate``, ``..._main_thread_over_granian_floor_at_ref_rate`` (the
    worker's main thread over the floor's whole server), ``..._cpu_over_uvicorn_at_ref_rate`` and
    ``..._max_rps_over_uvicorn``. None where a figure is missing or zero, or the reference rates differ."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    out: dict[str, float | None] = {}
    floors = figures.get("floor_granian", {})
    for enc, entry in figures.get("tiny", {}).items():
        uvicorn = entry.get("workers", {}).get("1")
        for label, fig in entry.get("granian", {}).items():
            key = f"tiny_{enc}_granian_{label.replace(' ', '_')}"
            floor = floors.get(label)
            same_ref = floor is not None and floor["ref_rate_rps"] == fig["ref_rate_rps"]
            out[f"{key}_cpu_over_granian_floor"] = (
                ratio(fig["cpu_us_per_request"], floor["cpu_us_per_request"]) if floor else None
            )
            out[f"{key}_cpu_over_granian_floor_at_ref_rate"] = (
                ratio(fig["cpu_us_per_request_at_ref_rate"], floor["cpu_us_per_request_at_ref_rate"])
                if floor and same_ref
                else None
            )
            out[f"{key}_main_thread_over_granian_floor_at_ref_rate"] = (
                ratio(
                    fig["main_thread_cpu_us_per_request_at_ref_rate"], floor["cpu_us_per_request_at_ref_rate"]
                )
                if floor and same_ref
                else None
            )
            same = uvicorn is not None and uvicorn["ref_rate_rps"] == fig["ref_rate_rps"]
            out[f"{key}_cpu_over_uvicorn_at_ref_rate"] = (
                ratio(fig["cpu_us_per_request_at_ref_rate"], uvicorn["cpu_us_per_request_at_ref_rate"])
                if uvicorn and same
                else None
            )
            out[f"{key}_max_rps_over_uvicorn"] = (
                ratio(fig["max_slo_rps"], uvicorn["max_slo_rps"]) if uvicorn else None
            )
    return out


def workers_speedup(figures: dict[str, Any]) -> dict[str, Any]:
    """Per model and encoding, each worker count against one process (same run): ``max_slo_rps`` ratio
    and CPU per request (all the pod's processes) ratio, at the highest passing rate and at the
    reference rate."""
    out: dict[str, Any] = {}
    for name in ("tiny", "minilm"):
        for enc, entry in figures.get(name, {}).items():
            workers = entry.get("workers", {})
            one = workers.get("1")
            if not one:
                continue
            for count, fig in workers.items():
                if count == "1":
                    continue
                out[f"{name}_{enc}_workers{count}_over_1"] = {
                    "max_slo_rps": fig["max_slo_rps"] / one["max_slo_rps"] if one["max_slo_rps"] else None,
                    "cpu_us_per_request": (
                        fig["cpu_us_per_request"] / one["cpu_us_per_request"]
                        if fig["cpu_us_per_request"] and one["cpu_us_per_request"]
                        else None
                    ),
                    "cpu_us_per_request_at_ref_rate": (
                        fig["cpu_us_per_request_at_ref_rate"] / one["cpu_us_per_request_at_ref_rate"]
                    ),
                }
    return out


def profile_section(figures: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Every profile of the run (tiny model, each encoding and front-end count) in one place:
    ``{"tiny w<workers> <encoding>": profile_load's summary}``, with how they were taken and the floor's
    CPU per request at the same rate (the HTTP stack alone: uvicorn, uvloop and the kernel)."""
    runs = {
        f"tiny w{workers} {encoding}": fig["profile"]
        for encoding, entry in figures.get("tiny", {}).items()
        for workers, fig in entry.get("workers", {}).items()
        if fig.get("profile")
    }
    return {
        "method": (
            "per configuration, two loads of --profile-seconds at --profile-rate (at most 70 % of its "
            "max_slo_rps): the first measures every thread's CPU from /proc (thread_us_per_request, exact; "
            "Python threads other than the main one carry the process's name: the executor threads, "
            "tokenization and the model); during the second, cProfile runs on the main thread of every "
            "process of the pod (started by SIGUSR1 from a sitecustomize on the runtime's PYTHONPATH), and "
            "its own-time shares by category, applied to the main threads' µs per request of the first "
            "load, give main_thread_us_per_request_by_category. cProfile starts inside the running event "
            "loop: the C code of uvloop/libuv, httptools, grpcio's Cython core and the kernel's socket calls "
            "between Python callbacks are not in its times, so the shares are of the Python-visible time; "
            "the floor's CPU per request at the same rate is the HTTP stack's cost with no Python work"
        ),
        "rate_rps": args.profile_rate,
        "floor_cpu_us_per_request": figures.get("floor", {}).get("cpu_us_per_request_at_profile_rate"),
        "plane_baseline": figures.get("plane_baseline"),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--floor-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plane-baseline", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--models", default="tiny,minilm", help="which runtimes: tiny, minilm")
    parser.add_argument("--workers", default="1,2", help="server.http_workers counts to measure, e.g. 1,2,4")
    parser.add_argument("--start-rate", type=float, default=300.0, help="first rate (tiny, floor), /s")
    parser.add_argument("--rate-factor", type=float, default=1.5)
    parser.add_argument("--max-rate", type=float, default=20000.0)
    parser.add_argument("--ref-rate", type=float, default=300.0, help="the common rate for CPU ratios, /s")
    parser.add_argument("--step-seconds", type=float, default=2.0)
    parser.add_argument("--refine", type=int, default=2)
    parser.add_argument("--profile-seconds", type=float, default=6.0, help="each of the profile's two loads")
    parser.add_argument(
        "--profile-rate", type=float, default=1000.0, help="the profile's rate, /s (at most 70 %% of the max)"
    )
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument(
        "--granian",
        default=DEFAULT_GRANIAN,
        help="granian floors beside uvicorn's, INTERFACE[/THREADS[/MODE]],... (asgi|rsgi, runtime threads, "
        "auto|st|mt); '' for none; needs `bash hack/setup.sh --bench-granian`",
    )
    parser.add_argument(
        "--granian-runtime",
        default="asgi/1",
        help="the tiny runtime's app under granian too, this setting (asgi[/THREADS[/MODE]]); '' for none",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "frontend.json"))
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.floor_server:  # a child of the run below, which holds the bench lock
        return floor_server("127.0.0.1")
    if args.plane_baseline:  # the same
        logging.basicConfig(level=logging.WARNING)
        return plane_baseline(args.plane_baseline, 3000)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.workers = [int(w) for w in args.workers.split(",") if w.strip()]
    try:
        args.granian = parse_granian_settings(args.granian)
        runtime = parse_granian_settings(args.granian_runtime)
    except ValueError as exc:
        parser.error(str(exc))
    if len(runtime) > 1 or any(r.interface != "asgi" for r in runtime):
        parser.error(
            f"--granian-runtime {args.granian_runtime!r}: one setting, interface asgi (the runtime's app)"
        )
    args.granian_runtime = runtime[0] if runtime else None
    if (args.granian or args.granian_runtime) and not (GRANIAN_VENV / "bin" / "python").exists():
        parser.error(
            f"--granian: {GRANIAN_VENV} is missing: `bash hack/setup.sh --bench-granian` installs it"
        )
    logging.basicConfig(level=logging.WARNING)
    with quiet.quiet_run("frontend_bench", args, log=progress) as run:
        return measure(args, argv, run)


def measure(args: argparse.Namespace, argv: list[str] | None, run: Any) -> int:
    """Every server and encoding (``run_all``), the ratios to the floor, the JSON at ``args.out``
    (stamped with ``run``'s machine fields, ``quiet.QuietRun``); returns the exit status, 0."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kubeinfer-frontend-") as tmp:
        loop_factory = None
        with contextlib.suppress(ImportError):
            import uvloop

            loop_factory = uvloop.new_event_loop
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            figures = runner.run(run_all(args, Path(tmp)))
    floor = figures["floor"]
    ratios = {}
    for name in ("tiny", "minilm"):
        for enc, entry in figures.get(name, {}).items():
            one = entry.get("workers", {}).get("1")
            if one and one["cpu_us_per_request"] and floor["cpu_us_per_request"]:
                ratio = one["cpu_us_per_request"] / floor["cpu_us_per_request"]
                ratios[f"{name}_{enc}_cpu_over_floor"] = ratio
            if one and one["ref_rate_rps"] == floor["ref_rate_rps"]:
                at_ref = one["cpu_us_per_request_at_ref_rate"] / floor["cpu_us_per_request_at_ref_rate"]
                ratios[f"{name}_{enc}_cpu_over_floor_at_ref_rate"] = at_ref
                main = one["main_thread_cpu_us_per_request_at_ref_rate"]
                ratios[f"{name}_{enc}_main_thread_over_floor_at_ref_rate"] = (
                    main / floor["cpu_us_per_request_at_ref_rate"]
                )
    ratios.update(granian_floor_ratios(floor, figures.get("floor_granian", {})))
    ratios.update(granian_runtime_ratios(figures))
    result = {
        **figures,
        "profile": profile_section(figures, args),
        "ratios": ratios,
        "workers_speedup": workers_speedup(figures),
        "targets": {
            "tiny_json_cpu_us_le": 150,
            "tiny_binary_cpu_us_le": 100,
            "tiny_grpc_cpu_us_le": 100,
            "tiny_grpc_cpu_le_binary": True,
        },
        "notes": [
            "workers: server.http_workers; '1' one process, '2' two front-end processes in front of the "
            "model process (serving REST and gRPC, both over SO_REUSEPORT), measured one after the other "
            "in this run; speedups in workers_speedup",
            "cpu_us_per_request: CPU (user+system, all threads) of every process of the pod (the model "
            "process and its front-end processes) / requests answered, at the highest rate meeting P99 <= "
            "100 ms; frontend_cpu_us_per_request: the front-end processes' part; main_thread_*: the model "
            "process's event loop thread only (with one process the whole front end: HTTP/gRPC, decode, "
            "validate, queue, encode, metrics); the rest is tokenization and "
            "the model on the executor threads (and grpc's poller thread)",
            "*_at_ref_rate: every server and encoding at one offered rate (--ref-rate, a tenth of it for "
            "MiniLM), the ratios to the floor at that rate",
            "client runs on the same machine (2 cores, shared with other work): max rates are a lower bound",
            "profile: see profile.method; thread_us_per_request exact (/proc), the main threads split by "
            "cProfile's shares of their Python-visible time",
            "plane_baseline: the tiny model's DataPlane.infer with no transport, in a process of its own, "
            "waves of N concurrent one-row requests: process CPU per request (main thread: the batcher's "
            "loop, validation, metrics; other threads: tokenization and the model); a transport adds to it",
        ],
        "granian": (
            "floor_granian: the same fixed response served by granian (one worker, its settings in each "
            "entry: interface asgi with the floor's Starlette app, rsgi with no framework), measured like "
            "the floor in this run; cpu_us_per_request is granian's supervisor and worker together, "
            "main_thread_* the worker's main thread (the event loop); granian's Rust runtime threads "
            "(tokio-rt-worker: I/O, HTTP) and its blocking thread carry the rest "
            "(thread_us_per_request_at_profile_rate); ratios granian_* "
            "over uvicorn's floor; tiny[encoding].granian: the tiny runtime's own app (RuntimeServer.app, "
            "one process) served by granian (bench/granian_runtime.py: no uvicorn, no header/body read "
            "timeouts), ratios tiny_*_granian_* over the granian floor of the same settings and over the "
            "runtime under uvicorn"
        ),
        "elapsed_seconds": time.monotonic() - started,
        "command": ["bench/frontend_bench.py", *(sys.argv[1:] if argv is None else argv)],
    }
    result = run.stamp(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    progress(f"floor: {floor['cpu_us_per_request']:.0f} µs/req, max {floor['max_rps']:.0f}/s")
    for label, fig in figures.get("floor_granian", {}).items():
        cpu = fig["cpu_us_per_request"]
        progress(
            f"floor under granian {label}: {cpu if cpu is None else round(cpu)} µs/req, max "
            f"{fig['max_rps']:.0f}/s; at {fig['profile_rate_rps']:.0f}/s "
            f"{fig['cpu_us_per_request_at_profile_rate']:.0f} µs/req (uvicorn "
            f"{floor['cpu_us_per_request_at_profile_rate']:.0f})"
        )
    for name in ("tiny", "minilm"):
        for enc, entry in figures.get(name, {}).items():
            for workers, one in entry.get("workers", {}).items():
                cpu = one["cpu_us_per_request"]
                progress(
                    f"{name} {enc} workers {workers}: {cpu if cpu is None else round(cpu)} µs/req (all the "
                    f"pod's processes), max {one['max_slo_rps']:.0f}/s at P99 <= 100 ms"
                )
            for label, one in entry.get("granian", {}).items():
                cpu = one["cpu_us_per_request"]
                progress(
                    f"{name} {enc} under granian {label}: {cpu if cpu is None else round(cpu)} µs/req, max "
                    f"{one['max_slo_rps']:.0f}/s at P99 <= 100 ms; at {one['ref_rate_rps']:.0f}/s "
                    f"{one['cpu_us_per_request_at_ref_rate']:.0f} µs/req (main thread "
                    f"{one['main_thread_cpu_us_per_request_at_ref_rate']:.0f})"
                )
    noisy = " (noisy: not a source of figures)" if run.noisy else ""
    progress(f"wrote {out} in {time.monotonic() - started:.0f} s{noisy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
