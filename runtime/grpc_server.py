"""The gRPC front end: the Open Inference Protocol's ``inference.GRPCInferenceService``.

Served on its own port (``server.grpc_port``, ``--grpc-port``, default 8081) by grpcio's asyncio
server (``grpc.aio``): in the model process over its ``DataPlane``, or, with ``server.http_workers``
> 1, by every front-end process over its ``RemotePlane`` (``SO_REUSEPORT``), so that gRPC's
decoding and encoding are spread over the front ends as REST's are. A transport over the data plane
(``kubeinfer.runtime.dataplane``), like REST: it decodes the protobuf messages, calls the plane and
encodes its answers, so admission, validation, batching, priorities, queue limits, metrics and the
drain are the same for both. The message and service classes are the ones ``tritonclient[grpc]`` ships
(``tritonclient.grpc.service_pb2`` / ``service_pb2_grpc``, generated from Triton's
``grpc_service.proto``, a superset of KServe's ``open_inference_grpc.proto`` with the same package
and field numbers): ``tritonclient.grpc`` and KServe's gRPC client work unchanged.

RPCs: ``ServerLive``, ``ServerReady``, ``ModelReady``, ``ServerMetadata``, ``ModelMetadata``,
``ModelConfig`` (Triton's model configuration extension: ``kubeinfer.runtime.model_config``'s
document as an ``inference.ModelConfig``), ``ModelInfer``, ``ModelStatistics`` (Triton's statistics
extension), and the shared-memory extension's
``SystemSharedMemory*`` and ``CudaSharedMemory*`` (``kubeinfer.runtime.shared_memory``; inputs and
outputs with ``shared_memory_region`` parameters). Every other RPC of the service (repository, trace,
logging, streaming) answers UNIMPLEMENTED with a message that names
it, and logs nothing (grpcio's generated base class would log an ERROR with a traceback).

``ModelInfer`` inputs come from ``raw_input_contents`` (one entry per input, in input order; the
binary layouts of the REST binary extension: little-endian, BYTES as 4-byte length + bytes) or from
the typed ``contents`` fields; outputs are always sent in ``raw_output_contents``. A message is at
most ``max_message_bytes(limits)`` (the tensor limits, without REST's factor for JSON text); its
inputs' shapes are checked against ``limits`` before any tensor is made, typed contents are parsed
only once counted (``kubeinfer.runtime.grpc_contents``), and a large request is decoded on a worker
thread (``dataplane.decode_off_loop``). Request parameters
``priority`` (1 = highest) and ``timeout`` (microseconds in the queue) as over REST; without a
``timeout``, a client's gRPC deadline bounds the time in the queue.

Status codes (the REST status in brackets): INVALID_ARGUMENT malformed request, wrong datatype or
shape, bad parameter, over a limit (400, 413); NOT_FOUND unknown model or version (404);
RESOURCE_EXHAUSTED queue full (429); UNAVAILABLE not ready or shutting down (503); DEADLINE_EXCEEDED
the request's ``timeout`` passed while queued (504); INTERNAL the model failed (500). The metrics
count gRPC requests with the REST status code, so one ``kubeinfer_requests_total`` covers both; a call
the client cancelled (CANCELLED; grpc.aio cancels its handler's task) is counted 499, as a REST client
that left, and its request leaves the batcher's queue (behind front ends too: ``ipc``'s ``cancel``).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from kubeinfer.runtime.auth import BearerAuth
from kubeinfer.runtime.config import LimitsConfig
from kubeinfer.runtime.dataplane import (
    MODEL_VERSION,
    OVERFLOW_PARAMETER,
    InferCall,
    Plane,
    Repository,
    decode_off_loop,
    server_metadata,
)
from kubeinfer.runtime.dtypes import DATATYPES, NUMPY_DTYPES, datatype_of
from kubeinfer.runtime.errors import InferenceError, ProtocolError
from kubeinfer.runtime.grpc_contents import LazyModelInferRequest, count_values, parse_contents
from kubeinfer.runtime.protocol import (
    RegionRef,
    RequestBudget,
    SharedInput,
    cache_parameter,
    check_shape,
    raw_buffer,
    region_ref,
    tensor_from_raw,
)
from tritonclient.grpc import service_pb2, service_pb2_grpc

log = logging.getLogger(__name__)

#: REST status -> gRPC status code.
STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def _param(params: Any, key: str) -> Any:
    """The value of a request's ``InferParameter`` ``key`` (None if absent)."""
    if key not in params:
        return None
    which = params[key].WhichOneof("parameter_choice")
    return None if which is None else getattr(params[key], which)


