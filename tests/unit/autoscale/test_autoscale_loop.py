"""loop.py: spec → policy, status rendering, and the write-only-on-change logic of one tick.

The Kubernetes client is replaced by a recorder of the requests the tick would send (the real API
server is exercised in tests/integration/autoscale); Prometheus by a canned ``Reading``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from kubeinfer.operator import api, k8s
from kubeinfer.operator.autoscale import loop
from kubeinfer.operator.autoscale.policy import Observation
from kubeinfer.operator.autoscale.signals import Reading, SignalError


class Recorder:
    """Records the write requests ``Autoscaler`` sends (the subset of ``k8s.Kube`` it uses)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        #: the path of each patch, in order
        self.paths: list[str] = []
        #: the kind of each Event's involved object, in order
        self.involved: list[str] = []

    async def patch_merge(
        self, path: str, patch: dict[str, Any], *, field_manager: str, subresource: str | None = None
    ) -> dict[str, Any]:
        self.calls.append((f"patch {subresource} {field_manager}", patch))
        self.paths.append(path)
        # what the API server stores, less all but the patch; an old resourceVersion, so that the
        # status writer keeps comparing with the bodies the test hands in
        return {**patch, "metadata": {"resourceVersion": "0"}}

    async def apply(self, obj: dict[str, Any], *, field_manager: str, force: bool = True) -> dict[str, Any]:
        self.calls.append((f"apply {obj['kind']} {field_manager}", obj))
        return obj

    async def post_event(
        self, involved: dict[str, Any], *, reason: str, message: str, type_: str = "Normal"
    ) -> None:
        self.calls.append(("event", reason))
        self.involved.append(str(involved.get("kind")))

    async def get(self, path: str) -> dict[str, Any] | None:
        return None

    # the real helpers of k8s.Kube, over this stand-in's requests
    record_event = k8s.Kube.record_event
    retry_on_conflict = k8s.Kube.retry_on_conflict


class CannedSignals:
    def __init__(self) -> None:
        self.reading = Reading(Observation(0.2, 0.5, 5.0, 1.0, 1.0), None)
        self.samples: list[tuple[float, float]] | SignalError = []
        self.history_calls: list[tuple[str, dt.datetime, dt.datetime, float]] = []
        #: The answer to an instant query (the quantization figures'), or its failure.
        self.instant: list[dict[str, Any]] | SignalError = []
        self.queries: list[str] = []

    def read(self, queries: Any, window_seconds: float) -> Reading:
        return self.reading

    def query(self, promql: str) -> list[dict[str, Any]]:
        self.queries.append(promql)
        if isinstance(self.instant, SignalError):
            raise self.instant
        return self.instant

    def history(
        self, promql: str, start: dt.datetime, end: dt.datetime, step: float
    ) -> list[tuple[float, float]]:
        self.history_calls.append((promql, start, end, step))
        if isinstance(self.samples, SignalError):
            raise self.samples
        return self.samples

    def close(self) -> None:
        pass


def body(
    status: dict[str, Any] | None = None, quantization: dict[str, Any] | None = None, **autoscaling: Any
) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "svc", "namespace": "ns", "generation": 1, "resourceVersion": "7", "uid": "u"},
        "spec": {
            "batching": {"maxQueueDelay": "10ms"},
            "autoscaling": {"enabled": True, "targetP99": "200ms", "maxReplicas": 4, **autoscaling},
            **({} if quantization is None else {"quantization": quantization}),
        },
        "status": status or {},
    }


DEPLOYMENT = {"spec": {"replicas": 2}, "status": {"readyReplicas": 2}}


def scaler() -> tuple[loop.Autoscaler, Recorder, CannedSignals]:
    rec, canned = Recorder(), CannedSignals()
    clock = iter(range(0, 10_000, 15))
    a = loop.Autoscaler(
        kube=rec,  # type: ignore[arg-type]
        signals_factory=lambda: canned,  # type: ignore[arg-type,return-value]
        monotonic=lambda: float(next(clock)),
        wall=lambda: dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )
    return a, rec, canned


