"""The model repository mode: one runtime serves every model of a directory, each loaded model in its
own OS process, loaded on its first request and evicted least recently used under a memory budget.

Layout (Triton's model repository, one file per model instead of ``config.pbtxt``), two forms side by
side in one directory::

    <repository.path>/
      <model>/runtime.yaml    # RuntimeConfig (kubeinfer.runtime.config), its model.source relative
      <model>/...             # to this directory; the directory's name is the model's name
      <model>.yaml            # flat: RuntimeConfig, its model.source relative to <repository.path>;
                              # the file's name without .yaml is the model's name

The flat form is a ModelPool's ConfigMap mounted whole (``kubeinfer.contract.pool``): a name starting
with ``.`` is never a model (the kubelet's ``..data`` link and timestamped directories), and a model
with both forms is its directory's. A model appearing later (a file the kubelet added) is found by the
next scan: on a request for a model not known yet, and on every repository index.

``ModelRepository`` is the data plane the transports (REST, gRPC) call in this mode (``dataplane.Plane``)
and the repository extension's (``dataplane.Repository``):

- **A process per model.** A load starts ``python -m kubeinfer.runtime.cli model-process`` with the
  model's configuration on stdin: a ``RuntimeServer`` that serves no port, only its IPC endpoint
  (``ipc.ModelEndpoint``), which this process reaches as an HTTP front end reaches its model process
  (``frontend.RemotePlane`` over ``ipc.ModelClient``). Unloading stops the process, so its memory (the
  framework's caches included) goes back to the system. The process dies with this one (it sets
  ``PR_SET_PDEATHSIG`` itself: a ``preexec_fn`` would fork under gRPC's threads).
- **Loaded on demand.** A request for a model that is not loaded is held (``kubeinfer.shared.hold``:
  bounded per model by ``repository.max_held_requests``/``max_held_bytes``, 503 beyond; each request at
  most ``repository.load_timeout_seconds`` or its own ``timeout``, then 504) and asks for the load. One
  load at a time per model (concurrent first requests share it), at most
  ``repository.max_parallel_loads`` at once. A load that fails fails the model's held requests with
  503 ``model 'NAME' failed to load: CAUSE`` (the model process's own sentence); for
  ``repository.failed_load_backoff_seconds`` after it, its requests get that answer at once; other
  models are unaffected.
- **Evicted least recently used** (``kubeinfer.runtime.residency``): each model's resident bytes are the
  RSS of its process after load and warmup (``/proc/PID/status``). Before a load (room for it and the
  other loads under way, each at its expected size: its size from its previous load, else the largest
  size measured so far, ``residency.expected_bytes``) and after it, the least recently used loaded
  models are unloaded until the total is within ``repository.memory_budget_bytes``. Pinned models
  (``repository.pinned``, loaded at start) and models with requests in flight are never evicted: when
  they alone fill the budget the runtime runs over it (logged) and evicts again whenever a request ends
  while it is over.
- **Explicit control**: ``repository_load``/``repository_unload`` (Triton's repository extension);
  an unload lets the requests in flight finish first; a request after it loads the model again.

A model process that exits on its own (killed by the kernel's OOM killer) is marked UNAVAILABLE with its
exit code; its next request loads it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from kubeinfer.runtime import ipc
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.dataplane import MODEL_VERSION, Decoder, InferCall
from kubeinfer.runtime.errors import HTTPError, InferenceError
from kubeinfer.runtime.frontend import RemotePlane
from kubeinfer.runtime.grpc_server import create_grpc_server
from kubeinfer.runtime.metrics import merge_expositions
from kubeinfer.runtime.residency import Resident, expected_bytes, plan_evictions
from kubeinfer.runtime.rest import RestApp, UvicornServer, listen_socket, uvicorn_config
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kubeinfer.contract.pool import (
    INDEX_EVICTIONS,
    INDEX_LAST_USED,
    INDEX_LOAD_ERROR,
    INDEX_LOAD_FAILURES,
    INDEX_LOADS,
    INDEX_RESIDENT_BYTES,
    model_of_file,
)
from kubeinfer.shared.hold import Hold, HoldError, HoldLimits, HoldTimeout, Overflow, retry_after_header
from kubeinfer.shared.hold import seconds_from_us as seconds_from_us

log = logging.getLogger(__name__)

#: The file of a model directory that makes it a model (``RuntimeConfig``).
CONFIG_FILE = "runtime.yaml"
#: Triton's repository index states.
READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
#: Seconds between two looks at a loading model process (and at the loaded ones: did one exit?).
POLL_SECONDS = 0.1
#: Seconds an unloaded model process has to exit after SIGTERM before SIGKILL.
STOP_TIMEOUT_SECONDS = 10.0


class LoadError(Exception):
    """A model that could not be loaded; the message is the cause (one line, no traceback)."""


def resident_bytes(pid: int) -> int:
    """The resident set size of process ``pid`` in bytes (``VmRSS`` of ``/proc/PID/status``); 0 when the
    process is gone or the field is missing."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def one_line(text: str) -> str:
    """``text`` with every run of whitespace one space (a pydantic error spans lines)."""
    return " ".join(text.split())


