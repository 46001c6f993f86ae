"""The controllers' lifecycle: the reconciler and the autoscaler created together from the settings,
both forgetting a deleted InferenceService, both closed at cleanup; the handlers registered with the
settings read once (nothing at import)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf
from kubeinfer.operator import handlers
from kubeinfer.operator.autoscale import loop
from kubeinfer.operator.autoscale.policy import Observation, restore_state
from kubeinfer.operator.autoscale.signals import Reading
from kubeinfer.operator.controllers import Controllers
from kubeinfer.operator.settings import Settings


class FakeKube:
    """The API client's lifecycle and the requests a reconcile of nothing makes."""

    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class FakeSignals:
    def __init__(self) -> None:
        self.closed = False

    def read(self, queries: Any, stale_after_seconds: float) -> Reading:
        return Reading(Observation.unknown("down"), "PrometheusUnavailable")

    def close(self) -> None:
        self.closed = True


SETTINGS = Settings.from_env(
    {"KUBEINFER_AUTOSCALE_INTERVAL_SECONDS": "7", "KUBEINFER_RESYNC_SECONDS": "42", "KUBEINFER_PEERING": ""}
)
BODY = {"metadata": {"name": "m", "namespace": "ns", "resourceVersion": "3"}}


def controllers() -> tuple[Controllers, FakeKube]:
    kube = FakeKube()
    return Controllers.create(kube, SETTINGS), kube  # type: ignore[arg-type]


