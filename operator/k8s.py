"""The only module of the operator that talks to the Kubernetes API server.

Transport, configuration, authentication and TLS are ``kubernetes-asyncio``'s (the asyncio port of
the official client, on aiohttp): its ``config`` loaders read the kubeconfig or the in-cluster
service account, with token refresh (the in-cluster loader re-reads the rotating bound
ServiceAccount token, at most once a minute; exec-plugin and GCP kubeconfig credentials are
renewed by the library's ``refresh_token`` task before they expire), and its ``ApiClient`` holds
the connection pool, the TLS context and the ``Authorization`` header. This module adds only what
kubeinfer needs on top: URL paths of the kinds it handles, raw JSON bodies (``ApiClient.call_api``
with the ``object`` response type, so no model classes on the hot path), server-side apply
(``application/apply-patch+yaml``), merge patches for status, the write counter, and a small error
hierarchy:

- :class:`TransientError` — worth retrying after a delay: 409 Conflict, 429, 5xx, connection errors,
  timeouts (``retry_after`` seconds, from ``Retry-After`` when the server sends it);
- :class:`PermanentError` — retrying will not help: 400, 401, 403, 422 ...; the reconciler turns it
  into a ``Ready=False`` condition and an Event, without a retry storm;
- :class:`NotFoundError` — 404 (a :class:`PermanentError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
from kubeinfer.operator import metrics, rfc3339
from kubernetes_asyncio import config as kconfig
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

from kubeinfer.contract.activator import API_VERSION
from kubeinfer.contract.pool import POOL_KIND, POOL_PLURAL

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Resource:
    """A namespaced API resource this operator reads or writes: ``apiVersion``, ``kind``, ``plural``."""

    api_version: str
    kind: str
    plural: str

    @property
    def group(self) -> str:
        """The API group (``""`` for the core group)."""
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        """The API version without the group (``v1``)."""
        return self.api_version.rpartition("/")[2]

    def path(self, namespace: str | None, name: str | None = None) -> str:
        """URL path of the collection in ``namespace`` (all namespaces when ``None``), or of one object."""
        return resource_path(self.api_version, self.plural, namespace, name)


DEPLOYMENT = Resource("apps/v1", "Deployment", "deployments")
SERVICE = Resource("v1", "Service", "services")
CONFIGMAP = Resource("v1", "ConfigMap", "configmaps")
POD_DISRUPTION_BUDGET = Resource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
NETWORK_POLICY = Resource("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies")
PERSISTENT_VOLUME_CLAIM = Resource("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
EVENT = Resource("v1", "Event", "events")
POD = Resource("v1", "Pod", "pods")
REPLICASET = Resource("apps/v1", "ReplicaSet", "replicasets")
ENDPOINT_SLICE = Resource("discovery.k8s.io/v1", "EndpointSlice", "endpointslices")
#: The ModelPool (its status is patched; its kind's names are ``kubeinfer.contract.pool``'s).
MODEL_POOL = Resource(API_VERSION, POOL_KIND, POOL_PLURAL)

#: Every resource the operator handles, by ``(apiVersion, kind)``.
_PLURALS: dict[tuple[str, str], str] = {
    (r.api_version, r.kind): r.plural
    for r in (
        DEPLOYMENT,
        SERVICE,
        CONFIGMAP,
        POD_DISRUPTION_BUDGET,
        NETWORK_POLICY,
        PERSISTENT_VOLUME_CLAIM,
        EVENT,
        POD,
        REPLICASET,
        ENDPOINT_SLICE,
    )
}

#: ``ApiClient.call_api`` response types: the ``object`` type returns the decoded JSON as is.
_RAW_JSON = {200: "object", 201: "object", 202: "object"}


class KubeError(Exception):
    """A failed API request. ``status``: HTTP status (0 = no response); ``reason``: API reason."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "", retry_after: float = 1.0):
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after


class TransientError(KubeError):
    """Retry after ``retry_after`` seconds (conflict, throttling, server or network trouble)."""


class PermanentError(KubeError):
    """Retrying the same request will not help (invalid object, forbidden, ...)."""


class NotFoundError(PermanentError):
    """404 Not Found."""


