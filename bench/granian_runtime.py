"""The runtime's own ASGI app served by granian, for ``bench/frontend_bench.py --granian-runtime``.

``granian --interface asgi --factory granian_runtime:app`` (granian's venv, ``--working-dir bench/``)
builds, in its worker process, the same ``RuntimeServer`` that ``kubeinfer-runtime serve`` builds from
the config file named by ``KUBEINFER_BENCH_RUNTIME_CONFIG`` (one process: ``server.http_workers`` must
be 1): the same data plane, batcher, model load and warmup, REST routes (``RuntimeServer.app``) and
gRPC server, on granian's event loop (uvloop with ``--loop uvloop``). Only the HTTP server differs:
``GranianServed`` starts no uvicorn; granian serves ``RuntimeServer.app``. ASGI lifespan: startup is
``RuntimeServer.start`` and then the wait for readiness (the model loaded and warmed), so granian
answers its first request ready; shutdown is ``stop`` (the drain) and ``wait``.

What the runtime does through uvicorn and does not do here (a benchmark of the request path, not a
server to deploy): ``wire.TimedHttpProtocol``'s header and body read timeouts, ``wire.Acceptor``
(accepting when out of file descriptors), ``UvicornServer``'s signal handling (granian's worker
handles SIGTERM: lifespan shutdown), and the graceful close of idle keep-alive connections at
shutdown. Whether ``rest.DisconnectWatch`` sees a client leave depends on granian's ASGI ``receive``
after the body (uvicorn's blocks until the connection is lost).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any

from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.server import RuntimeServer

log = logging.getLogger("granian_runtime")
#: The runtime.yaml the worker serves (written by the bench).
CONFIG_ENV = "KUBEINFER_BENCH_RUNTIME_CONFIG"
#: Seconds ``lifespan.startup`` waits for readiness (load and warmup of the tiny model: a few seconds).
READY_TIMEOUT_SECONDS = 300.0


class GranianServed(RuntimeServer):
    """``RuntimeServer`` whose HTTP granian serves: ``start`` starts no uvicorn (its serving task waits
    until the HTTP side is closed); everything else is ``RuntimeServer``'s."""

    _closed: asyncio.Event | None = None

    def _start_uvicorn(self) -> Coroutine[Any, Any, None]:
        if self.cfg.server.http_workers != 1:
            raise ValueError("granian_runtime serves one process: server.http_workers must be 1")
        self._closed = asyncio.Event()
        return self._closed.wait()

    def _close_http(self, force: bool = False) -> None:
        if self._closed is not None:
            self._closed.set()
        super()._close_http(force)


def app() -> Callable[..., Coroutine[Any, Any, None]]:
    """granian's ASGI factory: the runtime of ``$KUBEINFER_BENCH_RUNTIME_CONFIG`` (``RuntimeConfig.load``).
    Raises ``KeyError`` when the variable is unset, what ``RuntimeConfig.load`` raises for a bad file."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    server = GranianServed(RuntimeConfig.load(os.environ[CONFIG_ENV]))
    inner = server.app

    async def lifespan(receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await server.start()
                deadline = asyncio.get_running_loop().time() + READY_TIMEOUT_SECONDS
                while not server.ready and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.05)
                if not server.ready:
                    await send({"type": "lifespan.startup.failed", "message": "the model did not get ready"})
                    return
                log.info("ready under granian")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                server.stop()
                code = await server.wait()
                log.info("runtime exited with %d", code)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
        else:
            await inner(scope, receive, send)

    return asgi
