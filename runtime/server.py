"""The HTTP front end: Open Inference Protocol (KServe v2) REST routes, health, readiness, ``/metrics``.

Routes (``{v}`` forms are what ``tritonclient.http`` uses when given a model version; this server
serves version ``1`` of its one model):

- ``GET /v2/health/live``: 200 while the process runs.
- ``GET /v2/health/ready``: 200 once the model is loaded and warmed up, 503 before and while draining.
- ``GET /v2``: server metadata. ``GET /v2/models/{name}[/versions/{v}]``: model metadata.
- ``GET /v2/models/{name}[/versions/{v}]/ready``: 200 ready, 503 not (yet) ready, 404 unknown model.
- ``POST /v2/models/{name}[/versions/{v}]/infer``: inference (JSON or binary tensor data).
- ``GET /metrics``: Prometheus text format (``kubeinfer.runtime.metrics``).

Errors are ``{"error": "..."}``: 400 malformed request / wrong datatype or shape / bad parameter;
404 unknown model or version; 413 over ``limits`` (HTTP body over 4 x ``max_request_bytes`` -- JSON
text of numbers takes several bytes per binary byte --, tensor bytes, elements, text tokens, rows over
the warmed maximum batch); 429 queue full (``Retry-After``); 500 the model failed on this request;
503 not ready or shutting down; 504 the request's ``timeout`` passed while it was queued.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Mapping
from typing import Any

from kubeinfer.runtime.batching import Batcher, BatchSettings
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.errors import HTTPError, InferenceError
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models.base import ServableModel
from kubeinfer.runtime.protocol import check_outputs, decode_request, encode_json, encode_response
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kubeinfer import __version__

log = logging.getLogger("kubeinfer.runtime.server")

SERVER_NAME = "kubeinfer"
SERVER_VERSION = __version__
MODEL_VERSION = "1"
#: HTTP body limit relative to ``limits.max_request_bytes`` (JSON encodes numbers in several bytes).
BODY_LIMIT_FACTOR = 4
_JSON = "application/json"


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """``{"error": message}`` with ``status``."""
    return Response(encode_json({"error": message}), status, headers=dict(headers or {}), media_type=_JSON)


async def inference_error_response(request: Request, exc: Exception) -> Response:
    """The one place an ``InferenceError`` (``kubeinfer.runtime.errors``) becomes a response: a Starlette
    exception handler, registered for the whole hierarchy."""
    assert isinstance(exc, InferenceError)
    return error_response(exc.status, exc.message, exc.headers)


class RuntimeServer:
    """The runtime's state (model, batcher, readiness) and its ASGI app (``self.app``).

    Life cycle: ``RuntimeServer(cfg)`` -> ``attach(model)`` once the model is loaded and warmed up
    (readiness turns true) -> ``drain()`` on SIGTERM (readiness false, new infer requests 503, queued
    and running requests finish).
    """

    def __init__(self, cfg: RuntimeConfig, metrics: RuntimeMetrics | None = None) -> None:
        self.cfg = cfg
        self.model_name = cfg.model.name
        self.metrics = metrics if metrics is not None else RuntimeMetrics(cfg.model.name, cfg.executors)
        self.model: ServableModel | None = None
        self.batcher: Batcher | None = None
        self.draining = False
        self.stopping = False
        routes = [
            Route("/v2/health/live", self.live, methods=["GET"]),
            Route("/v2/health/ready", self.ready_route, methods=["GET"]),
            Route("/v2", self.server_metadata, methods=["GET"]),
            Route("/v2/models/{name}", self.model_metadata, methods=["GET"]),
            Route("/v2/models/{name}/versions/{version}", self.model_metadata, methods=["GET"]),
            Route("/v2/models/{name}/ready", self.model_ready, methods=["GET"]),
            Route("/v2/models/{name}/versions/{version}/ready", self.model_ready, methods=["GET"]),
            Route("/v2/models/{name}/infer", self.infer, methods=["POST"]),
            Route("/v2/models/{name}/versions/{version}/infer", self.infer, methods=["POST"]),
            Route("/metrics", self.metrics_route, methods=["GET"]),
        ]
        self.app = Starlette(routes=routes, exception_handlers={InferenceError: inference_error_response})

    # ----- state -----------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Model loaded and warmed up, and not shutting down."""
        return self.batcher is not None and not self.draining and not self.stopping

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
        return Response(b"", 200)

    async def ready_route(self, request: Request) -> Response:
        if self.ready:
            return Response(b"", 200)
        stopping = self.draining or self.stopping
        return error_response(503, "shutting down" if stopping else "model loading or warming up")

    async def server_metadata(self, request: Request) -> Response:
        doc = {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": ["binary_tensor_data"]}
        return Response(encode_json(doc), 200, media_type=_JSON)

    def _check_model(self, request: Request) -> None:
        name = request.path_params["name"]
        if name != self.model_name:
            raise HTTPError(f"unknown model '{name}'; this server serves '{self.model_name}'", 404)
        version = request.path_params.get("version")
        if version not in (None, "", MODEL_VERSION):
            raise HTTPError(f"unknown version '{version}' of model '{name}'; available: {MODEL_VERSION}", 404)

    async def model_metadata(self, request: Request) -> Response:
        self._check_model(request)
        model = self.model
        if model is None:
            raise HTTPError(f"model '{self.model_name}' is loading", 503)
        return Response(encode_json(model_metadata_doc(model)), 200, media_type=_JSON)

    async def model_ready(self, request: Request) -> Response:
        self._check_model(request)
        if self.ready:
            return Response(b"", 200)
        raise HTTPError(f"model '{self.model_name}' is not ready", 503)

    async def metrics_route(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(self.metrics.exposition(), 200, media_type=CONTENT_TYPE_LATEST)

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
        raw = request.headers.get("inference-header-content-length")
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            raise HTTPError(f"Inference-Header-Content-Length must be an integer, got {raw!r}", 400) from None

    async def _read_body(self, request: Request) -> bytes:
        limit = BODY_LIMIT_FACTOR * self.cfg.limits.max_request_bytes
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