def test_autoscale_loop_policy_from_spec_converts_durations() -> None:
    spec = api.AutoscalingSpec(
        enabled=True,
        target_p99="150ms",
        max_queue_delay=api.MaxQueueDelayBounds(min="2ms", max="40ms"),
    )
    p = loop.policy_from_spec(spec, stale_after_seconds=90)
    assert p.target_p99_seconds == pytest.approx(0.15)
    assert (p.max_queue_delay_min_seconds, p.max_queue_delay_max_seconds) == pytest.approx((0.002, 0.04))
    assert p.scale_down_stabilization_seconds == 300 and p.tolerance == 0.1
    assert p.plan_utilization == 0.85  # the CRD's default is the policy's
    headroom = api.AutoscalingSpec(enabled=True, plan_utilization=0.6)
    assert loop.policy_from_spec(headroom, stale_after_seconds=90).plan_utilization == 0.6
    assert loop.prom_duration(10.0) == "10000ms" and loop.prom_duration(1.5) == "1500ms"


def test_autoscale_loop_condition_only_on_status_or_reason_change() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "Ready"}
    conds = loop.condition_after([ready], "False", "PrometheusUnavailable", "down", "T1", 1)
    assert conds is not None and conds[0] == ready
    assert conds[1]["reason"] == "PrometheusUnavailable" and conds[1]["lastTransitionTime"] == "T1"
    assert loop.condition_after(conds, "False", "PrometheusUnavailable", "other message", "T2", 1) is None
    again = loop.condition_after(conds, "False", "StaleMetrics", "stale", "T3", 1)
    assert again is not None and again[1]["lastTransitionTime"] == "T1"  # status unchanged: time kept


def test_autoscale_loop_observed_never_zero() -> None:
    out = loop.observed_status(Observation.unknown("Prometheus unavailable"), "T")
    assert out["p99Seconds"] is None and out["gpuUtilization"] is None and out["unknownReason"]
    assert out["arrivalRate"] is None and out["serviceTimeSlopeSeconds"] is None
    # what the SLO-capacity rule read is in status, beside P99 and utilization
    seen = Observation(
        0.05,
        0.4,
        request_rate=100.0,
        arrival_rate=120.5,
        inflight_requests=7.0,
        service_time_a_seconds=0.004,
        service_time_c_seconds=0.00075,
        max_batch_size=32.0,
    )
    out = loop.observed_status(seen, "T")
    assert (out["arrivalRate"], out["inflightRequests"]) == (120.5, 7.0)
    assert (out["serviceTimeInterceptSeconds"], out["serviceTimeSlopeSeconds"]) == (0.004, 0.00075)


async def test_autoscale_loop_disabled_touches_nothing() -> None:
    a, rec, _ = scaler()
    b = body(enabled=False)
    assert await a.tick(b, DEPLOYMENT) is None
    assert rec.calls == []


async def test_autoscale_loop_writes_only_on_change() -> None:
    a, rec, canned = scaler()
    status: dict[str, Any] = {"maxQueueDelay": "10ms"}
    # Tick 1, in the tolerance band: only the condition (first time) is written.
    r = await a.tick(body(status), DEPLOYMENT)
    assert r is not None and not r.decision.changed and r.stored is None  # type: ignore[union-attr]
    assert [c[0] for c in rec.calls] == ["patch status kubeinfer-autoscaler"]
    status.update(rec.calls[0][1]["status"])
    rec.calls.clear()
    # Tick 2, same signals, status now carries the condition: no request at all.
    await a.tick(body(status), DEPLOYMENT)
    assert rec.calls == []
    # Tick 3, P99 over target with idle GPUs: max queue delay halves → status and Event; no ConfigMap:
    # the tick hands the stored object to the reconciler (controllers), the one writer of owned objects.
    canned.reading = Reading(Observation(0.4, 0.2, 5.0, 3.0, 1.0), None)
    r = await a.tick(body(status), DEPLOYMENT)
    assert r is not None and r.decision is not None and r.decision.max_queue_delay_changed
    kinds = [c[0] for c in rec.calls]
    assert kinds == ["patch status kubeinfer-autoscaler", "event"]
    patch = rec.calls[0][1]["status"]
    assert (
        patch["maxQueueDelay"] == "5ms" and "max queue delay 10 ms → 5 ms" in patch["lastDecision"]["reason"]
    )
    assert r.stored is not None and r.stored["status"]["maxQueueDelay"] == "5ms"
    status.update(patch)
    rec.calls.clear()
    # Tick 4, Prometheus down: the condition flips (one write), nothing else moves.
    canned.reading = Reading(Observation.unknown("Prometheus unavailable at x"), "PrometheusUnavailable")
    await a.tick(body(status), DEPLOYMENT)
    assert [c[0] for c in rec.calls] == ["patch status kubeinfer-autoscaler"]
    cond = rec.calls[0][1]["status"]["conditions"][-1]
    assert (cond["status"], cond["reason"]) == ("False", "PrometheusUnavailable")
    status.update(rec.calls[0][1]["status"])
    rec.calls.clear()
    await a.tick(body(status), DEPLOYMENT)
    assert rec.calls == []


