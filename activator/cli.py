"""``kubeinfer-activator``: the REST and gRPC fronts over one hold, in one process.

    kubeinfer-activator --port 8080 --grpc-port 8081 --targets-from kubernetes [--namespaces a,b]
    kubeinfer-activator --port 8080 --grpc-port 8081 --targets-file targets.json

The targets come from the Kubernetes API (``--targets-from kubernetes``: ``kube.KubernetesTargets``
watches InferenceServices, their Services and pods and the operator's EndpointSlices, with
``--kubeconfig`` / ``$KUBECONFIG``, else the in-cluster ServiceAccount), or from ``--targets-file``
(``targets.load_targets_file``'s JSON), re-read whenever it changes (polled every ``--poll-interval``
seconds): tests drive the activator by rewriting it (an endpoint appears = the replica is Ready). A
target of the file with a ``grpc_port`` gets its own gRPC listener (0: any free port; ``GET
/activator/status`` shows the port bound). A Kubernetes target gets its own listener on the port the
operator's EndpointSlice of its Service names while it is at zero (``GrpcFront.sync``; every replica
opens the same ones), closed once that slice goes; a target on the shared port (the operator had no
free port) is routed by the model its calls name. ``/activator/readyz`` turns 200 once every kind was
listed and those listeners were opened. The process logs ``listening on http://HOST:PORT`` and ``grpc
listening on HOST:PORT`` (plus `` for TARGET`` per target listener) once it serves.

Settings: flags, or the environment variable named in each flag's help. SIGTERM or SIGINT stops it:
uvicorn drains the REST connections, then the gRPC listeners get ``--grace`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import uvicorn
from kubeinfer.activator.gate import Gate
from kubeinfer.activator.grpc_proxy import GrpcFront
from kubeinfer.activator.rest import rest_app
from kubeinfer.activator.targets import InMemoryTargets, Targets, TargetState, load_targets_file

from kubeinfer.contract.activator import COLD_START_TIMEOUT_DEFAULT
from kubeinfer.contract.durations import parse_duration
from kubeinfer.shared.hold import HoldLimits

if TYPE_CHECKING:  # kubernetes_asyncio is in the operator's image, not the runtime's: imported in serve
    from kubeinfer.activator.kube import KubernetesTargets

log = logging.getLogger("kubeinfer.activator")

__all__ = ["main", "parse_args"]

#: The cold-start budget of a target that sets none: ``scaleToZero.coldStartTimeout``'s default, seconds.
_COLD_START_DEFAULT_S = parse_duration(COLD_START_TIMEOUT_DEFAULT)


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (defaults from the ``KUBEINFER_ACTIVATOR_*`` environment variables)."""
    p = argparse.ArgumentParser(prog="kubeinfer-activator", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default=_env("KUBEINFER_ACTIVATOR_HOST", "0.0.0.0"), help="bind address")
    p.add_argument(
        "--port", type=int, default=int(_env("KUBEINFER_ACTIVATOR_PORT", "8080")), help="REST port (0: any)"
    )
    p.add_argument(
        "--grpc-port",
        type=int,
        default=int(_env("KUBEINFER_ACTIVATOR_GRPC_PORT", "8081")),
        help="the shared gRPC port (targets named by the model a call names); -1: none",
    )
    p.add_argument(
        "--max-held-requests",
        type=int,
        default=int(_env("KUBEINFER_ACTIVATOR_MAX_HELD_REQUESTS", "100")),
        help="requests held per target (env KUBEINFER_ACTIVATOR_MAX_HELD_REQUESTS)",
    )
    p.add_argument(
        "--max-held-bytes",
        type=int,
        default=int(_env("KUBEINFER_ACTIVATOR_MAX_HELD_BYTES", str(64 * 1024 * 1024))),
        help="request bytes held per target (env KUBEINFER_ACTIVATOR_MAX_HELD_BYTES)",
    )
    p.add_argument(
        "--cold-start-timeout",
        type=float,
        default=float(_env("KUBEINFER_ACTIVATOR_COLD_START_TIMEOUT_SECONDS", str(_COLD_START_DEFAULT_S))),
        help="seconds a request is held at most for a target that sets no budget of its own (an "
        "InferenceService without scaleToZero.coldStartTimeout; default: that field's default) "
        "(env KUBEINFER_ACTIVATOR_COLD_START_TIMEOUT_SECONDS)",
    )
    p.add_argument(
        "--retry-after",
        type=float,
        default=float(_env("KUBEINFER_ACTIVATOR_RETRY_AFTER_SECONDS", "1")),
        help="Retry-After of a 503 for a full queue, seconds (env KUBEINFER_ACTIVATOR_RETRY_AFTER_SECONDS)",
    )
    p.add_argument(
        "--default-priority-level",
        type=int,
        default=int(_env("KUBEINFER_ACTIVATOR_DEFAULT_PRIORITY_LEVEL", "2")),
        help="the level of priority 0 / none (1 = highest; env KUBEINFER_ACTIVATOR_DEFAULT_PRIORITY_LEVEL)",
    )
    p.add_argument(
        "--upstream-timeout",
        type=float,
        default=float(_env("KUBEINFER_ACTIVATOR_UPSTREAM_TIMEOUT_SECONDS", "300")),
        help="REST: seconds to wait for each read of a replica's response",
    )
    p.add_argument("--cluster-domain", default=_env("KUBEINFER_ACTIVATOR_CLUSTER_DOMAIN", "cluster.local"))
    p.add_argument(
        "--targets-from",
        choices=["file", "kubernetes"],
        default=_env("KUBEINFER_ACTIVATOR_TARGETS_FROM", "file"),
        help="where the targets come from: --targets-file, or the Kubernetes API",
    )
    p.add_argument("--targets-file", type=Path, help="JSON file of targets (see kubeinfer.activator.targets)")
    p.add_argument(
        "--kubeconfig",
        help="kubeconfig for --targets-from kubernetes (default: $KUBECONFIG, else in-cluster)",
    )
    p.add_argument(
        "--namespaces",
        default=_env("KUBEINFER_ACTIVATOR_NAMESPACES", ""),
        help="comma-separated namespaces to watch (default: all; env KUBEINFER_ACTIVATOR_NAMESPACES)",
    )
    p.add_argument("--poll-interval", type=float, default=0.05, help="seconds between reads of the file")
    p.add_argument("--grace", type=float, default=5.0, help="seconds for gRPC calls in flight at shutdown")
    p.add_argument("--log-level", default=_env("KUBEINFER_ACTIVATOR_LOG_LEVEL", "INFO"))
    return p.parse_args(argv)