def model_config(path: Path, name: str) -> RuntimeConfig:
    """The configuration of the model ``name`` in the file ``path`` (``<dir>/<name>/runtime.yaml``, or
    ``<dir>/<name>.yaml`` in the flat layout): a relative ``model.source`` resolved against the file's
    directory, no port of its own and no shutdown delay. Raises ``LoadError`` naming the file and the
    field."""
    directory = path.parent
    try:
        cfg = RuntimeConfig.load(path)
    except OSError as exc:
        raise LoadError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # pydantic.ValidationError is one
        raise LoadError(f"{path}: {one_line(str(exc))}") from None
    if "name" in cfg.model.model_fields_set and cfg.model.name != name:
        what = "directory's" if path.name == CONFIG_FILE and directory.name == name else "file's"
        raise LoadError(f"{path}: model.name {cfg.model.name!r} is not the {what} name {name!r}")
    data = cfg.model_dump()
    data["model"]["name"] = name
    source = data["model"]["source"]
    if source != "default" and "://" not in source and not Path(source).is_absolute():
        data["model"]["source"] = str(directory / source)
    # No port of its own, one front end, and no shutdown delay: the delay keeps a pod serving while its
    # endpoints leave the Services, but nothing routes to a model process once the repository stops it
    # (an unload waits for the requests in flight first), and its memory stays counted until it exits.
    data["server"].update(port=0, grpc_port=0, http_workers=1, shutdown_delay_seconds=0.0)
    data["repository"] = None
    try:
        return RuntimeConfig.model_validate(data)
    except ValueError as exc:
        raise LoadError(f"{path}: {one_line(str(exc))}") from None