def _tensor_from_contents(
    name: str, datatype: str, shape: list[int], contents: Any, budget: RequestBudget
) -> np.ndarray:
    """A tensor from the typed ``InferTensorContents`` (``DatatypeInfo.contents`` names the field):
    its serialized bytes (``LazyModelInferRequest``), whose values are counted before they are
    parsed, or a parsed message. Raises ``ProtocolError`` (and ``InputError`` 413 for BYTES over
    ``budget``)."""
    field = DATATYPES[datatype].contents
    if field is None:
        raise ProtocolError(
            f"input tensor '{name}': datatype {datatype} can only be sent in raw_input_contents",
            tensor=name,
        )
    count = math.prod(shape)
    if isinstance(contents, bytes):
        if not count_values(contents, count)[1]:
            raise ProtocolError(
                f"input tensor '{name}': shape {shape} needs {count} elements, contents holds more",
                tensor=name,
            )
        try:
            contents = parse_contents(contents)
        except DecodeError:
            raise ProtocolError(
                f"input tensor '{name}': contents is no valid InferTensorContents", tensor=name
            ) from None
    repeated = getattr(contents, field)
    if len(repeated) != count:
        raise ProtocolError(
            f"input tensor '{name}': shape {shape} needs {count} elements, "
            f"contents.{field} has {len(repeated)}",
            tensor=name,
        )
    if datatype == "BYTES":
        elements = [bytes(v) for v in repeated]
        budget.payload(name, sum(len(v) for v in elements))
        out = np.empty(count, dtype=object)
        out[:] = elements
        return out.reshape(shape)
    values = list(repeated)
    dtype = NUMPY_DTYPES[datatype]
    if dtype.kind in "iu" and values:
        info = np.iinfo(dtype)
        if min(values) < info.min or max(values) > info.max:
            raise ProtocolError(f"input tensor '{name}': a value is out of range for {datatype}", tensor=name)
    return np.array(values, dtype=dtype).reshape(shape)


#: The keys of Triton's ``RepositoryIndexResponse.ModelIndex`` (the REST index carries kubeinfer's too).
_INDEX_FIELDS = ("name", "version", "state", "reason")
_SHM_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def _region(name: str, params: Any, what: str) -> RegionRef | None:
    """The shared-memory region a tensor's ``InferParameter`` map names, or None."""
    return region_ref(name, {key: _param(params, key) for key in _SHM_PARAMETERS if key in params}, what)


