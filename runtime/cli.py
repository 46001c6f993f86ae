"""``kubeinfer-runtime``: the runtime's command line.

``kubeinfer-runtime serve [--config PATH] [--model SRC] [--quantization Q] [--max-batch-size N]
[--max-queue-delay SECONDS] [--port P] [--grpc-port P] [--host H] [--device auto|cpu|cuda] [--executors N]``

Flags override the file (also on every hot reload of the file's ``batching`` section). Without a model
source the bundled all-MiniLM-L6-v2 is served. The process listens at once (``/v2/health/live`` is 200,
``/v2/health/ready`` 503), loads and warms up the model in a thread, then turns ready. It logs
``listening on http://HOST:PORT`` (the real port, also with ``--port 0``), ``grpc listening on HOST:PORT``
(the Open Inference Protocol's gRPC service, ``kubeinfer.runtime.grpc_server``) and ``ready``.

SIGTERM/SIGINT: readiness turns false; after ``server.shutdown_delay_seconds`` (default 0; set it to a few
seconds in a cluster so that endpoints stop routing here before requests are refused) new infer requests
get 503, queued and running requests finish (at most ``server.drain_timeout_seconds``), then the HTTP
server closes and the process exits 0. A second signal exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, TypeVar

import uvicorn
from kubeinfer.runtime.batching import BatchSettings
from kubeinfer.runtime.config import DEFAULT_CONFIG_PATH, BatchingConfig, RuntimeConfig
from kubeinfer.runtime.reload import ConfigWatcher
from kubeinfer.runtime.server import RuntimeServer

log = logging.getLogger("kubeinfer.runtime")
T = TypeVar("T")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (``serve`` sub-command)."""
    parser = argparse.ArgumentParser(
        prog="kubeinfer-runtime", description="kubeinfer's batching model server"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over the Open Inference Protocol (KServe v2)")
    serve.add_argument(
        "--config",
        help=f"runtime.yaml (RuntimeConfig); watched for batching changes (in a pod: {DEFAULT_CONFIG_PATH})",
    )
    serve.add_argument("--model", help="model source: 'default' (bundled MiniLM), a directory or a file")
    serve.add_argument("--quantization", choices=["none", "fp16", "bf16", "int8-dynamic", "int8-static"])
    serve.add_argument("--max-batch-size", type=int, help="rows per batch")
    serve.add_argument("--max-queue-delay", type=float, help="seconds the oldest request may wait")
    serve.add_argument("--port", type=int, help="TCP port (0 = any free port)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port (0 = any free port); default 8081")
    serve.add_argument("--host", help="bind address")
    serve.add_argument("--device", choices=["auto", "cpu", "cuda"])
    serve.add_argument("--executors", type=int, help="executor threads (model instances)")
    serve.add_argument("--log-level", default=os.environ.get("KUBEINFER_LOG_LEVEL", "INFO"))
    return parser


def overrides_from(args: argparse.Namespace) -> Callable[[RuntimeConfig], RuntimeConfig]:
    """A function applying the command-line flags to a config (validated again: bad values raise
    ``pydantic.ValidationError`` naming the field)."""

    def apply(cfg: RuntimeConfig) -> RuntimeConfig:
        data = cfg.model_dump()
        if args.model is not None:
            data["model"]["source"] = args.model
        if args.quantization is not None:
            data["quantization"]["mode"] = args.quantization
        if args.max_batch_size is not None:
            data["batching"]["max_batch_size"] = args.max_batch_size
        if args.max_queue_delay is not None:
            data["batching"]["max_queue_delay_seconds"] = args.max_queue_delay
        if args.port is not None:
            data["server"]["port"] = args.port
        if args.grpc_port is not None:
            data["server"]["grpc_port"] = args.grpc_port
        if args.host is not None:
            data["server"]["host"] = args.host
        if args.device is not None:
            data["device"] = args.device
        if args.executors is not None:
            data["executors"] = args.executors
        return RuntimeConfig.model_validate(data)

    return apply


def load_config(args: argparse.Namespace) -> RuntimeConfig:
    """The file (or the defaults without ``--config``) with the flags applied."""
    base = RuntimeConfig.load(args.config) if args.config else RuntimeConfig()
    return overrides_from(args)(base)


async def in_daemon_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` in a daemon thread and await its result.

    Unlike ``asyncio.to_thread`` (the default executor, joined by ``asyncio.run`` at exit), a signal
    during a long model load does not wait for the load to finish before the process exits."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # the awaiting task was cancelled
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        error: BaseException | None = None
        result: Any = None
        try:
            result = fn(*args)
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="kubeinfer-load", daemon=True).start()
    return await future


class _Uvicorn(uvicorn.Server):
    """uvicorn's server with kubeinfer's shutdown: the first signal drains the batcher before uvicorn
    closes (uvicorn's own handler would close the listener at once and re-raise the signal, so the
    process would not exit 0)."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_signal = on_signal
        self._signalled = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._signalled:
            log.warning("second signal %s: exiting without waiting", sig)
            self.should_exit = True
            self.force_exit = True
            return
        self._signalled = True
        log.info("signal %s: draining (not ready, new requests 503)", sig)
        self._on_signal()


async def serve(cfg: RuntimeConfig, args: argparse.Namespace) -> int:
    """Run the server until a signal; returns the exit status."""
    server = RuntimeServer(cfg)
    sock = socket.socket(socket.AF_INET6 if ":" in cfg.server.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit TCP_NODELAY (Linux): uvicorn writes a response's head and body in two
    # writes, and with Nagle the body waits for the client's delayed ACK (~40 ms per response).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((cfg.server.host, cfg.server.port))
    sock.listen(2048)
    sock.setblocking(False)
    host, port = sock.getsockname()[:2]
    loop = asyncio.get_running_loop()
    failed: list[BaseException] = []
    uv: _Uvicorn

    async def drain_then_exit() -> None:
        server.announce_shutdown()
        if cfg.server.shutdown_delay_seconds > 0:
            log.info("not ready; serving %.1f s more before draining", cfg.server.shutdown_delay_seconds)
            await asyncio.sleep(cfg.server.shutdown_delay_seconds)
        t0 = time.monotonic()
        complete = await server.drain(cfg.server.drain_timeout_seconds)
        log.info(
            "drained in %.2f s%s; closing",
            time.monotonic() - t0,
            "" if complete else f" (timeout {cfg.server.drain_timeout_seconds} s: requests still pending)",
        )
        uv.should_exit = True

    drain_tasks: list[asyncio.Task[None]] = []

    def on_signal() -> None:
        loop.call_soon_threadsafe(lambda: drain_tasks.append(loop.create_task(drain_then_exit())))

    uv_config = uvicorn.Config(
        server.app,
        lifespan="off",
        log_level=logging.WARNING,
        access_log=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=30,
    )
    uv = _Uvicorn(uv_config, on_signal)

    async def load() -> None:
        from kubeinfer.runtime.models import load_model

        try:
            t0 = time.monotonic()
            log.info(
                "loading model %r from %r (quantization %s)",
                cfg.model.name,
                cfg.model.source,
                cfg.quantization.mode,
            )
            model = await in_daemon_thread(load_model, cfg)
            log.info("model loaded in %.1f s on %s", time.monotonic() - t0, model.device)
            if cfg.warmup.enabled:
                log.info(
                    "warming up: batch sizes 1..%d, %d step(s)", cfg.batching.max_batch_size, cfg.warmup.steps
                )
                seconds = await in_daemon_thread(model.warmup, cfg.batching.max_batch_size, cfg.warmup.steps)
                log.info("warmup done in %.1f s", seconds)
            else:
                model.max_batch_size = cfg.batching.max_batch_size
            server.metrics.set_report(model.report())
            try:
                server.metrics.use_device(model.device)
            except Exception as exc:
                log.warning("NVML unavailable (%s); device utilization is executor busy time", exc)
            if server.draining:
                return
            try:
                server.attach(model, BatchSettings.from_config(latest[0]))
            except ValueError as exc:  # a change made during the load that the warmed model cannot take
                log.error("config changed during the load: %s; using the settings it started with", exc)
                server.metrics.config_reload_errors.inc()
                server.attach(model, BatchSettings.from_config(cfg.batching))
            log.info(
                "ready: serving model %r at http://%s:%d/v2/models/%s", model.name, host, port, model.name
            )
        except asyncio.CancelledError:  # shutting down during the load
            raise
        except BaseException as exc:
            log.exception("model load failed; exiting")
            failed.append(exc)
            uv.should_exit = True
            uv.force_exit = True

    latest: list[BatchingConfig] = [cfg.batching]  # the file's batching section, also while loading

    def apply_batching(batching: BatchingConfig) -> None:
        if server.batcher is None:  # still loading: applied when the model is ready
            latest[0] = batching
            return
        server.batcher.update_settings(BatchSettings.from_config(batching))
        latest[0] = batching

    tasks = [loop.create_task(load())]
    if args.config:
        watcher = ConfigWatcher(
            args.config,
            cfg,
            apply_batching,
            overrides=overrides_from(args),
            on_error=lambda msg: server.metrics.config_reload_errors.inc(),
        )
        tasks.append(loop.create_task(watcher.run()))
    from kubeinfer.runtime.grpc_server import create_grpc_server

    grpc_server, grpc_port = create_grpc_server(server, cfg.server.host, cfg.server.grpc_port)
    await grpc_server.start()
    log.info("grpc listening on %s:%d", host, grpc_port)
    log.info("listening on http://%s:%d", host, port)
    try:
        await uv.serve(sockets=[sock])
    finally:
        await grpc_server.stop(grace=1.0)
        for task in tasks + drain_tasks:
            task.cancel()
        for task in tasks + drain_tasks:
            with contextlib.suppress(BaseException):
                await task
        server.close()
    if failed:
        return 1
    log.info("exited cleanly")
    return 0


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (a dependency; libuv's loop costs the serving path
    less CPU per request than asyncio's, and the event loop shares the cores with torch), else
    ``None`` (asyncio's default loop)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        cfg = load_config(args)
    except Exception as exc:
        log.error("invalid configuration: %s", exc)
        return 2
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        code = runner.run(serve(cfg, args))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return code


if __name__ == "__main__":
    sys.exit(main())