async def test_autoscale_loop_scales_through_the_scale_subresource() -> None:
    a, rec, canned = scaler()
    canned.reading = Reading(Observation(0.5, 0.95, 100.0, 500.0, 1.0), None)
    r = await a.tick(body({"maxQueueDelay": "10ms"}), DEPLOYMENT)
    assert r is not None and r.scaled
    scale = [c for c in rec.calls if c[0] == "patch scale kubeinfer-autoscaler"]
    assert scale and scale[0][1] == {"spec": {"replicas": 4}}


async def test_autoscale_loop_hold_kind_shows_in_the_condition_once_per_transition() -> None:
    a, rec, canned = scaler()
    status: dict[str, Any] = {"maxQueueDelay": "10ms"}

    async def tick(obs: Observation) -> list[dict[str, Any]]:
        canned.reading = Reading(obs, None)
        rec.calls.clear()
        r = await a.tick(body(status), DEPLOYMENT)
        assert r is not None and r.decision is not None and not r.decision.changed
        writes = [c[1]["status"] for c in rec.calls]
        for w in writes:
            status.update(w)
        assert [c[0] for c in rec.calls] == ["patch status kubeinfer-autoscaler"] * len(writes)
        return writes

    def condition() -> tuple[str, str, str]:
        c = status["conditions"][-1]
        return c["status"], c["reason"], c["message"]

    # In the tolerance band: the kind of hold is the condition's reason, its words the message.
    assert len(await tick(Observation(0.2, 0.5, 5.0, 1.0, 1.0))) == 1
    assert condition()[:2] == ("True", "WithinTolerance") and "P99 0.20 s within 10%" in condition()[2]
    # Same kind, new numbers: nothing is written (the zero-writes-per-steady-resync rule).
    assert await tick(Observation(0.21, 0.55, 6.0, 2.0, 1.0)) == []
    # Another kind: P99 over target with busy GPUs, but 1 request in flight at 100/s (10 ms): one write.
    assert len(await tick(Observation(0.4, 0.95, 100.0, 0.0, 1.0, inflight_requests=1.0))) == 1
    assert condition()[:2] == ("True", "BacklogDrained") and "backlog drained" in condition()[2]
    assert await tick(Observation(0.45, 0.9, 120.0, 0.0, 1.0, inflight_requests=2.0)) == []
    # Prometheus answered, but no request completed while some are queued: False, says why.
    assert len(await tick(Observation(None, 0.5, 0.0, 4.0, 1.0))) == 1
    assert condition()[:2] == ("False", "UnusableSignals") and "4 are queued" in condition()[2]


