"""The only module of the operator that talks to the Kubernetes API server.

An async client (aiohttp, kopf's own HTTP client) with the credentials of the kubeconfig or the
in-cluster service account (loaded with the official ``kubernetes`` client's loaders). It speaks
raw JSON (no model classes), server-side apply (``application/apply-patch+yaml``), merge patches for
status, and wraps failures in a small hierarchy:

- :class:`TransientError` — worth retrying after a delay: 409 Conflict, 429, 5xx, connection errors,
  timeouts (``retry_after`` seconds, from ``Retry-After`` when the server sends it);
- :class:`PermanentError` — retrying will not help: 400, 401, 403, 422 ...; the reconciler turns it
  into a ``Ready=False`` condition and an Event, without a retry storm;
- :class:`NotFoundError` — 404 (a :class:`PermanentError`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import ssl
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubeinfer.operator import metrics

_PLURALS: dict[tuple[str, str], str] = {
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Event"): "events",
    ("v1", "Pod"): "pods",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
}


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


@dataclass
class Kube:
    """An async Kubernetes API client. Create with :meth:`from_environment`; close with :meth:`close`.

    ``writes`` counts write requests sent, by ``(verb, plural)`` (the operator's own metrics).
    """

    base_url: str
    headers: dict[str, str]
    ssl_context: ssl.SSLContext | bool
    timeout: float = 30.0
    max_connections: int = 64
    writes: Counter[tuple[str, str]] = field(default_factory=Counter)
    _session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        """The session, created on first use (inside the running event loop)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self.ssl_context, limit=self.max_connections)
            self._session = aiohttp.ClientSession(
                base_url=self.base_url,
                headers=self.headers,
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            )
        return self._session

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None, *, timeout: float = 30.0) -> Kube:
        """Credentials from ``kubeconfig`` (or ``$KUBECONFIG``/``~/.kube/config``), else in-cluster.

        Raises:
            PermanentError: no usable configuration.
        """
        from kubernetes import client as kclient
        from kubernetes import config as kconfig

        cfg = kclient.Configuration()
        try:
            if (
                kubeconfig
                or os.environ.get("KUBECONFIG")
                or os.path.exists(os.path.expanduser("~/.kube/config"))
            ):
                kconfig.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=kubeconfig, client_configuration=cfg, persist_config=False
                )
            else:
                kconfig.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise PermanentError(f"cannot load Kubernetes credentials: {exc}") from exc
        headers = {"Accept": "application/json", "User-Agent": "kubeinfer-operator"}
        token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
        if token:
            prefix = cfg.api_key_prefix.get("authorization", "")
            headers["Authorization"] = (
                f"{prefix} {token}".strip() if not token.startswith("Bearer") else token
            )
        verify: ssl.SSLContext | bool
        if cfg.verify_ssl:
            ctx = (
                ssl.create_default_context(cafile=cfg.ssl_ca_cert)
                if cfg.ssl_ca_cert
                else ssl.create_default_context()
            )
            if cfg.cert_file and cfg.key_file:
                ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
            verify = ctx
        else:
            verify = False
        return cls(base_url=cfg.host, headers=headers, ssl_context=verify, timeout=timeout)

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        content = json.dumps(body).encode("utf-8") if body is not None else None
        headers = {"Content-Type": content_type} if content is not None else {}
        try:
            async with self._client().request(
                method, path, params=params, data=content, headers=headers
            ) as response:
                code = response.status
                raw = await response.read()
                retry_header = response.headers.get("Retry-After", "1")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise TransientError(f"{method} {path}: {type(exc).__name__}: {exc}", retry_after=2.0) from exc
        if method != "GET":
            self.writes[(method, _plural_of(path))] += 1
            metrics.API_WRITES.labels(verb=method, resource=_plural_of(path)).inc()
        if code < 400:
            data: dict[str, Any] = json.loads(raw) if raw else {}
            return data
        try:
            status: dict[str, Any] = json.loads(raw)
        except ValueError:
            status = {}
        text = raw[:500].decode("utf-8", "replace")
        message = f"{method} {path}: {code} {status.get('message') or text}"
        reason = str(status.get("reason", ""))
        if code == 404:
            raise NotFoundError(message, status=code, reason=reason)
        if code in (409, 429) or code >= 500:
            retry_after = 1.0
            with contextlib.suppress(ValueError, TypeError):
                retry_after = float(retry_header)
            raise TransientError(message, status=code, reason=reason, retry_after=retry_after)
        raise PermanentError(message, status=code, reason=reason)

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
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
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
