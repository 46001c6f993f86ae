"""The gRPC front end: the Open Inference Protocol's ``inference.GRPCInferenceService``.

Served on its own port (``server.grpc_port``, ``--grpc-port``, default 8081) by grpcio's asyncio
server (``grpc.aio``) on the runtime's event loop, sharing the HTTP front end's state
(``RuntimeServer``: model, batcher, readiness, metrics), so batching, priorities, queue limits and
the drain apply to both. The message and service classes are the ones ``tritonclient[grpc]`` ships
(``tritonclient.grpc.service_pb2`` / ``service_pb2_grpc``, generated from Triton's
``grpc_service.proto``, a superset of KServe's ``open_inference_grpc.proto`` with the same package
and field numbers): ``tritonclient.grpc`` and KServe's gRPC client work unchanged.

RPCs: ``ServerLive``, ``ServerReady``, ``ModelReady``, ``ServerMetadata``, ``ModelMetadata``,
``ModelInfer``. Other Triton RPCs (repository, shared memory, statistics, streaming) answer
UNIMPLEMENTED.

``ModelInfer`` inputs come from ``raw_input_contents`` (one entry per input, in input order; the
binary layouts of the REST binary extension: little-endian, BYTES as 4-byte length + bytes) or from
the typed ``contents`` fields; outputs are always sent in ``raw_output_contents``. Request parameters
``priority`` (1 = highest) and ``timeout`` (microseconds in the queue) as over REST; without a
``timeout``, a client's gRPC deadline bounds the time in the queue.

Status codes (the REST status in brackets): INVALID_ARGUMENT malformed request, wrong datatype or
shape, bad parameter, over a limit (400, 413); NOT_FOUND unknown model or version (404);
RESOURCE_EXHAUSTED queue full (429); UNAVAILABLE not ready or shutting down (503); DEADLINE_EXCEEDED
the request's ``timeout`` passed while queued (504); INTERNAL the model failed (500). The metrics
count gRPC requests with the REST status code, so one ``kubeinfer_requests_total`` covers both.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from kubeinfer.runtime.dtypes import NUMPY_DTYPES
from kubeinfer.runtime.errors import InferenceError, ProtocolError
from kubeinfer.runtime.protocol import deserialize_bytes, serialize_bytes
from tritonclient.grpc import service_pb2, service_pb2_grpc

if TYPE_CHECKING:
    from kubeinfer.runtime.server import RuntimeServer

log = logging.getLogger("kubeinfer.runtime.grpc")

#: REST status -> gRPC status code.
STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

#: ``InferTensorContents`` field holding each datatype's values (the typed, non-raw input form).
CONTENTS_FIELDS: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

_LITTLE_ENDIAN = sys.byteorder == "little"


def _param(params: Any, key: str) -> Any:
    """The value of a request's ``InferParameter`` ``key`` (None if absent)."""
    if key not in params:
        return None
    which = params[key].WhichOneof("parameter_choice")
    return None if which is None else getattr(params[key], which)


def _tensor_from_raw(name: str, datatype: str, shape: list[int], raw: bytes) -> np.ndarray:
    """A tensor from its raw little-endian bytes. Raises ``ProtocolError`` if the sizes disagree."""
    count = int(np.prod(shape)) if shape else 1
    if datatype == "BYTES":
        return deserialize_bytes(raw, count, name).reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise ProtocolError(
            f"input tensor '{name}': {datatype} shape {shape} needs {expected} bytes of raw_input_contents, "
            f"got {len(raw)}",
            tensor=name,
        )
    array = np.frombuffer(raw, dtype=dtype if _LITTLE_ENDIAN else dtype.newbyteorder("<"))
    return array.astype(dtype, copy=False).reshape(shape)