class _FileTargets:
    """Keeps an ``InMemoryTargets`` equal to ``--targets-file`` and starts per-target gRPC listeners."""

    def __init__(self, path: Path, targets: InMemoryTargets, front: GrpcFront) -> None:
        self.path = path
        self.targets = targets
        self.front = front
        self._seen: tuple[int, int] | None = None

    async def refresh(self) -> None:
        """Re-read the file when its mtime or size changed; a malformed file is logged and skipped."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        seen = (st.st_mtime_ns, st.st_size)
        if seen == self._seen:
            return
        try:
            states = load_targets_file(self.path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("targets file %s not loaded: %s", self.path, exc)  # half-written: next poll
            return
        self._seen = seen
        for state in states:
            if state.grpc_port is not None and state.key not in self.front.ports:
                bound = await self.front.listen(state.grpc_port, state.key)
                log.info("grpc listening on %s:%d for %s", self.front.host, bound, state.key)
        self.targets.sync(states)

    async def run(self, interval_s: float) -> None:
        """``refresh`` every ``interval_s`` seconds, forever."""
        while True:
            await self.refresh()
            await asyncio.sleep(interval_s)


class _KubePorts:
    """Keeps the per-target gRPC listeners equal to the ports the operator's EndpointSlices name
    (``KubernetesTargets.grpc_ports``, ``GrpcFront.sync``); ``applied`` is set once they were opened
    after every kind was listed. A port that cannot be bound is logged once and tried again every
    ``RETRY_S`` seconds."""

    RETRY_S = 5.0

    def __init__(self, kube: KubernetesTargets, front: GrpcFront, grace_s: float) -> None:
        self.kube = kube
        self.front = front
        self.grace_s = grace_s
        self.applied = asyncio.Event()
        self._failing: set[int] = set()

    async def run(self) -> None:
        """Open, move and close the listeners at every change of the ports, forever (cancel to stop)."""
        await self.kube.synced.wait()
        while True:
            self.kube.ports_changed.clear()  # before reading: a change from now on sets it again
            wanted = dict(self.kube.grpc_ports)
            failed = await self.front.sync(wanted, self.grace_s)
            for port in sorted(set(failed) - self._failing):
                log.warning("%s for %s (tried again every %.0f s)", failed[port], wanted[port], self.RETRY_S)
            for port in sorted(self._failing - set(failed)):
                log.info("grpc port %d no longer failing", port)
            self._failing = set(failed)
            self.applied.set()
            waiting = self.kube.ports_changed.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiting, self.RETRY_S if failed else None)


class _Listed(Protocol):
    """What the status page reads of the targets (``InMemoryTargets``, ``KubernetesTargets``)."""

    demands: dict[str, int]

    def states(self) -> list[TargetState]: ...


def _status(gate: Gate, targets: _Listed, front: GrpcFront) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for state in targets.states():
        held = gate.hold.held(state.key)
        out[state.key] = {
            "ready": state.endpoint is not None,
            "stage": state.stage,
            "held": held.requests,
            "held_bytes": held.nbytes,
            "demands": targets.demands.get(state.key, 0),
            "grpc_port": front.ports.get(state.key),
        }
    return {"targets": out, "grpc_port": front.ports.get(None)}


async def serve(args: argparse.Namespace) -> None:
    """Run the fronts until SIGTERM/SIGINT."""
    limits = HoldLimits(
        max_requests=args.max_held_requests,
        max_bytes=args.max_held_bytes,
        cold_start_timeout_s=args.cold_start_timeout,
        retry_after_s=args.retry_after,
        default_priority_level=args.default_priority_level,
    )
    closing: list[Callable[[], Awaitable[Any]]] = []
    table = InMemoryTargets(cluster_domain=args.cluster_domain)
    targets: Targets = table
    listed: _Listed = table
    watch: Callable[[], Coroutine[Any, Any, None]] | None = None
    kube: KubernetesTargets | None = None
    if args.targets_from == "kubernetes":
        # imported here: kubernetes_asyncio is in the operator's image, not the runtime's
        from kubeinfer.activator.kube import KubernetesTargets, connect

        api = await connect(args.kubeconfig)
        closing.append(api.close)
        namespaces = [n.strip() for n in args.namespaces.split(",") if n.strip()]
        kube = KubernetesTargets(api, namespaces=namespaces, cluster_domain=args.cluster_domain)
        targets, listed, watch = kube, kube, kube.run
    gate = Gate(targets, limits)
    front = GrpcFront(gate, args.host)
    tasks = [asyncio.create_task(gate.hold.run_deadlines())]
    is_ready: Callable[[], bool] | None = None
    if kube is not None and watch is not None:
        ports = _KubePorts(kube, front, args.grace)
        tasks += [asyncio.create_task(watch()), asyncio.create_task(ports.run())]
        # ready once every kind was listed (no 404 for a target not yet seen) and the targets' own gRPC
        # ports listen
        is_ready = ports.applied.is_set
    elif args.targets_file is not None:
        watcher = _FileTargets(args.targets_file, table, front)
        await watcher.refresh()
        tasks.append(asyncio.create_task(watcher.run(args.poll_interval)))
    if args.grpc_port >= 0:
        bound = await front.listen(args.grpc_port, None)
        log.info("grpc listening on %s:%d", args.host, bound)
    app = rest_app(
        gate,
        upstream_timeout_s=args.upstream_timeout,
        status=lambda: _status(gate, listed, front),
        ready=is_ready,
    )
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    ready = asyncio.create_task(_announce(server))
    try:
        await server.serve()
    finally:
        for task in [*tasks, ready]:
            task.cancel()
        for task in [*tasks, ready]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await front.stop(args.grace)
        for close in closing:
            await close()


async def _announce(server: uvicorn.Server) -> None:
    """Log the REST port once uvicorn listens (port 0 binds a free one: the log says which)."""
    while not server.started:
        await asyncio.sleep(0.01)
    for s in server.servers:
        for sock in s.sockets:
            host, port = sock.getsockname()[:2]
            log.info("listening on http://%s:%d", host, port)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``kubeinfer-activator`` entry point; returns the exit status."""
    args = parse_args(argv)
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=args.log_level.upper(), format=fmt)
    # httpx logs every request at INFO: the activator logs only what it refuses
    logging.getLogger("httpx").setLevel(logging.WARNING)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
