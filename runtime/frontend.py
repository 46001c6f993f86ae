"""An HTTP front-end process (``server.http_workers`` > 1): ``python -m kubeinfer.runtime.frontend``.

The model process (``RuntimeServer`` with ``kubeinfer.runtime.frontend_pool``) starts ``http_workers`` of
these. Each one listens on the pod's HTTP port with ``SO_REUSEPORT`` (the kernel spreads new connections
over them) and serves the same REST transport as the one-process server (``kubeinfer.runtime.rest``:
routes, bodies, status codes) and the same gRPC service on the gRPC port (``SO_REUSEPORT`` too), on a
``RemotePlane``: the model process's data plane reached over ZeroMQ
(``kubeinfer.runtime.ipc``). The body is read and decoded here (JSON and the binary tensor extension,
body limits, Content-Encoding) and the outputs encoded here; admission, validation, the batcher,
metrics and errors are the model process's ``DataPlane``'s, so a request gets the same answer as in one
process. It imports no torch and holds no model.

Health: ``/v2/health/live`` is 200 when this process runs and the model process answers (503 after
``LIVE_TIMEOUT_SECONDS`` without an answer); ``/v2/health/ready``, the model's ready and metadata routes
ask the model process, so readiness is the model process's; ``/metrics`` is the model process's
exposition (one ``/metrics`` for the pod, whichever front end answers). Requests this process refuses
itself (a body it cannot read or decode, an unknown model) are counted in the model process's metrics
with a one-way ``count`` message. When a client leaves (an HTTP disconnect, a cancelled gRPC call) after
its call went to the model process, a one-way ``cancel`` tells the model process to drop it.

Signals: SIGTERM (sent by the model process after its drain) closes the listener and waits for the
requests in flight (uvicorn's graceful shutdown); SIGINT is ignored (a Ctrl-C reaches the whole
process group: the model process drains first, then stops the front ends). The process dies with the
model process (``PR_SET_PDEATHSIG``, set by the pool).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from kubeinfer.runtime import ipc
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.dataplane import Decoder, check_model, decode_off_loop, internal_error, not_ready_error
from kubeinfer.runtime.errors import CLIENT_CLOSED, InferenceError
from kubeinfer.runtime.grpc_server import create_grpc_server
from kubeinfer.runtime.openai_api import OpenAIRoutes
from kubeinfer.runtime.process import event_loop_factory, freeze_heap, raise_open_files_limit
from kubeinfer.runtime.rest import RestApp, UvicornServer, listen_socket, uvicorn_config

log = logging.getLogger(__name__)

#: Seconds the health routes wait for the model process (the pod's livenessProbe times out at 5 s).
LIVE_TIMEOUT_SECONDS = 3.0


class RemotePlane:
    """The model process's data plane seen from a front-end process (a ``dataplane.Plane``): each call
    is a message to the model process's IPC endpoint, whose ``DataPlane`` answers it.

    Args:
        model_name: the model the runtime serves (a request for another gets 404 before its body is read).
        client: the connection to the model process (started by ``serve``).
    """

    def __init__(self, model_name: str, client: ipc.ModelClient) -> None:
        self.model_name = model_name
        self.client = client
        #: the model's metadata once known (the model does not change while the process runs)
        self._metadata: dict[str, Any] | None = None
        #: the model process said it is shutting down (``Header.closing`` on a reply): ``Plane.closing``
        self.closing = False

    async def _call(
        self, header: ipc.Header, frames: Sequence[ipc.Buffer] = ()
    ) -> tuple[ipc.Header, list[Any]]:
        reply, out = await self.client.call(header, frames)
        if reply.closing:
            self.closing = True
        if reply.error is not None:
            ipc.raise_error(reply.error)
        return reply, out

    async def liveness(self) -> str | None:
        """None when the model process answers within ``LIVE_TIMEOUT_SECONDS`` (its event loop runs),
        so the kubelet restarts a pod whose model process hangs, as with one process."""
        try:
            await asyncio.wait_for(self._call(ipc.Header(op="status")), LIVE_TIMEOUT_SECONDS)
        except TimeoutError:
            return f"model process did not answer within {LIVE_TIMEOUT_SECONDS} s"
        return None

    async def readiness(self) -> str | None:
        """The model process's readiness; not ready when it does not answer in ``LIVE_TIMEOUT_SECONDS``."""
        try:
            reply, _ = await asyncio.wait_for(self._call(ipc.Header(op="status")), LIVE_TIMEOUT_SECONDS)
        except TimeoutError:
            return "model process not answering"
        reason: str | None = (reply.info or {}).get("reason")
        return reason

    async def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """The model's metadata (asked once, then kept). Raises ``HTTPError`` 404 or 503 (loading)."""
        check_model(self.model_name, name, version)
        if self._metadata is None:
            reply, _ = await self._call(ipc.Header(op="model", model=name, version=version or ""))
            self._metadata = reply.info
        assert self._metadata is not None
        return self._metadata

    async def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """The model's configuration (``DataPlane.model_config``), asked each time: a config reload
        changes its batching settings. Raises ``HTTPError`` 404 or 503 (loading)."""
        check_model(self.model_name, name, version)
        reply, _ = await self._call(ipc.Header(op="config", model=name, version=version or ""))
        doc: dict[str, Any] = reply.info or {}
        return doc

    async def _loaded(self) -> None:
        """Returns once the model process has loaded the model (its metadata, kept); raises
        ``dataplane.not_ready_error`` before."""
        try:
            await self.model_metadata(self.model_name, None)
        except InferenceError as exc:
            if exc.status == 503:
                raise not_ready_error(self.model_name) from None
            raise

    async def model_ready(self, name: str, version: str | None) -> None:
        """Returns when the model is ready. Raises ``HTTPError`` 404 or 503."""
        await self._call(ipc.Header(op="model_ready", model=name, version=version or ""))

    async def statistics(self, name: str, version: str | None) -> list[dict[str, Any]]:
        """The model process's statistics (``DataPlane.statistics``)."""
        reply, _ = await self._call(ipc.Header(op="stats", model=name, version=version or ""))
        stats: list[dict[str, Any]] = (reply.info or {})["model_stats"]
        return stats

    async def shared_memory(
        self, kind: str, action: str, name: str | None, spec: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """The model process's shared-memory registry (``DataPlane.shared_memory``)."""
        info = {"kind": kind, "action": action, "name": name, "spec": dict(spec)}
        reply, _ = await self._call(ipc.Header(op="shm", info=info))
        regions: list[dict[str, Any]] = (reply.info or {})["regions"]
        return regions

    async def metrics_text(self) -> bytes:
        """The model process's exposition."""
        _, frames = await self._call(ipc.Header(op="metrics"))
        return frames[0].bytes if frames else b""

    async def _count(self, status: int, received: float) -> None:
        """Count an outcome decided here in the model process's metrics (a one-way message)."""
        seconds = max(0.0, time.monotonic() - received)
        await self.client.send(ipc.Header(op="count", code=status, seconds=seconds))

    async def infer(
        self, received: float, name: str, version: str | None, decode: Decoder
    ) -> dict[str, np.ndarray]:
        """Check the model and that it is loaded (as ``DataPlane.infer`` does before decoding), decode
        here, then have the model process's data plane serve the call (``Plane.infer``). An outcome
        decided here is counted there with a one-way ``count`` message; every other outcome is counted
        there. A drain is the model process's to refuse (after the decoding). Cancelled (the client
        left), before the call was sent it is counted 499 here; after, ``ipc.ModelClient.call`` sends
        the model process a ``cancel``, whose data plane drops the request and counts it."""
        try:
            check_model(self.model_name, name, version)
            if self._metadata is None:
                await self._loaded()
            call = await decode()
            size = sum(array.nbytes for array in call.inputs.values())  # BYTES: 8 bytes an element
            specs, frames = await decode_off_loop(size, ipc.encode_tensors, call.inputs)
        # no local may hold the exception past its handler: its traceback holds the decoder's frame,
        # which holds the body, and a cycle through this frame would keep the body until a GC run
        except asyncio.CancelledError:  # the client left before the call reached the model process
            await self._count(CLIENT_CLOSED, received)
            raise
        except InferenceError as exc:
            await self._count(exc.status, received)
            raise
        except Exception as exc:
            log.exception("decoding failed")
            await self._count(500, received)
            raise internal_error(exc) from exc
        header = ipc.Header(
            op="infer",
            model=name,
            version=version or "",
            tensors=specs,
            outputs=list(call.outputs),
            usage=call.usage,
            cache=call.cache,
            split=call.split,
            shm_inputs=[
                (n, d, list(shape), r.region, r.offset, r.byte_size)
                for n, (d, shape, r) in call.shm_inputs.items()
            ],
            shm_outputs=[(n, r.region, r.offset, r.byte_size) for n, r in call.shm_outputs.items()],
            priority=call.priority,
            timeout_us=call.timeout_us,
            overflow=call.overflow,
            received=received,
        )
        reply, out_frames = await self._call(header, frames)
        return ipc.decode_tensors(reply.tensors, out_frames)


async def serve(cfg: RuntimeConfig, address: str, index: int) -> int:
    """Listen on ``cfg.server.host:port`` (SO_REUSEPORT), tell the model process (``hello``), serve until
    SIGTERM. Returns 0."""
    sock = listen_socket(cfg.server.host, cfg.server.port, reuse_port=True)
    client = ipc.ModelClient(address)
    await client.start()
    plane = RemotePlane(cfg.model.name, client)
    rest = RestApp(plane, cfg, OpenAIRoutes(plane, cfg).routes)
    server = UvicornServer(uvicorn_config(rest.app, graceful_seconds=30, server=cfg.server))
    grpc_server, _ = create_grpc_server(
        plane,
        cfg.server.host,
        cfg.server.grpc_port,
        cfg.limits,
        rest.auth,
        reuse_port=True,
        handshake_timeout=cfg.server.header_timeout_seconds,
    )
    await grpc_server.start()
    frozen = freeze_heap()
    await client.send(ipc.Header(op="hello", pid=os.getpid(), code=index))
    log.info(
        "front end %d listening on %s:%d, gRPC :%d (pid %d; %d objects frozen out of garbage collection)",
        index,
        cfg.server.host,
        cfg.server.port,
        cfg.server.grpc_port,
        os.getpid(),
        frozen,
    )
    try:
        await server.serve(sockets=[sock])  # until SIGTERM: uvicorn finishes the requests in flight
    finally:
        await grpc_server.stop(grace=5.0)  # and gRPC its calls in flight
        await client.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of a front-end process (started by ``FrontEndPool``, not by users)."""
    parser = argparse.ArgumentParser(prog="kubeinfer-runtime-frontend")
    parser.add_argument("--ipc", required=True, help="the model process's ZeroMQ address")
    parser.add_argument("--index", type=int, default=0, help="front-end slot number (logs)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise_open_files_limit()
    cfg = RuntimeConfig.model_validate_json(sys.stdin.buffer.read())
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(serve(cfg, args.ipc, args.index))


if __name__ == "__main__":
    sys.exit(main())