def nothing(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    return None


def test_both_controllers_share_the_client_and_the_settings() -> None:
    c, kube = controllers()
    assert c.reconciler.kube is kube and c.autoscaler.kube is kube
    assert c.autoscaler.interval_seconds == 7.0
    assert c.reconciler.status_writer.field_manager == "kubeinfer"
    assert c.autoscaler.status_writer.field_manager == "kubeinfer-autoscaler"


async def test_a_deleted_inferenceservice_is_forgotten_by_both() -> None:
    c, _ = controllers()
    c.reconciler.bodies[("ns", "m")] = BODY
    c.reconciler._failures[("ns", "m")] = 2
    c.reconciler.status_writer._stored[("ns", "m")] = BODY
    c.autoscaler._memory[("ns", "m")] = loop_memory()
    c.autoscaler.status_writer._stored[("ns", "m")] = BODY
    await c.isvc_event("DELETED", BODY, nothing)
    assert ("ns", "m") not in c.reconciler.bodies and ("ns", "m") not in c.reconciler._failures
    assert ("ns", "m") not in c.reconciler.status_writer._stored
    assert ("ns", "m") not in c.autoscaler._memory and ("ns", "m") not in c.autoscaler.status_writer._stored


def loop_memory() -> Any:
    from kubeinfer.operator.autoscale.loop import _Memory

    return _Memory(restore_state(now=0.0))


async def test_close_closes_the_prometheus_client_the_retries_and_the_api_client() -> None:
    c, kube = controllers()
    signals = FakeSignals()
    c.autoscaler.signals_factory = lambda: signals  # type: ignore[assignment,return-value]
    c.autoscaler._signals = signals  # type: ignore[assignment]
    retry = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
    c.reconciler._retries[("ns", "m")] = retry
    await c.close()
    await asyncio.sleep(0)
    assert signals.closed and kube.closed and retry.cancelled()
    assert c.reconciler._retries == {} and c.autoscaler._signals is None


async def test_owned_and_pod_events_without_an_owner_or_at_listing_do_nothing() -> None:
    c, _ = controllers()
    c.reconciler._applied[("Deployment", "ns", "m")] = {"kind": "Deployment"}
    await c.owned_event("ADDED", "Deployment", "ns", "m", None, nothing)
    assert ("Deployment", "ns", "m") in c.reconciler._applied
    await c.owned_event("DELETED", "Deployment", "ns", "m", None, nothing)  # deleted by hand: forgotten
    assert ("Deployment", "ns", "m") not in c.reconciler._applied
    await c.pod_event("MODIFIED", None, nothing)
    await c.resync(BODY, nothing, indexed=False)  # an object gone from the index: no reconcile
    assert c.reconciler.bodies == {}


async def test_an_autoscale_step_that_changed_the_max_queue_delay_is_applied_by_the_reconciler() -> None:
    """The autoscaler writes status only; the InferenceService it stored with the new max queue delay
    goes to the reconciler (the one writer of the ConfigMap); a step that changed nothing does not."""
    c, _ = controllers()
    stored = {**BODY, "status": {"maxQueueDelay": "4ms"}}
    results = iter(
        [loop.TickResult(None, "Active", wrote_status=True, stored=stored), loop.TickResult(None, "Active")]
    )
    seen: list[tuple[Mapping[str, Any], Mapping[str, Any] | None]] = []

    async def tick(
        body: Mapping[str, Any], deployment: Mapping[str, Any] | None, *, on_zero: Any = None
    ) -> loop.TickResult:
        seen.append((body, deployment))
        return next(results)

    reconciled: list[Mapping[str, Any]] = []

    async def reconcile(body: Mapping[str, Any], lookup: Any, *, latest: bool = False) -> None:
        reconciled.append(body)

    c.autoscaler.tick = tick  # type: ignore[method-assign]
    c.reconciler.reconcile = reconcile  # type: ignore[method-assign]
    deployment = {"kind": "Deployment"}
    await c.autoscale(BODY, lambda kind, ns, name: deployment if kind == "Deployment" else None)
    assert seen == [(BODY, deployment)] and reconciled == [stored]
    await c.autoscale(BODY, nothing)
    assert reconciled == [stored]


def test_handlers_register_with_the_settings_intervals_and_nothing_at_import() -> None:
    registry = kopf.OperatorRegistry()
    assert handlers.register(SETTINGS, registry) is registry
    timers = {h.id: h for h in registry._spawning.get_all_handlers() if hasattr(h, "interval")}
    assert (timers["resync"].interval, timers["resync"].initial_delay) == (42.0, 42.0)  # type: ignore[attr-defined]
    assert timers["autoscale"].interval == 7.0  # type: ignore[attr-defined]
    watched = {h.id for h in registry._watching.get_all_handlers()}
    assert {"isvc_event", "pod_event", "kubeinfer_deployments_event"} <= watched
    assert {h.id for h in registry._activities.get_all_handlers()} >= {"startup", "cleanup"}
    default = kopf.get_default_registry()
    assert not [h for h in default._spawning.get_all_handlers() if h.id in ("resync", "autoscale")]


async def test_a_pooled_services_timer_ticks_its_pools_autoscaler_with_the_pools_models() -> None:
    c, _ = controllers()
    seen: list[tuple[Any, Any, list[str]]] = []

    async def not_due(namespace: str, pool: str) -> bool:
        return False

    async def tick_pool(body: Any, deployment: Any, models: Any = ()) -> None:
        seen.append((body, deployment, [m.name for m in models]))

    c.poller.poll_if_due = not_due  # type: ignore[method-assign]
    c.autoscaler.tick_pool = tick_pool  # type: ignore[method-assign]
    pool = {"metadata": {"name": "small", "namespace": "ns"}, "spec": {"memoryBudget": "1Gi"}}

    def isvc(name: str, pool: str, namespace: str = "ns") -> dict[str, Any]:
        spec = {"pool": pool, "model": {"uri": "/models/x", "name": name}}
        return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}

    deployment = {"metadata": {"name": "small"}, "spec": {"replicas": 2}}

    def lookup(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return deployment if (kind, namespace, name) == ("Deployment", "ns", "small") else None

    members = [isvc("b", "small"), isvc("a", "small"), isvc("c", "other"), isvc("d", "small", "elsewhere")]
    await c.poll_pool(pool, iter(members), lookup)
    assert seen == [(pool, deployment, ["a", "b"])]


async def test_a_deleted_pool_is_forgotten_by_the_autoscaler() -> None:
    c, _ = controllers()
    c.autoscaler._pool_memory[("ns", "small")] = loop_memory()
    c.autoscaler.pool_status_writer._stored[("ns", "small")] = BODY
    await c.pool_event("DELETED", {"metadata": {"name": "small", "namespace": "ns"}}, [], nothing)
    assert ("ns", "small") not in c.autoscaler._pool_memory
    assert ("ns", "small") not in c.autoscaler.pool_status_writer._stored