def decode_infer_request(
    request: Any, limits: LimitsConfig | None = None
) -> tuple[dict[str, np.ndarray], dict[str, SharedInput]]:
    """The input tensors of a ``ModelInferRequest`` by name: from ``raw_input_contents`` (the raw
    layout, ``protocol.tensor_from_raw``) or the typed ``contents``; and those left in shared memory
    (name -> datatype, shape, region), which the data plane reads. ``request`` is what the server
    receives, a ``grpc_contents.LazyModelInferRequest`` (typed contents as bytes: their values are
    counted before they are parsed), or a ``ModelInferRequest``.

    Every input's datatype and shape is checked (``protocol.check_shape``) and counted against
    ``limits`` (``protocol.RequestBudget``; None: no limits) before any tensor is made.

    Raises:
        ProtocolError: unknown datatype, bad shape, a duplicate input, raw contents that do not match
            the inputs or their sizes, bad shared-memory parameters.
        InputError: 413 for a request over ``limits``.
    """
    if not request.inputs:
        raise ProtocolError("request must have at least one input")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise ProtocolError(
            f"request has {len(request.inputs)} inputs but {len(raw)} raw_input_contents; "
            "send all inputs raw or none"
        )
    budget = RequestBudget(limits)
    declared: list[tuple[str, str, list[int], RegionRef | None]] = []
    names: set[str] = set()
    for tensor in request.inputs:
        name, datatype = tensor.name, tensor.datatype
        if name in names:
            raise ProtocolError(f"input tensor '{name}' is given twice", tensor=name)
        names.add(name)
        if datatype not in NUMPY_DTYPES:
            raise ProtocolError(
                f"input tensor '{name}': unknown datatype {datatype!r}; one of {', '.join(NUMPY_DTYPES)}",
                tensor=name,
            )
        shape = [int(d) for d in tensor.shape]
        check_shape(shape, name)
        budget.declare(name, datatype, shape)
        declared.append((name, datatype, shape, _region(name, tensor.parameters, "input tensor")))
    inputs: dict[str, np.ndarray] = {}
    shared: dict[str, SharedInput] = {}
    for i, (name, datatype, shape, ref) in enumerate(declared):
        if ref is not None:
            shared[name] = (datatype, shape, ref)
        elif raw:
            blob = raw[i]  # protobuf hands a bytes field out as a copy: once
            if datatype == "BYTES":  # the elements' bytes: the data less a 4-byte length each
                budget.payload(name, max(0, len(blob) - 4 * math.prod(shape)))
            inputs[name] = tensor_from_raw(name, datatype, shape, blob, f"raw_input_contents[{i}]")
        else:
            inputs[name] = _tensor_from_contents(name, datatype, shape, request.inputs[i].contents, budget)
    return inputs, shared


def queue_parameters(request: Any, context: grpc.aio.ServicerContext) -> tuple[Any, Any]:
    """``priority`` and ``timeout`` (microseconds) of a request; the gRPC deadline when it sets no
    ``timeout``. Raises ``ProtocolError`` for a boolean value."""
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


def _duration(doc: dict[str, int]) -> Any:
    return service_pb2.StatisticDuration(count=doc["count"], ns=doc["ns"])


def statistics_message(stat: dict[str, Any]) -> Any:
    """A ``ModelStatistics`` message from the statistics extension's ``$model_stat`` JSON object."""
    batches = [
        service_pb2.InferBatchStatistics(
            batch_size=b["batch_size"],
            compute_input=_duration(b["compute_input"]),
            compute_infer=_duration(b["compute_infer"]),
            compute_output=_duration(b["compute_output"]),
        )
        for b in stat["batch_stats"]
    ]
    inference = service_pb2.InferStatistics(
        **{key: _duration(value) for key, value in stat["inference_stats"].items()}
    )
    return service_pb2.ModelStatistics(
        name=stat["name"],
        version=stat["version"],
        last_inference=stat["last_inference"],
        inference_count=stat["inference_count"],
        execution_count=stat["execution_count"],
        inference_stats=inference,
        batch_stats=batches,
    )


def _tensors(specs: list[dict[str, Any]]) -> list[Any]:
    return [
        service_pb2.ModelMetadataResponse.TensorMetadata(
            name=s["name"], datatype=s["datatype"], shape=list(s["shape"])
        )
        for s in specs
    ]