async def test_autoscale_loop_prometheus_outage_logs_once_and_backs_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, rec, canned = scaler()  # ticks every 15 s on the monotonic clock; interval 15 s
    reads: list[float] = []
    read = canned.read

    def counting_read(queries: Any, window_seconds: float) -> Reading:
        reads.append(1.0)
        return read(queries, window_seconds)

    canned.read = counting_read  # type: ignore[method-assign]
    canned.reading = Reading(Observation.unknown("P99: Prometheus unavailable at x"), "PrometheusUnavailable")
    status: dict[str, Any] = {"maxQueueDelay": "10ms"}
    with caplog.at_level("INFO", logger="kubeinfer.operator.autoscale"):
        for _ in range(16):  # 16 ticks, 0..225 s: reads at 0, 15, 45, 105, 225 s (15 · 2^n back-off)
            await a.tick(body(status), DEPLOYMENT)
            for call in rec.calls:
                status.update(call[1].get("status") or {})
            rec.calls.clear()
    assert len(reads) == 5
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "PrometheusUnavailable" in warnings[0].getMessage()
    # Prometheus is back: the next read (after the back-off) says so once, at INFO, and reads resume
    canned.reading = Reading(Observation(0.2, 0.5, 5.0, 1.0, 1.0), None)
    caplog.clear()
    with caplog.at_level("INFO", logger="kubeinfer.operator.autoscale"):
        for _ in range(30):  # 240..675 s: the back-off ends at 345 s (225 + the 120 s cap)
            await a.tick(body(status), DEPLOYMENT)
    assert [r.getMessage() for r in caplog.records if "readable again" in r.getMessage()] == [
        "autoscale ns/svc: signals readable again"
    ]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(reads) == 5 + 23  # 345, 360, ... 675 s: every tick reads again


async def test_autoscale_loop_status_write_dropped_when_the_spec_moved_meanwhile() -> None:
    """A tick decided on generation 1; its status patch meets a 409 and the re-read object is at
    generation 2 (autoscaling turned off, say, and AutoscalingActive removed by the operator): the
    decision for the old spec writes nothing."""
    a, rec, _ = scaler()
    newer = body(enabled=False)
    newer["metadata"]["generation"] = 2
    attempts: list[dict[str, Any]] = []

    async def conflict(
        path: str, patch: dict[str, Any], *, field_manager: str, subresource: str | None = None
    ) -> dict[str, Any]:
        attempts.append(patch)
        raise k8s.TransientError("conflict", status=409)

    async def get(path: str) -> dict[str, Any] | None:
        return newer

    rec.patch_merge = conflict  # type: ignore[method-assign]
    rec.get = get  # type: ignore[method-assign]
    r = await a.tick(body({"maxQueueDelay": "10ms"}), DEPLOYMENT)
    assert r is not None and not r.wrote_status
    assert len(attempts) == 1  # the first attempt only: no second write on the newer generation


#: 1000 requests/s arriving, with the runtime's s(b) known: the SLO-capacity rule and the burst headroom
#: decide (s(b) = 10 ms + 1 ms*b, B = 32: 762 requests/s per replica at the 200 ms target).
BUSY = Observation(
    p99_seconds=0.1,
    gpu_utilization=0.6,
    request_rate=1000.0,
    queue_size=1.0,
    sample_age_seconds=1.0,
    inflight_requests=5.0,
    arrival_rate=1000.0,
    service_time_a_seconds=0.01,
    service_time_c_seconds=0.001,
    max_batch_size=32.0,
)
WALL = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()


async def test_autoscale_loop_restart_reads_the_burst_history_back() -> None:
    # An operator restarted: the last 30 minutes of arrival rates (1000/s with two x1.8 bursts) are read
    # back from Prometheus on the first tick, so the burst headroom stands at once instead of the surge
    # prior that a service without history gets.
    a, _, canned = scaler()
    canned.reading = Reading(BUSY, None)
    ages = range(1785, 0, -15)
    canned.samples = [(WALL - age, 1800.0 if age in (1500, 900) else 1000.0) for age in ages]
    r = await a.tick(body({"maxQueueDelay": "10ms"}), DEPLOYMENT)
    assert r is not None and r.decision is not None
    assert "burst headroom x1.80 learned from 2 bursts" in r.decision.reason, r.decision.reason
    ((promql, start, end, step),) = canned.history_calls
    assert "kubeinfer_requests_total" in promql and step == 15.0
    assert (WALL - start.timestamp(), WALL - end.timestamp()) == (1800.0, 15.0)
    assert len(r.decision.state.arrivals) == len(ages) + 1  # the history, then this tick's sample
    # read once: the next tick does not query the history again
    await a.tick(body({"maxQueueDelay": "10ms"}), DEPLOYMENT)
    assert len(canned.history_calls) == 1

    fresh, _, canned = scaler()  # no history (a new service): the surge prior, not a learned factor
    canned.reading = Reading(BUSY, None)
    r = await fresh.tick(body({"maxQueueDelay": "10ms"}), DEPLOYMENT)
    assert r is not None and r.decision is not None and "surge prior" in r.decision.reason