def resource_path(
    api_version: str, plural: str, namespace: str | None = None, name: str | None = None
) -> str:
    """URL path of a collection or object: ``/api/v1/...`` for the core group, else ``/apis/...``."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    ns = f"/namespaces/{namespace}" if namespace else ""
    obj = f"/{name}" if name else ""
    return f"{base}{ns}/{plural}{obj}"


def _plural_of(path: str) -> str:
    """The resource plural of an API path (``/apis/apps/v1/namespaces/x/deployments/y`` → deployments)."""
    parts = path.strip("/").split("/")
    if "namespaces" in parts:
        i = parts.index("namespaces")
        return parts[i + 2] if len(parts) > i + 2 else "namespaces"
    return parts[3] if parts[0] == "apis" and len(parts) > 3 else parts[-1]


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """URL path of a namespaced object of a kind this operator handles. Raises ``KeyError`` otherwise."""
    return resource_path(api_version, _PLURALS[(api_version, kind)], namespace, name)


def error_from_api(method: str, path: str, exc: ApiException) -> KubeError:
    """The :class:`KubeError` for an ``ApiException`` (an HTTP error response, or status 0).

    The message and ``reason`` come from the ``Status`` body when there is one (else the first 500
    characters of the body); ``retry_after`` (seconds) from the ``Retry-After`` header (default 1).
    404 → :class:`NotFoundError`; 409, 429, 5xx → :class:`TransientError`; else
    :class:`PermanentError`.
    """
    code = int(exc.status or 0)
    raw = exc.body or b""
    text = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))[:500]
    status: dict[str, Any] = {}
    with contextlib.suppress(ValueError):
        decoded = json.loads(raw)
        if isinstance(decoded, dict):
            status = decoded
    message = f"{method} {path}: {code} {status.get('message') or text or exc.reason or ''}".rstrip()
    reason = str(status.get("reason", ""))
    if code == 404:
        return NotFoundError(message, status=code, reason=reason)
    if code in (409, 429) or code >= 500:
        retry_after = 1.0
        with contextlib.suppress(ValueError, TypeError):
            retry_after = float(exc.headers.get("Retry-After", "1") if exc.headers else "1")
        return TransientError(message, status=code, reason=reason, retry_after=retry_after)
    return PermanentError(message, status=code, reason=reason)


@dataclass
class Kube:
    """An async Kubernetes API client. Create with :meth:`from_environment`; close with :meth:`close`.

    ``api``: the ``kubernetes_asyncio`` ``ApiClient`` (connection pool, TLS, credentials);
    ``timeout``: seconds per request, total. ``writes`` counts write requests answered by the
    server, by ``(verb, plural)`` (also ``kubeinfer_operator_api_writes_total``).
    """

    api: ApiClient
    timeout: float = 30.0
    writes: Counter[tuple[str, str]] = field(default_factory=Counter)
    _refresh: asyncio.Task[None] | None = None

    @classmethod
    async def from_environment(
        cls, kubeconfig: str | None = None, *, timeout: float = 30.0, max_connections: int = 64
    ) -> Kube:
        """Connect with ``kubeconfig`` (or ``$KUBECONFIG``/``~/.kube/config``), else in-cluster.

        Call inside the running event loop (the pool and the refresh task belong to it).
        ``timeout``: seconds per request; ``max_connections``: the pool's limit.

        Raises:
            PermanentError: no usable configuration (file, context, credentials).
        """
        cfg = Configuration()
        refresh: asyncio.Task[None] | None = None
        default = os.path.expanduser("~/.kube/config")
        try:
            if kubeconfig or os.environ.get("KUBECONFIG") or os.path.exists(default):
                loader = await kconfig.load_kube_config(
                    config_file=kubeconfig or os.environ.get("KUBECONFIG") or default,
                    client_configuration=cfg,
                    persist_config=False,
                )
                if loader.provider == "gcp" or "exec" in (loader._user or {}):
                    # Expiring credentials: the library re-runs the plugin before they expire.
                    refresh = asyncio.create_task(
                        kconfig.refresh_token(loader, cfg),
                        name="kubeinfer-kube-token-refresh",
                    )
                    refresh.add_done_callback(_log_refresh_end)
            else:
                # try_refresh_token: re-read the rotating ServiceAccount token (at most once a minute).
                kconfig.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=cfg, try_refresh_token=True
                )
        except Exception as exc:  # ConfigException, OSError, YAML errors, a failing exec plugin ...
            raise PermanentError(f"cannot load Kubernetes credentials: {exc}") from exc
        cfg.connection_pool_maxsize = max_connections
        api = ApiClient(cfg)
        api.user_agent = "kubeinfer-operator"
        return cls(api=api, timeout=timeout, _refresh=refresh)

    async def close(self) -> None:
        """Stop the credential refresh task and close the connection pool."""
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refresh
            self._refresh = None
        await self.api.close()

    def _count_write(self, method: str, path: str) -> None:
        """Count a write request the server answered (any status)."""
        plural = _plural_of(path)
        self.writes[(method, plural)] += 1
        metrics.API_WRITES.labels(verb=method, resource=plural).inc()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """Send one request; the decoded JSON response body (``{}`` when empty).

        Raises:
            TransientError / PermanentError / NotFoundError: see the module docstring.
        """
        try:
            data = await self.api.call_api(
                path,
                method,
                query_params=params,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                response_types_map=_RAW_JSON,
                _return_http_data_only=True,
                _request_timeout=self.timeout,
            )
        except ApiException as exc:
            if method != "GET" and exc.status:
                self._count_write(method, path)
            raise error_from_api(method, path, exc) from exc
        except (aiohttp.ClientError, TimeoutError, OSError, kconfig.ConfigException) as exc:
            # No answer (connection, timeout), or the token file could not be re-read.
            raise TransientError(f"{method} {path}: {type(exc).__name__}: {exc}", retry_after=2.0) from exc
        if method != "GET":
            self._count_write(method, path)
        return data if isinstance(data, dict) else {}

    async def get(self, path: str) -> dict[str, Any] | None:
        """GET an object; ``None`` if it does not exist."""
        try:
            return await self._request("GET", path)
        except NotFoundError:
            return None

    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        """GET a collection; returns its ``items``."""
        params = {"labelSelector": label_selector} if label_selector else None
        items: list[dict[str, Any]] = (await self._request("GET", path, params=params)).get("items") or []
        return items

    async def create(self, collection_path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """POST ``obj`` to a collection. 409 AlreadyExists raises :class:`TransientError`."""
        return await self._request("POST", collection_path, body=obj)

    async def apply(self, obj: dict[str, Any], *, field_manager: str, force: bool = True) -> dict[str, Any]:
        """Server-side apply ``obj`` (must carry apiVersion, kind, metadata.name/namespace).

        Returns the object as stored. ``force`` takes ownership of conflicting fields (the
        controller's own objects: a hand edit of an owned field is put back).
        """
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        params = {"fieldManager": field_manager, "force": "true" if force else "false"}
        return await self._request(
            "PATCH", path, params=params, body=obj, content_type="application/apply-patch+yaml"
        )

    async def patch_merge(
        self, path: str, patch: dict[str, Any], *, field_manager: str, subresource: str | None = None
    ) -> dict[str, Any]:
        """JSON merge patch (RFC 7386) of an object or of its ``subresource`` (``status``, ``scale``)."""
        full = f"{path}/{subresource}" if subresource else path
        return await self._request(
            "PATCH",
            full,
            params={"fieldManager": field_manager},
            body=patch,
            content_type="application/merge-patch+json",
        )

    async def delete(self, path: str) -> bool:
        """DELETE an object (foreground-free, background propagation). False if it was already gone."""
        try:
            await self._request("DELETE", path, body={"propagationPolicy": "Background"})
        except NotFoundError:
            return False
        return True

    async def post_event(
        self,
        involved: dict[str, Any],
        *,
        reason: str,
        message: str,
        type_: str = "Normal",
        component: str = "kubeinfer-operator",
    ) -> None:
        """Create a ``core/v1`` Event about ``involved`` (a body with apiVersion, kind, metadata)."""
        meta = involved["metadata"]
        now = rfc3339.now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": component},
            "reportingComponent": f"kubeinfer.io/{component}",
            "reportingInstance": socket.gethostname()[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._request("POST", object_path("v1", "Event", meta["namespace"]), body=event)

    async def record_event(
        self, involved: dict[str, Any], *, reason: str, message: str, type_: str = "Normal"
    ) -> bool:
        """:meth:`post_event`, best effort: an API error is logged at WARNING, not raised.

        ``message`` is cut to 1000 characters. Returns True when the Event was created.
        """
        try:
            await self.post_event(involved, reason=reason, message=message[:1000], type_=type_)
        except KubeError as exc:
            logger.warning("posting Event %s failed: %s", reason, exc)
            return False
        return True

    async def retry_on_conflict(
        self,
        path: str,
        body: Mapping[str, Any],
        write: Callable[[Mapping[str, Any]], Awaitable[T]],
        *,
        attempts: int = 2,
    ) -> T | None:
        """``write(body)``; on 409 Conflict (a stale ``resourceVersion``: another writer was first)
        GET the object at ``path`` afresh and call ``write`` with it, at most ``attempts`` calls.

        Returns what ``write`` returned, or ``None`` when the object is gone (404 on the re-read).

        Raises:
            TransientError: the last attempt's 409, or any other transient error of ``write``.
            PermanentError: from ``write`` or the re-read.
        """
        current = body
        for attempt in range(attempts):
            try:
                return await write(current)
            except TransientError as exc:
                if exc.status != 409 or attempt == attempts - 1:
                    raise
            fresh = await self.get(path)
            if fresh is None:
                return None
            current = fresh
        return None


def _log_refresh_end(task: asyncio.Task[None]) -> None:
    """Log why the credential refresh task ended (it runs until :meth:`Kube.close`)."""
    if not task.cancelled() and task.exception() is not None:
        logger.error("Kubernetes credential refresh stopped: %r", task.exception())