def tensor_bytes(request: Any) -> int:
    """About the bytes of tensor data a ``LazyModelInferRequest`` carries (what ``decode_infer_request``
    reads): its serialized size, computed by protobuf without copying a field out."""
    size: int = request.ByteSize()
    return size


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """``inference.GRPCInferenceService`` over a data plane (``dataplane.Plane``).

    Args:
        plane: the data plane.
        auth: the bearer token check (None: no authentication).
        limits: the request limits ``ModelInfer`` checks the declared shapes against before it makes
            any tensor (None: none).
        repository: the model repository mode's (``dataplane.Repository``): ``RepositoryIndex``,
            ``RepositoryModelLoad`` and ``RepositoryModelUnload`` (UNIMPLEMENTED without it).
    """

    def __init__(
        self,
        plane: Plane,
        auth: BearerAuth | None = None,
        limits: LimitsConfig | None = None,
        repository: Repository | None = None,
    ) -> None:
        self.plane = plane
        self.repository = repository
        self.auth = auth or BearerAuth(None)
        self.limits = limits

    def _check_auth(self, context: grpc.aio.ServicerContext) -> None:
        """Raises ``HTTPError`` 401 unless the call's ``authorization`` metadata carries the token."""
        if self.auth.enabled:
            metadata = dict(context.invocation_metadata() or ())
            self.auth.check(metadata.get("authorization"))

    async def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        """``_check_auth``, answered as UNAUTHENTICATED."""
        try:
            self._check_auth(context)
        except InferenceError as exc:
            await self._abort(context, exc)

    @staticmethod
    async def _abort(context: grpc.aio.ServicerContext, exc: InferenceError) -> Any:
        await context.abort(STATUS_CODES.get(exc.status, grpc.StatusCode.INTERNAL), exc.message)

    # ----- health and metadata ---------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerLiveResponse(live=await self.plane.liveness() is None)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerReadyResponse(ready=await self.plane.readiness() is None)

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._authorize(context)
        try:
            await self.plane.model_ready(request.name, request.version)
        except InferenceError as exc:
            if exc.status != 503:
                return await self._abort(context, exc)
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._authorize(context)
        return service_pb2.ServerMetadataResponse(**server_metadata(self.repository is not None))

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._authorize(context)
        try:
            doc = await self.plane.model_metadata(request.name, request.version)
        except InferenceError as exc:
            return await self._abort(context, exc)
        return service_pb2.ModelMetadataResponse(
            name=doc["name"],
            versions=doc["versions"],
            platform=doc["platform"],
            inputs=_tensors(doc["inputs"]),
            outputs=_tensors(doc["outputs"]),
        )

    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._authorize(context)
        try:
            doc = await self.plane.model_config(request.name, request.version)
        except InferenceError as exc:
            return await self._abort(context, exc)
        return json_format.ParseDict({"config": doc}, service_pb2.ModelConfigResponse())

    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._authorize(context)
        try:
            stats = await self.plane.statistics(request.name, request.version)
        except InferenceError as exc:
            return await self._abort(context, exc)
        return service_pb2.ModelStatisticsResponse(model_stats=[statistics_message(s) for s in stats])

    # ----- inference -------------------------------------------------------------------------------
    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Decode, call the plane, answer raw outputs (every outcome counted by the plane)."""
        received = time.monotonic()
        plane = self.plane

        shm_outputs: dict[str, RegionRef] = {}

        async def decode() -> InferCall:
            self._check_auth(context)
            inputs, shm_inputs = await decode_off_loop(
                tensor_bytes(request), decode_infer_request, request, self.limits
            )
            priority, timeout_us = queue_parameters(request, context)
            for o in request.outputs:
                ref = _region(o.name, o.parameters, "output")
                if ref is not None:
                    shm_outputs[o.name] = ref
            names = [o.name for o in request.outputs]
            cache = cache_parameter(_param(request.parameters, "cache"))
            return InferCall(
                inputs,
                names,
                priority,
                timeout_us,
                shm_inputs=shm_inputs,
                shm_outputs=shm_outputs,
                cache=cache,
                overflow=_param(request.parameters, OVERFLOW_PARAMETER),
            )

        try:
            outputs = await plane.infer(received, request.model_name, request.model_version, decode)
        except InferenceError as exc:
            return await self._abort(context, exc)
        response = service_pb2.ModelInferResponse(
            model_name=request.model_name, model_version=MODEL_VERSION, id=request.id
        )
        for name, array in outputs.items():
            datatype = datatype_of(array)
            tensor = response.outputs.add()
            tensor.name, tensor.datatype = name, datatype
            tensor.shape.extend(array.shape)
            ref = shm_outputs.get(name)
            if ref is None:
                response.raw_output_contents.append(bytes(raw_buffer(array, datatype)))
            else:  # written into the region by the data plane; an empty entry keeps the positions
                tensor.parameters["shared_memory_region"].string_param = ref.region
                tensor.parameters["shared_memory_byte_size"].int64_param = ref.byte_size
                response.raw_output_contents.append(b"")
        return response

    # ----- shared memory ---------------------------------------------------------------------------
    async def _shm(
        self, context: Any, kind: str, action: str, name: str, spec: dict[str, Any]
    ) -> list[dict[str, Any]]:
        try:
            return await self.plane.shared_memory(kind, action, name or None, spec)
        except InferenceError as exc:
            await self._abort(context, exc)
            raise  # abort raised already

    async def SystemSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._authorize(context)
        regions = await self._shm(context, "system", "status", request.name, {})
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for r in regions:
            response.regions[r["name"]].CopyFrom(
                service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r["name"], key=r["key"], offset=r["offset"], byte_size=r["byte_size"]
                )
            )
        return response

    async def SystemSharedMemoryRegister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._authorize(context)
        spec = {"key": request.key, "offset": request.offset, "byte_size": request.byte_size}
        await self._shm(context, "system", "register", request.name, spec)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._authorize(context)
        await self._shm(context, "system", "unregister", request.name, {})
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._authorize(context)
        await self._shm(context, "cuda", "status", request.name, {})
        return service_pb2.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._authorize(context)
        await self._shm(context, "cuda", "register", request.name, {})
        return service_pb2.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._authorize(context)
        await self._shm(context, "cuda", "unregister", request.name, {})
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    # ----- the model repository extension ---------------------------------------------------------------
    async def _repository(self, rpc: str, context: grpc.aio.ServicerContext) -> Repository:
        await self._authorize(context)
        if self.repository is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"{rpc} is not implemented by this server: it serves one model, not a model repository "
                "(kubeinfer-runtime serve --model-repository)",
            )
        assert self.repository is not None
        return self.repository

    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        repository = await self._repository("RepositoryIndex", context)
        index = await repository.repository_index(request.ready)
        return service_pb2.RepositoryIndexResponse(
            models=[
                service_pb2.RepositoryIndexResponse.ModelIndex(**{k: entry[k] for k in _INDEX_FIELDS})
                for entry in index
            ]
        )

    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        repository = await self._repository("RepositoryModelLoad", context)
        try:
            if len(request.parameters):
                raise InferenceError(
                    "load parameters (config, files) are not supported: edit runtime.yaml", 400
                )
            await repository.repository_load(request.model_name)
        except InferenceError as exc:
            return await self._abort(context, exc)
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        repository = await self._repository("RepositoryModelUnload", context)
        try:
            await repository.repository_unload(request.model_name)
        except InferenceError as exc:
            return await self._abort(context, exc)
        return service_pb2.RepositoryModelUnloadResponse()


def _unimplemented(rpc: str) -> Any:
    async def handler(self: InferenceServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            f"{rpc} is not implemented by this server; it serves health, metadata, ModelConfig, "
            "ModelInfer, ModelStatistics and system shared memory",
        )

    handler.__name__ = rpc
    return handler


#: The service's RPCs, from its descriptor.
RPCS = [m.name for m in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods]
for _rpc in RPCS:
    if _rpc not in InferenceServicer.__dict__:
        setattr(InferenceServicer, _rpc, _unimplemented(_rpc))


#: Bytes a ``ModelInferRequest`` may take beyond its tensor data: names, datatypes, shapes, parameters,
#: the outputs it asks for, protobuf's tags and lengths.
MESSAGE_ENVELOPE_BYTES = 64 * 1024


def max_message_bytes(limits: LimitsConfig) -> int:
    """The largest gRPC message the server receives: the tensor bytes a request may carry
    (``limits.max_request_bytes``), plus the 4-byte length of each BYTES element the raw layout adds
    (``4 * limits.max_request_elements``), plus ``MESSAGE_ENVELOPE_BYTES``. Protobuf sends the tensor
    bytes as they are (no factor, unlike JSON's text of numbers); typed ``contents`` take about as
    much, up to 10 bytes per varint value (a negative INT32 takes 10): ``raw_input_contents`` is the
    way to send a tensor near the limit. A larger message is refused by grpc (RESOURCE_EXHAUSTED)
    before it is read whole."""
    return limits.max_request_bytes + 4 * limits.max_request_elements + MESSAGE_ENVELOPE_BYTES


class _Handlers:
    """Stands for the server while the generated ``add_GRPCInferenceServiceServicer_to_server``
    registers the service: it keeps the method handlers it is given."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """Ignored: the handlers come again by name (``add_registered_method_handlers``)."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        """Keep the service's handlers by method name."""
        self.service, self.handlers = service, dict(handlers)


def _add_servicer(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer``'s RPCs on ``server`` as the generated code does, except that
    ``ModelInfer`` requests are parsed as ``LazyModelInferRequest`` (typed contents counted before
    they are parsed: ``kubeinfer.runtime.grpc_contents``)."""
    recorded = _Handlers()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, recorded)
    handlers = recorded.handlers
    infer = handlers["ModelInfer"]
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        infer.unary_unary,
        request_deserializer=LazyModelInferRequest.FromString,
        response_serializer=infer.response_serializer,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(recorded.service, handlers),))
    server.add_registered_method_handlers(recorded.service, handlers)


#: A gRPC connection without a call for this long gets a GOAWAY and is closed (HTTP keeps an idle
#: connection 30 s).
GRPC_IDLE_SECONDS = 60.0


def create_grpc_server(
    plane: Plane,
    host: str,
    port: int,
    limits: LimitsConfig,
    auth: BearerAuth | None = None,
    *,
    reuse_port: bool = False,
    handshake_timeout: float = 10.0,
    repository: Repository | None = None,
) -> tuple[grpc.aio.Server, int]:
    """A ``grpc.aio`` server with the inference service over ``plane`` on ``host:port`` (0 = any free
    port), not started; returns it and the bound port. Received messages up to
    ``max_message_bytes(limits)``, requests checked against ``limits`` before their tensors are made;
    sent messages unbounded (a response is what the model returned); with ``auth``, every RPC but
    ServerLive and ServerReady requires the bearer token; with ``reuse_port`` (the front-end
    processes), ``SO_REUSEPORT``: the kernel spreads connections over every process that serves the
    port.

    A connection is closed when it has not sent the HTTP/2 preface within ``handshake_timeout`` seconds
    (``server.header_timeout_seconds``; gRPC's default is 120 s) and when it has had no call for
    ``GRPC_IDLE_SECONDS`` (a GOAWAY first; gRPC's default is never): an idle or silent connection does
    not hold a file descriptor for ever, and a client's channel reconnects on its next call.

    With ``repository`` (the model repository mode), the repository extension's RPCs answer too.

    Call it, then ``await grpc_server.start()``, on the running event loop. Raises ``RuntimeError``
    when the port cannot be bound."""
    grpc_server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes(limits)),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            ("grpc.server_handshake_timeout_ms", int(handshake_timeout * 1000)),
            ("grpc.max_connection_idle_ms", int(GRPC_IDLE_SECONDS * 1000)),
        ]
    )
    _add_servicer(InferenceServicer(plane, auth, limits, repository), grpc_server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = grpc_server.add_insecure_port(address)
    if not bound:
        raise RuntimeError(f"cannot bind the gRPC port {address}")
    return grpc_server, bound
