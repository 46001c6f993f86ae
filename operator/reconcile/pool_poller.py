"""The operator's reads of a pool's replicas: each ready pod's model repository index (``POST
/v2/repository/index`` at the pod's IP and its ``http`` container port), kept per pool as a
:class:`~kubeinfer.operator.reconcile.poolindex.PoolIndex` for the statuses (the mapping is pure:
:mod:`kubeinfer.operator.reconcile.poolindex`).

Why the index and not Prometheus: the cause of a failed load is a sentence, and a sentence does not
belong in a metric's label; the index also names the pod, and reading it needs no Prometheus.

A pool is polled at most once per ``interval`` seconds (the autoscaler's interval: the timers of its
InferenceServices ask, the first one due polls). The pods are listed from the API server (one read).
A pod that does not answer is left out of the index; it is logged once when it stops answering and once
when it answers again, not on every poll.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from kubeinfer.operator import k8s
from kubeinfer.operator.reconcile.poolindex import IndexEntry, PoolIndex, index_url, parse_index

from kubeinfer.contract.pool import POOL_LABEL

logger = logging.getLogger(__name__)

__all__ = ["PoolPoller"]

#: Seconds one pod has to answer its index.
INDEX_TIMEOUT_SECONDS = 5.0


@dataclass
class PoolPoller:
    """Polls the pools' ready pods; ``indexes``: (namespace, pool) -> the latest :class:`PoolIndex` (read
    by the reconcilers). ``clock``: monotonic seconds."""

    kube: k8s.Kube
    interval: float = 15.0
    timeout: float = INDEX_TIMEOUT_SECONDS
    clock: Callable[[], float] = time.monotonic
    indexes: dict[tuple[str, str], PoolIndex] = field(default_factory=dict)
    _polled_at: dict[tuple[str, str], float] = field(default_factory=dict)
    #: (namespace, pool, pod or "" for the pool's listing) -> what was logged when it started failing
    _failing: dict[tuple[str, str, str], str] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = None

    def forget(self, namespace: str, pool: str) -> None:
        """Drop what is kept of a deleted pool."""
        self.indexes.pop((namespace, pool), None)
        self._polled_at.pop((namespace, pool), None)
        for key in [k for k in self._failing if k[:2] == (namespace, pool)]:
            del self._failing[key]

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def poll_if_due(self, namespace: str, pool: str) -> bool:
        """Poll the pool unless it was polled less than ``interval`` seconds ago (90 %: the timers that ask
        drift). Returns whether its index changed. Never raises for an API error or a pod's failure
        (logged)."""
        key = (namespace, pool)
        now = self.clock()
        last = self._polled_at.get(key)
        if last is not None and now - last < 0.9 * self.interval:
            return False
        self._polled_at[key] = now
        index = await self._poll(namespace, pool)
        if index is None or self.indexes.get(key) == index:
            return False
        self.indexes[key] = index
        return True

    async def _poll(self, namespace: str, pool: str) -> PoolIndex | None:
        """The pool's index now; ``None`` when its pods cannot be listed (the last one is kept)."""
        try:
            pods = await self.kube.list(k8s.POD.path(namespace), label_selector=f"{POOL_LABEL}={pool}")
        except k8s.KubeError as exc:
            self._failed((namespace, pool, ""), f"ModelPool {namespace}/{pool}: cannot list its pods: {exc}")
            return None
        self._answered((namespace, pool, ""), f"ModelPool {namespace}/{pool}: its pods are listed again")
        targets = {str(p["metadata"]["name"]): url for p in pods if (url := index_url(p)) is not None}
        names = sorted(targets)
        for gone in [k for k in self._failing if k[:2] == (namespace, pool) and k[2] and k[2] not in targets]:
            del self._failing[gone]  # a pod deleted or not ready any more: a new spell when it is again
        answers = await asyncio.gather(*(self._index((namespace, pool, pod), targets[pod]) for pod in names))
        return PoolIndex({pod: found for pod, found in zip(names, answers, strict=True) if found is not None})

    async def _index(self, key: tuple[str, str, str], url: str) -> dict[str, IndexEntry] | None:
        """The index of the pod ``key`` (namespace, pool, pod); ``None`` when it does not answer with one
        (logged once per spell)."""
        namespace, _, pod = key
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        try:
            async with self._session.post(url, json={}) as response:
                if response.status != 200:
                    raise ValueError(f"HTTP {response.status}")
                doc: object = await response.json(content_type=None)
            found = parse_index(doc)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            cause = str(exc) or type(exc).__name__
            self._failed(key, f"pod {namespace}/{pod}: no model repository index from {url}: {cause}")
            return None
        self._answered(key, f"pod {namespace}/{pod}: its model repository index answers again")
        return found

    def _failed(self, key: tuple[str, str, str], message: str) -> None:
        if key not in self._failing:
            logger.warning("%s", message)
        self._failing[key] = message

    def _answered(self, key: tuple[str, str, str], message: str) -> None:
        if self._failing.pop(key, None) is not None:
            logger.info("%s", message)
