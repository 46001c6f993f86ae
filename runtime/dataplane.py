"""The data plane: what the runtime does with a request, whichever transport carried it.

The transports decode their wire format into an ``InferCall``, call the data plane and encode what it
returns; nothing else. They are REST (``kubeinfer.runtime.rest``, served by ``server`` in one process
and by the HTTP front-end processes, ``frontend``), gRPC (``grpc_server``) and the IPC endpoint of the
model process (``frontend_pool``). What happens to a request between decoding and encoding happens here,
once, so every transport answers the same input the same way:

- the model check: a request for another model or version is refused (404, ``check_model``);
- admission: not ready or draining (503); the queue's limits are the batcher's (429, 504);
- validation: the requested outputs against the model's (400), the inputs against the model's
  tensors (``ServableModel.validate`` through the batcher: 400, 413);
- the request's deadline: a ``timeout`` parameter counts from the request's receipt, also when it
  crossed from a front-end process (``remaining_timeout_us``);
- the response cache (``kubeinfer.runtime.cache``): a request already answered skips the queue and
  the model;
- metrics: every infer request in flight and every outcome, with its status code and its
  receipt-to-answer seconds (``DataPlane.infer``; ``DataPlane.count`` for an outcome a front-end
  process decided itself); a client that left before its answer is 499 (``errors.CLIENT_CLOSED``),
  whichever transport saw it go, and its queued work is dropped;
- errors: every failure is one ``InferenceError`` with its status; any other exception becomes a
  500 that names it (``internal_error``): the process never dies on a request;
- the protocol extensions served by more than one transport: health (``liveness``, ``readiness``),
  server metadata (``SERVER_METADATA``), model metadata, configuration (Triton's model configuration
  extension, ``kubeinfer.runtime.model_config``) and readiness, and Triton's statistics
  extension (``statistics``, kept by ``RuntimeMetrics`` beside the Prometheus metrics).

``DataPlane`` lives in the model process, which owns the model and the batcher. A front-end process
reaches it through ``frontend.RemotePlane``, which has the same methods (``Plane``); the model
process's IPC endpoint answers those calls with this ``DataPlane``.

Modelled on KServe's Python model server (``kserve/protocol/dataplane.py``: one data plane, REST and
gRPC as thin adapters over it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
from kubeinfer.runtime.batching import Batcher, BatchSettings
from kubeinfer.runtime.cache import ResponseCache, cache_key
from kubeinfer.runtime.config import CacheConfig
from kubeinfer.runtime.dtypes import NUMPY_DTYPES
from kubeinfer.runtime.errors import (
    CLIENT_CLOSED,
    HTTPError,
    InferenceError,
    InputError,
    ProtocolError,
    ServingError,
)
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.model_config import model_config_doc
from kubeinfer.runtime.models.base import TOKEN_COUNTS, ServableModel
from kubeinfer.runtime.protocol import RegionRef, SharedInput, check_outputs, raw_buffer, tensor_from_raw
from kubeinfer.runtime.shared_memory import SharedMemoryRegistry

from kubeinfer import __version__

log = logging.getLogger(__name__)
T = TypeVar("T")

SERVER_NAME = "kubeinfer"
SERVER_VERSION = __version__
#: The one version of its one model a runtime serves.
MODEL_VERSION = "1"
#: The Open Inference Protocol extensions this server implements (server metadata ``extensions``).
#: Triton's names: ``schedule_policy`` is the ``priority`` and ``timeout`` request parameters; CUDA shared
#: memory is not listed (its routes answer, but no CUDA region is ever held).
EXTENSIONS: tuple[str, ...] = (
    "binary_tensor_data",
    "statistics",
    "system_shared_memory",
    "model_configuration",
    "schedule_policy",
)
#: Server metadata (``GET /v2``, gRPC ``ServerMetadata``).
SERVER_METADATA: dict[str, Any] = {
    "name": SERVER_NAME,
    "version": SERVER_VERSION,
    "extensions": list(EXTENSIONS),
}
#: The extension the model repository mode adds (Triton's name; ``dataplane.Repository``).
REPOSITORY_EXTENSION = "model_repository"


def server_metadata(repository: bool) -> dict[str, Any]:
    """Server metadata; with ``repository`` (the model repository mode) its extension listed too."""
    if not repository:
        return SERVER_METADATA
    return {**SERVER_METADATA, "extensions": [*EXTENSIONS, REPOSITORY_EXTENSION]}


SHUTTING_DOWN = "shutting down"
LOADING = "model loading or warming up"

#: A request whose body (or tensor data) is larger than this many bytes is decoded on a worker thread
#: (``decode_off_loop``): decoding 64 MB of JSON takes seconds of CPU, during which the event loop
#: would answer nothing, liveness included. Below it the thread hop (tens of microseconds) would cost
#: more than it saves.
DECODE_THREAD_BYTES = 1 << 20


async def decode_off_loop(size: int, decode: Callable[..., T], *args: Any) -> T:
    """``decode(*args)``: on a worker thread (``asyncio.to_thread``) when ``size`` (bytes the decoder
    reads) is over ``DECODE_THREAD_BYTES``, else here on the event loop. Returns what ``decode``
    returns and raises what it raises."""
    if size > DECODE_THREAD_BYTES:
        return await asyncio.to_thread(decode, *args)
    return decode(*args)


@dataclass
class InferCall:
    """One decoded infer request, as every transport hands it to the data plane.

    Attributes:
        inputs: input name -> array (first dimension: rows; BYTES as ``object`` arrays of ``bytes``).
        outputs: the output names requested, in order; empty for all of the model's.
        priority: the ``priority`` parameter as sent (1 = highest; the batcher judges it).
        timeout_us: the ``timeout`` parameter as sent (microseconds in the queue; the batcher judges it).
        usage: also return the model's per-row token counts (``models.base.TOKEN_COUNTS``, INT64
            [rows]) where the model reports them.
        shm_inputs: inputs left in registered shared-memory regions (name -> datatype, shape, where).
        shm_outputs: outputs to write into regions (name -> where); also named in ``outputs``.
        cache: read and fill the response cache (where it is on); a request's ``cache`` parameter.
        split: the rows may be more than one batch: queued as pieces of at most ``max_batch_size``
            rows, admitted all together or not at all (``Batcher.infer_pieces``; the OpenAI routes),
            still one request in every count.
        overflow: the ``overflow`` parameter as sent (``OVERFLOW_PARAMETER``: a narrower policy than
            the service's for a text longer than the window; the batcher judges it).
    """

    inputs: dict[str, np.ndarray]
    outputs: Sequence[str] = ()
    priority: Any = None
    timeout_us: Any = None
    usage: bool = False
    shm_inputs: Mapping[str, SharedInput] = field(default_factory=dict)
    shm_outputs: Mapping[str, RegionRef] = field(default_factory=dict)
    cache: bool = True
    split: bool = False
    overflow: Any = None


#: The request parameter that narrows the service's overflow policy (``refuse``, ``truncate``, ``chunk``;
#: ``ServableModel.narrow_overflow``): the Open Inference Protocol's ``parameters.overflow`` over REST and
#: gRPC. The OpenAI route takes TEI's ``truncate`` (true: truncate, false: refuse).
OVERFLOW_PARAMETER = "overflow"


#: An async callable that decodes a request: the transport's part, run inside the data plane's count.
Decoder = Callable[[], Awaitable[InferCall]]


class Plane(Protocol):
    """What a transport calls: the model process's ``DataPlane``, or a front end's ``RemotePlane``."""

    model_name: str

    @property
    def closing(self) -> bool:
        """The server is shutting down (from the SIGTERM on): HTTP responses carry ``Connection: close``,
        so that a keep-alive client reconnects (through the Service, to a pod that stays) instead of
        sending its next request on a connection the shutdown is about to close under it."""

    async def liveness(self) -> str | None:
        """None when live, else why not."""

    async def readiness(self) -> str | None:
        """None when ready to serve, else why not."""

    async def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """The v2 model metadata; raises ``HTTPError`` 404 (unknown model) or 503 (loading)."""

    async def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """The model's configuration in Triton's schema (``kubeinfer.runtime.model_config``), with the
        batching settings in force; raises ``HTTPError`` 404 (unknown model) or 503 (loading)."""

    async def model_ready(self, name: str, version: str | None) -> None:
        """Returns when the model is ready; raises ``HTTPError`` 404 (unknown model) or 503 (not ready)."""

    async def infer(
        self, received: float, name: str, version: str | None, decode: Decoder
    ) -> dict[str, np.ndarray]:
        """Check the model, admit, decode, validate, queue and run one request; every outcome counted
        once. The model check and admission come before ``decode``: a request for another model gets
        404, and one that arrives while the model loads gets 503, whatever its body.

        Args:
            received: ``time.monotonic()`` at the request's receipt.
            name, version: the model and version the request names ("" or None: the default version).
            decode: the transport's decoder (reads and decodes the body).

        Returns the requested outputs (all of the model's when none is named), each cast to its declared
        datatype. Raises ``InferenceError`` with the request's status."""

    async def statistics(self, name: str, version: str | None) -> list[dict[str, Any]]:
        """Triton's ``model_stats`` for ``name`` (all models when empty) and ``version`` (all when
        empty); raises ``HTTPError`` 404 for a model or version this server does not serve."""

    async def shared_memory(
        self, kind: str, action: str, name: str | None, spec: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """Triton's shared-memory extension: ``kind`` "system" or "cuda", ``action`` "status",
        "register" (``spec``: key, offset, byte_size) or "unregister", region ``name`` (all when None).
        Returns the regions' status (empty for register and unregister); raises ``InputError`` 400."""

    async def metrics_text(self) -> bytes:
        """The Prometheus text exposition of the model process."""


class Repository(Protocol):
    """Triton's model repository extension, in the model repository mode
    (``kubeinfer.runtime.repository.ModelRepository``); the transports serve its routes when given one."""

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """``[{"name", "version", "state", "reason", ...}]`` (state READY, UNAVAILABLE, LOADING or
        UNLOADING; more keys may follow: ``kubeinfer.contract.pool``'s ``INDEX_*``); only the READY ones
        with ``ready_only``."""

    async def repository_load(self, name: str) -> None:
        """Load ``name`` and return once it is ready; raises ``HTTPError`` 400 (unknown, or its load
        failed: the cause)."""

    async def repository_unload(self, name: str) -> None:
        """Unload ``name`` once its requests in flight are done; raises ``HTTPError`` 400 (unknown)."""


def check_model(served: str, name: str, version: str | None) -> None:
    """Refuse a request for a model or version this server does not serve.

    Raises:
        HTTPError: 404 when ``name`` is not ``served`` or ``version`` is neither empty nor ``MODEL_VERSION``.
    """
    if name != served:
        # Triton's wording first: its clients and examples look for "Request for unknown model"
        raise HTTPError(f"Request for unknown model '{name}': this server serves '{served}'", 404)
    if version not in (None, "", MODEL_VERSION):
        raise HTTPError(f"unknown version '{version}' of model '{name}'; available: {MODEL_VERSION}", 404)


def register_spec(name: str, spec: Mapping[str, Any]) -> tuple[str, int, int]:
    """The ``key``, ``offset`` (default 0) and ``byte_size`` of a shared-memory registration of region
    ``name`` (the body of ``POST v2/systemsharedmemory/region/NAME/register``, or gRPC's message).

    Raises:
        InputError: 400 naming the field: a key that is no string, an offset or byte_size that is no
            non-negative integer (a byte_size of 0 is the registry's to refuse).
    """
    key = spec.get("key", "")
    if not isinstance(key, str):
        raise InputError(f"shared memory region '{name}': 'key' must be a string, got {key!r:.40}")
    values = []
    for field_name, default in (("offset", 0), ("byte_size", 0)):
        value = spec.get(field_name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(
                f"shared memory region '{name}': '{field_name}' must be a non-negative integer, "
                f"got {value!r:.40}"
            )
        values.append(value)
    return key, values[0], values[1]


def model_metadata_doc(model: ServableModel) -> dict[str, Any]:
    """The v2 model metadata of ``model``: name, versions, platform, inputs and outputs (name,
    datatype, shape with -1 for a variable dimension). An input declared with the batch dimension only
    is listed as [-1, 1] (``ServableModel.column_inputs``: one element per row, as Triton lists it)."""
    inputs = []
    for spec in model.inputs:
        doc = spec.model_dump()
        if spec.name in model.column_inputs:
            doc["shape"] = [-1, 1]
        inputs.append(doc)
    return {
        "name": model.name,
        "versions": [MODEL_VERSION],
        "platform": model.platform,
        "inputs": inputs,
        "outputs": [s.model_dump() for s in model.outputs],
    }


def not_ready_error(model_name: str) -> HTTPError:
    """The 503 of a request that arrives before the model is loaded and warmed up."""
    return HTTPError(f"model '{model_name}' is not ready", 503)


def internal_error(exc: BaseException) -> InferenceError:
    """The 500 a client gets for an exception that is no ``InferenceError`` (a bug, not its request)."""
    return InferenceError(f"internal error: {type(exc).__name__}: {exc}", 500)


def remaining_timeout_us(timeout_us: Any, received: float, now: float) -> Any:
    """The queue timeout left to a request received at ``received`` (monotonic seconds) by ``now``.

    A positive integer ``timeout_us`` (Triton's ``timeout`` parameter, microseconds) shrinks by the
    time the request spent before the queue (decoding, a front end and the IPC), at least 1 us; any
    other value (None, 0, a bad value the batcher will refuse with 400) is returned unchanged.
    CLOCK_MONOTONIC is one clock for every process of the machine.

    Raises:
        ServingError: 504 when the whole timeout passed before the request reached the queue.
    """
    if isinstance(timeout_us, bool) or not isinstance(timeout_us, int) or timeout_us <= 0 or not received:
        return timeout_us
    left = timeout_us - int((now - received) * 1e6)
    if left <= 0:
        raise ServingError(
            f"request timed out after {(now - received) * 1e3:.1f} ms before it reached the queue "
            "(timeout parameter)",
            504,
        )
    return left


def as_declared(
    outputs: Mapping[str, np.ndarray], declared: Mapping[str, str], names: Sequence[str]
) -> dict[str, np.ndarray]:
    """The outputs ``names`` (all of ``declared`` when empty), each cast to its declared datatype
    (a model's BF16 output comes back as float32 from torch; a cast only when the dtype differs)."""
    out: dict[str, np.ndarray] = {}
    for name in names or declared:
        array = outputs[name]
        datatype = declared[name]
        if datatype != "BYTES" and array.dtype != NUMPY_DTYPES[datatype]:
            array = array.astype(NUMPY_DTYPES[datatype])
        out[name] = array
    return out


class DataPlane:
    """The model process's data plane: the served model, its batcher, readiness and the request path.

    Life cycle (driven by ``RuntimeServer``): ``attach`` a loaded, warmed-up model (ready) ->
    ``announce_shutdown`` (not ready, still serving) -> ``drain`` (new requests 503, queued ones
    finish) -> ``close``.

    Args:
        model_name: the model this runtime serves (requests for another get 404).
        metrics: the runtime's metrics (requests, in flight; the batcher's).
        instances: the model's instances (``instances`` of the runtime config): the batcher's executor
            threads.
        cache: the response cache's settings (``cache.enabled``: ``kubeinfer.runtime.cache``).
    """

    def __init__(
        self, model_name: str, metrics: RuntimeMetrics, instances: int = 1, cache: CacheConfig | None = None
    ) -> None:
        self.model_name = model_name
        self.metrics = metrics
        self.instances = instances
        self.model: ServableModel | None = None
        self.batcher: Batcher | None = None
        self.draining = False
        self.stopping = False
        #: Triton's system shared-memory regions, registered by clients in the pod.
        self.shm = SharedMemoryRegistry()
        #: The response cache, or None when ``cache.enabled`` is off.
        self.cache = ResponseCache(cache.max_bytes) if cache is not None and cache.enabled else None
        #: Infer requests received and not yet answered (read from other threads: the background warmup).
        self.in_flight = 0
        self._declared: dict[str, str] = {}

    # ----- life cycle ------------------------------------------------------------------------------
    def attach(self, model: ServableModel, settings: BatchSettings) -> None:
        """Serve ``model`` (loaded and warmed up): start its batcher on the running loop; ready.

        Raises ``ValueError`` for settings the batcher refuses (over the warmed maximum batch)."""
        batcher = Batcher(model, settings, executors=self.instances, metrics=self.metrics)
        batcher.start()
        self._declared = {s.name: s.datatype for s in model.outputs}
        self.model = model
        self.batcher = batcher

    def announce_shutdown(self) -> None:
        """Readiness turns false; infer requests are still served (until ``drain``)."""
        self.stopping = True

    async def drain(self, timeout: float | None = None) -> bool:
        """Not ready; new infer requests get 503; wait for queued and running requests (``timeout``
        seconds at most). Returns False if requests were still pending at the timeout."""
        self.draining = True
        if self.batcher is None:
            return True
        complete: bool = await self.batcher.drain(timeout)
        return complete

    def close(self) -> None:
        """Stop the batcher's threads; unmap the shared-memory regions."""
        if self.batcher is not None:
            self.batcher.close()
        self.shm.close()

    # ----- health and metadata ---------------------------------------------------------------------
    @property
    def closing(self) -> bool:
        """``announce_shutdown`` or ``drain`` was called (``Plane.closing``)."""
        return self.stopping or self.draining

    @property
    def ready(self) -> bool:
        """Model loaded and warmed up, and not shutting down."""
        return self.batcher is not None and not self.draining and not self.stopping

    def not_ready_reason(self) -> str | None:
        """None when ready, else ``SHUTTING_DOWN`` or ``LOADING``."""
        if self.ready:
            return None
        return SHUTTING_DOWN if self.draining or self.stopping else LOADING

    async def liveness(self) -> str | None:
        """None: the model process answers while it runs."""
        return None

    async def readiness(self) -> str | None:
        """None when ready, else why not (``not_ready_reason``)."""
        return self.not_ready_reason()

    async def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """The model's v2 metadata. Raises ``HTTPError`` 404 (another model) or 503 (still loading)."""
        check_model(self.model_name, name, version)
        if self.model is None:
            raise HTTPError(f"model '{self.model_name}' is loading", 503)
        return model_metadata_doc(self.model)

    async def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """The model's configuration in Triton's schema (``model_config.model_config_doc``) with the
        batching settings in force now (a config reload changes them). Raises ``HTTPError`` 404
        (another model) or 503 (still loading)."""
        check_model(self.model_name, name, version)
        if self.model is None or self.batcher is None:
            raise HTTPError(f"model '{self.model_name}' is loading", 503)
        return model_config_doc(
            model_metadata_doc(self.model),
            self.batcher.settings,
            optional_inputs=self.model.request_inputs,
            instances=self.instances,
            device=self.model.device,
            cache=self.cache is not None,
            parameters=self.model.parameters(),
        )

    async def model_ready(self, name: str, version: str | None) -> None:
        """Returns when ready. Raises ``HTTPError`` 404 (another model) or 503 (not ready)."""
        check_model(self.model_name, name, version)
        if not self.ready:
            raise not_ready_error(self.model_name)

    async def statistics(self, name: str, version: str | None) -> list[dict[str, Any]]:
        """See ``Plane.statistics``: one ``$model_stat`` (``kubeinfer.runtime.statistics``)."""
        if name:
            check_model(self.model_name, name, version)
        return [self.metrics.statistics.doc(self.model_name, MODEL_VERSION)]

    async def shared_memory(
        self, kind: str, action: str, name: str | None, spec: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """See ``Plane.shared_memory``: system regions in ``self.shm``; no CUDA regions are held (status
        lists none, unregistering succeeds, registering is refused)."""
        if kind == "cuda":
            if action == "register":
                raise InputError(
                    "CUDA shared memory is not supported by this server; use system shared memory"
                )
            if action == "status" and name:
                raise InputError(f"unable to find cuda shared memory region '{name}'")
            return []
        if action == "register":
            assert name is not None
            key, offset, byte_size = register_spec(name, spec)
            self.shm.register(name, key, offset, byte_size)
            return []
        if action == "unregister":
            self.shm.unregister(name or None)
            return []
        return self.shm.status(name or None)

    async def metrics_text(self) -> bytes:
        """The Prometheus text exposition (``RuntimeMetrics.exposition``)."""
        return self.metrics.exposition()

    # ----- inference -------------------------------------------------------------------------------
    def count(self, status: int, seconds: float) -> None:
        """Count an outcome decided outside this process (a front end's own refusal)."""
        self.metrics.count_request(status, seconds)

    async def infer(
        self, received: float, name: str, version: str | None, decode: Decoder
    ) -> dict[str, np.ndarray]:
        """See ``Plane.infer``: in flight while it runs; its status and seconds from ``received``
        counted once, whatever the outcome. Cancelled (its client left: the REST transport's disconnect
        watch, gRPC's cancellation, a front end's ``cancel``), it leaves the batcher's queue (a batch
        already running finishes without it), is counted ``CLIENT_CLOSED`` (499), logged at DEBUG,
        and the ``CancelledError`` propagates."""
        metrics = self.metrics
        metrics.inflight.inc()
        self.in_flight += 1
        status = 500
        try:
            check_model(self.model_name, name, version)
            batcher = self._admit()
            outputs = await self._serve(batcher, await decode(), received)
            status = 200
            return outputs
        except asyncio.CancelledError:  # its client left (REST disconnect, gRPC cancel, a front end's cancel)
            status = CLIENT_CLOSED
            log.debug("infer: the client left before its answer (cancelled); counted %d", status)
            raise
        except InferenceError as exc:
            status = exc.status
            if status == CLIENT_CLOSED:
                log.debug("infer: the client left before its answer (%s); counted %d", exc.message, status)
            raise
        except Exception as exc:  # the process never dies on a request
            log.exception("infer failed")
            raise internal_error(exc) from exc
        finally:
            metrics.inflight.dec()
            self.in_flight -= 1
            metrics.count_request(status, max(0.0, time.monotonic() - received))

    def _admit(self) -> Batcher:
        """The batcher, or ``HTTPError`` 503 while the model loads or once the drain began (a drain that
        begins after this check is the batcher's 503)."""
        batcher = self.batcher
        if self.draining or batcher is None:
            raise HTTPError(SHUTTING_DOWN, 503) if self.draining else not_ready_error(self.model_name)
        return batcher

    async def _serve(self, batcher: Batcher, call: InferCall, received: float) -> dict[str, np.ndarray]:
        declared = self._declared
        check_outputs(call.outputs, self.model_name, list(declared))
        inputs = self._with_shared_inputs(call) if call.shm_inputs else call.inputs
        outputs, key, lookup = None, None, 0.0
        if self.cache is not None and call.cache:
            # a hit answers what a miss would: the same 400s, and a narrowed policy's own entries
            batcher.check_parameters(call.priority, call.timeout_us, call.overflow)
            t0 = time.perf_counter()
            key = cache_key(inputs)
            policy = batcher.model.narrow_overflow(call.overflow)
            if policy is not None:
                key += f"{OVERFLOW_PARAMETER}={policy}".encode()
            outputs = self.cache.get(key)
            lookup = time.perf_counter() - t0
            if outputs is not None:
                self._count_cache(True, lookup, 0)
        if outputs is None:
            timeout_us = remaining_timeout_us(call.timeout_us, received, time.monotonic())
            queue = batcher.infer_pieces if call.split else batcher.infer
            outputs = await queue(
                inputs, priority=call.priority, timeout_us=timeout_us, overflow=call.overflow
            )
            if self.cache is not None and key is not None:
                t1 = time.perf_counter()
                evicted = self.cache.put(key, outputs)
                self._count_cache(False, lookup + time.perf_counter() - t1, evicted)
        result = as_declared(outputs, declared, call.outputs)
        for name, ref in call.shm_outputs.items():
            self.shm.write(ref, name, raw_buffer(result[name], declared[name]))
        if call.usage and TOKEN_COUNTS in outputs:
            result[TOKEN_COUNTS] = outputs[TOKEN_COUNTS]
        return result

    def _count_cache(self, hit: bool, seconds: float, evicted: int) -> None:
        assert self.cache is not None
        self.metrics.observe_cache(hit, seconds, evicted, self.cache.bytes, self.cache.entries)

    def _with_shared_inputs(self, call: InferCall) -> dict[str, np.ndarray]:
        """The call's inputs with those it left in shared memory read (copied) from their regions.
        Raises ``InputError``/``ProtocolError`` 400 (a region not registered, sizes that differ)."""
        inputs = dict(call.inputs)
        for name, (datatype, shape, ref) in call.shm_inputs.items():
            if name in inputs:
                raise ProtocolError(f"input tensor '{name}' is given twice", tensor=name)
            source = f"shared memory region '{ref.region}' (shared_memory_byte_size)"
            inputs[name] = tensor_from_raw(name, datatype, shape, self.shm.read(ref, name), source)
        return inputs