async def test_autoscale_loop_history_failure_does_not_block_the_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, _, canned = scaler()
    canned.reading = Reading(BUSY, None)
    canned.samples = SignalError("PrometheusUnavailable", "Prometheus answered HTTP 503")
    r = await a.tick(body({"maxQueueDelay": "10ms"}), DEPLOYMENT)
    assert r is not None and r.decision is not None and r.decision.known
    assert "arrival-rate history not read" in caplog.text
    await a.tick(body({"maxQueueDelay": "10ms"}), DEPLOYMENT)
    assert len(canned.history_calls) == 1  # tried once; the headroom relearns from new samples


async def test_autoscale_loop_history_waits_for_known_signals() -> None:
    a, _, canned = scaler()
    canned.reading = Reading(Observation.unknown("Prometheus unavailable at x"), "PrometheusUnavailable")
    await a.tick(body({"maxQueueDelay": "10ms"}), DEPLOYMENT)
    assert canned.history_calls == []


async def test_autoscale_loop_history_step_stays_under_prometheus_point_limit() -> None:
    a, _, canned = scaler()
    a.interval_seconds = 0.1  # 18,000 samples in 30 minutes: over Prometheus' 11,000 points
    canned.reading = Reading(BUSY, None)
    await a.tick(body({"maxQueueDelay": "10ms"}), DEPLOYMENT)
    ((_, start, end, step),) = canned.history_calls
    assert (end - start).total_seconds() / step <= loop.HISTORY_MAX_POINTS


async def test_autoscale_loop_records_the_scale_to_zero_before_it_scales_and_only_with_the_activator() -> (
    None
):
    idle = Reading(Observation(None, 0.0, request_rate=0.0, queue_size=0.0, inflight_requests=0.0), None)
    one = {"spec": {"replicas": 1}, "status": {"readyReplicas": 1}}
    spec = {"minReplicas": 0, "scaleToZero": {"idleAfter": "15s"}}
    for activator in (True, False):
        a, rec, canned = scaler()
        a.activator = activator
        canned.reading = idle
        first = await a.tick(body({"maxQueueDelay": "10ms"}, **spec), one)  # the idle run starts (t=0)
        second = await a.tick(body({"maxQueueDelay": "10ms"}, **spec), one)  # 15 s idle (t=15)
        assert first is not None and second is not None and first.decision is not None
        assert second.decision is not None
        if not activator:
            assert second.decision.replicas == 1 and not second.scaled
            assert not any("scaledToZeroAt" in str(patch) for _, patch in rec.calls)
            continue
        assert second.decision.replicas == 0 and second.scaled
        writes = [(kind, patch) for kind, patch in rec.calls if kind.startswith("patch")]
        status_at = next(i for i, (_, p) in enumerate(writes) if "scaledToZeroAt" in p.get("status", {}))
        scale_at = next(i for i, (k, _) in enumerate(writes) if k == "patch scale kubeinfer-autoscaler")
        assert status_at < scale_at and writes[scale_at][1] == {"spec": {"replicas": 0}}
        assert writes[status_at][1]["status"]["scaledToZeroAt"] == "2026-01-01T00:00:00Z"


