"""Which target a request is for, where the target is served, and how to ask for it.

A target is an InferenceService, named ``namespace/name``. ``Targets`` is what the fronts ask; this module
ships ``InMemoryTargets`` (tests, the CLI's ``--targets-file``, and the table that ``kube.KubernetesTargets``
keeps from the Kubernetes API for ``--targets-from kubernetes``).

Resolution (``resolve``) accepts what a client puts in ``Host`` (REST) for a Service: ``name``,
``name.ns``, ``name.ns.svc``, ``name.ns.svc.<cluster domain>`` (``cluster.local`` by default) or the
Service's ClusterIP, each with or without ``:port``, case-insensitive, a trailing dot allowed. A bare
``name`` resolves only when one target has that name (the activator cannot know the client's namespace).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Endpoint", "InMemoryTargets", "TargetState", "Targets", "load_targets_file", "split_host"]


@dataclass(frozen=True)
class Endpoint:
    """A ready replica: its IP and the runtime's REST and gRPC ports."""

    host: str
    http_port: int
    grpc_port: int

    @property
    def http(self) -> str:
        """``ip:port`` of the REST port (IPv6 bracketed)."""
        return f"{_bracket(self.host)}:{self.http_port}"

    @property
    def grpc(self) -> str:
        """``ip:port`` of the gRPC port (IPv6 bracketed)."""
        return f"{_bracket(self.host)}:{self.grpc_port}"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Targets(Protocol):
    """What the fronts need to know about targets (implementations: ``InMemoryTargets``,
    ``kube.KubernetesTargets``). Targets are ``namespace/name`` strings. No method may block."""

    def resolve(self, host: str) -> str | None:
        """The target a ``Host`` value (see the module docstring) names, or None."""
        ...

    def endpoint(self, target: str) -> Endpoint | None:
        """A ready replica of ``target`` to forward to, or None while it has none."""
        ...

    def stage(self, target: str) -> str:
        """Where ``target``'s replica is (e.g. "Unschedulable: 0/1 nodes are available", "loading model")."""
        ...

    def demand(self, target: str) -> None:
        """Ask for a replica of ``target`` (idempotent; called when a request is held for it)."""
        ...

    def cold_start_timeout(self, target: str) -> float | None:
        """The longest a request for ``target`` is held, seconds (its InferenceService's
        ``scaleToZero.coldStartTimeout``); None: the activator's default."""
        ...

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(target)`` whenever ``target``'s endpoint may have changed."""
        ...


