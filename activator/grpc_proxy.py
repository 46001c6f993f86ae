"""The gRPC front: any unary method, as raw bytes, forwarded to the target's replica (grpcio aio).

A generic handler takes every method without decoding it and calls the same method on the replica's gRPC
port with the caller's metadata (``authorization`` included, untouched: the runtime checks the token, and
its UNAUTHENTICATED comes back as it sent it) and the caller's remaining deadline; the replica's status,
details and trailing metadata come back unchanged.

Which target a call is for: grpcio's server API does not expose a call's ``:authority`` (the C core has
it, Python does not see it), so a target is named by the port the call arrives on or by the call itself:

- a **per-target listener** (``GrpcFront.listen(port, target)``): every call on it is for that target
  (NOT_FOUND while the target is unknown). With the targets from Kubernetes, ``GrpcFront.sync`` keeps
  these listeners equal to the ports the operator's EndpointSlices name (the Service of a target at zero
  sends its gRPC traffic to the activator on the target's own port, ``kubeinfer.contract.activator``);
  a listener whose port now names another target is closed and opened again for it, so that a client's
  connection made for the one never carries calls to the other;
- the **shared listener** (``GrpcFront.listen(port, None)``): the target is the one whose name is the
  model the call names (``ModelInfer``'s ``model_name``, the ``name`` of ``ModelMetadata``,
  ``ModelReady``, ``ModelConfig``, ``ModelStatistics``) when exactly one target has that name; other
  calls are NOT_FOUND.

The activator's own answers are gRPC statuses: NOT_FOUND (unknown target), UNAVAILABLE (full queue, or
the replica unreachable), DEADLINE_EXCEEDED naming the replica's stage (deadline passed while held).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Mapping
from typing import Any, NoReturn

import grpc
from kubeinfer.activator.gate import Gate, refused
from tritonclient.grpc import service_pb2

from kubeinfer.shared.hold import HoldTimeout, Overflow, seconds_from_us

log = logging.getLogger("kubeinfer.activator")

__all__ = ["GrpcFront", "infer_parameters", "model_of"]

_SERVICE = "/inference.GRPCInferenceService/"
#: The OIP methods whose request names a model, and that field.
_MODEL_FIELD: dict[str, tuple[Any, str]] = {
    _SERVICE + "ModelInfer": (service_pb2.ModelInferRequest, "model_name"),
    _SERVICE + "ModelMetadata": (service_pb2.ModelMetadataRequest, "name"),
    _SERVICE + "ModelReady": (service_pb2.ModelReadyRequest, "name"),
    _SERVICE + "ModelConfig": (service_pb2.ModelConfigRequest, "name"),
    _SERVICE + "ModelStatistics": (service_pb2.ModelStatisticsRequest, "name"),
}
#: No limit on message sizes in either direction: the runtime enforces its own.
_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
#: A listener's port is its own: binding a port already bound fails (grpc's default, SO_REUSEPORT, would
#: share it with another listener, and the kernel would spread connections over both).
_SERVER_OPTIONS = [*_OPTIONS, ("grpc.so_reuseport", 0)]
#: Metadata the transport sets for each hop.
_HOP_METADATA = frozenset({"user-agent", "grpc-timeout", "grpc-accept-encoding", "grpc-encoding", "te"})


def model_of(method: str, request: bytes) -> str | None:
    """The model a call names (see the module docstring), or None (another method, or undecodable)."""
    kind = _MODEL_FIELD.get(method)
    if kind is None:
        return None
    message, field = kind
    try:
        name = getattr(message.FromString(request), field)
    except Exception:  # a malformed message: the runtime is the one to say what is wrong with it
        return None
    return str(name) or None


async def _abort(context: grpc.aio.ServicerContext, code: Any, details: str, trailing: Any = ()) -> NoReturn:
    """End the call with ``code`` and ``details`` (``context.abort`` raises; grpc's stubs are untyped)."""
    await context.abort(code, details, trailing)
    raise AssertionError("context.abort returned")


def _param(params: Any, key: str) -> object:
    if key not in params:
        return None
    which = params[key].WhichOneof("parameter_choice")
    return None if which is None else getattr(params[key], which)


def infer_parameters(method: str, request: bytes) -> tuple[object, float | None]:
    """The OIP ``priority`` and ``timeout`` (seconds) of a ``ModelInfer`` call; (None, None) for another
    method or an undecodable request."""
    if method != _SERVICE + "ModelInfer":
        return None, None
    try:
        params = service_pb2.ModelInferRequest.FromString(request).parameters
    except Exception:  # the runtime answers a malformed request
        return None, None
    return _param(params, "priority"), seconds_from_us(_param(params, "timeout"))


class _Handler:
    """Every method of one listener, unary-unary, bytes in and out (a ``grpc.GenericRpcHandler``: grpc
    asks only for ``service``)."""

    def __init__(self, front: GrpcFront, target: str | None) -> None:
        self._front = front
        self._target = target

    def service(self, handler_call_details: Any) -> Any:
        method: str = handler_call_details.method
        return grpc.unary_unary_rpc_method_handler(functools.partial(self._front.call, self._target, method))


class GrpcFront:
    """The gRPC listeners of one activator and their upstream channels.

    Args:
        gate: targets and the hold.
        host: the address to listen on.
    """

    def __init__(self, gate: Gate, host: str = "0.0.0.0") -> None:
        self.gate = gate
        self.host = host
        #: bound port -> its server and its target (None: the shared listener)
        self._servers: dict[int, tuple[grpc.aio.Server, str | None]] = {}
        #: the ports ``sync`` manages (per-target listeners of the Kubernetes targets)
        self._synced: set[int] = set()
        #: the listeners being stopped (their calls in flight finishing), by port
        self._closing: dict[int, set[asyncio.Task[None]]] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}

    @property
    def ports(self) -> dict[str | None, int]:
        """Target (None: the shared listener) -> the port it listens on."""
        return {target: port for port, (_, target) in sorted(self._servers.items())}

    def target_of(self, port: int) -> str | None:
        """The target of the per-target listener on ``port``; None for the shared one or no listener."""
        return self._servers[port][1] if port in self._servers else None

    async def listen(self, port: int, target: str | None) -> int:
        """Start a listener on ``port`` (0: any free port) for ``target`` (None: the shared one).

        Returns the bound port. Raises ``RuntimeError`` when the port cannot be bound (in use: a
        listener's port is its own)."""
        server = grpc.aio.server(options=_SERVER_OPTIONS)
        server.add_generic_rpc_handlers((_Handler(self, target),))
        try:
            bound: int = server.add_insecure_port(f"{self.host}:{port}")
        except RuntimeError:
            bound = 0
        if not bound:
            raise RuntimeError(f"cannot listen for gRPC on {self.host}:{port}")
        await server.start()
        self._servers[bound] = (server, target)
        return bound

    def close(self, port: int, grace_s: float | None) -> None:
        """Stop the listener on ``port`` (none: nothing): it takes no new call at once (its clients are
        told to go away, and reconnect through their Service), the calls in flight get ``grace_s``
        seconds, in the background (:meth:`stop` waits for them)."""
        entry = self._servers.pop(port, None)
        self._synced.discard(port)
        if entry is None:
            return
        task = asyncio.get_running_loop().create_task(entry[0].stop(grace_s))
        self._closing.setdefault(port, set()).add(task)
        task.add_done_callback(functools.partial(self._closed, port))

    def _closed(self, port: int, task: asyncio.Task[None]) -> None:
        tasks = self._closing.get(port, set())
        tasks.discard(task)
        if not tasks:
            self._closing.pop(port, None)

    async def _reopen(self, port: int, target: str) -> None:
        """:meth:`listen` on ``port``; while a listener of that port is being stopped (it lets go of the
        port as its stop begins), tried again for up to about a second."""
        for delay in (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, None):
            closing = port in self._closing
            if closing and delay is not None:
                await asyncio.sleep(delay)  # the stop begins (0: its first step)
            try:
                await self.listen(port, target)
                return
            except RuntimeError:
                if delay is None or not closing:
                    raise

    async def sync(self, wanted: Mapping[int, str], grace_s: float | None) -> dict[int, str]:
        """Make the per-target listeners that ``sync`` manages exactly ``wanted`` (port -> target):
        open a listener for each new port, close the ones no longer wanted (:meth:`close`, ``grace_s``)
        and close then open again one whose port now names another target. Listeners opened by
        :meth:`listen` alone (the shared one, the targets file's) are left alone. Each change is logged.

        Returns port -> why, for the ports that could not be bound (tried again on the next call)."""
        for port in sorted(self._synced - set(wanted)):
            log.info("grpc port %d closed (was for %s)", port, self.target_of(port))
            self.close(port, grace_s)
        failed: dict[int, str] = {}
        for port, target in sorted(wanted.items()):
            if port in self._synced:
                before = self.target_of(port)
                if before == target:
                    continue
                log.info("grpc port %d now for %s (was for %s): listener opened again", port, target, before)
                self.close(port, grace_s)
            try:
                await self._reopen(port, target)
            except RuntimeError as exc:
                failed[port] = str(exc)
                continue
            self._synced.add(port)
            log.info("grpc listening on %s:%d for %s", self.host, port, target)
        return failed

    async def stop(self, grace_s: float | None) -> None:
        """Stop every listener (``grace_s`` seconds for the calls in flight) and close the channels."""
        for port in list(self._servers):
            self.close(port, grace_s)
        while self._closing:
            with contextlib.suppress(Exception):
                await asyncio.gather(*(t for tasks in self._closing.values() for t in tasks))
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def _target(
        self, target: str | None, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> str:
        """The target of a call on the listener for ``target`` (None: the shared one, where the model the
        call names resolves it); ends the call NOT_FOUND when there is none."""
        if target is not None:
            namespace, _, name = target.partition("/")
            if self.gate.targets.resolve(f"{name}.{namespace}") != target:
                await _abort(context, grpc.StatusCode.NOT_FOUND, f"no InferenceService {target[:200]} (yet)")
            return target
        model = model_of(method, request)
        found = self.gate.targets.resolve(model) if model else None
        if found is None:
            await _abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"no InferenceService serves model '{(model or '')[:100]}' through this activator"
                if model
                else f"{method} names no model: call the target's own activator port",
            )
        return found

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(address, options=_OPTIONS)
        return channel

    async def call(
        self, target: str | None, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        """Forward one call (held first while the target has no ready replica); see the module docstring."""
        target = await self._target(target, method, request, context)
        endpoint = self.gate.targets.endpoint(target)
        if endpoint is None:
            priority, timeout_s = infer_parameters(method, request)
            remaining = context.time_remaining()
            if remaining is not None:
                timeout_s = remaining if timeout_s is None else min(timeout_s, remaining)
            try:
                endpoint = await self.gate.endpoint(
                    target, nbytes=len(request), priority=priority, timeout_s=timeout_s
                )
            except Overflow as exc:
                refused("gRPC UNAVAILABLE", target, exc.message)
                await _abort(context, grpc.StatusCode.UNAVAILABLE, exc.message)
            except HoldTimeout as exc:
                refused("gRPC DEADLINE_EXCEEDED", target, exc.message)
                await _abort(context, grpc.StatusCode.DEADLINE_EXCEEDED, exc.message)
        metadata = tuple(
            (m.key, m.value)
            for m in (context.invocation_metadata() or ())
            if m.key not in _HOP_METADATA and not m.key.startswith(":")
        )
        call = self._channel(endpoint.grpc).unary_unary(method)(
            request, metadata=metadata, timeout=context.time_remaining()
        )
        try:
            response: bytes = await call
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                refused("gRPC UNAVAILABLE", target, f"replica at {endpoint.grpc}: {exc.details()}")
            await _abort(context, code, exc.details() or "", exc.trailing_metadata() or ())
        trailing = await call.trailing_metadata()
        if trailing:
            context.set_trailing_metadata(tuple(trailing))
        return response