async def test_autoscale_loop_routes_to_the_activator_before_it_scales_to_zero() -> None:
    """``on_zero`` runs after ``scaledToZeroAt`` is written and before the scale to 0, with the object as
    stored; a Service that does not route to the activator (``False``) keeps its replica."""
    idle = Reading(Observation(None, 0.0, request_rate=0.0, queue_size=0.0, inflight_requests=0.0), None)
    one = {"spec": {"replicas": 1}, "status": {"readyReplicas": 1}}
    spec = {"minReplicas": 0, "scaleToZero": {"idleAfter": "15s"}}
    for routed in (True, False):
        a, rec, canned = scaler()
        a.activator = True
        canned.reading = idle
        hooked: list[Any] = []

        async def on_zero(
            stored: Any, routed: bool = routed, rec: Recorder = rec, hooked: list[Any] = hooked
        ) -> bool:
            hooked.append(stored)
            rec.calls.append(("on_zero", None))
            return routed

        await a.tick(body({"maxQueueDelay": "10ms"}, **spec), one, on_zero=on_zero)
        assert hooked == []  # the idle run only starts
        second = await a.tick(body({"maxQueueDelay": "10ms"}, **spec), one, on_zero=on_zero)
        assert second is not None and second.decision is not None and second.decision.replicas == 0
        (stored,) = hooked
        assert stored["status"]["scaledToZeroAt"] == "2026-01-01T00:00:00Z"
        order = [kind for kind, patch in rec.calls if kind == "on_zero" or kind.startswith("patch")]
        hook_at = order.index("on_zero")
        status_at = next(
            i for i, (k, p) in enumerate(rec.calls) if k.startswith("patch") and "scaledToZeroAt" in str(p)
        )
        assert rec.calls.index(("on_zero", None)) > status_at
        if routed:
            assert second.scaled and order[hook_at + 1] == "patch scale kubeinfer-autoscaler"
        else:
            assert not second.scaled and "patch scale kubeinfer-autoscaler" not in order


def _gauge(name: str, value: float, pod: str, **labels: str) -> dict[str, Any]:
    """One series of an instant vector as Prometheus answers it."""
    metric = {"__name__": f"kubeinfer_quantization_{name}", "pod": pod, **labels}
    return {"metric": metric, "value": [1.0, str(value)]}


#: Two int8 pods of an embedder gated on the user's texts, one a little worse than the other.
TWO_PODS = [
    _gauge("cosine_mean_ratio", 0.9871, "a"),
    _gauge("cosine_mean_ratio", 0.9853, "b"),
    _gauge("retrieval_agreement_ratio", 0.96, "a"),
    _gauge("retrieval_agreement_ratio", 0.97, "b"),
    _gauge("compared_texts", 200, "a", measured_on="gate texts"),
    _gauge("compared_texts", 200, "b", measured_on="gate texts"),
]
GATE = {"mode": "int8-dynamic", "gate": {"minCosine": 0.98, "minAgreement": 0.9}}


async def test_autoscale_loop_writes_the_quantization_figures_once_with_the_gates_bars() -> None:
    a, rec, canned = scaler()
    canned.instant = list(TWO_PODS)
    status: dict[str, Any] = {"maxQueueDelay": "10ms"}
    await a.tick(body(status, GATE), DEPLOYMENT)
    assert canned.queries == [
        '{__name__=~"kubeinfer_quantization_(cosine_mean_ratio|retrieval_agreement_ratio|'
        'label_agreement_ratio|compared_texts)",namespace="ns",inferenceservice="svc"}'
    ]
    written = rec.calls[0][1]["status"]
    # the worst pod's figures, the bars, what they were measured on
    assert written["quantization"] == {
        "cosineMean": 0.9853,
        "retrievalAgreement": 0.96,
        "minCosine": 0.98,
        "minAgreement": 0.9,
        "measuredOn": "gate texts",
        "texts": 200,
        "time": "2026-01-01T00:00:00Z",
    }
    api.InferenceServiceStatus.from_k8s(written)  # the status model reads it
    status.update(written)
    rec.calls.clear()
    # the same figures again (a later time): nothing is written
    a.wall = lambda: dt.datetime(2026, 1, 1, 0, 5, tzinfo=dt.UTC)
    await a.tick(body(status, GATE), DEPLOYMENT)
    assert rec.calls == []
    # Prometheus fails this query only: status is left as it is
    canned.instant = SignalError("QueryError", "bad")
    await a.tick(body(status, GATE), DEPLOYMENT)
    assert rec.calls == []
    # the service now serves unquantized: no pod measured anything, the figures go
    canned.instant = [_gauge("cosine_mean_ratio", 1.0, "c"), _gauge("retrieval_agreement_ratio", 1.0, "c")]
    await a.tick(body(status), DEPLOYMENT)
    assert rec.calls[0][1]["status"] == {"quantization": None}


