"""What the autoscaler's end-to-end tests share: a load generator and reads of one autoscaled
InferenceService (its status, Deployment, pods and Prometheus targets)."""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from typing import Any

import httpx
from kubeinfer.operator.api import parse_duration

from hack.devtools.prom import PrometheusServer
from tests.e2e.conftest import runtime_pods
from tests.support.cluster import Cluster

#: The bundled MiniLM's model name in the v2 URLs.
MODEL = "minilm"


class Load:
    """Requests to ``url`` (host:port) from an asyncio loop in a thread, one connection each.

    ``rate`` > 0: open loop, that many requests per second, paced on a schedule (a late send does not
    make the next one early by more than a second's worth); set ``rate`` while it runs to change it.
    ``concurrency`` > 0: closed loop. ``latencies`` holds ``(time.monotonic() at the response, seconds)``
    of every 200 response. Raises ValueError when neither ``rate`` nor ``concurrency`` is positive.
    """

    def __init__(
        self,
        url: str,
        *,
        rate: float = 0.0,
        concurrency: int = 0,
        text: str = "A short sentence.",
        max_connections: int = 512,
    ) -> None:
        if rate <= 0 and concurrency <= 0:
            raise ValueError("Load: rate > 0 (open loop) or concurrency > 0 (closed loop)")
        self.url = url
        self.rate = rate
        self.concurrency = concurrency
        self.sent = 0
        self.ok = 0
        self.latencies: list[tuple[float, float]] = []
        self._max_connections = max_connections
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def p99_since(self, since: float) -> tuple[float, int]:
        """The P99 latency, seconds, of the responses after ``since`` (``time.monotonic()``) and their
        count; ``(nan, 0)`` when there were none."""
        seconds = sorted(s for at, s in list(self.latencies) if at >= since)
        if not seconds:
            return math.nan, 0
        return seconds[min(len(seconds) - 1, math.ceil(0.99 * len(seconds)) - 1)], len(seconds)

    async def _one(self, client: httpx.AsyncClient) -> None:
        self.sent += 1
        started = time.monotonic()
        try:
            r = await client.post(f"http://{self.url}/v2/models/{MODEL}/infer", json=self._body)
            if r.status_code == 200:
                self.ok += 1
                done = time.monotonic()
                self.latencies.append((done, done - started))
        except httpx.HTTPError:
            await asyncio.sleep(0.05)

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=self._max_connections, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=10.0, limits=limits, headers={"Connection": "close"}) as client:
            if self.concurrency:

                async def worker() -> None:
                    while not self._stop.is_set():
                        await self._one(client)

                await asyncio.gather(*(worker() for _ in range(self.concurrency)))
                return
            tasks: set[asyncio.Task[None]] = set()
            due = time.monotonic()
            while not self._stop.is_set():
                task = asyncio.create_task(self._one(client))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                due = max(due + 1.0 / self.rate, time.monotonic() - 1.0)
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            if tasks:
                await asyncio.wait(tasks, timeout=10)


def gauge(target: str, metric: str) -> float | None:
    """A metric's value on a runtime pod's /metrics (``target`` is ``<pod IP>:8080``), ``None`` if absent."""
    text = httpx.get(f"http://{target}/metrics", timeout=5).text
    m = re.search(rf"^{metric}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def ready(pod: dict[str, Any]) -> bool:
    """Whether the pod's Ready condition is True."""
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


class ServiceView:
    """Reads of InferenceService ``name`` in ``namespace``, its Deployment, pods and Prometheus targets."""

    def __init__(self, cluster: Cluster, namespace: str, prometheus: PrometheusServer, name: str) -> None:
        self.cluster, self.namespace, self.prometheus, self.name = cluster, namespace, prometheus, name

    def ready_targets(self) -> list[str]:
        """``<pod IP>:8080`` of the Ready runtime pods."""
        pods = runtime_pods(self.cluster, self.namespace, self.name)
        return [f"{p['status']['podIP']}:8080" for p in pods if ready(p)]

    def isvc(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.cluster.get_json(
            "inferenceservices.kubeinfer.io", self.name, "-n", self.namespace
        )
        return obj

    def replicas(self) -> int:
        return int(self.cluster.get_json("deployment", self.name, "-n", self.namespace)["spec"]["replicas"])

    def max_queue_delay_seconds(self) -> float | None:
        text = (self.isvc().get("status") or {}).get("maxQueueDelay")
        return parse_duration(text) if text else None

    def last_decision(self) -> dict[str, Any]:
        return dict((self.isvc().get("status") or {}).get("lastDecision") or {})

    def decision_time(self) -> Any:
        return self.last_decision().get("time")

    def condition(self) -> tuple[str, str]:
        for c in (self.isvc().get("status") or {}).get("conditions") or []:
            if c.get("type") == "AutoscalingActive":
                return str(c.get("status")), str(c.get("reason"))
        return "", ""

    def scraped(self, target: str) -> bool:
        return any(
            t["labels"].get("instance") == target
            and t["health"] == "up"
            and t["labels"].get("inferenceservice") == self.name
            for t in self.prometheus.active_targets()
        )

    def url(self) -> str:
        svc = self.cluster.get_json("service", self.name, "-n", self.namespace)
        port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "http")
        return f"{svc['spec']['clusterIP']}:{port}"