def _tensor_from_contents(name: str, datatype: str, shape: list[int], contents: Any) -> np.ndarray:
    """A tensor from the typed ``InferTensorContents``. Raises ``ProtocolError``."""
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise ProtocolError(
            f"input tensor '{name}': datatype {datatype} can only be sent in raw_input_contents",
            tensor=name,
        )
    values = list(getattr(contents, field))
    count = int(np.prod(shape)) if shape else 1
    if len(values) != count:
        raise ProtocolError(
            f"input tensor '{name}': shape {shape} needs {count} elements, "
            f"contents.{field} has {len(values)}",
            tensor=name,
        )
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        out[:] = [bytes(v) for v in values]
        return out.reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    if dtype.kind in "iu" and values:
        info = np.iinfo(dtype)
        if min(values) < info.min or max(values) > info.max:
            raise ProtocolError(f"input tensor '{name}': a value is out of range for {datatype}", tensor=name)
    return np.array(values, dtype=dtype).reshape(shape)


def decode_infer_request(request: Any) -> dict[str, np.ndarray]:
    """The input tensors of a ``ModelInferRequest`` by name.

    Raises:
        ProtocolError: unknown datatype, bad shape, a duplicate input, raw contents that do not match
            the inputs or their sizes.
    """
    if not request.inputs:
        raise ProtocolError("request must have at least one input")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise ProtocolError(
            f"request has {len(request.inputs)} inputs but {len(raw)} raw_input_contents; "
            "send all inputs raw or none"
        )
    inputs: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        name, datatype = tensor.name, tensor.datatype
        if name in inputs:
            raise ProtocolError(f"input tensor '{name}' is given twice", tensor=name)
        if datatype not in NUMPY_DTYPES:
            raise ProtocolError(
                f"input tensor '{name}': unknown datatype {datatype!r}; one of {', '.join(NUMPY_DTYPES)}",
                name,
            )
        shape = [int(d) for d in tensor.shape]
        if any(d < 0 for d in shape):
            raise ProtocolError(f"input tensor '{name}': shape {shape} has a negative dimension", tensor=name)
        if "shared_memory_region" in tensor.parameters:
            raise ProtocolError(
                f"input tensor '{name}': shared memory is not supported by this server", tensor=name
            )
        if raw:
            inputs[name] = _tensor_from_raw(name, datatype, shape, raw[i])
        else:
            inputs[name] = _tensor_from_contents(name, datatype, shape, tensor.contents)
    return inputs


