"""Front-end processes <-> the model process: messages over ZeroMQ (pyzmq), for ``server.httpWorkers``.

With ``server.http_workers`` > 1 the HTTP front-end processes (``kubeinfer.runtime.frontend``) parse and
validate v2 requests and hand the decoded tensors to the one model process (``RuntimeServer``), which
owns the device, the batcher and its priority queue. Transport: a ZeroMQ ROUTER socket in the model
process (``ModelEndpoint``), one DEALER socket per front end (``ModelClient``), on an ``ipc://`` path
(a Unix socket) in a private temporary directory. Calls are matched to replies by ``Header.id``, so
one front end has any number of requests in flight on its one socket.

A message is a multipart ZeroMQ message: frame 0 is a small JSON header (msgspec, ``Header``), frames
1.. are the raw bytes of the tensors the header lists (``Header.tensors``: name, protocol datatype,
shape, in frame order). Numeric tensors go as their C-contiguous little-endian buffer (sent with
``copy=False``: pyzmq copies below its ``copy_threshold``, 64 KiB, and hands larger buffers to libzmq
without a copy; on receipt ``np.frombuffer`` reads the frame in place). BYTES tensors go in the binary
tensor extension's layout (each element a 4-byte little-endian length, then the bytes;
``protocol.serialize_bytes``).

Operations (``Header.op``), front end -> model process:

- ``infer``: ``model`` and ``version`` as the request named them, tensors, the requested ``outputs``
  (and ``usage``: the model's token counts too; ``split``: rows queued as pieces admitted together),
  ``priority`` and ``timeout_us`` as the request sent them (the data plane judges them all),
  ``received`` (``time.monotonic()`` when the front end got the request; CLOCK_MONOTONIC is one
  clock for every process of the machine): the request's deadline travels with it
  (``dataplane.remaining_timeout_us``). Reply: the output tensors, or ``error``.
- ``status``: reply ``info`` = ``{"reason": None when ready, else why not}``.
- ``model`` / ``config`` / ``model_ready`` / ``stats``: ``model``, ``version``; reply ``info`` = the model
  metadata / the model configuration (Triton's schema, with the batching settings in force) / nothing /
  ``{"model_stats": [...]}``, or ``error`` (404 unknown model, 503 loading or not ready).
- ``shm``: ``info`` = ``{"kind", "action", "name", "spec"}`` (the shared-memory extension); reply ``info``
  = ``{"regions": [...]}`` or ``error``. An ``infer`` names its shared-memory tensors in
  ``shm_inputs``/``shm_outputs``: the model process reads and writes the regions.
- ``metrics``: reply frame 1 = the Prometheus exposition of the model process (one ``/metrics`` for the
  pod: the front ends proxy it).
- ``count``: a response the front end gave itself (bad request, unknown model): ``code``, ``seconds``;
  no reply. ``hello``: a new front end is listening (``pid``); no reply.
- ``cancel``: ``id`` = the ``id`` of a call of this front end whose caller left (the HTTP client
  disconnected, the gRPC call was cancelled): the endpoint cancels that call's handler (the data plane
  drops the request from the queue and counts it 499); no reply, for it nor for the call. Sent by
  ``ModelClient.call`` when its task is cancelled; one for a call already answered is ignored.

Errors (``Header.error``) carry an ``InferenceError``'s class name, status, message and headers, and
``raise_error`` raises the same class on the front end, so the HTTP answer is the same as in one
process. Sources: the ZeroMQ guide (ROUTER/DEALER, "Asynchronous Client/Server Pattern"), pyzmq's
"Serializing messages" and zero-copy notes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
import zmq
from kubeinfer.runtime.dataplane import remaining_timeout_us as remaining_timeout_us
from kubeinfer.runtime.dtypes import datatype_of
from kubeinfer.runtime.errors import HTTPError, InferenceError, InputError, ProtocolError, ServingError
from kubeinfer.runtime.protocol import raw_buffer, tensor_from_raw

log = logging.getLogger(__name__)

#: The error classes a reply may name (``ErrorInfo.kind``).
ERROR_KINDS: dict[str, type[InferenceError]] = {
    cls.__name__: cls for cls in (InferenceError, ProtocolError, InputError, ServingError, HTTPError)
}

#: (name, protocol datatype, shape) of one tensor frame.
TensorSpec = tuple[str, str, list[int]]
#: What a frame may be on the way out: bytes, a numpy array or a received ``zmq.Frame``.
Buffer = Any


class ErrorInfo(msgspec.Struct):
    """An ``InferenceError`` on the wire: class name, HTTP status, message, response headers."""

    kind: str
    status: int
    message: str
    headers: dict[str, str] = msgspec.field(default_factory=dict)


class Header(msgspec.Struct, omit_defaults=True):
    """Frame 0 of every message (JSON). Fields unused by an operation keep their defaults and are not
    sent. ``id`` matches a reply to its call (0 for messages without a reply)."""

    op: str = ""
    id: int = 0
    model: str = ""
    version: str = ""
    tensors: list[TensorSpec] = msgspec.field(default_factory=list)
    outputs: list[str] = msgspec.field(default_factory=list)
    usage: bool = False
    cache: bool = True
    #: the rows may be queued as several pieces, admitted together (``dataplane.InferCall.split``)
    split: bool = False
    #: inputs left in shared memory: (name, datatype, shape, region, offset, byte_size)
    shm_inputs: list[tuple[str, str, list[int], str, int, int]] = msgspec.field(default_factory=list)
    #: outputs to write into shared memory: (name, region, offset, byte_size)
    shm_outputs: list[tuple[str, str, int, int]] = msgspec.field(default_factory=list)
    priority: Any = None
    timeout_us: Any = None
    #: the ``overflow`` parameter as sent (``dataplane.InferCall.overflow``)
    overflow: Any = None
    received: float = 0.0
    error: ErrorInfo | None = None
    info: dict[str, Any] | None = None
    code: int = 0
    seconds: float = 0.0
    pid: int = 0
    #: on a reply: the model process is shutting down (``dataplane.Plane.closing``)
    closing: bool = False


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Header)


def encode_header(header: Header) -> bytes:
    """JSON bytes of ``header``."""
    return _ENCODER.encode(header)


def decode_header(frame: Buffer) -> Header:
    """Parse frame 0. Raises ``msgspec.DecodeError`` (a ``ValueError``) on a malformed header."""
    return _DECODER.decode(_view(frame))


def _view(frame: Buffer) -> memoryview:
    return frame.buffer if isinstance(frame, zmq.Frame) else memoryview(frame)


def encode_tensors(tensors: Mapping[str, np.ndarray]) -> tuple[list[TensorSpec], list[Buffer]]:
    """Specs and frames of ``tensors`` (name -> array of a protocol datatype; BYTES as object arrays).

    Each frame is the tensor's raw layout (``protocol.raw_buffer``): a numeric array is sent as itself
    when it is C-contiguous and little-endian (else as a copy that is), BYTES as one length-prefixed
    buffer. Raises ``ValueError`` for an array of no protocol datatype."""
    specs: list[TensorSpec] = []
    frames: list[Buffer] = []
    for name, array in tensors.items():
        datatype = datatype_of(array)
        specs.append((name, datatype, list(array.shape)))
        frames.append(raw_buffer(array, datatype))
    return specs, frames


def decode_tensors(specs: Sequence[TensorSpec], frames: Sequence[Buffer]) -> dict[str, np.ndarray]:
    """The arrays of ``specs``, read in place from ``frames`` (``protocol.tensor_from_raw``: numeric
    tensors with ``np.frombuffer``, no copy).

    Raises ``ProtocolError`` if the number of frames or a frame's size does not match its spec."""
    if len(specs) != len(frames):
        raise ProtocolError(f"ipc: {len(specs)} tensors declared, {len(frames)} frames sent")
    return {
        name: tensor_from_raw(name, datatype, shape, _view(frame), "frame")
        for (name, datatype, shape), frame in zip(specs, frames, strict=True)
    }


