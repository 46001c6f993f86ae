"""The HTTP front end: Open Inference Protocol (KServe v2) REST routes, health, readiness, ``/metrics``.

Routes (``{v}`` forms are what ``tritonclient.http`` uses when given a model version; this server
serves version ``1`` of its one model):

- ``GET /v2/health/live``: 200 ``{"live": true}`` while the process runs.
- ``GET /v2/health/ready``: 200 ``{"ready": true}`` once the model is loaded and warmed up, 503
  ``{"ready": false, "error": ...}`` before and while draining (the bodies of KServe's model server).
- ``GET /v2``: server metadata. ``GET /v2/models/{name}[/versions/{v}]``: model metadata.
- ``GET /v2/models/{name}[/versions/{v}]/ready``: 200 ``{"name": ..., "ready": true}``, 503 not (yet)
  ready, 404 unknown model.
- ``POST /v2/models/{name}[/versions/{v}]/infer``: inference (JSON or binary tensor data).
- ``GET /metrics``: Prometheus text format (``kubeinfer.runtime.metrics``).

Errors are ``{"error": "..."}``: 400 malformed request / wrong datatype or shape / bad parameter;
404 unknown model or version; 413 over ``limits`` (HTTP body over 4 x ``max_request_bytes`` -- JSON
text of numbers takes several bytes per binary byte --, tensor bytes, elements, text tokens, rows over
the warmed maximum batch); 429 queue full (``Retry-After``); 500 the model failed on this request;
503 not ready or shutting down; 504 the request's ``timeout`` passed while it was queued.

``server.http_workers`` > 1: this process serves no HTTP itself; that many front-end processes
(``kubeinfer.runtime.frontend``, same routes and bodies) share the port and send decoded tensors here
over ZeroMQ (``kubeinfer.runtime.ipc``); ``kubeinfer.runtime.frontend_pool`` starts, supervises and
answers them. gRPC, the batcher, the config watcher and the drain stay in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import socket
import threading
import time
import zlib
from collections.abc import Callable, Coroutine, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import uvicorn
from kubeinfer.runtime.batching import Batcher, BatchSettings
from kubeinfer.runtime.config import BatchingConfig, RuntimeConfig
from kubeinfer.runtime.errors import HTTPError, InferenceError
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models.base import ServableModel
from kubeinfer.runtime.protocol import check_outputs, decode_request, encode_json, encode_response
from kubeinfer.runtime.reload import ConfigWatcher
from kubeinfer.runtime.service_time import calibrate_model
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kubeinfer import __version__

if TYPE_CHECKING:
    from kubeinfer.runtime.frontend_pool import FrontEndPool

log = logging.getLogger("kubeinfer.runtime.server")
T = TypeVar("T")

SERVER_NAME = "kubeinfer"
SERVER_VERSION = __version__
MODEL_VERSION = "1"
#: HTTP body limit relative to ``limits.max_request_bytes`` (JSON encodes numbers in several bytes).
BODY_LIMIT_FACTOR = 4
_JSON = "application/json"
# Health bodies as KServe's model server answers them (its Python SDK's is_server_live/ready read them;
# tritonclient reads only the status code).
_LIVE = encode_json({"live": True})
_READY = encode_json({"ready": True})
#: The infer routes, matched before (instead of through) Starlette's middleware and router.
_INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """``{"error": message}`` with ``status``."""
    return Response(encode_json({"error": message}), status, headers=dict(headers or {}), media_type=_JSON)


async def inference_error_response(request: Request, exc: Exception) -> Response:
    """The one place an ``InferenceError`` (``kubeinfer.runtime.errors``) becomes a response: a Starlette
    exception handler, registered for the whole hierarchy."""
    assert isinstance(exc, InferenceError)
    return error_response(exc.status, exc.message, exc.headers)


class RuntimeServer:
    """The runtime: its state (model, batcher, readiness), its ASGI app (``self.app``) and its life cycle.

    Life cycle, as ``kubeinfer-runtime serve`` drives it (the shape of kserve's ``ModelServer``)::

        server = RuntimeServer(cfg, config_path=path, overrides=flags)
        await server.start()        # listening (live 200, ready 503); the model loads in the background
        code = await server.wait()  # until stopped; 0 after a drain, 1 if the model failed to load

    ``start`` binds the port, starts the HTTP server, the model load (load, warmup, ``attach``: ready)
    and the config-file watcher (``apply_batching`` on every change). ``stop`` is the SIGTERM/SIGINT
    handler: readiness false; after ``server.shutdown_delay_seconds`` new infer requests get 503 and
    queued and running requests finish (``drain``, at most ``server.drain_timeout_seconds``); then
    the HTTP server closes. A second signal exits at once.

    With ``server.http_workers`` > 1, ``start`` starts the front-end processes instead of uvicorn
    (``FrontEndPool``) and installs the signal handlers itself; ``stop`` drains, then stops them.

    Tests drive the parts directly: ``RuntimeServer(cfg)`` -> ``attach(model)`` -> ``drain()``.

    Args:
        cfg: the configuration in force (file plus command-line flags).
        metrics: the metrics (default: a new ``RuntimeMetrics`` in its own registry).
        config_path: the config file to watch for ``batching`` changes, or None.
        overrides: re-applies the command-line flags to a re-read config file.
    """

    def __init__(
        self,
        cfg: RuntimeConfig,
        metrics: RuntimeMetrics | None = None,
        *,
        config_path: str | None = None,
        overrides: Callable[[RuntimeConfig], RuntimeConfig] = lambda c: c,
    ) -> None:
        self.cfg = cfg
        self.model_name = cfg.model.name
        self.metrics = metrics if metrics is not None else RuntimeMetrics(cfg.model.name, cfg.executors)
        self.model: ServableModel | None = None
        self.batcher: Batcher | None = None
        self.draining = False
        self.stopping = False
        self.host = cfg.server.host
        self.port = cfg.server.port
        self._config_path = config_path
        self._overrides = overrides
        self._batching = cfg.batching  # the file's batching section, also while the model loads
        self._uvicorn: _Uvicorn | None = None
        self._serving: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._failed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._grpc: Any = None
        self._pool: FrontEndPool | None = None
        self._signalled = False
        self._router = v2_router(self)
        #: The ASGI app uvicorn serves: ``POST .../infer`` straight to ``infer``, the rest to Starlette.
        self.app: Callable[..., Any] = self._asgi

    # ----- life cycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen on ``server.host:port`` (``self.port`` is the real port, also for port 0), start the
        HTTP server, the model load and, with ``config_path``, the config-file watcher."""
        loop = self._loop = asyncio.get_running_loop()
        if self.cfg.server.http_workers > 1:
            serving = await self._start_frontends(loop)
        else:
            serving = self._start_uvicorn()
        self._tasks.append(loop.create_task(self._load()))
        if self._config_path:
            watcher = ConfigWatcher(
                self._config_path,
                self.cfg,
                self.apply_batching,
                overrides=self._overrides,
                on_error=lambda msg: self.metrics.config_reload_errors.inc(),
            )
            self._tasks.append(loop.create_task(watcher.run()))
        from kubeinfer.runtime.grpc_server import create_grpc_server

        self._grpc, grpc_port = create_grpc_server(self, self.cfg.server.host, self.cfg.server.grpc_port)
        await self._grpc.start()
        log.info("grpc listening on %s:%d", self.host, grpc_port)
        log.info("listening on http://%s:%d", self.host, self.port)
        self._serving = loop.create_task(serving)

    def _start_uvicorn(self) -> Coroutine[Any, Any, None]:
        """One process: uvicorn serves ``self.app`` here (``server.http_workers`` 1)."""
        sock = listen_socket(self.cfg.server.host, self.cfg.server.port)
        self.host, self.port = sock.getsockname()[:2]
        self._uvicorn = _Uvicorn(
            uvicorn.Config(
                self.app,
                interface="asgi3",  # self.app is a bound coroutine method: uvicorn's guess would be ASGI2
                lifespan="off",
                log_level=logging.WARNING,
                access_log=False,
                timeout_graceful_shutdown=5,
                timeout_keep_alive=30,
            ),
            on_signal=self.stop,
        )
        return self._uvicorn.serve(sockets=[sock])

    async def _start_frontends(self, loop: asyncio.AbstractEventLoop) -> Coroutine[Any, Any, None]:
        """``server.http_workers`` > 1: front-end processes serve HTTP (``kubeinfer.runtime.frontend_pool``);
        this process handles SIGTERM/SIGINT itself (as ``_Uvicorn.handle_exit`` does)."""
        from kubeinfer.runtime.frontend_pool import FrontEndPool

        pool = self._pool = FrontEndPool(self, self.cfg.server.http_workers)
        self.port = await pool.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        return self._until_frontends_stopped(pool)

    @staticmethod
    async def _until_frontends_stopped(pool: FrontEndPool) -> None:
        await pool.done.wait()

    def _on_signal(self, sig: int) -> None:
        if self._signalled:
            log.warning("second signal %s: exiting without waiting", sig)
            self._close_http(force=True)
            return
        self._signalled = True
        log.info("signal %s: draining (not ready, new requests 503)", sig)
        self.stop()

    def _close_http(self, force: bool = False) -> None:
        """Close the HTTP side: uvicorn (one process) or the front-end processes (after the drain)."""
        if self._pool is not None:
            if force:
                self._pool.kill()
            else:
                from kubeinfer.runtime.frontend_pool import DRAIN_LINGER_SECONDS

                stopping = self._pool.stop(linger=DRAIN_LINGER_SECONDS)
                self._tasks.append(asyncio.get_running_loop().create_task(stopping))
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            self._uvicorn.force_exit = force

    async def wait(self) -> int:
        """Wait until the HTTP server closed (after ``stop``, or a failed model load), then stop the
        background tasks and the batcher. Returns the exit status: 0, or 1 if the model failed to load.
        """
        assert self._serving is not None, "start() first"
        try:
            await self._serving
        finally:
            if self._grpc is not None:
                await self._grpc.stop(grace=1.0)
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(BaseException):
                    await task
            self.close()
        if self._failed:
            return 1
        log.info("exited cleanly")
        return 0

    def stop(self) -> None:
        """Shut down (the SIGTERM/SIGINT handler; safe to call from a signal handler or another thread):
        readiness turns false at once; after ``server.shutdown_delay_seconds`` the server drains and
        closes. Raises ``RuntimeError`` before ``start``."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("RuntimeServer.stop() before start()")
        loop.call_soon_threadsafe(lambda: self._tasks.append(loop.create_task(self._drain_then_exit())))

    async def _drain_then_exit(self) -> None:
        server = self.cfg.server
        self.announce_shutdown()
        if server.shutdown_delay_seconds > 0:
            log.info("not ready; serving %.1f s more before draining", server.shutdown_delay_seconds)
            await asyncio.sleep(server.shutdown_delay_seconds)
        t0 = time.monotonic()
        complete = await self.drain(server.drain_timeout_seconds)
        log.info(
            "drained in %.2f s%s; closing",
            time.monotonic() - t0,
            "" if complete else f" (timeout {server.drain_timeout_seconds} s: requests still pending)",
        )
        self._close_http()

    async def _load(self) -> None:
        """Load and warm up the model in daemon threads, then ``attach`` it (ready); on failure exit 1."""
        try:
            model = await self._load_model()
            if self.draining:
                return
            try:
                self.attach(model, BatchSettings.from_config(self._batching))
            except ValueError as exc:  # a change made during the load that the warmed model cannot take
                log.error("config changed during the load: %s; using the settings it started with", exc)
                self.metrics.config_reload_errors.inc()
                self.attach(model, BatchSettings.from_config(self.cfg.batching))
            log.info(
                "ready: serving model %r at http://%s:%d/v2/models/%s",
                model.name,
                self.host,
                self.port,
                model.name,
            )
        except asyncio.CancelledError:  # shutting down during the load
            raise
        except BaseException:
            log.exception("model load failed; exiting")
            self._failed = True
            self._close_http(force=True)

    async def _load_model(self) -> ServableModel:
        from kubeinfer.runtime.models import load_model

        cfg = self.cfg
        t0 = time.monotonic()
        log.info(
            "loading model %r from %r (quantization %s)",
            cfg.model.name,
            cfg.model.source,
            cfg.quantization.mode,
        )
        model = await in_daemon_thread(load_model, cfg)
        log.info("model loaded in %.1f s on %s", time.monotonic() - t0, model.device)
        if cfg.warmup.enabled:
            log.info(
                "warming up: batch sizes 1..%d, %d step(s)", cfg.batching.max_batch_size, cfg.warmup.steps
            )
            seconds = await in_daemon_thread(model.warmup, cfg.batching.max_batch_size, cfg.warmup.steps)
            log.info("warmup done in %.1f s", seconds)
            fit = self.metrics.service_time
            await in_daemon_thread(calibrate_model, model, cfg.batching.max_batch_size, fit)
        else:
            model.max_batch_size = cfg.batching.max_batch_size
        self.metrics.set_report(model.report())
        try:
            self.metrics.use_device(model.device)
        except Exception as exc:
            log.warning("NVML unavailable (%s); device utilization is executor busy time", exc)
        return model

    def apply_batching(self, batching: BatchingConfig) -> None:
        """Apply a changed ``batching`` section (the config watcher's callback); while the model loads,
        keep it for ``attach``. Raises ``ValueError`` (settings unchanged) for one the batcher refuses."""
        if self.batcher is not None:
            self.batcher.update_settings(BatchSettings.from_config(batching))
        self._batching = batching

    # ----- state -----------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Model loaded and warmed up, and not shutting down."""
        return self.batcher is not None and not self.draining and not self.stopping

    def status_info(self) -> dict[str, Any]:
        """``{"ready": bool, "reason": why not ready or None, "metadata": model metadata or None}``
        (what the front-end processes ask, ``kubeinfer.runtime.ipc``)."""
        reason = None
        if not self.ready:
            reason = "shutting down" if self.draining or self.stopping else "model loading or warming up"
        metadata = model_metadata_doc(self.model) if self.model is not None else None
        return {"ready": self.ready, "reason": reason, "metadata": metadata}

    def announce_shutdown(self) -> None:
        """Readiness turns false; infer requests are still served (until ``drain``)."""
        self.stopping = True

    def attach(self, model: ServableModel, settings: BatchSettings | None = None) -> None:
        """Serve ``model`` (loaded and warmed up): start the batcher on the running loop; ready."""
        batcher = Batcher(
            model,
            settings or BatchSettings.from_config(self.cfg.batching),
            executors=self.cfg.executors,
            metrics=self.metrics,
        )
        batcher.start()
        self.model = model
        self.batcher = batcher

    async def drain(self, timeout: float | None = None) -> bool:
        """Not ready; new infer requests get 503; wait for queued and running requests (``timeout``
        seconds at most). Returns False if requests were still pending at the timeout."""
        self.draining = True
        if self.batcher is None:
            return True
        complete: bool = await self.batcher.drain(timeout)
        return complete

    def close(self) -> None:
        """Stop the batcher's threads."""
        if self.batcher is not None:
            self.batcher.close()

    # ----- routes ----------------------------------------------------------------------------------
    async def live(self, request: Request) -> Response:
        """200 ``{"live": true}`` while the process runs."""
        return Response(_LIVE, 200, media_type=_JSON)

    async def ready_route(self, request: Request) -> Response:
        """200 ``{"ready": true}``; 503 ``{"ready": false, "error": why}`` while loading or shutting down."""
        if self.ready:
            return Response(_READY, 200, media_type=_JSON)
        why = "shutting down" if self.draining or self.stopping else "model loading or warming up"
        return Response(encode_json({"ready": False, "error": why}), 503, media_type=_JSON)

    async def server_metadata(self, request: Request) -> Response:
        doc = {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": ["binary_tensor_data"]}
        return Response(encode_json(doc), 200, media_type=_JSON)

    def _check_model(self, request: Request) -> None:
        check_model(request, self.model_name)

    async def model_metadata(self, request: Request) -> Response:
        self._check_model(request)
        model = self.model
        if model is None:
            raise HTTPError(f"model '{self.model_name}' is loading", 503)
        return Response(encode_json(model_metadata_doc(model)), 200, media_type=_JSON)

    async def model_ready(self, request: Request) -> Response:
        """200 ``{"name": model, "ready": true}``; 503 not (yet) ready; 404 unknown model or version."""
        self._check_model(request)
        if self.ready:
            return Response(encode_json({"name": self.model_name, "ready": True}), 200, media_type=_JSON)
        raise HTTPError(f"model '{self.model_name}' is not ready", 503)

    async def metrics_route(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(self.metrics.exposition(), 200, media_type=CONTENT_TYPE_LATEST)

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The infer routes straight to ``infer``, the rest through Starlette (``route_asgi``)."""
        await route_asgi(scope, receive, send, self.infer, self._router)

    async def infer(self, request: Request) -> Response:
        """``POST .../infer``: decode, queue, encode; every outcome counted in the metrics."""
        t0 = time.perf_counter()
        self.metrics.inflight.inc()
        status = 500
        try:
            response = await self._infer(request)
            status = response.status_code
            return response
        except InferenceError as exc:  # answered by inference_error_response
            status = exc.status
            raise
        except Exception as exc:  # the process never dies on a request
            log.exception("infer failed")
            raise InferenceError(f"internal error: {type(exc).__name__}: {exc}", 500) from exc
        finally:
            self.metrics.inflight.dec()
            self.metrics.count_request(status, time.perf_counter() - t0)

    async def _infer(self, request: Request) -> Response:
        self._check_model(request)
        batcher, model = self.batcher, self.model
        if self.draining or batcher is None or model is None:
            raise HTTPError(
                "shutting down" if self.draining else f"model '{self.model_name}' is not ready", 503
            )
        body = await self._read_body(request)
        header_length = self._header_length(request)
        decoded = decode_request(body, header_length)
        check_outputs(decoded, model.name, [s.name for s in model.outputs])
        outputs = await batcher.infer(
            decoded.inputs, priority=decoded.priority, timeout_us=decoded.timeout_us
        )
        out_body, out_header = encode_response(
            model.name,
            outputs,
            decoded,
            datatypes={s.name: s.datatype for s in model.outputs},
            model_version=MODEL_VERSION,
        )
        headers: dict[str, str] = {}
        if out_header is not None:
            headers["Inference-Header-Content-Length"] = str(out_header)
            return Response(out_body, 200, headers=headers, media_type="application/octet-stream")
        return Response(out_body, 200, media_type=_JSON)

    @staticmethod
    def _header_length(request: Request) -> int | None:
        return request_header_length(request)

    async def _read_body(self, request: Request) -> bytes:
        return await read_body(request, BODY_LIMIT_FACTOR * self.cfg.limits.max_request_bytes)


def check_model(request: Request, model_name: str) -> None:
    """Raise ``HTTPError`` 404 unless the request's path names ``model_name`` (and version 1 or none)."""
    name = request.path_params["name"]
    if name != model_name:
        raise HTTPError(f"unknown model '{name}'; this server serves '{model_name}'", 404)
    version = request.path_params.get("version")
    if version not in (None, "", MODEL_VERSION):
        raise HTTPError(f"unknown version '{version}' of model '{name}'; available: {MODEL_VERSION}", 404)


def request_header_length(request: Request) -> int | None:
    """``Inference-Header-Content-Length`` as an int, None without it; ``HTTPError`` 400 if not an int."""
    raw = request.headers.get("inference-header-content-length")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise HTTPError(f"Inference-Header-Content-Length must be an integer, got {raw!r}", 400) from None


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, decompressed (gzip, deflate); ``HTTPError`` 413 over ``limit`` bytes (sent or
    decompressed), 400 for an unknown Content-Encoding or corrupt compressed data."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(f"request body of {declared} bytes is over the limit of {limit} bytes", 413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPError(f"request body is over the limit of {limit} bytes", 413)
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise HTTPError(f"unsupported Content-Encoding '{encoding}'; use gzip, deflate or none", 400)
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    decomp = zlib.decompressobj(wbits)
    try:
        out = decomp.decompress(body, limit + 1)
    except zlib.error as exc:
        raise HTTPError(f"request body is not valid {encoding} data: {exc}", 400) from None
    if len(out) > limit or decomp.unconsumed_tail:
        raise HTTPError(f"decompressed request body is over the limit of {limit} bytes", 413)
    return out


def model_metadata_doc(model: ServableModel) -> dict[str, Any]:
    """The v2 model metadata of ``model``."""
    return {
        "name": model.name,
        "versions": [MODEL_VERSION],
        "platform": "pytorch",
        "inputs": [s.model_dump() for s in model.inputs],
        "outputs": [s.model_dump() for s in model.outputs],
    }


class V2Handlers(Protocol):
    """The Open Inference Protocol REST handlers of a front end (``RuntimeServer``, ``frontend.FrontEnd``)."""

    async def live(self, request: Request) -> Response: ...
    async def ready_route(self, request: Request) -> Response: ...
    async def server_metadata(self, request: Request) -> Response: ...
    async def model_metadata(self, request: Request) -> Response: ...
    async def model_ready(self, request: Request) -> Response: ...
    async def metrics_route(self, request: Request) -> Response: ...
    async def infer(self, request: Request) -> Response: ...


def v2_router(h: V2Handlers) -> Starlette:
    """The v2 REST routes (health, metadata, readiness, infer, ``/metrics``) on ``h``'s handlers, with the
    one ``InferenceError`` handler; ``route_asgi`` sends ``POST .../infer`` past it."""
    routes = [
        Route("/v2/health/live", h.live, methods=["GET"]),
        Route("/v2/health/ready", h.ready_route, methods=["GET"]),
        Route("/v2", h.server_metadata, methods=["GET"]),
        Route("/v2/models/{name}", h.model_metadata, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}", h.model_metadata, methods=["GET"]),
        Route("/v2/models/{name}/ready", h.model_ready, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}/ready", h.model_ready, methods=["GET"]),
        Route("/v2/models/{name}/infer", h.infer, methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", h.infer, methods=["POST"]),
        Route("/metrics", h.metrics_route, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={InferenceError: inference_error_response})


async def route_asgi(
    scope: dict[str, Any],
    receive: Any,
    send: Any,
    infer: Callable[[Request], Coroutine[Any, Any, Response]],
    router: Callable[[dict[str, Any], Any, Any], Coroutine[Any, Any, None]],
) -> None:
    """The ASGI entry of a front end (``RuntimeServer`` and ``frontend.FrontEnd``): ``POST .../infer``
    goes straight to ``infer``, skipping Starlette's middleware stack and its route-by-route matching
    (the per-request cost of the HTTP front end, issue 13 item 2), with the same error bodies
    (``InferenceError`` -> ``error_response``); everything else goes to ``router``."""
    if scope["type"] == "http" and scope["method"] == "POST":
        match = _INFER_PATH.fullmatch(scope["path"])
        if match is not None:
            scope["path_params"] = {k: v for k, v in match.groupdict().items() if v is not None}
            try:
                response = await infer(Request(scope, receive))
            except InferenceError as exc:
                response = error_response(exc.status, exc.message, exc.headers)
            await response(scope, receive, send)
            return
    await router(scope, receive, send)


def listen_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A non-blocking listening TCP socket on ``host:port`` (IPv6 when ``host`` has a colon); with
    ``reuse_port``, ``SO_REUSEPORT`` (the front-end processes of ``server.http_workers`` share the port).

    Accepted connections inherit TCP_NODELAY (Linux): uvicorn writes a response's head and body in two
    writes, and with Nagle the body waits for the client's delayed ACK (~40 ms per response).
    Raises ``OSError`` if the address is taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def in_daemon_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` in a daemon thread and await its result.

    Unlike ``asyncio.to_thread`` (the default executor, joined by ``asyncio.run`` at exit), a signal
    during a long model load does not wait for the load to finish before the process exits."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # the awaiting task was cancelled
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        error: BaseException | None = None
        result: Any = None
        try:
            result = fn(*args)
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="kubeinfer-load", daemon=True).start()
    return await future


class _Uvicorn(uvicorn.Server):
    """uvicorn's server with kubeinfer's shutdown: the first signal calls ``on_signal``
    (``RuntimeServer.stop``: drain, then close); uvicorn's own handler would close the listener at once
    and re-raise the signal, so the process would not exit 0. A second signal exits at once."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_signal = on_signal
        self._signalled = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._signalled:
            log.warning("second signal %s: exiting without waiting", sig)
            self.should_exit = True
            self.force_exit = True
            return
        self._signalled = True
        log.info("signal %s: draining (not ready, new requests 503)", sig)
        self._on_signal()