def raw_bytes(array: np.ndarray, datatype: str) -> bytes:
    """The raw little-endian bytes of an output (BYTES length-prefixed), cast to ``datatype``."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    dtype = NUMPY_DTYPES[datatype]
    if not _LITTLE_ENDIAN:
        dtype = dtype.newbyteorder("<")
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """``inference.GRPCInferenceService`` over a ``RuntimeServer``'s model and batcher."""

    def __init__(self, server: RuntimeServer) -> None:
        self.server = server

    # ----- health and metadata ---------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.server.ready)

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._check_model(request.name, request.version, context)
        return service_pb2.ModelReadyResponse(ready=self.server.ready)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        from kubeinfer.runtime.server import SERVER_NAME, SERVER_VERSION

        return service_pb2.ServerMetadataResponse(
            name=SERVER_NAME, version=SERVER_VERSION, extensions=["binary_tensor_data"]
        )

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        from kubeinfer.runtime.server import MODEL_VERSION

        await self._check_model(request.name, request.version, context)
        model = self.server.model
        if model is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"model '{self.server.model_name}' is loading")
        assert model is not None

        def tensors(specs: Sequence[Any]) -> list[Any]:
            return [
                service_pb2.ModelMetadataResponse.TensorMetadata(
                    name=s.name, datatype=s.datatype, shape=list(s.shape)
                )
                for s in specs
            ]

        return service_pb2.ModelMetadataResponse(
            name=model.name,
            versions=[MODEL_VERSION],
            platform="pytorch",
            inputs=tensors(model.inputs),
            outputs=tensors(model.outputs),
        )

    async def _check_model(self, name: str, version: str, context: grpc.aio.ServicerContext) -> None:
        try:
            self._model_known(name, version)
        except InferenceError as exc:
            await context.abort(STATUS_CODES[exc.status], str(exc))

    def _model_known(self, name: str, version: str) -> None:
        from kubeinfer.runtime.server import MODEL_VERSION

        if name != self.server.model_name:
            raise InferenceError(
                f"unknown model '{name}'; this server serves '{self.server.model_name}'", 404
            )
        if version not in ("", MODEL_VERSION):
            raise InferenceError(
                f"unknown version '{version}' of model '{name}'; available: {MODEL_VERSION}", 404
            )

    # ----- inference -------------------------------------------------------------------------------
    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Decode, queue on the shared batcher, answer raw outputs; every outcome in the metrics."""
        metrics = self.server.metrics
        t0 = time.perf_counter()
        metrics.inflight.inc()
        status, message = 500, ""
        try:
            response = await self._infer(request, context)
            status = 200
            return response
        except InferenceError as exc:
            status, message = exc.status, exc.message
        except Exception as exc:  # the process never dies on a request
            log.exception("gRPC infer failed")
            message = f"internal error: {type(exc).__name__}: {exc}"
        finally:
            metrics.inflight.dec()
            metrics.count_request(status, time.perf_counter() - t0)
        await context.abort(STATUS_CODES.get(status, grpc.StatusCode.INTERNAL), message)

    async def _infer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        from kubeinfer.runtime.server import MODEL_VERSION

        server = self.server
        self._model_known(request.model_name, request.model_version)
        batcher, model = server.batcher, server.model
        if server.draining or batcher is None or model is None:
            message = "shutting down" if server.draining else f"model '{server.model_name}' is not ready"
            raise InferenceError(message, 503)
        inputs = decode_infer_request(request)
        declared = {s.name: s.datatype for s in model.outputs}
        names = [o.name for o in request.outputs] or list(declared)
        for name in names:
            if name not in declared:
                raise ProtocolError(
                    f"unknown output '{name}' requested; model '{model.name}' has: {', '.join(declared)}"
                )
        priority, timeout_us = self._queue_parameters(request, context)
        outputs = await batcher.infer(inputs, priority=priority, timeout_us=timeout_us)
        response = service_pb2.ModelInferResponse(
            model_name=model.name, model_version=MODEL_VERSION, id=request.id
        )
        for name in names:
            array = outputs[name]
            tensor = response.outputs.add()
            tensor.name, tensor.datatype = name, declared[name]
            tensor.shape.extend(array.shape)
            response.raw_output_contents.append(raw_bytes(array, declared[name]))
        return response

    @staticmethod
    def _queue_parameters(request: Any, context: grpc.aio.ServicerContext) -> tuple[Any, Any]:
        """``priority`` and ``timeout`` (microseconds) of a request; the gRPC deadline when it sets no
        ``timeout``."""
        params = request.parameters
        priority = _param(params, "priority")
        timeout_us = _param(params, "timeout")
        if isinstance(priority, bool) or isinstance(timeout_us, bool):
            raise ProtocolError("parameters 'priority' and 'timeout' must be integers")
        if timeout_us is None:
            remaining = context.time_remaining()
            if remaining is not None:
                timeout_us = max(1, int(remaining * 1e6))
        return priority, timeout_us


def create_grpc_server(server: RuntimeServer, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """A ``grpc.aio`` server with the inference service on ``host:port`` (0 = any free port), not
    started; returns it and the bound port. Messages up to 4 x ``limits.max_request_bytes``.

    Call it, then ``await grpc_server.start()``, on the running event loop. Raises ``RuntimeError``
    when the port cannot be bound."""
    limit = 4 * server.cfg.limits.max_request_bytes
    grpc_server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ]
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(server), grpc_server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = grpc_server.add_insecure_port(address)
    if not bound:
        raise RuntimeError(f"cannot bind the gRPC port {address}")
    return grpc_server, bound