def error_info(exc: InferenceError) -> ErrorInfo:
    """``exc`` on the wire."""
    kind = type(exc).__name__ if type(exc).__name__ in ERROR_KINDS else "InferenceError"
    return ErrorInfo(kind=kind, status=exc.status, message=exc.message, headers=dict(exc.headers))


def raise_error(info: ErrorInfo) -> None:
    """Raise the ``InferenceError`` subclass ``info`` names, with its status, message and headers."""
    cls = ERROR_KINDS.get(info.kind, InferenceError)
    raise cls(info.message, info.status, info.headers)


def _socket(ctx: zmq.Context[zmq.Socket[bytes]], kind: int) -> zmq.Socket[bytes]:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # no message limit: the batcher's queue bounds what is in flight
    sock.setsockopt(zmq.RCVHWM, 0)
    return sock


class _Pump:
    """A ZeroMQ socket on the running event loop, without ``zmq.asyncio``'s future per receive: the
    socket's file descriptor (edge-triggered, as libzmq documents ``ZMQ_FD``) wakes ``_drain``, which
    hands every queued message to ``on_message``; ``send`` never blocks (no high-water mark). After a
    send the descriptor's edge may have been consumed, so one more ``_drain`` is scheduled (once per
    loop iteration). Measured with an echo handler on this machine: about half the CPU per call of
    ``zmq.asyncio``'s ``recv_multipart``/``send_multipart``.
    """

    def __init__(self, sock: zmq.Socket[bytes], on_message: Callable[[list[zmq.Frame]], None]) -> None:
        self.sock = sock
        self.on_message = on_message
        self.loop = asyncio.get_running_loop()
        fd = int(sock.getsockopt(zmq.FD))
        self._fd: int | None = fd
        self._scheduled = False
        self.loop.add_reader(fd, self._drain)
        self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        sock = self.sock
        while self._fd is not None and int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                self.on_message(parts)
            except Exception:
                log.exception("ipc: message handler failed")

    def send(self, parts: Sequence[Buffer]) -> None:
        """Send one multipart message now. Raises ``ServingError`` 503 if the socket refuses it."""
        try:
            self.sock.send_multipart(parts, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:
            raise ServingError(f"ipc: cannot send to the model process: {exc}", 503) from exc
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._drain)

    def stop(self) -> None:
        """Stop reading (idempotent)."""
        if self._fd is not None:
            self.loop.remove_reader(self._fd)
            self._fd = None

    def close(self) -> None:
        """Stop reading and close the socket."""
        self.stop()
        self.sock.close(0)


