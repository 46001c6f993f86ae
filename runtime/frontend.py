"""An HTTP front-end process (``server.http_workers`` > 1): ``python -m kubeinfer.runtime.frontend``.

The model process (``RuntimeServer`` with ``kubeinfer.runtime.frontend_pool``) starts ``http_workers`` of
these. Each one listens on the pod's HTTP port with ``SO_REUSEPORT`` (the kernel spreads new connections
over them), serves the same routes and bodies as the one-process server (``kubeinfer.runtime.server``),
parses and validates infer requests (JSON and the binary tensor extension, ``protocol.decode_request``;
body limits, Content-Encoding, unknown model or output), and hands the decoded tensors to the model
process over ZeroMQ (``kubeinfer.runtime.ipc``); the model process validates them against the model,
queues them in its batcher and answers with the output tensors, which this process encodes
(``protocol.encode_response``). It imports no torch and holds no model.

Routes: ``/v2/health/live`` is 200 when this process runs and the model process answers (503 after
``LIVE_TIMEOUT_SECONDS`` without an answer); ``/v2/health/ready``, the model's
ready and metadata routes ask the model process (``status``), so readiness is the model process's;
``/metrics`` is the model process's exposition (one ``/metrics`` for the pod, whichever front end
answers). Requests this process refuses itself (400, 404, 413, 503 before the model is known) are
counted in the model process's metrics with a one-way ``count`` message.

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
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import uvicorn
from kubeinfer.runtime import ipc
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.errors import HTTPError, InferenceError
from kubeinfer.runtime.protocol import check_outputs, decode_request, encode_json, encode_response
from kubeinfer.runtime.server import (
    _JSON,
    _LIVE,
    BODY_LIMIT_FACTOR,
    MODEL_VERSION,
    SERVER_NAME,
    SERVER_VERSION,
    check_model,
    listen_socket,
    read_body,
    request_header_length,
    route_asgi,
    v2_router,
)
from starlette.requests import Request
from starlette.responses import Response

log = logging.getLogger("kubeinfer.runtime.frontend")

#: Seconds the health routes wait for the model process (the pod's livenessProbe times out at 5 s).
LIVE_TIMEOUT_SECONDS = 3.0


class FrontEnd:
    """One front-end process's state and ASGI app (``self.app``).

    Args:
        cfg: the runtime configuration (model name, ``limits``).
        client: the connection to the model process (started by ``serve``).
    """

    def __init__(self, cfg: RuntimeConfig, client: ipc.ModelClient) -> None:
        self.cfg = cfg
        self.model_name = cfg.model.name
        self.client = client
        self._limit = BODY_LIMIT_FACTOR * cfg.limits.max_request_bytes
        #: the model's metadata once the model process was ready (the model does not change while it runs)
        self._metadata: dict[str, Any] | None = None
        self._router = v2_router(self)
        self.app: Callable[..., Any] = self._asgi

    # ----- the model process -------------------------------------------------------------------------
    async def status(self) -> dict[str, Any]:
        """The model process's ``{"ready", "reason", "metadata"}``."""
        reply, _ = await self.client.call(ipc.Header(op="status"))
        info = reply.info or {}
        if info.get("metadata") is not None:
            self._metadata = info["metadata"]
        return info

    async def metadata(self) -> dict[str, Any]:
        """The model's v2 metadata; raises ``HTTPError`` 503 while the model loads."""
        if self._metadata is None:
            await self.status()
        if self._metadata is None:
            raise HTTPError(f"model '{self.model_name}' is not ready", 503)
        return self._metadata

    # ----- routes ----------------------------------------------------------------------------------
    async def live(self, request: Request) -> Response:
        """200 ``{"live": true}`` while this process runs and the model process answers within
        ``LIVE_TIMEOUT_SECONDS`` (its event loop runs); else 503 ``{"live": false, "error"}``, so the
        kubelet restarts a pod whose model process hangs, as with one process."""
        try:
            await asyncio.wait_for(self.status(), LIVE_TIMEOUT_SECONDS)
        except TimeoutError:
            doc = {"live": False, "error": f"model process did not answer within {LIVE_TIMEOUT_SECONDS} s"}
            return Response(encode_json(doc), 503, media_type=_JSON)
        return Response(_LIVE, 200, media_type=_JSON)

    async def ready_route(self, request: Request) -> Response:
        """The model process's readiness: 200 ``{"ready": true}`` or 503 ``{"ready": false, "error"}``
        (also when it does not answer within ``LIVE_TIMEOUT_SECONDS``)."""
        try:
            info = await asyncio.wait_for(self.status(), LIVE_TIMEOUT_SECONDS)
        except TimeoutError:
            info = {"ready": False, "reason": "model process not answering"}
        if info.get("ready"):
            return Response(encode_json({"ready": True}), 200, media_type=_JSON)
        return Response(encode_json({"ready": False, "error": info.get("reason")}), 503, media_type=_JSON)

    async def server_metadata(self, request: Request) -> Response:
        doc = {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": ["binary_tensor_data"]}
        return Response(encode_json(doc), 200, media_type=_JSON)

    async def model_metadata(self, request: Request) -> Response:
        check_model(request, self.model_name)
        if self._metadata is None and (await self.status()).get("metadata") is None:
            raise HTTPError(f"model '{self.model_name}' is loading", 503)
        return Response(encode_json(await self.metadata()), 200, media_type=_JSON)

    async def model_ready(self, request: Request) -> Response:
        check_model(request, self.model_name)
        if (await self.status()).get("ready"):
            return Response(encode_json({"name": self.model_name, "ready": True}), 200, media_type=_JSON)
        raise HTTPError(f"model '{self.model_name}' is not ready", 503)

    async def metrics_route(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        _, frames = await self.client.call(ipc.Header(op="metrics"))
        return Response(frames[0].bytes if frames else b"", 200, media_type=CONTENT_TYPE_LATEST)

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """``POST .../infer`` straight to ``infer``; the rest through Starlette (``route_asgi``)."""
        await route_asgi(scope, receive, send, self.infer, self._router)

    async def infer(self, request: Request) -> Response:
        """``POST .../infer``: decode and check here, queue in the model process, encode here.

        Outcomes decided in the model process are counted there; those decided here are sent to it
        (``count``)."""
        received = time.monotonic()
        t0 = time.perf_counter()
        try:
            decoded = await self._decode(request)
        except InferenceError as exc:
            await self.client.send(ipc.Header(op="count", code=exc.status, seconds=time.perf_counter() - t0))
            raise
        try:
            return await self._call(decoded, received)
        except InferenceError:
            raise
        except Exception as exc:  # the process never dies on a request
            log.exception("infer failed")
            raise InferenceError(f"internal error: {type(exc).__name__}: {exc}", 500) from exc

    async def _call(self, decoded: Any, received: float) -> Response:
        specs, frames = ipc.encode_tensors(decoded.inputs)
        header = ipc.Header(
            op="infer",
            tensors=specs,
            priority=decoded.priority,
            timeout_us=decoded.timeout_us,
            received=received,
        )
        reply, out_frames = await self.client.call(header, frames)
        if reply.error is not None:
            ipc.raise_error(reply.error)
        outputs = ipc.decode_tensors(reply.tensors, out_frames)
        meta = await self.metadata()
        body, out_header = encode_response(
            self.model_name,
            outputs,
            decoded,
            datatypes={o["name"]: o["datatype"] for o in meta["outputs"]},
            model_version=MODEL_VERSION,
        )
        if out_header is not None:
            headers = {"Inference-Header-Content-Length": str(out_header)}
            return Response(body, 200, headers=headers, media_type="application/octet-stream")
        return Response(body, 200, media_type=_JSON)

    async def _decode(self, request: Request) -> Any:
        check_model(request, self.model_name)
        meta = await self.metadata()
        body = await read_body(request, self._limit)
        decoded = decode_request(body, request_header_length(request))
        check_outputs(decoded, self.model_name, [o["name"] for o in meta["outputs"]])
        return decoded


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, deaf to SIGINT (the model process decides when the front ends stop)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGINT:
            return
        super().handle_exit(sig, frame)


async def serve(cfg: RuntimeConfig, address: str, index: int) -> int:
    """Listen on ``cfg.server.host:port`` (SO_REUSEPORT), tell the model process (``hello``), serve until
    SIGTERM. Returns 0."""
    sock = listen_socket(cfg.server.host, cfg.server.port, reuse_port=True)
    client = ipc.ModelClient(address)
    await client.start()
    front = FrontEnd(cfg, client)
    server = _Uvicorn(
        uvicorn.Config(
            front.app,
            interface="asgi3",
            lifespan="off",
            log_level=logging.WARNING,
            access_log=False,
            timeout_graceful_shutdown=30,
            timeout_keep_alive=30,
        )
    )
    await client.send(ipc.Header(op="hello", pid=os.getpid(), code=index))
    log.info("front end %d listening on %s:%d (pid %d)", index, cfg.server.host, cfg.server.port, os.getpid())
    try:
        await server.serve(sockets=[sock])
    finally:
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
    cfg = RuntimeConfig.model_validate_json(sys.stdin.buffer.read())
    from kubeinfer.runtime.cli import event_loop_factory

    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(serve(cfg, args.ipc, args.index))


if __name__ == "__main__":
    sys.exit(main())
