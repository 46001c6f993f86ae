"""The Open Inference Protocol (KServe v2) REST transport: routes over a data plane (``Plane``).

One ``RestApp`` serves the model process's ``DataPlane`` (``server.http_workers`` 1) or, in a front-end
process, a ``frontend.RemotePlane``: the same routes, bodies and status codes either way. It decodes
the HTTP request, calls the plane, encodes the answer; nothing else.

Routes (``{v}`` forms are what ``tritonclient.http`` uses when given a model version; the server
serves version ``1`` of its one model):

- ``GET /v2/health/live``: 200 ``{"live": true}``; 503 ``{"live": false, "error": ...}`` when a front
  end's model process does not answer.
- ``GET /v2/health/ready``: 200 ``{"ready": true}`` once the model is loaded and warmed up, 503
  ``{"ready": false, "error": ...}`` before and while draining (the bodies of KServe's model server).
- ``GET /v2``: server metadata. ``GET /v2/models/{name}[/versions/{v}]``: model metadata.
- ``GET /v2/models/{name}[/versions/{v}]/config``: Triton's model configuration extension
  (``kubeinfer.runtime.model_config``), with the batching settings in force.
- ``GET /v2/models/{name}[/versions/{v}]/ready``: 200 ``{"name": ..., "ready": true}``, 503 not (yet)
  ready, 404 unknown model.
- ``GET /v2/models[/{name}[/versions/{v}]]/stats``: Triton's statistics extension
  (``kubeinfer.runtime.statistics``).
- ``POST /v2/models/{name}[/versions/{v}]/infer``: inference (JSON or binary tensor data).
- ``GET /metrics``: Prometheus text format (``kubeinfer.runtime.metrics``).
- ``v2/systemsharedmemory/...`` and ``v2/cudasharedmemory/...``: Triton's shared-memory extension
  (``kubeinfer.runtime.shared_memory``).

Errors are ``{"error": "..."}``, unknown routes (404) and methods (405) included: 400 malformed
request / wrong datatype or shape / bad parameter; 404 unknown model or version; 413 over ``limits``
(HTTP body over 4 x ``max_request_bytes`` -- JSON text of numbers takes several bytes per binary
byte --, tensor bytes, elements, text tokens, rows over the warmed maximum batch); 429 queue full
(``Retry-After``); 500 the model failed on this request; 503 not ready or shutting down; 504 the
request's ``timeout`` passed while it was queued.

An infer body is read once into memory (``read_body``: a compressed one inflated in steps that stop
at the body limit), then decoded by ``protocol.decode_request`` with the ``limits``, which checks the
shapes the inputs declare before it makes a tensor; a body over ``dataplane.DECODE_THREAD_BYTES`` is
decoded on a worker thread, so that the event loop answers liveness and other requests meanwhile.

A client that leaves before its answer gets none and is counted 499 (``errors.CLIENT_CLOSED``), not
a 5xx and without a traceback: one that closes the connection while sending the body (starlette's
``ClientDisconnect``) is ``ClientGone``; one whose request waits in the queue or is computed is seen by
``DisconnectWatch``, which cancels the request's task, so the data plane drops it from the batcher's
queue (a batch already running finishes without it) or, in a front end, tells the model process to.

From the SIGTERM on (``Plane.closing``: during ``server.shutdown_delay_seconds``, the drain and after),
every response carries ``Connection: close``: a keep-alive client's next request opens a new
connection (to a pod that stays, once the endpoints dropped this one; here a 503 or a refused
connection) rather than meeting the shutdown's close of its idle connection under the request.

Also here, for both HTTP servers: the listening socket (``listen_socket``) and uvicorn with kubeinfer's
signal handling (``UvicornServer``); their event loop is ``process.event_loop_factory``'s.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import socket
import time
import zlib
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import FrameType
from typing import Any

import msgspec
import numpy as np
import uvicorn
from kubeinfer.runtime.auth import BearerAuth
from kubeinfer.runtime.config import RuntimeConfig, ServerConfig
from kubeinfer.runtime.dataplane import (
    OVERFLOW_PARAMETER,
    SERVER_METADATA,
    InferCall,
    Plane,
    Repository,
    decode_off_loop,
    server_metadata,
)
from kubeinfer.runtime.errors import CLIENT_CLOSED, ClientGone, HTTPError, InferenceError
from kubeinfer.runtime.protocol import (
    MAX_FIELD_BYTES,
    cache_parameter,
    decode_request,
    encode_json,
    encode_response,
)
from kubeinfer.runtime.wire import Acceptor, WireConfig
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive

log = logging.getLogger(__name__)

#: HTTP body limit relative to ``limits.max_request_bytes`` (JSON encodes numbers in several bytes).
BODY_LIMIT_FACTOR = 4
JSON = "application/json"
# Health bodies as KServe's model server answers them (its Python SDK's is_server_live/ready read them;
# tritonclient reads only the status code).
_LIVE = encode_json({"live": True})
_READY = encode_json({"ready": True})
_SERVER_METADATA = encode_json(SERVER_METADATA)
#: The infer routes, matched before (instead of through) Starlette's middleware and router.
_JSON_TYPE = (b"content-type", JSON.encode())
_BINARY_TYPE = (b"content-type", b"application/octet-stream")
_HEADER_LENGTH = b"inference-header-content-length"
_CONNECTION_CLOSE = (b"connection", b"close")
_INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """``{"error": message}`` with ``status``."""
    return Response(encode_json({"error": message}), status, headers=dict(headers or {}), media_type=JSON)


async def inference_error_response(request: Request, exc: Exception) -> Response:
    """The one place an ``InferenceError`` (``kubeinfer.runtime.errors``) becomes a response: a Starlette
    exception handler, registered for the whole hierarchy."""
    assert isinstance(exc, InferenceError)
    return error_response(exc.status, exc.message, exc.headers)


async def route_error_response(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route 404, a method the route does not take 405) in the
    protocol's error shape, ``{"error": ...}``, with their status and headers (``Allow``)."""
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path} on this server"
    elif exc.status_code == 405:
        allowed = headers.get("allow") or headers.get("Allow") or ""
        message = f"method {request.method} is not allowed on {request.url.path}; allowed: {allowed}"
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, message, headers)