async def test_autoscale_loop_does_not_ask_for_the_figures_while_prometheus_is_down() -> None:
    a, rec, canned = scaler()
    canned.reading = Reading(Observation.unknown("Prometheus unavailable at x"), "PrometheusUnavailable")
    canned.instant = list(TWO_PODS)
    await a.tick(body({"maxQueueDelay": "10ms"}, GATE), DEPLOYMENT)
    assert canned.queries == [] and "quantization" not in rec.calls[0][1]["status"]


def test_autoscale_loop_quantization_patch_removes_what_is_no_longer_said() -> None:
    embedder = {"cosineMean": 0.99, "retrievalAgreement": 0.95, "minCosine": 0.98, "measuredOn": "gate texts"}
    current = {"quantization": {**embedder, "texts": 40, "time": "T1"}}
    tagger = {"labelAgreement": 0.97, "measuredOn": "held-out sentences", "texts": 349}
    patch = loop.quantization_patch(current, tagger, "T2")
    assert patch == {
        "quantization": {
            "cosineMean": None,
            "retrievalAgreement": None,
            "minCosine": None,
            **tagger,
            "time": "T2",
        }
    }
    assert loop.quantization_patch({"quantization": {**tagger, "time": "T2"}}, tagger, "T3") == {}
    assert loop.quantization_patch({}, None, "T3") == {}


# ----- a ModelPool's tick: the same policy on the pool's signals, over its Deployment -----------------


def pool_body(status: dict[str, Any] | None = None, **autoscaling: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.POOL_KIND,
        "metadata": {"name": "small", "namespace": "ns", "generation": 1, "resourceVersion": "7", "uid": "p"},
        "spec": {
            "memoryBudget": "1Gi",
            "autoscaling": {"enabled": True, "targetP99": "200ms", "maxReplicas": 6, **autoscaling},
        },
        "status": status or {},
    }


def pooled_model(name: str, delay: str) -> api.InferenceService:
    return api.InferenceService.from_body(
        {
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"pool": "small", "model": {"uri": "/models/x"}, "batching": {"maxQueueDelay": delay}},
        }
    )


def pool_scaler(times: list[float]) -> tuple[loop.Autoscaler, Recorder, CannedSignals]:
    """An autoscaler whose monotonic clock reads ``times`` in turn (one read per pool tick)."""
    rec, canned = Recorder(), CannedSignals()
    clock = iter(times)
    a = loop.Autoscaler(
        kube=rec,  # type: ignore[arg-type]
        signals_factory=lambda: canned,  # type: ignore[arg-type,return-value]
        monotonic=lambda: float(next(clock)),
        wall=lambda: dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )
    return a, rec, canned