class ModelClient:
    """A front end's connection to the model process (DEALER): calls with replies, and one-way messages.

    Args:
        address: the model process's ``ipc://`` address.

    ``start`` connects and starts reading replies (on the running loop); ``close`` fails every pending
    call with ``ServingError`` 503.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._sock = _socket(self._ctx, zmq.DEALER)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[Header, list[zmq.Frame]]]] = {}
        self._pump: _Pump | None = None

    async def start(self) -> None:
        """Connect and start reading replies."""
        self._sock.connect(self.address)
        self._pump = _Pump(self._sock, self._on_reply)

    async def call(self, header: Header, frames: Sequence[Buffer] = ()) -> tuple[Header, list[zmq.Frame]]:
        """Send ``header`` (its ``id`` is set here) and ``frames``; wait for the reply (header, frames).
        Cancelled while it waits, it sends a ``cancel`` for the call (the model process stops serving
        it) and the ``CancelledError`` propagates.

        Raises ``ServingError`` 503 if the client is closed meanwhile or the message cannot be sent."""
        if self._pump is None:
            raise ServingError("model process connection closed", 503)
        header.id = next(self._ids)
        pump = self._pump
        future: asyncio.Future[tuple[Header, list[zmq.Frame]]] = pump.loop.create_future()
        self._pending[header.id] = future
        try:
            pump.send([encode_header(header), *frames])
            return await future
        except asyncio.CancelledError:  # the caller left: the model process need not serve the call
            if self._pump is not None:
                with contextlib.suppress(ServingError):
                    self._pump.send([encode_header(Header(op="cancel", id=header.id))])
            raise
        finally:
            self._pending.pop(header.id, None)

    async def send(self, header: Header) -> None:
        """Send a one-way message (``count``, ``hello``)."""
        if self._pump is not None:
            self._pump.send([encode_header(header)])

    def _on_reply(self, parts: list[zmq.Frame]) -> None:
        try:
            header = decode_header(parts[0])
        except ValueError:
            log.error("ipc: dropped a reply with a malformed header")
            return
        future = self._pending.get(header.id)
        if future is not None and not future.done():
            future.set_result((header, list(parts[1:])))

    async def close(self) -> None:
        """Stop reading, fail pending calls (503), close the socket."""
        pump, self._pump = self._pump, None
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ServingError("model process connection closed", 503))
        if pump is not None:
            pump.close()
        else:
            self._sock.close(0)
        self._ctx.term()


#: The model process's handler: (request header, tensor frames) -> (reply header, frames), or None for a
#: one-way message. It must not raise for a request's own fault (reply with ``Header.error``).
Handler = Callable[[Header, list[zmq.Frame]], Awaitable[tuple[Header, Sequence[Buffer]] | None]]


class ModelEndpoint:
    """The model process's side (ROUTER): every message from a front end runs ``handler`` in its own task;
    the reply goes back to the front end that sent it (to none if that front end is gone: ZeroMQ's
    ROUTER drops it). A ``cancel`` from a front end cancels the task of its call with that ``id``
    (handled here, not by ``handler``).

    Args:
        address: ``ipc://PATH`` to bind.
        handler: see ``Handler``.
        closing: when given and true at the time of a reply, the reply (an error one too) carries
            ``Header.closing``.
    """

    def __init__(self, address: str, handler: Handler, closing: Callable[[], bool] | None = None) -> None:
        self.address = address
        self._handler = handler
        self._closing = closing
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._sock = _socket(self._ctx, zmq.ROUTER)
        self._sock.bind(address)
        self._tasks: set[asyncio.Task[None]] = set()
        #: (front end's identity, call id) -> the task serving that call, for ``cancel``
        self._calls: dict[tuple[bytes, int], asyncio.Task[None]] = {}
        self._pump: _Pump | None = None

    async def run(self) -> None:
        """Receive and dispatch until cancelled."""
        self._pump = _Pump(self._sock, self._on_message)
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            if self._pump is not None:
                self._pump.stop()

    def _on_message(self, parts: list[zmq.Frame]) -> None:
        if len(parts) < 2:
            return
        task = asyncio.get_running_loop().create_task(self._serve(parts[0].bytes, parts[1], parts[2:]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, peer: bytes, head: zmq.Frame, frames: list[zmq.Frame]) -> None:
        try:
            header = decode_header(head)
        except ValueError:
            log.error("ipc: dropped a message with a malformed header")
            return
        if header.op == "cancel":
            call = self._calls.get((peer, header.id))
            if call is not None:
                call.cancel()  # its handler sees CancelledError; no reply is sent
            return
        key = (peer, header.id)
        if header.id:  # a call (one-way messages have id 0): cancellable until it is answered
            task = asyncio.current_task()
            assert task is not None
            self._calls[key] = task
        try:
            reply = await self._handler(header, frames)
        except InferenceError as exc:
            reply = (Header(op="reply", id=header.id, error=error_info(exc)), [])
        except Exception as exc:  # the model process never dies on a request
            log.exception("ipc: handler failed on %s", header.op)
            err = ServingError(f"internal error: {type(exc).__name__}: {exc}", 500)
            reply = (Header(op="reply", id=header.id, error=error_info(err)), [])
        finally:
            if header.id:
                self._calls.pop(key, None)
        if reply is None or self._pump is None:
            return
        out, out_frames = reply
        out.id = header.id
        if self._closing is not None and self._closing():
            out.closing = True
        self._pump.send([peer, encode_header(out), *out_frames])

    def close(self) -> None:
        """Cancel running handlers and close the socket."""
        for task in list(self._tasks):
            task.cancel()
        if self._pump is not None:
            self._pump.stop()
            self._pump = None
        self._sock.close(0)
        self._ctx.term()