class RestApp:
    """The v2 REST routes over ``plane``; ``self.app`` is the ASGI app uvicorn serves.

    ``POST .../infer`` goes straight to ``infer``, skipping Starlette's middleware stack and its
    route-by-route matching (the per-request cost of the HTTP front end); every other route goes through
    a Starlette router with the one ``InferenceError`` handler. Both answer errors as ``error_response``.

    Args:
        plane: the data plane (``DataPlane`` in the model process, ``RemotePlane`` in a front end).
        cfg: the runtime configuration; an HTTP body may be ``BODY_LIMIT_FACTOR`` times its
            ``limits.max_request_bytes`` (read per request); ``server.bearer_token_env`` turns on
            bearer-token authentication (``kubeinfer.runtime.auth``).

    Raises ``ValueError`` when ``server.bearer_token_env`` names a variable that is not set.
        routes: more routes on the same port (``openai_api.OpenAIRoutes.routes``).
        repository: the model repository mode's (``dataplane.Repository``): Triton's repository
            extension's routes, ``POST /v2/repository/index`` and ``.../models/{name}/load|unload``.
    """

    def __init__(
        self,
        plane: Plane,
        cfg: RuntimeConfig,
        routes: Sequence[BaseRoute] = (),
        repository: Repository | None = None,
    ) -> None:
        self.plane = plane
        self.repository = repository
        self._server_metadata = encode_json(server_metadata(True)) if repository else _SERVER_METADATA
        self.cfg = cfg
        #: ``server.bearer_token_env``: every route but health and /metrics checks it
        self.auth = BearerAuth.from_config(cfg)
        self.router = Starlette(
            routes=[
                Route("/v2/health/live", self.live, methods=["GET"]),
                Route("/v2/health/ready", self.ready, methods=["GET"]),
                Route("/v2", self.server_metadata, methods=["GET"]),
                Route("/v2/models/stats", self.statistics, methods=["GET"]),
                Route("/v2/models/{name}/stats", self.statistics, methods=["GET"]),
                Route("/v2/models/{name}/versions/{version}/stats", self.statistics, methods=["GET"]),
                Route("/v2/models/{name}", self.model_metadata, methods=["GET"]),
                Route("/v2/models/{name}/versions/{version}", self.model_metadata, methods=["GET"]),
                Route("/v2/models/{name}/config", self.model_config, methods=["GET"]),
                Route("/v2/models/{name}/versions/{version}/config", self.model_config, methods=["GET"]),
                Route("/v2/models/{name}/ready", self.model_ready, methods=["GET"]),
                Route("/v2/models/{name}/versions/{version}/ready", self.model_ready, methods=["GET"]),
                Route("/v2/models/{name}/infer", self.infer, methods=["POST"]),
                Route("/v2/models/{name}/versions/{version}/infer", self.infer, methods=["POST"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                *self._shared_memory_routes(),
                *self._repository_routes(),
                *routes,
            ],
            exception_handlers={
                InferenceError: inference_error_response,
                StarletteHTTPException: route_error_response,
            },
        )

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI entry: ``POST .../infer`` straight to ``infer``, the rest through the router."""
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _INFER_PATH.fullmatch(scope["path"])
            if match is not None:
                scope["path_params"] = {k: v for k, v in match.groupdict().items() if v is not None}
                try:
                    body, header_length = await self._infer(Request(scope, receive))
                except InferenceError as exc:
                    if exc.status == CLIENT_CLOSED:
                        return  # nobody to answer (uvicorn drops what is sent on a closed connection)
                    await error_response(exc.status, exc.message, exc.headers)(
                        scope, receive, self._send(send)
                    )
                    return
                # the messages starlette's Response sends, without building one per request
                headers = [(b"content-length", str(len(body)).encode()), _JSON_TYPE]
                if header_length is not None:
                    headers = [(_HEADER_LENGTH, str(header_length).encode()), headers[0], _BINARY_TYPE]
                if self.plane.closing:
                    headers.append(_CONNECTION_CLOSE)
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.router(scope, receive, self._send(send) if scope["type"] == "http" else send)

    def _send(self, send: Any) -> Any:
        """``send`` that adds ``Connection: close`` to the response's start while ``plane.closing``
        (read when the response starts, after the plane answered): uvicorn then closes the connection
        after this response, and the client's next request opens a new one."""

        async def send_closing(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and self.plane.closing:
                message = {**message, "headers": [*message.get("headers", ()), _CONNECTION_CLOSE]}
            await send(message)

        return send_closing

    # ----- health and metadata ---------------------------------------------------------------------
    async def live(self, request: Request) -> Response:
        """200 ``{"live": true}``; 503 ``{"live": false, "error": why}``."""
        why = await self.plane.liveness()
        if why is None:
            return Response(_LIVE, 200, media_type=JSON)
        return Response(encode_json({"live": False, "error": why}), 503, media_type=JSON)

    async def ready(self, request: Request) -> Response:
        """200 ``{"ready": true}``; 503 ``{"ready": false, "error": why}`` while loading or shutting down."""
        why = await self.plane.readiness()
        if why is None:
            return Response(_READY, 200, media_type=JSON)
        return Response(encode_json({"ready": False, "error": why}), 503, media_type=JSON)

    def _authorize(self, request: Request) -> None:
        self.auth.check(request.headers.get("authorization"))

    async def server_metadata(self, request: Request) -> Response:
        """Server metadata: name, version, extensions."""
        self._authorize(request)
        return Response(self._server_metadata, 200, media_type=JSON)

    async def model_metadata(self, request: Request) -> Response:
        """The model's metadata; 404 unknown model, 503 loading."""
        self._authorize(request)
        params = request.path_params
        doc = await self.plane.model_metadata(params["name"], params.get("version"))
        return Response(encode_json(doc), 200, media_type=JSON)

    async def model_config(self, request: Request) -> Response:
        """Triton's model configuration extension: the model's configuration in Triton's JSON schema
        (``kubeinfer.runtime.model_config``); 404 unknown model or version, 503 loading."""
        self._authorize(request)
        params = request.path_params
        doc = await self.plane.model_config(params["name"], params.get("version"))
        return Response(encode_json(doc), 200, media_type=JSON)

    async def model_ready(self, request: Request) -> Response:
        """200 ``{"name": model, "ready": true}``; 503 not (yet) ready; 404 unknown model or version."""
        self._authorize(request)
        params = request.path_params
        await self.plane.model_ready(params["name"], params.get("version"))
        return Response(encode_json({"name": params["name"], "ready": True}), 200, media_type=JSON)

    async def statistics(self, request: Request) -> Response:
        """Triton's statistics extension: ``{"model_stats": [...]}``; 404 unknown model or version."""
        self._authorize(request)
        params = request.path_params
        stats = await self.plane.statistics(params.get("name", ""), params.get("version"))
        return Response(encode_json({"model_stats": stats}), 200, media_type=JSON)

    def _shared_memory_routes(self) -> list[Route]:
        """Triton's shared-memory extension (``kubeinfer.runtime.shared_memory``), system and CUDA."""
        routes: list[Route] = []
        for kind, prefix in (("system", "/v2/systemsharedmemory"), ("cuda", "/v2/cudasharedmemory")):
            for path, action, method in (
                ("/status", "status", "GET"),
                ("/region/{region}/status", "status", "GET"),
                ("/region/{region}/register", "register", "POST"),
                ("/unregister", "unregister", "POST"),
                ("/region/{region}/unregister", "unregister", "POST"),
            ):
                routes.append(Route(prefix + path, self._shared_memory(kind, action), methods=[method]))
        return routes

    def _shared_memory(self, kind: str, action: str) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        async def handle(request: Request) -> Response:
            self._authorize(request)
            spec: dict[str, Any] = {}
            if action == "register":
                body = await read_body(request, MAX_FIELD_BYTES)  # {"key", "offset", "byte_size"}
                try:
                    spec = msgspec.json.decode(body) if body else {}
                except msgspec.DecodeError as exc:
                    raise HTTPError(f"shared memory register body is not valid JSON: {exc}", 400) from None
                except RecursionError:
                    raise HTTPError(
                        "shared memory register body is not valid JSON: nested too deeply", 400
                    ) from None
                if not isinstance(spec, dict):
                    raise HTTPError("shared memory register body must be a JSON object", 400)
            region = request.path_params.get("region")
            regions = await self.plane.shared_memory(kind, action, region, spec)
            if action != "status":
                return Response(b"", 200, media_type=JSON)
            return Response(encode_json(regions), 200, media_type=JSON)

        return handle

    def _repository_routes(self) -> list[Route]:
        if self.repository is None:
            return []
        return [
            Route("/v2/repository/index", self.repository_index, methods=["POST"]),
            Route("/v2/repository/models/{name}/load", self.repository_load, methods=["POST"]),
            Route("/v2/repository/models/{name}/unload", self.repository_unload, methods=["POST"]),
        ]

    async def _repository_body(self, request: Request) -> dict[str, Any]:
        """The optional JSON object of a repository request (empty: ``{}``). Raises ``HTTPError`` 400."""
        body = await read_body(request, self.cfg.limits.max_request_bytes)
        if not bytes(body).strip():
            return {}
        try:
            doc = msgspec.json.decode(body)
        except msgspec.DecodeError:
            raise HTTPError("the request body is not JSON", 400) from None
        if not isinstance(doc, dict):
            raise HTTPError("the request body must be a JSON object", 400)
        return doc

    async def repository_index(self, request: Request) -> Response:
        """Triton's ``POST /v2/repository/index`` (body ``{"ready": bool}``, optional): a JSON array of
        ``{"name", "version", "state", "reason"}``."""
        self._authorize(request)
        assert self.repository is not None
        doc = await self._repository_body(request)
        index = await self.repository.repository_index(bool(doc.get("ready", False)))
        return Response(encode_json(index), 200, media_type=JSON)

    async def repository_load(self, request: Request) -> Response:
        """Triton's ``POST /v2/repository/models/{name}/load``: 200 once loaded; 400 with the cause. A
        ``parameters`` override (``config``, files) is refused: the model's ``runtime.yaml`` is its
        configuration."""
        self._authorize(request)
        assert self.repository is not None
        doc = await self._repository_body(request)
        if doc.get("parameters"):
            raise HTTPError("load parameters (config, files) are not supported: edit runtime.yaml", 400)
        await self.repository.repository_load(request.path_params["name"])
        return Response(b"", 200, media_type=JSON)

    async def repository_unload(self, request: Request) -> Response:
        """Triton's ``POST /v2/repository/models/{name}/unload``: 200 once unloaded; 400 unknown model."""
        self._authorize(request)
        assert self.repository is not None
        await self._repository_body(request)
        await self.repository.repository_unload(request.path_params["name"])
        return Response(b"", 200, media_type=JSON)

    async def metrics(self, request: Request) -> Response:
        """The Prometheus exposition."""
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(await self.plane.metrics_text(), 200, media_type=CONTENT_TYPE_LATEST)

    # ----- inference -------------------------------------------------------------------------------
    async def infer(self, request: Request) -> Response:
        """``POST .../infer``: decode the body (JSON or binary tensor data), call the plane, encode the
        outputs as the request asked (binary or JSON per output). Raises ``InferenceError``."""
        body, header_length = await self._infer(request)
        if header_length is not None:
            headers = {"Inference-Header-Content-Length": str(header_length)}
            return Response(body, 200, headers=headers, media_type="application/octet-stream")
        return Response(body, 200, media_type=JSON)

    async def _infer(self, request: Request) -> tuple[bytes, int | None]:
        """``infer``'s work: the response body and, when it carries binary outputs, the length of its
        JSON header (``Inference-Header-Content-Length``; None: JSON only). Raises ``InferenceError``."""
        received = time.monotonic()
        params = request.path_params
        decoded = None
        watch: DisconnectWatch | None = None

        async def decode() -> InferCall:
            nonlocal decoded, watch
            self._authorize(request)
            limits = self.cfg.limits
            body = await read_body(request, BODY_LIMIT_FACTOR * limits.max_request_bytes)
            watch = DisconnectWatch(request.receive)  # the body is read: receive() now only says disconnect
            header_length = request_header_length(request)
            decoded = await decode_off_loop(len(body), decode_request, body, header_length, limits)
            return InferCall(
                decoded.inputs,
                list(decoded.outputs),
                decoded.priority,
                decoded.timeout_us,
                shm_inputs=decoded.shm_inputs,
                shm_outputs=decoded.shm_outputs,
                cache=cache_parameter(decoded.parameters.get("cache")),
                overflow=decoded.parameters.get(OVERFLOW_PARAMETER),
            )

        try:
            outputs = await self.plane.infer(received, params["name"], params.get("version"), decode)
        except asyncio.CancelledError:
            if watch is None or not watch.gone:
                raise
            # the watch cancelled this task (the plane counted the request 499): not a cancellation of
            # the server's, so it ends here, quietly
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise ClientGone("the client closed the connection before its answer") from None
        finally:
            if watch is not None:
                watch.stop()
        assert decoded is not None
        return encode_response(params["name"], outputs, decoded)


def request_header_length(request: Request) -> int | None:
    """``Inference-Header-Content-Length`` as an int, None without it; ``HTTPError`` 400 if not an int."""
    raw = request.headers.get("inference-header-content-length")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise HTTPError(f"Inference-Header-Content-Length must be an integer, got {raw!r}", 400) from None


#: Bytes of decompressed body produced per step; the event loop serves other requests between steps.
DECOMPRESS_STEP_BYTES = 1 << 20


#: What ``read_body`` returns: the body's bytes, in a buffer sized once.
Body = bytearray | memoryview


async def read_body(request: Request, limit: int) -> Body:
    """The request body, decompressed (gzip, deflate), in memory once and without copies on the event
    loop: it is written into one buffer of its ``Content-Length`` (or of ``limit`` when decompressed)
    as it arrives, and decompressed in steps of ``DECOMPRESS_STEP_BYTES`` (the event loop answers
    other requests, liveness included, between them) that stop at ``limit``.

    A bytearray that grew as the body arrived would be copied by realloc now and then, up to 120 ms
    for one chunk of a 64 MB body (measured: glibc keeps blocks under its raised mmap threshold on the
    heap). The buffers are numpy's ``empty`` (``_reserve``): a large one is mapped, and what is never
    written costs no memory, so a client that declares 64 MB and sends a byte costs a page.

    Raises:
        HTTPError: 413 over ``limit`` bytes (sent or decompressed: a small gzip body that inflates
            past it is cut off there), 400 for an unknown Content-Encoding or corrupt compressed data.
        ClientGone: 499, the client closed the connection before the whole body arrived.
    """
    header = request.headers.get("content-length")
    declared = int(header) if header is not None and header.isdigit() else None
    if declared is not None and declared > limit:
        raise HTTPError(f"request body of {declared} bytes is over the limit of {limit} bytes", 413)
    body = await _receive(request, limit, declared)
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise HTTPError(f"unsupported Content-Encoding '{encoding}'; use gzip, deflate or none", 400)
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    decomp = zlib.decompressobj(wbits)
    out: np.ndarray | None = None
    size = 0
    data: Body | bytes = body
    while True:
        try:
            piece = decomp.decompress(data, DECOMPRESS_STEP_BYTES)
        except zlib.error as exc:
            raise HTTPError(f"request body is not valid {encoding} data: {exc}", 400) from None
        if size + len(piece) > limit:
            raise HTTPError(f"decompressed request body is over the limit of {limit} bytes", 413)
        if out is None:
            out = _reserve(limit)
        out[size : size + len(piece)] = np.frombuffer(piece, np.uint8)
        size += len(piece)
        data = decomp.unconsumed_tail
        if not data and len(piece) < DECOMPRESS_STEP_BYTES:
            # the stream must end where the body ends: a cut one (its checksum unread) or bytes after
            # its end are not a body this client meant
            if not decomp.eof or decomp.unused_data:
                why = "bytes follow its end" if decomp.eof else "it ends before the compressed stream does"
                raise HTTPError(f"request body is not valid {encoding} data: {why}", 400)
            return out.data[:size]
        await asyncio.sleep(0)


def _reserve(size: int) -> np.ndarray:
    """``size`` bytes of uninitialized memory (``np.empty``: glibc maps a large block lazily, so its
    pages cost memory once written)."""
    return np.empty(size, np.uint8)


async def _receive(request: Request, limit: int, declared: int | None) -> Body:
    """The body as sent: written into a buffer of its ``declared`` length (reserved at the first
    chunk), or, without a ``Content-Length``, appended to a bytearray. More than ``limit`` bytes is a
    413."""
    buf: np.ndarray | None = None
    grown = bytearray()
    size = 0
    try:
        async for chunk in request.stream():
            end = size + len(chunk)
            if end > limit:
                raise HTTPError(f"request body is over the limit of {limit} bytes", 413)
            if declared is not None and end <= declared:
                if buf is None:
                    buf = _reserve(declared)
                buf[size:end] = np.frombuffer(chunk, np.uint8)
            else:  # no Content-Length (or a server that let more through): grow
                if buf is not None:
                    grown += buf.data[:size]
                    buf = None
                grown += chunk
            size = end
    except ClientDisconnect:
        raise ClientGone(f"the client closed the connection after {size} bytes of the body") from None
    return grown if buf is None else buf.data[:size]


#: Seconds after its body was read before a request's connection is watched for the client leaving
#: (``DisconnectWatch``): a request answered sooner costs a timer, not a task (the fast path).
DISCONNECT_WATCH_AFTER_SECONDS = 0.05


class DisconnectWatch:
    """Cancels the task that serves an HTTP request when its client leaves before the answer.

    Once the body is read, the ASGI ``receive`` of uvicorn blocks until the connection is lost (then
    ``http.disconnect``) or the response is complete; uvicorn itself neither cancels the request's
    task nor tells it otherwise (it drops what is sent afterwards). After
    ``DISCONNECT_WATCH_AFTER_SECONDS`` (a timer: a request answered sooner creates no task) a task
    waits on ``receive``; at ``http.disconnect`` it sets ``gone`` and cancels the task that created the
    watch, so the data plane drops the request from the batcher's queue (or, in a front end, tells the
    model process to) and counts it 499. A client that leaves earlier is seen when the timer fires.

    Create it on the request's task after the body was read; ``stop`` it once the plane answered (before
    the response is sent: receive() also returns ``http.disconnect`` once the response is complete).
    """

    __slots__ = ("_receive", "_task", "_timer", "_waiter", "gone")

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        self._receive = receive
        self._task = asyncio.current_task()
        self._waiter: asyncio.Future[Message] | None = None
        loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = loop.call_later(DISCONNECT_WATCH_AFTER_SECONDS, self._watch)

    def _watch(self) -> None:
        self._timer = None
        if self._task is None:
            return
        self._waiter = asyncio.ensure_future(self._receive())
        self._waiter.add_done_callback(self._received)

    def _received(self, waiter: asyncio.Future[Message]) -> None:
        task = self._task
        if task is None or waiter.cancelled() or waiter.exception() is not None:
            return
        if waiter.result().get("type") == "http.disconnect":
            self.gone = True
            self._task = None
            task.cancel()

    def stop(self) -> None:
        """Stop watching (idempotent); the request's task is never cancelled after this."""
        self._task = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiter is not None:
            self._waiter.cancel()
            self._waiter = None


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


def uvicorn_config(app: Callable[..., Any], graceful_seconds: int, server: ServerConfig) -> WireConfig:
    """uvicorn's settings for both HTTP servers: ``app`` as ASGI3 (a bound coroutine method, which
    uvicorn would guess to be ASGI2), no lifespan, no access log, 30 s keep-alive,
    ``graceful_seconds`` for the requests in flight at shutdown, and the read timeouts of ``server``
    (``header_timeout_seconds``, ``body_timeout_seconds``: ``wire.TimedHttpProtocol``)."""
    return WireConfig(
        app,
        header_timeout=server.header_timeout_seconds,
        body_timeout=server.body_timeout_seconds,
        interface="asgi3",
        lifespan="off",
        log_level=logging.WARNING,
        access_log=False,
        timeout_graceful_shutdown=graceful_seconds,
        timeout_keep_alive=30,
    )


class UvicornServer(uvicorn.Server):
    """uvicorn's server with kubeinfer's signal handling.

    With ``on_signal`` (the one-process server): the first SIGTERM/SIGINT calls it
    (``RuntimeServer.stop``: drain, then close) instead of uvicorn's handler, which would close the
    listener at once and re-raise the signal, so the process would not exit 0; a second signal exits at
    once. Without it (a front-end process): deaf to SIGINT (the model process decides when the front ends
    stop; a Ctrl-C reaches the whole process group), SIGTERM as uvicorn does (graceful shutdown).
    """

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._on_signal = on_signal
        self._signalled = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve on ``sockets`` (listening, non-blocking) through ``wire.Acceptor`` rather than the event
        loop's server, which drops connections silently when out of file descriptors. Without sockets
        (not used here), uvicorn's own startup."""
        if sockets is None:
            await super().startup(sockets)
            return
        config = self.config

        def create_protocol() -> asyncio.Protocol:
            protocol: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )
            return protocol

        self.servers = [Acceptor(sock, create_protocol) for sock in sockets]  # type: ignore[misc]
        self.started = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, with the connections accepted from now on shut down as they are made
        (``wire.TimedHttpProtocol.shutdown``: an idle connection lingers for a request in flight)."""
        if isinstance(self.config, WireConfig):
            self.config.shutting_down = True
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._on_signal is None:
            if sig != signal.SIGINT:
                super().handle_exit(sig, frame)
            return
        if self._signalled:
            log.warning("second signal %s: exiting without waiting", sig)
            self.should_exit = True
            self.force_exit = True
            return
        self._signalled = True
        log.info("signal %s: draining (not ready, new requests 503)", sig)
        self._on_signal()