class RepositoryMetrics:
    """The repository's metrics, in their own registry (served with the transports' ``/metrics``):
    ``kubeinfer_model_loads_total{model,outcome}``, ``kubeinfer_model_unloads_total{model,reason}``
    (reason ``request``, ``evicted`` or ``exited``), ``kubeinfer_model_evictions_total{model}``,
    ``nv_model_load_duration_secs{model,version}`` (Triton's: the latest load, start of the process to
    ready, warmup included),
    ``kubeinfer_model_resident_bytes{model}`` (0 when not loaded),
    ``kubeinfer_repository_memory_budget_bytes`` and ``kubeinfer_repository_resident_bytes``."""

    def __init__(self, budget: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.loads = Counter("kubeinfer_model_loads", "Model loads", ["model", "outcome"], registry=r)
        self.unloads = Counter("kubeinfer_model_unloads", "Model unloads", ["model", "reason"], registry=r)
        self.evictions = Counter(
            "kubeinfer_model_evictions", "Models unloaded for the memory budget", ["model"], registry=r
        )
        # Triton's name and shape: the latest load's seconds, per model and version
        self.load_seconds = Gauge(
            "nv_model_load_duration_secs", "Model load time in seconds", ["model", "version"], registry=r
        )
        self.resident = Gauge(
            "kubeinfer_model_resident_bytes", "RSS of the model's process after load", ["model"], registry=r
        )
        Gauge(
            "kubeinfer_repository_memory_budget_bytes", "The memory budget of the loaded models", registry=r
        ).set(budget)
        self.total = Gauge(
            "kubeinfer_repository_resident_bytes", "Resident bytes of the loaded models", registry=r
        )


@dataclass(eq=False)
class _Model:
    """One model of the repository and its process, if loaded."""

    name: str
    #: its configuration file (``<name>/runtime.yaml`` or ``<name>.yaml``)
    path: Path
    state: str = UNAVAILABLE
    reason: str = ""
    proc: subprocess.Popen[bytes] | None = None
    client: ipc.ModelClient | None = None
    plane: RemotePlane | None = None
    #: resident bytes measured after its latest load (kept after an unload: the next load's estimate)
    nbytes: int = 0
    last_used: float = 0.0
    #: wall-clock seconds (``time.time``) of its latest request, ``None`` before the first
    used_at: float | None = None
    #: loads that succeeded, loads that failed, unloads for the budget (since this process started)
    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    #: the cause of its latest load when that failed ("" otherwise)
    load_error: str = ""
    #: requests for it now, held or served (a model with any is not evicted)
    in_flight: int = 0
    #: requests past the hold, on its process (an unload waits for them)
    active: int = 0
    failed_at: float | None = None
    loading: asyncio.Task[None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ModelRepository:
    """The models of ``cfg.repository.path`` (see the module's docstring).

    Args:
        cfg: the runtime configuration; its ``repository`` section is required.
        clock: monotonic seconds (``time.monotonic``).
        wall_clock: seconds since the epoch (``time.time``), for the index's ``lastUsed``.

    ``start`` (on the running loop) scans the directory, starts the hold's deadlines and the process
    watcher and loads the pinned models in the background; ``close`` stops every model process.
    Raises ``ValueError`` without a ``repository`` section."""

    model_name = ""

    def __init__(self, cfg: RuntimeConfig, clock: Any = time.monotonic, wall_clock: Any = time.time) -> None:
        if cfg.repository is None:
            raise ValueError("the model repository mode needs the repository section")
        self.cfg = cfg
        self.settings = cfg.repository
        self.root = Path(self.settings.path)
        self.metrics = RepositoryMetrics(self.settings.memory_budget_bytes)
        self._clock = clock
        self._wall_clock = wall_clock
        self._models: dict[str, _Model] = {}
        self._slots = asyncio.Semaphore(self.settings.max_parallel_loads)
        #: models whose load has its slot and has not finished (their expected bytes are reserved)
        self._starting: set[str] = set()
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalancing: asyncio.Task[None] | None = None
        self._workdir = Path(tempfile.mkdtemp(prefix="kubeinfer-repository-"))
        self.hold: Hold[str] = Hold(
            HoldLimits(
                max_requests=self.settings.max_held_requests,
                max_bytes=self.settings.max_held_bytes,
                cold_start_timeout_s=self.settings.load_timeout_seconds,
                default_priority_level=cfg.batching.default_priority_level,
            ),
            ready=lambda name: self._models[name].state == READY,
            demand=lambda name: self._start_load(self._models[name]),
            stage=lambda name: self._models[name].state.lower(),
            clock=clock,
        )

    # ----- life cycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Scan the repository, start the hold's deadlines and the watcher, load the pinned models.
        Raises ``ValueError`` when the directory is missing or a pinned model is not in it."""
        if not self.root.is_dir():
            raise ValueError(f"model repository {self.root} is not a directory")
        self.scan()
        missing = [name for name in self.settings.pinned if name not in self._models]
        if missing:
            raise ValueError(f"pinned models not in {self.root}: {', '.join(missing)}")
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(self.hold.run_deadlines()), loop.create_task(self._watch())]
        for name in self.settings.pinned:
            self._start_load(self._models[name])
        log.info(
            "model repository %s: %d models, pinned: %s", self.root, len(self._models), self.settings.pinned
        )

    def scan(self) -> list[str]:
        """Add the models found since the last scan (a directory with ``runtime.yaml``, then a
        ``<name>.yaml`` file: see the module's docstring); returns every model's name, sorted. A removed
        model stays until it is unloaded (loading it again then fails, naming its missing file)."""
        with contextlib.suppress(OSError):
            entries = sorted(e for e in self.root.iterdir() if not e.name.startswith("."))
            for entry in entries:
                if entry.name not in self._models and (entry / CONFIG_FILE).is_file():
                    self._models[entry.name] = _Model(entry.name, entry / CONFIG_FILE)
            for entry in entries:
                name = model_of_file(entry.name)
                if name is not None and name not in self._models and entry.is_file():
                    self._models[name] = _Model(name, entry)
        return sorted(self._models)

    async def close(self) -> None:
        """Stop the background tasks and every model process (SIGTERM: each drains its requests)."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        for model in self._models.values():
            if model.loading is not None:
                model.loading.cancel()
        await asyncio.gather(*(self._stop_process(m) for m in self._models.values()))
        shutil.rmtree(self._workdir, ignore_errors=True)

    def announce_shutdown(self) -> None:
        """Not ready from now on; responses carry ``Connection: close``."""
        self._closing = True

    async def drain(self, timeout: float) -> bool:
        """Wait until no request is in flight, ``timeout`` seconds at most; True when none is left."""
        deadline = time.monotonic() + timeout
        while any(m.in_flight for m in self._models.values()):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    # ----- loads, unloads, evictions ---------------------------------------------------------------
    def _start_load(self, model: _Model) -> None:
        """Start ``model``'s load unless one is running (the hold's demand: idempotent)."""
        if self._closing or (model.loading is not None and not model.loading.done()):
            return
        model.loading = asyncio.get_running_loop().create_task(self._load(model))

    async def _load(self, model: _Model) -> None:
        async with model.lock:
            if model.state == READY:
                self.hold.notify(model.name)
                return
            model.state, model.reason = LOADING, ""
            async with self._slots:
                # room for this load and the others past their slot, each at its expected size
                self._starting.add(model.name)
                measured = [m.nbytes for m in self._models.values() if m.nbytes]
                incoming = sum(expected_bytes(self._models[n].nbytes, measured) for n in self._starting)
                try:
                    await self._make_room(incoming=incoming, keep=self._starting)
                    t0 = time.monotonic()
                    try:
                        await self._start_process(model)
                    except LoadError as exc:
                        self._load_failed(model, str(exc))
                        return
                    seconds = time.monotonic() - t0
                finally:
                    self._starting.discard(model.name)
            assert model.proc is not None
            model.nbytes = resident_bytes(model.proc.pid)
            model.state, model.failed_at, model.last_used = READY, None, self._clock()
            model.loads, model.load_error = model.loads + 1, ""
            self.metrics.loads.labels(model.name, "success").inc()
            self.metrics.load_seconds.labels(model.name, MODEL_VERSION).set(seconds)
            self.metrics.resident.labels(model.name).set(model.nbytes)
            self._update_total()
            log.info("model %r loaded in %.1f s: %d MiB resident", model.name, seconds, model.nbytes >> 20)
            self.hold.notify(model.name)
        await self._make_room(keep={model.name})

    def _load_failed(self, model: _Model, cause: str) -> None:
        model.state, model.reason, model.failed_at = UNAVAILABLE, f"failed to load: {cause}", self._clock()
        model.load_failures, model.load_error = model.load_failures + 1, cause
        self.metrics.loads.labels(model.name, "failure").inc()
        log.error("model %r failed to load: %s", model.name, cause)
        self.hold.fail(model.name, HoldError(f"model '{model.name}' failed to load: {cause}"))

    async def _start_process(self, model: _Model) -> None:
        """Start ``model``'s process and wait until it is ready. Raises ``LoadError`` (the process's
        termination message, its exit code, or the timeout), with no process left behind."""
        cfg = model_config(model.path, model.name)
        address = f"ipc://@kubeinfer-{os.getpid()}-{model.name}-{secrets.token_hex(4)}"
        termination = self._workdir / f"{model.name}.termination"
        termination.write_text("")  # written only when it exists (``termination.write_termination_message``)
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        cmd = [sys.executable, "-m", "kubeinfer.runtime.cli", "model-process", "--ipc", address]
        proc = subprocess.Popen(
            [*cmd, "--parent-pid", str(os.getpid())],
            stdin=subprocess.PIPE,
            env={
                **os.environ,
                "KUBEINFER_TERMINATION_LOG": str(termination),
                "KUBEINFER_LOG_LEVEL": str(level),
            },
        )  # no preexec_fn: gRPC's threads run here, and a fork (not a vfork) under them may crash the child
        assert proc.stdin is not None
        proc.stdin.write(cfg.model_dump_json().encode())
        proc.stdin.close()
        client = ipc.ModelClient(address)
        await client.start()
        model.proc, model.client, model.plane = proc, client, RemotePlane(model.name, client)
        deadline = time.monotonic() + self.settings.load_timeout_seconds
        try:
            await self._until_ready(model, termination, deadline)
        except BaseException:
            await self._stop_process(model, kill=True)
            raise

    async def _until_ready(self, model: _Model, termination: Path, deadline: float) -> None:
        assert model.proc is not None and model.plane is not None
        while True:
            code = model.proc.poll()
            if code is not None:
                cause = termination.read_text(encoding="utf-8", errors="replace").strip()
                raise LoadError(cause or f"its process exited with code {code}")
            if time.monotonic() >= deadline:
                raise LoadError(f"not ready after {self.settings.load_timeout_seconds:g} s")
            try:
                reason = await asyncio.wait_for(model.plane.readiness(), 1.0)
            except TimeoutError:
                reason = "not answering yet"
            if reason is None:
                return
            await asyncio.sleep(POLL_SECONDS)

    async def _stop_process(self, model: _Model, *, kill: bool = False) -> None:
        """Stop ``model``'s process (SIGTERM, SIGKILL after ``STOP_TIMEOUT_SECONDS``; at once with
        ``kill``) and close its connection."""
        proc, client = model.proc, model.client
        model.proc = model.client = model.plane = None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        if client is not None:
            await client.close()

    async def _unload(self, model: _Model, reason: str) -> bool:
        """Unload ``model`` (``reason``: "request" or "evicted"): its requests in flight finish first.
        An eviction is given up when a request arrived meanwhile. Returns whether it was unloaded."""
        async with model.lock:
            if model.state != READY or (reason == "evicted" and model.in_flight):
                return False
            model.state = UNLOADING
            deadline = time.monotonic() + self.cfg.server.drain_timeout_seconds
            while model.active and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await self._stop_process(model)
            model.state = UNAVAILABLE
            model.reason = "evicted: memory budget" if reason == "evicted" else "unloaded"
            self.metrics.unloads.labels(model.name, reason).inc()
            if reason == "evicted":
                self.metrics.evictions.labels(model.name).inc()
                model.evictions += 1
            self.metrics.resident.labels(model.name).set(0)
            self._update_total()
            log.info("model %r unloaded (%s)", model.name, model.reason)
        return True

    async def _make_room(self, *, incoming: int = 0, keep: frozenset[str] | set[str] = frozenset()) -> bool:
        """Evict the least recently used models (``residency.plan_evictions``) until the loaded ones
        plus ``incoming`` bytes are within the budget; returns whether they are."""
        resident = [
            Resident(m.name, m.nbytes, m.last_used, m.name in self.settings.pinned, m.in_flight)
            for m in self._models.values()
            if m.state == READY
        ]
        plan = plan_evictions(resident, self.settings.memory_budget_bytes, incoming=incoming, keep=keep)
        for name in plan.evict:
            await self._unload(self._models[name], "evicted")
        if not plan.fits:
            log.warning(
                "over the memory budget: %d MiB resident (+%d MiB loading) of %d MiB; the rest are pinned or "
                "in use",
                plan.resident_bytes >> 20,
                incoming >> 20,
                self.settings.memory_budget_bytes >> 20,
            )
        return plan.fits

    def _update_total(self) -> None:
        self.metrics.total.set(sum(m.nbytes for m in self._models.values() if m.state == READY))

    def _over_budget(self) -> bool:
        loaded = sum(m.nbytes for m in self._models.values() if m.state == READY)
        return loaded > self.settings.memory_budget_bytes

    async def _watch(self) -> None:
        """Mark a loaded model whose process exited (the OOM killer) UNAVAILABLE: its requests in flight
        fail (503), its next request loads it again."""
        while True:
            await asyncio.sleep(POLL_SECONDS * 5)
            for model in self._models.values():
                proc = model.proc
                if model.state == READY and proc is not None and proc.poll() is not None:
                    log.error("model %r: its process exited with code %s", model.name, proc.returncode)
                    await self._stop_process(model)
                    model.state, model.reason = UNAVAILABLE, f"its process exited with code {proc.returncode}"
                    self.metrics.unloads.labels(model.name, "exited").inc()
                    self.metrics.resident.labels(model.name).set(0)
                    self._update_total()

    # ----- requests --------------------------------------------------------------------------------
    def _model(self, name: str, version: str | None) -> _Model:
        """The model ``name`` (scanning again for a new one). Raises ``HTTPError`` 404."""
        model = self._models.get(name)
        if model is None and name in self.scan():
            model = self._models[name]
        if model is None:
            raise HTTPError(f"unknown model: '{name}' is not in the model repository", 404)
        if version not in (None, "", MODEL_VERSION):
            raise HTTPError(f"unknown version '{version}' of model '{name}' (it has version 1)", 404)
        return model

    def _refuse_after_failure(self, model: _Model) -> None:
        """503 at once while a failed load's backoff lasts."""
        if model.failed_at is None:
            return
        left = model.failed_at + self.settings.failed_load_backoff_seconds - self._clock()
        if left > 0:
            headers = {"Retry-After": retry_after_header(left)}
            raise HTTPError(f"model '{model.name}' {model.reason}", 503, headers)

    @contextlib.asynccontextmanager
    async def _using(
        self, model: _Model, *, nbytes: int = 0, priority: object = None, timeout_s: float | None = None
    ) -> AsyncIterator[RemotePlane]:
        """``model``'s process, loaded if need be (the request held meanwhile), kept loaded until the
        block ends. Raises ``HTTPError`` 503 (held requests over the bounds, the load failed), 504 (not
        loaded in time)."""
        model.in_flight += 1
        model.last_used, model.used_at = self._clock(), self._wall_clock()
        try:
            while model.state != READY or model.plane is None:
                self._refuse_after_failure(model)
                try:
                    await self.hold.wait(model.name, nbytes=nbytes, priority=priority, timeout_s=timeout_s)
                except Overflow as exc:
                    raise HTTPError(
                        exc.message, 503, {"Retry-After": retry_after_header(exc.retry_after_s)}
                    ) from None
                except HoldTimeout as exc:
                    raise HTTPError(exc.message, 504) from None
                except HoldError as exc:
                    raise HTTPError(exc.message, 503) from None
            model.active += 1
            try:
                yield model.plane
            finally:
                model.active -= 1
        finally:
            model.in_flight -= 1
            model.last_used, model.used_at = self._clock(), self._wall_clock()
            if self._over_budget() and not self._closing and self._rebalancing is None:
                self._rebalancing = asyncio.get_running_loop().create_task(self._rebalance())

    async def _rebalance(self) -> None:
        """Evict again while over the budget (a request ended: its model may go now)."""
        try:
            await self._make_room()
        finally:
            self._rebalancing = None

    # ----- dataplane.Plane -------------------------------------------------------------------------
    @property
    def closing(self) -> bool:
        """Shutting down."""
        return self._closing

    async def liveness(self) -> str | None:
        """Always live (the model processes are watched apart)."""
        return None

    async def readiness(self) -> str | None:
        """Ready when every pinned model is loaded and not shutting down."""
        if self._closing:
            return "shutting down"
        waiting = [self._models[n] for n in self.settings.pinned if self._models[n].state != READY]
        why = [f"{m.name} ({m.reason or m.state})" for m in waiting]
        return f"pinned models not loaded: {', '.join(why)}" if why else None

    async def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """The model's metadata, loading it first. Raises ``HTTPError`` 404, 503, 504."""
        async with self._using(self._model(name, version)) as plane:
            return await plane.model_metadata(name, version)

    async def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """The model's configuration, loading it first. Raises ``HTTPError`` 404, 503, 504."""
        async with self._using(self._model(name, version)) as plane:
            return await plane.model_config(name, version)

    async def model_ready(self, name: str, version: str | None) -> None:
        """Returns when the model is loaded and ready (never loads it). Raises ``HTTPError`` 404, 503."""
        model = self._model(name, version)
        if model.state != READY or model.plane is None:
            why = f" ({model.reason})" if model.reason else ""
            raise HTTPError(f"model '{name}' is not loaded: {model.state}{why}", 503)
        await model.plane.model_ready(name, version)

    async def infer(
        self, received: float, name: str, version: str | None, decode: Decoder
    ) -> dict[str, np.ndarray]:
        """Serve one request on the model's process (``RemotePlane.infer``). A model not loaded: the body
        is decoded here first (the hold needs its size, priority and timeout), then the request is held
        until the load. Raises ``InferenceError``."""
        model = self._model(name, version)
        if model.state == READY:
            async with self._using(model) as plane:
                return await plane.infer(received, name, version, decode)
        call = await decode()
        nbytes = sum(int(array.nbytes) for array in call.inputs.values())

        async def decoded() -> InferCall:
            return call

        timeout_s = seconds_from_us(call.timeout_us)
        async with self._using(model, nbytes=nbytes, priority=call.priority, timeout_s=timeout_s) as plane:
            return await plane.infer(received, name, version, decoded)

    async def statistics(self, name: str, version: str | None) -> list[dict[str, Any]]:
        """The loaded models' statistics (``name`` "": all of them; a model not loaded has none)."""
        if name:
            model = self._model(name, version)
            return await model.plane.statistics(name, version) if model.plane is not None else []
        stats: list[dict[str, Any]] = []
        for model in list(self._models.values()):
            if model.plane is not None:
                with contextlib.suppress(InferenceError):
                    stats += await model.plane.statistics(model.name, version)
        return stats

    async def shared_memory(
        self, kind: str, action: str, name: str | None, spec: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """Not in this mode (each model process would need the regions): ``HTTPError`` 400."""
        raise HTTPError("shared memory is not supported in the model repository mode", 400)

    async def metrics_text(self) -> bytes:
        """The repository's metrics and each loaded model's process's (its request metrics, queue,
        utilization, each labelled with its ``model``), as one exposition (``metrics.merge_expositions``):
        the series a pool's autoscaler reads over the pool's pods. A process that does not answer (it is
        stopping) is left out of this scrape."""
        texts = [generate_latest(self.metrics.registry)]
        for model in list(self._models.values()):
            if model.state == READY and model.plane is not None:
                with contextlib.suppress(InferenceError):
                    texts.append(await model.plane.metrics_text())
        return merge_expositions(texts)

    # ----- dataplane.Repository --------------------------------------------------------------------
    async def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: ``[{"name", "version", "state", "reason"}]`` by name, each with
        kubeinfer's keys (``kubeinfer.contract.pool``'s ``INDEX_*``: resident bytes, last use, load,
        failure and eviction counts, the latest load's error); only the READY ones with ``ready_only``."""
        self.scan()
        return [
            self._index_entry(m)
            for m in sorted(self._models.values(), key=lambda m: m.name)
            if not ready_only or m.state == READY
        ]

    def _index_entry(self, m: _Model) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": m.name,
            "version": MODEL_VERSION,
            "state": m.state,
            "reason": m.reason,
            INDEX_RESIDENT_BYTES: m.nbytes if m.state == READY else 0,
            INDEX_LOADS: m.loads,
            INDEX_LOAD_FAILURES: m.load_failures,
            INDEX_EVICTIONS: m.evictions,
        }
        if m.used_at is not None:
            entry[INDEX_LAST_USED] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(m.used_at))
        if m.load_error and m.failed_at is not None:
            entry[INDEX_LOAD_ERROR] = m.load_error
        return entry

    async def repository_load(self, name: str) -> None:
        """Load ``name`` now (again after a failure: no backoff) and return once it is READY. Raises
        ``HTTPError`` 400 (unknown model, or the load failed: its cause)."""
        try:
            model = self._model(name, None)
        except HTTPError as exc:
            raise HTTPError(f"failed to load '{name}': {exc.message}", 400) from None
        model.failed_at = None
        self._start_load(model)
        if model.loading is not None:
            await asyncio.shield(model.loading)
        if model.state != READY:
            raise HTTPError(f"model '{name}' {model.reason or 'is ' + model.state}", 400)

    async def repository_unload(self, name: str) -> None:
        """Unload ``name`` (its requests in flight finish first); nothing when it is not loaded. Raises
        ``HTTPError`` 400 for an unknown or a pinned model (pinned: always loaded, readiness needs it)."""
        try:
            model = self._model(name, None)
        except HTTPError as exc:
            raise HTTPError(f"failed to unload '{name}': {exc.message}", 400) from None
        if name in self.settings.pinned:
            raise HTTPError(f"failed to unload '{name}': it is pinned (repository.pinned)", 400)
        if model.loading is not None and not model.loading.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(model.loading)
        await self._unload(model, "request")


class RepositoryServer:
    """The model repository mode's server: REST (uvicorn, this process) and gRPC over a
    ``ModelRepository``, as ``RuntimeServer`` serves one model::

        server = RepositoryServer(cfg)
        await server.start()        # listening; the pinned models load in the background
        code = await server.wait()  # until SIGTERM/SIGINT: not ready, drain, stop the model processes

    Args:
        cfg: the configuration; its ``repository`` section names the directory and the budget, its
            ``server`` section the ports, limits and authentication (the models' own ``runtime.yaml``
            configure each model).
    """

    def __init__(self, cfg: RuntimeConfig) -> None:
        self.cfg = cfg
        self.repository = ModelRepository(cfg)
        self.rest = RestApp(self.repository, cfg, repository=self.repository)
        self.host, self.port, self.grpc_port = cfg.server.host, cfg.server.port, cfg.server.grpc_port
        self._uvicorn: UvicornServer | None = None
        self._grpc: Any = None
        self._serving: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Scan the repository, bind and serve the ports, start the pinned models' loads. Raises
        ``ValueError`` (the repository) or ``OSError``/``RuntimeError`` (a port)."""
        self._loop = asyncio.get_running_loop()
        await self.repository.start()
        server = self.cfg.server
        sock = listen_socket(server.host, server.port)
        self.host, self.port = sock.getsockname()[:2]
        self._uvicorn = UvicornServer(
            uvicorn_config(self.rest.app, graceful_seconds=5, server=server), on_signal=self.stop
        )
        self._grpc, self.grpc_port = create_grpc_server(
            self.repository,
            server.host,
            server.grpc_port,
            self.cfg.limits,
            self.rest.auth,
            handshake_timeout=server.header_timeout_seconds,
            repository=self.repository,
        )
        await self._grpc.start()
        self._serving = self._loop.create_task(self._uvicorn.serve(sockets=[sock]))
        log.info("grpc listening on %s:%d", self.host, self.grpc_port)
        log.info(
            "listening on http://%s:%d (model repository %s)", self.host, self.port, self.repository.root
        )

    def stop(self) -> None:
        """SIGTERM/SIGINT: not ready; after ``server.shutdown_delay_seconds`` the requests in flight
        finish (``server.drain_timeout_seconds`` at most), then the ports close. Raises
        ``RuntimeError`` before ``start``."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("RepositoryServer.stop() before start()")

        def begin() -> None:
            if self._stopping is None:
                self._stopping = loop.create_task(self._drain_then_exit())

        loop.call_soon_threadsafe(begin)

    async def _drain_then_exit(self) -> None:
        server = self.cfg.server
        self.repository.announce_shutdown()
        if server.shutdown_delay_seconds > 0:
            await asyncio.sleep(server.shutdown_delay_seconds)
        if not await self.repository.drain(server.drain_timeout_seconds):
            log.warning("drain timeout (%s s): requests still in flight", server.drain_timeout_seconds)
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True

    async def wait(self) -> int:
        """Serve until stopped, then stop gRPC and every model process. Returns 0."""
        assert self._serving is not None, "start() first"
        try:
            await self._serving
        finally:
            if self._grpc is not None:
                await self._grpc.stop(grace=1.0)
            await self.repository.close()
        log.info("exited cleanly")
        return 0
