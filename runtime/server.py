"""The model process's life cycle: ``RuntimeServer`` loads the model, serves it through its transports,
re-reads the batching settings, and drains on SIGTERM.

What a request goes through is the data plane's (``kubeinfer.runtime.dataplane``); the transports are
adapters over it: REST (``kubeinfer.runtime.rest``) served by uvicorn in this process, or, with
``server.http_workers`` > 1, by that many front-end processes (``kubeinfer.runtime.frontend``) that share
the port and send decoded tensors here over ZeroMQ (``kubeinfer.runtime.ipc``;
``kubeinfer.runtime.frontend_pool`` starts, supervises and answers them); gRPC
(``kubeinfer.runtime.grpc_server``) on its own port, in this process or, with front ends, in each of
them. The model, the batcher, the config
watcher and the drain stay in this process.

A model process of the model repository mode (``ipc_address``: its parent serves HTTP and gRPC) imports
no transport: ``rest``, ``openai_api`` (uvicorn, starlette) and ``grpc_server`` (grpc) are imported
where they are started, and the model's engine by its format's loader (``kubeinfer.runtime.models``),
so that a process costs the memory of what it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from kubeinfer.runtime.batching import Batcher, BatchSettings
from kubeinfer.runtime.config import BatchingConfig, RuntimeConfig
from kubeinfer.runtime.dataplane import DataPlane
from kubeinfer.runtime.fetch import FetchReport, read_report
from kubeinfer.runtime.fetch.progress import megabytes
from kubeinfer.runtime.frontend_pool import DRAIN_LINGER_SECONDS, FrontEndPool
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models import REPORT_WARMUP_SECONDS, ServableModel, load_model
from kubeinfer.runtime.models.base import WarmupPass, first_request_passes, run_warmup
from kubeinfer.runtime.process import freeze_heap
from kubeinfer.runtime.reload import ConfigWatcher
from kubeinfer.runtime.service_time import calibrate_model
from kubeinfer.runtime.startup import (
    STAGE_FETCHED,
    STAGE_LOADED,
    STAGE_WARMED,
    WarmupStopped,
    wait_quiet,
)
from kubeinfer.runtime.termination import write_termination_message

if TYPE_CHECKING:
    from kubeinfer.runtime.rest import RestApp, UvicornServer

log = logging.getLogger(__name__)
T = TypeVar("T")


def startup_summary(report: dict[str, float], fetched: FetchReport | None) -> str:
    """Where the time to ready went, one line: ``fetch 4.1 s (87.2 MB, 3 files), load 2.0 s, warmup
    6.0 s`` (the fetch only when the init container reported one; ``report``: the model's ``report()``)."""
    parts = []
    if fetched is not None:
        files = f"{fetched.files} file{'' if fetched.files == 1 else 's'}"
        parts.append(f"fetch {fetched.seconds:.1f} s ({megabytes(fetched.bytes)}, {files})")
    for key, name in (("model_load_seconds", "load"), ("warmup_seconds", "warmup")):
        if key in report:
            parts.append(f"{name} {report[key]:.1f} s")
    return ", ".join(parts) or "no figures"


class RuntimeServer:
    """The runtime: its state (model, batcher, readiness), its ASGI app (``self.app``) and its life cycle.

    Life cycle, as ``kubeinfer-runtime serve`` drives it (the shape of kserve's ``ModelServer``)::

        server = RuntimeServer(cfg, config_path=path, overrides=flags)
        await server.start()        # listening (live 200, ready 503); the model loads in the background
        code = await server.wait()  # until stopped; 0 after a drain, 1 if the model failed to load

    ``start`` binds the port, starts the HTTP server, the model load (load, warmup, ``attach``: ready)
    and the config-file watcher (``apply_batching`` on every change). ``stop`` is the SIGTERM/SIGINT
    handler: readiness false; after ``server.shutdown_delay_seconds`` new infer requests get 503 and
    queued and running requests finish (``drain``, at most ``server.drain_timeout_seconds``); then
    the HTTP server closes. A second signal exits at once.

    With ``server.http_workers`` > 1, ``start`` starts the front-end processes instead of uvicorn
    (``FrontEndPool``) and installs the signal handlers itself; ``stop`` drains, then stops them.

    Tests drive the parts directly: ``RuntimeServer(cfg)`` -> ``attach(model)`` -> ``drain()``.

    Args:
        cfg: the configuration in force (file plus command-line flags).
        metrics: the metrics (default: a new ``RuntimeMetrics`` in its own registry).
        config_path: the config file to watch for ``batching`` changes, or None.
        overrides: re-applies the command-line flags to a re-read config file.
        ipc_address: serve no HTTP or gRPC port, only the IPC endpoint at this ZeroMQ address (a model
            process of the model repository mode, ``kubeinfer.runtime.repository``, whose parent serves
            the ports and reaches this process as a front end does).
        freeze_after_load: the process is this server's alone (``kubeinfer-runtime serve`` and
            ``model-process`` pass True): once the model is loaded and warmed up, before ready, the
            objects alive are frozen out of garbage collection (``freeze_heap``). Off for a server in
            a process shared with other work (the tests'), whose objects it would freeze too.
    """

    def __init__(
        self,
        cfg: RuntimeConfig,
        metrics: RuntimeMetrics | None = None,
        *,
        config_path: str | None = None,
        overrides: Callable[[RuntimeConfig], RuntimeConfig] = lambda c: c,
        ipc_address: str | None = None,
        freeze_after_load: bool = False,
    ) -> None:
        self.cfg = cfg
        self._ipc_address = ipc_address
        self._freeze_after_load = freeze_after_load
        self.model_name = cfg.model.name
        self.metrics = metrics if metrics is not None else RuntimeMetrics(cfg.model.name, cfg.instances)
        #: What every transport calls: admission, validation, the batcher, metrics, errors.
        self.plane = DataPlane(cfg.model.name, self.metrics, cfg.instances, cfg.cache)
        #: The REST routes (``RestApp``); None in a model process of the repository mode (IPC only).
        self.rest: RestApp | None = None if ipc_address else rest_app(self.plane, cfg)
        self.host = cfg.server.host
        self.port = cfg.server.port
        self._config_path = config_path
        self._overrides = overrides
        self._batching = cfg.batching  # the file's batching section, also while the model loads
        self._uvicorn: UvicornServer | None = None
        self._serving: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._failed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._grpc: Any = None
        self._pool: FrontEndPool | None = None
        self._signalled = False
        #: The warmup passes left for after readiness (``_warm_first``, ``_warm_rest``).
        self._warm_later: list[WarmupPass] = []

    @property
    def app(self) -> Callable[..., Any]:
        """The ASGI app uvicorn serves (``RestApp.app``). Raises ``RuntimeError`` in a model process of
        the repository mode (``ipc_address``), which serves no HTTP."""
        if self.rest is None:
            raise RuntimeError("a model process serving only its IPC endpoint has no HTTP app")
        return self.rest.app

    # ----- life cycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen on ``server.host:port`` (``self.port`` is the real port, also for port 0), start the
        HTTP server, the gRPC server, the model load and, with ``config_path``, the config-file watcher.
        """
        loop = self._loop = asyncio.get_running_loop()
        if self.cfg.server.http_workers > 1 or self._ipc_address:
            serving = await self._start_frontends(loop)
        else:
            serving = self._start_uvicorn()
        self._tasks.append(loop.create_task(self._load()))
        if self._config_path:
            watcher = ConfigWatcher(
                self._config_path,
                self.cfg,
                self.apply_batching,
                overrides=self._overrides,
                on_error=lambda msg: self.metrics.config_reload_errors.inc(),
            )
            self._tasks.append(loop.create_task(watcher.run()))
        server = self.cfg.server
        if self._pool is not None:  # the front ends serve gRPC too
            grpc_port = self._pool.grpc_port
        else:
            from kubeinfer.runtime.grpc_server import create_grpc_server

            assert self.rest is not None  # only a model process (IPC) has none, and it has a pool
            self._grpc, grpc_port = create_grpc_server(
                self.plane,
                server.host,
                server.grpc_port,
                self.cfg.limits,
                self.rest.auth,
                handshake_timeout=server.header_timeout_seconds,
            )
            await self._grpc.start()
        if self._ipc_address:
            log.info("model process: serving %s", self._ipc_address)
        else:
            log.info("grpc listening on %s:%d", self.host, grpc_port)
            log.info("listening on http://%s:%d", self.host, self.port)
        self._serving = loop.create_task(serving)

    def _start_uvicorn(self) -> Coroutine[Any, Any, None]:
        """One process: uvicorn serves ``self.app`` here (``server.http_workers`` 1)."""
        from kubeinfer.runtime.rest import UvicornServer, listen_socket, uvicorn_config

        sock = listen_socket(self.cfg.server.host, self.cfg.server.port)
        self.host, self.port = sock.getsockname()[:2]
        self._uvicorn = UvicornServer(
            uvicorn_config(self.app, graceful_seconds=5, server=self.cfg.server), on_signal=self.stop
        )
        return self._uvicorn.serve(sockets=[sock])

    async def _start_frontends(self, loop: asyncio.AbstractEventLoop) -> Coroutine[Any, Any, None]:
        """``server.http_workers`` > 1: front-end processes serve HTTP (``kubeinfer.runtime.frontend_pool``);
        this process handles SIGTERM/SIGINT itself (as ``UvicornServer.handle_exit`` does)."""
        workers = 0 if self._ipc_address else self.cfg.server.http_workers
        pool = self._pool = FrontEndPool(self.plane, self.cfg, workers, self._ipc_address)
        self.port = await pool.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        return self._until_frontends_stopped(pool)

    @staticmethod
    async def _until_frontends_stopped(pool: FrontEndPool) -> None:
        await pool.done.wait()

    def _on_signal(self, sig: int) -> None:
        if self._signalled:
            log.warning("second signal %s: exiting without waiting", sig)
            self._close_http(force=True)
            return
        self._signalled = True
        log.info("signal %s: draining (not ready, new requests 503)", sig)
        self.stop()

    def _close_http(self, force: bool = False) -> None:
        """Close the HTTP side: uvicorn (one process) or the front-end processes (after the drain)."""
        if self._pool is not None:
            if force:
                self._pool.kill()
            else:
                stopping = self._pool.stop(linger=DRAIN_LINGER_SECONDS)
                self._tasks.append(asyncio.get_running_loop().create_task(stopping))
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            self._uvicorn.force_exit = force

    async def wait(self) -> int:
        """Wait until the HTTP server closed (after ``stop``, or a failed model load), then stop the
        background tasks and the batcher. Returns the exit status: 0, or 1 if the model failed to load.
        """
        assert self._serving is not None, "start() first"
        try:
            await self._serving
        finally:
            if self._grpc is not None:
                await self._grpc.stop(grace=1.0)
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(BaseException):
                    await task
            self.close()
        if self._failed:
            return 1
        log.info("exited cleanly")
        return 0

    def stop(self) -> None:
        """Shut down (the SIGTERM/SIGINT handler; safe to call from a signal handler or another thread):
        readiness turns false at once; after ``server.shutdown_delay_seconds`` the server drains and
        closes. Raises ``RuntimeError`` before ``start``."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("RuntimeServer.stop() before start()")
        loop.call_soon_threadsafe(lambda: self._tasks.append(loop.create_task(self._drain_then_exit())))

    async def _drain_then_exit(self) -> None:
        server = self.cfg.server
        self.announce_shutdown()
        if server.shutdown_delay_seconds > 0:
            log.info("not ready; serving %.1f s more before draining", server.shutdown_delay_seconds)
            await asyncio.sleep(server.shutdown_delay_seconds)
        t0 = time.monotonic()
        complete = await self.drain(server.drain_timeout_seconds)
        log.info(
            "drained in %.2f s%s; closing",
            time.monotonic() - t0,
            "" if complete else f" (timeout {server.drain_timeout_seconds} s: requests still pending)",
        )
        self._close_http()

    async def _load(self) -> None:
        """Load and warm up the model in daemon threads, then ``attach`` it (ready), then warm up the
        rest in the background (``_warm_rest``); on failure exit 1."""
        try:
            model = await self._load_model()
            if self.draining:
                return
            frozen = freeze_heap() if self._freeze_after_load else 0
            try:
                self.attach(model, BatchSettings.from_config(self._batching))
            except ValueError as exc:  # a change made during the load that the warmed model cannot take
                log.error("config changed during the load: %s; using the settings it started with", exc)
                self.metrics.config_reload_errors.inc()
                self.attach(model, BatchSettings.from_config(self.cfg.batching))
            cold = self.metrics.cold_start
            cold.mark(STAGE_WARMED)
            log.info(
                "ready: serving model %r at http://%s:%d/v2/models/%s; cold start: %s since the process "
                "started%s",
                model.name,
                self.host,
                self.port,
                model.name,
                cold.summary(),
                f"; {frozen} objects of the load frozen out of garbage collection" if frozen else "",
            )
        except asyncio.CancelledError:  # shutting down during the load
            raise
        except BaseException as exc:
            log.exception("model load failed; exiting")
            write_termination_message(f"model load failed: {type(exc).__name__}: {exc}")
            self._failed = True
            self._close_http(force=True)
            return
        if self._warm_later:
            await self._warm_rest(self._warm_later)

    def _fetch_report(self) -> FetchReport | None:
        """The fetch init container's report in the model directory (exported as gauges), or None."""
        try:
            report = read_report(self.cfg.model.source)
        except ValueError as exc:
            log.warning("%s; no fetch figures", exc)
            return None
        if report is not None:
            self.metrics.set_fetch(report.seconds, report.bytes)
            log.info(
                "model fetched by the init container: %d file(s), %s in %.1f s from %s",
                report.files,
                megabytes(report.bytes),
                report.seconds,
                report.source,
            )
        return report

    async def _load_model(self) -> ServableModel:
        cfg = self.cfg
        fetched = self._fetch_report()
        cold = self.metrics.cold_start
        cold.mark(STAGE_FETCHED)
        t0 = time.monotonic()
        log.info(
            "loading model %r from %r (quantization %s)",
            cfg.model.name,
            cfg.model.source,
            cfg.quantization.mode,
        )
        model = await in_daemon_thread(load_model, cfg)
        cold.graph_cache(model.graph_cache)
        cold.mark(STAGE_LOADED)
        log.info("model loaded in %.1f s on %s", time.monotonic() - t0, model.device)
        report = model.report()
        if cfg.warmup.enabled:
            report[REPORT_WARMUP_SECONDS] = await self._warm_first(model)
        else:
            model.max_batch_size = cfg.batching.max_batch_size
        self.metrics.set_report(report, model.measured_on)
        log.info("startup: %s", startup_summary(report, fetched))
        try:
            self.metrics.use_device(model.device)
        except Exception as exc:
            log.warning("NVML unavailable (%s); device utilization is executor busy time", exc)
        return model

    async def _warm_first(self, model: ServableModel) -> float:
        """The warmup before readiness, then the service-time calibration (``calibrate_model``); returns
        the warmup's seconds. ``warmup.before_ready`` first (unset): the passes of one row
        (``first_request_passes``), the others kept in ``_warm_later`` for after; all, or a model that
        does not list its passes: the whole warmup."""
        cfg = self.cfg
        size, steps = cfg.batching.max_batch_size, cfg.warmup.steps
        passes: list[WarmupPass] | None = None
        if cfg.warmup.before_ready != "all":
            try:
                passes = model.warmup_passes(size)
            except NotImplementedError:
                passes = None
        if passes is None:
            log.info("warming up: batch sizes 1..%d, %d step(s)", size, steps)
            seconds = await in_daemon_thread(model.warmup, size, steps)
            log.info("warmup done in %.1f s", seconds)
            await in_daemon_thread(calibrate_model, model, size, self.metrics.service_time)
            return seconds
        first, self._warm_later = first_request_passes(passes)
        seconds = await in_daemon_thread(run_warmup, first, steps)
        model.max_batch_size = size
        # the service-time fit is exported from the moment the replica is ready (the autoscaler reads it)
        await in_daemon_thread(calibrate_model, model, size, self.metrics.service_time)
        log.info(
            "warmup of what a first request needs done in %.2f s: batches of one row at %s, %d step(s); "
            "%d larger batch(es) up to %d rows after ready, while no request is in flight",
            seconds,
            "every size" if len(first) > 1 else "one size",
            steps,
            len(self._warm_later),
            size,
        )
        return seconds

    async def _warm_rest(self, passes: list[WarmupPass]) -> None:
        """After readiness, in a daemon thread: the rest of the warmup, each pass once no request has
        been in flight for ``WARMUP_QUIET_SECONDS``. Stops at the drain; a pass the model refuses is
        logged, and ends it."""
        plane = self.plane

        def gate() -> None:
            wait_quiet(lambda: plane.in_flight > 0, lambda: plane.closing)

        try:
            seconds = await in_daemon_thread(run_warmup, passes, self.cfg.warmup.steps, gate)
        except WarmupStopped:
            log.info("background warmup stopped: the runtime is shutting down")
        except Exception as exc:
            log.warning("background warmup stopped: %s: %s", type(exc).__name__, exc)
        else:
            log.info("background warmup done: %d batch(es) in %.1f s, waits included", len(passes), seconds)
        finally:
            self._warm_later = []

    def apply_batching(self, batching: BatchingConfig) -> None:
        """Apply a changed ``batching`` section (the config watcher's callback); while the model loads,
        keep it for ``attach``. Raises ``ValueError`` (settings unchanged) for one the batcher refuses."""
        if self.plane.batcher is not None:
            self.plane.batcher.update_settings(BatchSettings.from_config(batching))
        self._batching = batching

    # ----- state: the data plane's ------------------------------------------------------------------
    @property
    def model(self) -> ServableModel | None:
        """The served model once loaded (``DataPlane.model``)."""
        return self.plane.model

    @property
    def batcher(self) -> Batcher | None:
        """The model's batcher once attached (``DataPlane.batcher``)."""
        return self.plane.batcher

    @property
    def draining(self) -> bool:
        """True once the drain began (new infer requests get 503)."""
        return self.plane.draining

    @property
    def ready(self) -> bool:
        """Model loaded and warmed up, and not shutting down."""
        return self.plane.ready

    def announce_shutdown(self) -> None:
        """Readiness turns false; infer requests are still served (until ``drain``)."""
        self.plane.announce_shutdown()

    def attach(self, model: ServableModel, settings: BatchSettings | None = None) -> None:
        """Serve ``model`` (loaded and warmed up): start the batcher on the running loop; ready."""
        self.plane.attach(model, settings or BatchSettings.from_config(self.cfg.batching))

    async def drain(self, timeout: float | None = None) -> bool:
        """Not ready; new infer requests get 503; wait for queued and running requests (``timeout``
        seconds at most). Returns False if requests were still pending at the timeout."""
        return await self.plane.drain(timeout)

    def close(self) -> None:
        """Stop the batcher's threads."""
        self.plane.close()


def rest_app(plane: DataPlane, cfg: RuntimeConfig) -> RestApp:
    """The REST routes of ``plane`` (the Open Inference Protocol's and the OpenAI-compatible ones).
    Imported here, not at the module's top: a model process of the repository mode serves no HTTP and
    so imports no uvicorn or starlette."""
    from kubeinfer.runtime.openai_api import OpenAIRoutes
    from kubeinfer.runtime.rest import RestApp

    return RestApp(plane, cfg, OpenAIRoutes(plane, cfg).routes)


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
