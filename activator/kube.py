"""``Targets`` from the Kubernetes API: InferenceServices, their Services and their pods, watched.

``KubernetesTargets.run`` lists and watches four kinds, cluster-wide or in each namespace given:
InferenceServices (``kubeinfer.io``), Services and pods carrying the InferenceService pod label
(``kubeinfer.contract.activator.ISVC_LABEL``), and the operator's EndpointSlices (labelled
``endpointslice.kubernetes.io/managed-by: operator.kubeinfer.io``: those of the Services at zero).
Each watch resumes from the last ``resourceVersion`` it saw; a 410 Gone (the version is too old) lists
again; any other failure (connection, 5xx, 403) is one log line, then a retry after an exponential
backoff (0.5 s doubling to 30 s, reset by a good list). The objects are kept as the API server sends
them (JSON); ``kubestate`` turns a target's objects into its state after every event that touches it
(pure functions, unit-tested).

- ``endpoint``: the target's Ready pods in turn (round-robin over each call).
- ``stage``: ``kubestate.stage_words`` (the InferenceService's ``Ready`` reason and message, the pods).
- ``demand``: a merge patch of the demand annotation (``kubestate.demand_patch``), sent in the background
  (the request path never waits for it or sees its errors). One patch per target at a time; a failed
  one is logged once (until a patch succeeds again) and sent again on the next ``demand``.
- ``subscribe``: listeners hear of every target whose state changed (a Ready pod appeared included).
- ``grpc_ports``: port -> target, the per-target gRPC ports the operator's EndpointSlices name
  (``kubestate.port_targets``); ``ports_changed`` is set whenever it changes (the CLI then opens, moves
  and closes the listeners, ``GrpcFront.sync``).

The API client is kubernetes-asyncio's (``connect``: a kubeconfig, else the in-cluster ServiceAccount).
The activator needs ``get``, ``list``, ``watch`` on inferenceservices, services, pods and
endpointslices (``discovery.k8s.io``) and ``patch`` on inferenceservices.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubeinfer.activator import kubestate
from kubeinfer.activator.targets import Endpoint, InMemoryTargets, TargetState
from kubernetes_asyncio import config as kconfig
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

from kubeinfer.contract.activator import (
    ENDPOINTSLICE_MANAGED_BY,
    GROUP,
    ISVC_LABEL,
    PLURAL,
    SLICE_MANAGED_BY_LABEL,
    VERSION,
)

log = logging.getLogger("kubeinfer.activator.kube")

__all__ = ["KubernetesTargets", "connect"]

#: Seconds the API server keeps one watch open before it ends it (the watch then resumes).
WATCH_SECONDS = 300
#: Backoff after a failed list or watch: first and longest delay, seconds.
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True)
class _Kind:
    name: str
    path: str  # with {ns}: the namespaced collection; the cluster-wide one without "namespaces/{ns}/"
    label_selector: str | None

    def url(self, namespace: str | None) -> str:
        if namespace is None:
            return self.path.replace("namespaces/{ns}/", "")
        return self.path.format(ns=namespace)


ISVCS = _Kind("inferenceservices", f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}", None)
SERVICES = _Kind("services", "/api/v1/namespaces/{ns}/services", ISVC_LABEL)
PODS = _Kind("pods", "/api/v1/namespaces/{ns}/pods", ISVC_LABEL)
SLICES = _Kind(
    "endpointslices",
    "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
    f"{SLICE_MANAGED_BY_LABEL}={ENDPOINTSLICE_MANAGED_BY}",
)
KINDS = (ISVCS, SERVICES, PODS, SLICES)


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


async def connect(kubeconfig: str | None = None) -> ApiClient:
    """An API client from ``kubeconfig`` (or ``$KUBECONFIG``), else the in-cluster ServiceAccount
    (its rotating token re-read). Raises ``kubernetes_asyncio.config.ConfigException`` (or ``OSError``)
    when neither is usable."""
    cfg = Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        await kconfig.load_kube_config(config_file=path, client_configuration=cfg, persist_config=False)
    else:
        kconfig.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=cfg, try_refresh_token=True
        )
    api = ApiClient(cfg)
    api.user_agent = "kubeinfer-activator"
    return api


class KubernetesTargets:
    """``Targets`` kept from the Kubernetes API (see the module docstring).

    Args:
        api: the API client (``connect``); closed by the caller.
        namespaces: the namespaces to watch; None or empty: all (cluster-wide lists and watches).
        cluster_domain: the cluster's DNS domain (``name.ns.svc.<cluster_domain>``).
        now: the wall clock for the demand annotation (aware datetimes; tests hand a fixed one).
    """

    def __init__(
        self,
        api: ApiClient,
        *,
        namespaces: Sequence[str] | None = None,
        cluster_domain: str = "cluster.local",
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.namespaces: list[str | None] = list(namespaces) if namespaces else [None]
        self._now = now
        self._table = InMemoryTargets(cluster_domain=cluster_domain)
        #: kind name -> namespace/name -> the object as the API server sent it
        self._objects: dict[str, dict[str, dict[str, Any]]] = {k.name: {} for k in KINDS}
        self._endpoints: dict[str, tuple[Endpoint, ...]] = {}
        self._turns: dict[str, int] = {}
        self._patching: dict[str, asyncio.Task[None]] = {}
        self._patch_failing: set[str] = set()
        #: demand calls per target (the status page), and patches the API server accepted
        self.demands: dict[str, int] = {}
        self.patched: dict[str, int] = {}
        #: port -> target: the per-target gRPC ports of the operator's EndpointSlices; ``ports_changed``
        #: is set when it changes (its reader clears it)
        self.grpc_ports: dict[int, str] = {}
        self.ports_changed = asyncio.Event()
        #: set once every watch has listed its kind once
        self.synced = asyncio.Event()
        self._listed: set[tuple[str, str | None]] = set()

    # ----- the Targets protocol
    def resolve(self, host: str) -> str | None:
        """See ``Targets.resolve``."""
        return self._table.resolve(host)

    def endpoint(self, target: str) -> Endpoint | None:
        """A Ready pod of ``target``, each in turn; None while it has none."""
        endpoints = self._endpoints.get(target, ())
        turn = self._turns.get(target, 0)
        self._turns[target] = turn + 1
        return kubestate.pick(endpoints, turn)

    def stage(self, target: str) -> str:
        """See ``Targets.stage`` (``kubestate.stage_words``)."""
        return self._table.stage(target)

    def demand(self, target: str) -> None:
        """Ask for a replica: patch the demand annotation in the background (see the module docstring).
        Never blocks or raises; a patch already in flight for ``target`` covers this call."""
        self.demands[target] = self.demands.get(target, 0) + 1
        running = self._patching.get(target)
        if running is not None and not running.done():
            return
        task = asyncio.get_running_loop().create_task(self._patch_demand(target, self._now()))
        self._patching[target] = task

    def cold_start_timeout(self, target: str) -> float | None:
        """See ``Targets.cold_start_timeout`` (``kubestate.cold_start_timeout``)."""
        return self._table.cold_start_timeout(target)

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """See ``Targets.subscribe``."""
        self._table.subscribe(listener)

    def states(self) -> list[TargetState]:
        """Every target's state (the status page)."""
        return self._table.states()

    # ----- the demand patch
    async def _patch_demand(self, target: str, when: datetime) -> None:
        namespace, _, name = target.partition("/")
        path = f"{ISVCS.url(namespace)}/{name}"
        try:
            await self.api.call_api(
                path,
                "PATCH",
                header_params={"Accept": "application/json", "Content-Type": "application/merge-patch+json"},
                body=kubestate.demand_patch(when),
                auth_settings=["BearerToken"],
                response_types_map={200: "object"},
                _return_http_data_only=True,
                _request_timeout=10,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the request path never sees it: the next demand sends it again
            if target not in self._patch_failing:
                self._patch_failing.add(target)
                log.warning(
                    "demand for %s not written (sent again on the next demand): %s", target, _brief(exc)
                )
            return
        self.patched[target] = self.patched.get(target, 0) + 1
        if target in self._patch_failing:
            self._patch_failing.discard(target)
            log.info("demand for %s written again", target)

    # ----- the watches
    async def run(self) -> None:
        """List and watch every kind in every namespace, forever (cancel to stop)."""
        tasks = [
            asyncio.create_task(self._watch(kind, ns), name=f"watch {kind.name} {ns or '*'}")
            for kind in KINDS
            for ns in self.namespaces
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in [*tasks, *self._patching.values()]:
                task.cancel()
            for task in [*tasks, *self._patching.values()]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _watch(self, kind: _Kind, namespace: str | None) -> None:
        """List, then watch from the list's resourceVersion; list again on 410, back off on errors."""
        delay = BACKOFF_FIRST_S
        failing = False
        while True:
            try:
                version = await self._list(kind, namespace)
                delay = BACKOFF_FIRST_S
                if failing:
                    log.info("%s in %s listed again", kind.name, namespace or "all namespaces")
                    failing = False
                while True:  # each watch ends after WATCH_SECONDS: resume from the last version seen
                    version = await self._watch_once(kind, namespace, version)
            except _Gone:
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one line per failure, never a traceback per event
                if not failing:
                    log.warning(
                        "%s in %s: %s (retrying with backoff)",
                        kind.name,
                        namespace or "all namespaces",
                        _brief(exc),
                    )
                failing = True
                await asyncio.sleep(delay)
                delay = min(BACKOFF_MAX_S, delay * 2)

    def _query(self, kind: _Kind) -> list[tuple[str, str]]:
        return [("labelSelector", kind.label_selector)] if kind.label_selector else []

    async def _list(self, kind: _Kind, namespace: str | None) -> str:
        doc = await self.api.call_api(
            kind.url(namespace),
            "GET",
            query_params=self._query(kind),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            response_types_map={200: "object"},
            _return_http_data_only=True,
            _request_timeout=60,
        )
        items = {kubestate.key_of(o): o for o in doc.get("items") or []}
        store = self._objects[kind.name]
        old = {k for k in store if namespace is None or k.startswith(f"{namespace}/")}
        touched = {self._target_of(kind, store[k]) for k in old}
        for k in old:
            del store[k]
        store.update(items)
        touched |= {self._target_of(kind, o) for o in items.values()}
        self._refresh(t for t in touched if t)
        if kind is SLICES:
            self._refresh_ports()
        self._listed.add((kind.name, namespace))
        if len(self._listed) == len(KINDS) * len(self.namespaces):
            self.synced.set()
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch_once(self, kind: _Kind, namespace: str | None, version: str) -> str:
        """One watch request; returns the last resourceVersion seen when the server ends it."""
        query = [
            *self._query(kind),
            ("watch", "true"),
            ("resourceVersion", version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(WATCH_SECONDS)),
        ]
        resp = await self.api.call_api(
            kind.url(namespace),
            "GET",
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=WATCH_SECONDS + 30,
        )
        try:
            if resp.status == 410:
                raise _Gone
            if not 200 <= resp.status <= 299:
                body = (await resp.read())[:300].decode("utf-8", "replace")
                raise ApiException(status=resp.status, reason=f"{resp.reason}: {body}")
            # one JSON event a line; split here rather than with readline, whose buffer limit (128 KiB)
            # a large object's line can pass
            pending = bytearray()
            async for chunk in resp.content.iter_any():
                pending += chunk
                while (end := pending.find(b"\n")) >= 0:
                    line = bytes(pending[:end])
                    del pending[: end + 1]
                    if line.strip():
                        version = self._apply(kind, json.loads(line)) or version
            return version
        finally:
            resp.release()

    def _apply(self, kind: _Kind, event: dict[str, Any]) -> str | None:
        """Apply one watch event; returns its resourceVersion. Raises ``_Gone`` for a 410 ERROR event,
        ``ApiException`` for another."""
        kind_of_event, obj = event.get("type"), event.get("object") or {}
        if kind_of_event == "ERROR":
            code = int(obj.get("code") or 0)
            if code == 410:
                raise _Gone
            raise ApiException(status=code, reason=str(obj.get("message") or obj))
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind_of_event == "BOOKMARK":
            return str(version) if version else None
        store = self._objects[kind.name]
        key = kubestate.key_of(obj)
        touched = {self._target_of(kind, obj)}
        if key in store:
            touched.add(self._target_of(kind, store[key]))  # a pod whose label changed leaves its old target
        if kind_of_event == "DELETED":
            store.pop(key, None)
        else:
            store[key] = obj
        self._refresh(t for t in touched if t)
        if kind is SLICES:
            self._refresh_ports()
        return str(version) if version else None

    @staticmethod
    def _target_of(kind: _Kind, obj: dict[str, Any]) -> str | None:
        if kind is SLICES:
            return None  # a slice names a port, not a target's state
        return kubestate.key_of(obj) if kind is ISVCS else kubestate.target_key_of_labelled(obj)

    def _refresh_ports(self) -> None:
        """Recompute :attr:`grpc_ports` from the slices kept; set ``ports_changed`` when it changed."""
        ports = kubestate.port_targets(self._objects[SLICES.name].values())
        if ports != self.grpc_ports:
            self.grpc_ports = ports
            self.ports_changed.set()

    def _labelled(self, kind: _Kind, target: str) -> list[dict[str, Any]]:
        """The objects of ``kind`` whose pod label names ``target`` (a scan: O(objects kept))."""
        found = self._objects[kind.name].values()
        return [o for o in found if kubestate.target_key_of_labelled(o) == target]

    def _refresh(self, targets: Iterable[str]) -> None:
        """Recompute the state of ``targets`` from the objects kept; listeners hear of those that changed."""
        for target in set(targets):
            isvc = self._objects[ISVCS.name].get(target)
            if isvc is None:
                self._endpoints.pop(target, None)
                self._table.remove(target)
                continue
            services = [
                s
                for s in self._objects[SERVICES.name].values()
                if kubestate.target_key_of_labelled(s) == target
            ]
            pods = [
                p for p in self._objects[PODS.name].values() if kubestate.target_key_of_labelled(p) == target
            ]
            service = self._objects[SERVICES.name].get(target) or (services[0] if services else None)
            view = kubestate.target_view(isvc, service, pods)
            # the endpoints first: a listener told of the change asks for one
            self._endpoints[target] = view.endpoints
            if self._table.get(target) != view.state:
                self._table.put(view.state)


def _brief(exc: BaseException) -> str:
    """One line for a failed API call: the status and reason of an ``ApiException``, else the type and
    message."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {str(exc.reason or '')[:300]}".strip()
    return f"{type(exc).__name__}: {str(exc)[:300]}"