async def test_autoscale_loop_pool_scales_out_under_load_through_its_deployments_scale() -> None:
    a, rec, canned = pool_scaler([0.0])
    canned.reading = Reading(Observation(0.5, 0.95, 100.0, 500.0, 1.0), None)
    r = await a.tick_pool(pool_body(), {"spec": {"replicas": 2}, "status": {"readyReplicas": 2}})
    assert (
        r is not None and r.scaled and r.decision is not None and r.decision.replicas == 5
    )  # ceil(2 · 0.5 / 0.2)
    assert [c[0] for c in rec.calls] == [
        "patch status kubeinfer-autoscaler",
        "patch scale kubeinfer-autoscaler",
        "event",
    ]
    assert rec.paths == [k8s.MODEL_POOL.path("ns", "small"), k8s.DEPLOYMENT.path("ns", "small")]
    assert rec.calls[1][1] == {"spec": {"replicas": 5}} and rec.involved == ["ModelPool"]
    written = rec.calls[0][1]["status"]
    assert written["lastDecision"]["replicas"] == 5 and "maxQueueDelay" not in written["lastDecision"]
    assert "maxQueueDelay" not in written and written["observed"]["p99Seconds"] == 0.5
    (cond,) = written["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("AutoscalingActive", "True", "Active")


async def test_autoscale_loop_pool_adds_replicas_where_a_service_would_halve_its_delay() -> None:
    # P99 over target while the pods are not busy: a service halves its max queue delay first; a pool's
    # is each model's, held at the longest of its models' (10 ms here), so the pool adds replicas
    a, rec, canned = pool_scaler([0.0])
    canned.reading = Reading(Observation(0.4, 0.2, 5.0, 3.0, 1.0), None)
    models = [pooled_model("a", "5ms"), pooled_model("b", "10ms")]
    r = await a.tick_pool(pool_body(), {"spec": {"replicas": 2}, "status": {"readyReplicas": 2}}, models)
    assert r is not None and r.decision is not None
    assert r.decision.replicas > 2 and not r.decision.max_queue_delay_changed
    assert rec.calls[1] == ("patch scale kubeinfer-autoscaler", {"spec": {"replicas": r.decision.replicas}})
    assert r.decision.max_queue_delay_seconds == pytest.approx(0.010)
    assert loop.pool_max_queue_delay(models) == pytest.approx(0.010)
    assert loop.pool_max_queue_delay([]) == pytest.approx(float(api.BatchingSpec().max_queue_delay))


async def test_autoscale_loop_pool_scales_in_when_idle_after_its_window() -> None:
    # stabilization 30 s, cooldown 15 s: ticks at 0, 15, 30, 45 s (the pool's members' timers ask)
    a, rec, canned = pool_scaler([0.0, 15.0, 30.0, 45.0])
    canned.reading = Reading(Observation(0.02, 0.05, 2.0, 0.0, 1.0, inflight_requests=0.0), None)
    spec = {"scaleDownStabilization": "30s", "scaleDownCooldown": "15s", "minReplicas": 1}
    deployment = {"spec": {"replicas": 4}, "status": {"readyReplicas": 4}}
    status: dict[str, Any] = {}
    replicas = []
    for _ in range(4):
        rec.calls.clear()
        r = await a.tick_pool(pool_body(status, **spec), deployment)
        assert r is not None and r.decision is not None
        for kind, patch in rec.calls:
            if kind == "patch status kubeinfer-autoscaler":
                status.update(patch["status"])
            if kind == "patch scale kubeinfer-autoscaler":
                deployment["spec"]["replicas"] = patch["spec"]["replicas"]
        replicas.append(deployment["spec"]["replicas"])
    assert replicas[0] == 4 and replicas[-1] < 4, replicas  # held through the window, then fewer
    assert status["lastDecision"]["replicas"] == replicas[-1]


async def test_autoscale_loop_pool_ticks_once_per_interval_and_not_when_off() -> None:
    a, rec, _ = pool_scaler([0.0, 5.0, 15.0])
    deployment = {"spec": {"replicas": 2}, "status": {"readyReplicas": 2}}
    assert await a.tick_pool(pool_body(), deployment) is not None
    assert await a.tick_pool(pool_body(), deployment) is None  # 5 s later: another member's timer
    assert await a.tick_pool(pool_body(), deployment) is not None
    rec.calls.clear()
    off = pool_body()
    off["spec"]["autoscaling"]["enabled"] = False
    assert await a.tick_pool(off, deployment) is None and rec.calls == []


async def test_autoscale_loop_pool_without_deployment_says_so() -> None:
    a, rec, _ = pool_scaler([0.0])
    r = await a.tick_pool(pool_body(), None)
    assert r is not None and r.condition_reason == "NoDeployment"
    assert rec.paths == [k8s.MODEL_POOL.path("ns", "small")]