def split_host(host: str) -> str:
    """The host part of a ``Host`` / ``:authority`` value, lower-cased, without port, brackets or a trailing
    dot: ``"Simple.NS.svc.:8080"`` -> ``"simple.ns.svc"``, ``"[fd00::1]:80"`` -> ``"fd00::1"``."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else host[1:]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


@dataclass(frozen=True)
class TargetState:
    """One target as ``InMemoryTargets`` knows it.

    Args:
        name, namespace: the InferenceService (and its Service).
        cluster_ip: the Service's ClusterIP (resolves like its DNS names), or None.
        endpoint: the ready replica, or None while there is none.
        stage: where the replica is, for the hold's timeout message.
        grpc_port: the activator's own gRPC port for this target (0: any free port), or None for none;
            see ``grpc_proxy``.
        cold_start_timeout_s: the longest a request for it is held, seconds (None: the activator's
            default).
    """

    name: str
    namespace: str = "default"
    cluster_ip: str | None = None
    endpoint: Endpoint | None = None
    stage: str = "no replica requested yet"
    grpc_port: int | None = None
    cold_start_timeout_s: float | None = None

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


@dataclass
class InMemoryTargets:
    """``Targets`` from a table kept in memory; ``demands`` counts ``demand`` calls per target.

    Args:
        cluster_domain: the cluster's DNS domain (``name.ns.svc.<cluster_domain>``).
    """

    cluster_domain: str = "cluster.local"
    demands: dict[str, int] = field(default_factory=dict)
    _states: dict[str, TargetState] = field(default_factory=dict)
    _listeners: list[Callable[[str], None]] = field(default_factory=list)

    # ----- the Targets protocol
    def resolve(self, host: str) -> str | None:
        """See ``Targets.resolve``."""
        h = split_host(host)
        for state in self._states.values():
            if h == state.cluster_ip:
                return state.key
        parts = h.split(".")
        if len(parts) == 1:
            named = [s.key for s in self._states.values() if s.name == h]
            return named[0] if len(named) == 1 else None
        name, namespace, rest = parts[0], parts[1], ".".join(parts[2:])
        if rest not in ("", "svc", f"svc.{self.cluster_domain}"):
            return None
        key = f"{namespace}/{name}"
        return key if key in self._states else None

    def endpoint(self, target: str) -> Endpoint | None:
        """See ``Targets.endpoint``."""
        state = self._states.get(target)
        return state.endpoint if state else None

    def stage(self, target: str) -> str:
        """See ``Targets.stage``."""
        state = self._states.get(target)
        return state.stage if state else "unknown target"

    def demand(self, target: str) -> None:
        """See ``Targets.demand``: counted in ``demands``."""
        self.demands[target] = self.demands.get(target, 0) + 1

    def cold_start_timeout(self, target: str) -> float | None:
        """See ``Targets.cold_start_timeout``."""
        state = self._states.get(target)
        return state.cold_start_timeout_s if state else None

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """See ``Targets.subscribe``."""
        self._listeners.append(listener)

    # ----- changing the table
    def put(self, state: TargetState) -> None:
        """Add or replace a target; listeners hear of it."""
        self._states[state.key] = state
        self._changed(state.key)

    def get(self, target: str) -> TargetState | None:
        """The state of ``target``, or None for an unknown one."""
        return self._states.get(target)

    def remove(self, target: str) -> None:
        """Forget ``target`` (nothing for an unknown one); listeners hear of it."""
        if self._states.pop(target, None) is not None:
            self._changed(target)

    def set_endpoint(self, target: str, endpoint: Endpoint | None, stage: str | None = None) -> None:
        """Give ``target`` a ready replica (or take it away), optionally with a new stage.

        Raises ``KeyError`` for an unknown target."""
        state = self._states[target]
        self.put(replace(state, endpoint=endpoint, stage=stage if stage is not None else state.stage))

    def sync(self, states: Iterable[TargetState]) -> None:
        """Make the table exactly ``states``; listeners hear of every target that changed or left."""
        new = {s.key: s for s in states}
        old, self._states = self._states, new
        for key in set(old) | set(new):
            if old.get(key) != new.get(key):
                self._changed(key)

    def states(self) -> list[TargetState]:
        """The table, in insertion order."""
        return list(self._states.values())

    def _changed(self, key: str) -> None:
        for listener in list(self._listeners):
            listener(key)


def _endpoint(doc: Any) -> Endpoint | None:
    if doc is None:
        return None
    return Endpoint(host=str(doc["host"]), http_port=int(doc["http_port"]), grpc_port=int(doc["grpc_port"]))


def load_targets_file(path: Path) -> list[TargetState]:
    """The targets a JSON file lists: ``{"targets": [{"name", "namespace", "cluster_ip", "stage",
    "grpc_port", "cold_start_timeout_s", "endpoint": null | {"host", "http_port", "grpc_port"}}]}`` (only
    ``name`` required).

    Raises ``ValueError`` (``json.JSONDecodeError`` included) or ``KeyError`` for a malformed file and
    ``OSError`` when it cannot be read."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("targets"), list):
        raise ValueError(f"{path}: expected an object with a list 'targets'")
    states = []
    for item in doc["targets"]:
        port = item.get("grpc_port")
        budget = item.get("cold_start_timeout_s")
        states.append(
            TargetState(
                name=str(item["name"]),
                namespace=str(item.get("namespace", "default")),
                cluster_ip=item.get("cluster_ip"),
                endpoint=_endpoint(item.get("endpoint")),
                stage=str(item.get("stage", "no replica requested yet")),
                grpc_port=None if port is None else int(port),
                cold_start_timeout_s=None if budget is None else float(budget),
            )
        )
    return states
