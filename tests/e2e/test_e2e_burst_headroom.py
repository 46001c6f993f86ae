"""The burst headroom in the real kopf loop: an operator restarted onto an arrival history with
recurring bursts reads it back from Prometheus, learns them and adds the replica they need before the
next burst comes, while the P99 is under its target, and keeps it standing.

The model is the bundled MiniLM (int8-dynamic) on 3 to 4 replicas of 250m CPU, sent a sentence of about
60 tokens, so that one replica serves tens of requests/s and four fit this 2-core node; the P99 target
is 1 s; the operator decides every 5 s (the session release). Phases, each bounded in time:

1. three replicas (``minReplicas``) Ready; a short closed-loop probe gives the runtimes' s(b) fit, which
   the test reads through the operator's own queries (``signals.default_queries``) and turns into one
   replica's SLO capacity with the policy's ``plan.slo_capacity``;
2. steady load at ``RHO`` times that capacity, its rate adjusted until the operator's own signals say
   so (a loaded replica's s(b) is not the probe's on a shared CPU): the SLO-capacity rule asks three
   replicas and no burst has been seen, so the fleet stays at three (the control);
3. a past is written into Prometheus (``PrometheusServer.backfill``: blocks made by promtool): the
   half hour before the load (from 3 minutes inside the operator's 30-minute memory), the same rate
   with x``BURST`` bursts of 30 s every 4 minutes, under a pod that is gone. The operator is
   restarted (``kubectl rollout restart``): on its first tick it reads the arrival rate's last 30
   minutes back (``loop.Autoscaler._restore_history``), learns the bursts and scales to four while the
   P99 is under target, the reason naming the burst headroom. The pure policy on the same history and
   signals (``decide``, what ``bench/autoscaler_sim.py`` runs) gives the same count, and three without
   the history;
4. the fourth replica turns Ready and stays through more than the 30 s stabilization window under the
   same load (standing capacity: the rule alone would scale in to three), unless the pure policy
   replayed as the operator knew things at that decision scales in too (``_scale_in_is_the_policys``);
   a burst of x``LIVE_BURST`` then comes for 30 s and is served (0.63 of four replicas' SLO capacity,
   0.84 of three's).

This shares the session's cluster, chart and Prometheus (phase 3 restarts both that Prometheus and the
session's operator).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeinfer.operator import api
from kubeinfer.operator.autoscale.loop import policy_from_spec
from kubeinfer.operator.autoscale.policy import (
    Current,
    Decision,
    Observation,
    State,
    decide,
    restore_arrivals,
)
from kubeinfer.operator.autoscale.policy.plan import BACKLOG_DRAIN_SECONDS, slo_capacity
from kubeinfer.operator.autoscale.prometheus import PrometheusConfig, PrometheusSignals
from kubeinfer.operator.autoscale.signals import Queries, default_queries

from hack.devtools.prom import PrometheusServer, Series
from tests.e2e.autoscaled import Load, ServiceView, ready
from tests.e2e.conftest import OPERATOR_NAMESPACE, OPERATOR_PODS, RELEASE, GraphCache
from tests.support.cluster import Cluster, wait_until

ROOT = Path(__file__).resolve().parents[2]
NAME = "bursty"

pytestmark = [pytest.mark.timeout(1500), pytest.mark.quiet_node]

TARGET_P99 = 1.0  # seconds
MAX_BATCH = 8
MIN_REPLICAS, MAX_REPLICAS = 3, 4
#: The steady load, in units of one replica's SLO capacity as the rule counts it (arrivals and the
#: backlog): the rule plans 3 replicas for it (1.8 / 0.85 = 2.1 rounds up to 3; the demand can rise by
#: 40 %, as a stall on the shared CPU drains, before it asks 4) and the bursts learned ask ``BURST`` x
#: the arrival rate (about 1.65 of it: the headroom counts no backlog) = 3.2 at full capacity, so 4, with
#: room for the capacity estimate to move by 7 % (at 1.7 the headroom's count was 3.06: a capacity read
#: 2 % higher in the live burst scaled in to three). The load is held within ``RHO_TOLERANCE`` of it.
RHO = 1.8
RHO_TOLERANCE = 0.05
BURST = 1.95  # the past's bursts, x the steady rate (under the headroom's x2 limit)
BURST_SECONDS, BURST_EVERY = 30, 240
MEMORY_SECONDS = 1800  # the operator's burst memory (Policy.burst_memory_seconds)
RESTART_MARGIN = 180  # the past starts this long inside that memory, for the restart to come
#: x the steady rate: 2.5 replicas' SLO capacity, 0.63 of four's, 0.84 of three's; under the halfway
#: mark (1.475) from the level to the learned x1.95, so the headroom carries the rise ahead as it does
#: for a burst's first seconds.
LIVE_BURST = 1.4
INTERVAL = 5.0  # the session release's autoscaleIntervalSeconds
PROBE_SECONDS = 40  # under two reaction times (2 x 60 s), so that the probe is not a level
#: About 60 tokens: tens of milliseconds of one 250m replica's CPU per row.
TEXT = (
    "Operators of inference services watch the tail of the latency distribution rather than its mean, "
    "because a user waits for the slowest of the calls a page makes, and batching trades that latency "
    "against the cost of the accelerators."
)


def isvc_manifest(namespace: str, graph_cache: str) -> dict[str, Any]:
    """The service, its graphs from the claim ``graph_cache`` (the session's: its pods load the graphs an
    earlier module's pod made instead of exporting and quantizing MiniLM on 250m each)."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "minilm.yaml").read_text())
    doc["metadata"] = {"name": NAME, "namespace": namespace}
    spec = doc["spec"]
    spec["server"] = {"graphCache": {"claimName": graph_cache}}
    spec["batching"] = {"maxBatchSize": MAX_BATCH, "maxQueueDelay": "10ms", "maxQueueSize": 1024}
    spec["warmup"] = {"enabled": False}  # four replicas of 250m start sooner; the first batches are slower
    spec["resources"] = {"gpus": 0, "cpu": "250m", "memory": "1536Mi"}
    spec["autoscaling"] = {
        "enabled": True,
        "minReplicas": MIN_REPLICAS,
        "maxReplicas": MAX_REPLICAS,
        "targetP99": f"{TARGET_P99 * 1000:.0f}ms",
        "gpuUtilization": {"low": 0.05, "high": 0.95},
        "maxQueueDelay": {"min": "5ms", "max": "20ms"},
        "window": "20s",
        "scaleDownStabilization": "30s",
        "scaleUpCooldown": "4s",
        "scaleDownCooldown": "5s",
        "maxQueueDelayCooldown": "10s",
    }
    return doc


def _queries(namespace: str) -> Queries:
    """The operator's queries for this service (``loop.Autoscaler.tick``'s arguments)."""
    return default_queries(namespace, NAME, "20s", arrival_window=f"{2 * INTERVAL:.0f}s")


def _value(prometheus: PrometheusServer, promql: str) -> float | None:
    result = prometheus.query(promql)
    if len(result) != 1:
        return None
    value = float(result[0]["value"][1])
    return value if math.isfinite(value) else None


def _slo_capacity(s: ServiceView, q: Queries) -> tuple[float, float, float]:
    """``(a, c, requests/s)``: the runtimes' s(b) fit as the operator reads it and one replica's
    capacity at the SLO for the max queue delay in force."""
    a = _value(s.prometheus, q.service_time_a)
    c = _value(s.prometheus, q.service_time_c)
    assert a is not None and c is not None, f"no s(b) fit: a={a}, c={c}"
    isvc = api.InferenceService.from_body(s.isvc())
    timeout = isvc.spec.max_queue_delay_in_force(isvc.status.max_queue_delay)
    _, capacity = slo_capacity(a, c, MAX_BATCH, TARGET_P99, timeout)
    return a, c, capacity


def _past(namespace: str, rate: float, start: float, end: float, quiet_from: float) -> list[Series]:
    """The arrival history of a pod gone before the test: ``rate`` requests/s from ``start`` to ``end``
    (Unix seconds), 1 s samples, with x``BURST`` bursts of ``BURST_SECONDS`` every ``BURST_EVERY`` from a
    minute in until ``quiet_from``, as its request counter and its (empty) in-flight gauge."""
    labels = {"namespace": namespace, "inferenceservice": NAME, "pod": f"{NAME}-before", "job": "backfill"}
    counter, total, inflight = [], 0.0, []
    for t in range(int(start), int(end) + 1):
        since = t - int(start) - 60
        in_burst = since >= 0 and since % BURST_EVERY < BURST_SECONDS and t + BURST_SECONDS < quiet_from
        total += rate * (BURST if in_burst else 1.0)
        counter.append((float(t), total))
        inflight.append((float(t), 0.0))
    return [
        Series("kubeinfer_requests_total", labels, counter),
        Series("kubeinfer_inflight_requests", labels, inflight),
    ]


def _observation(observed: dict[str, Any]) -> Observation:
    """The signals a decision read, from its ``status.observed``."""
    return Observation(
        p99_seconds=observed["p99Seconds"],
        gpu_utilization=observed["gpuUtilization"],
        request_rate=observed["requestRate"],
        queue_size=observed["queueSize"],
        inflight_requests=observed["inflightRequests"],
        sample_age_seconds=1.0,
        arrival_rate=observed["arrivalRate"],
        service_time_a_seconds=observed["serviceTimeInterceptSeconds"],
        service_time_c_seconds=observed["serviceTimeSlopeSeconds"],
        max_batch_size=MAX_BATCH,
        instance_concurrency=observed["instanceConcurrency"],
    )


def _one_operator_pod(cluster: Cluster) -> bool:
    """Whether the session's operator is one Ready pod (the tests after this one expect that)."""
    items = cluster.get_json("pods", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_PODS)["items"]
    return len(items) == 1 and ready(items[0])


def _restart_operator(cluster: Cluster) -> None:
    """``kubectl rollout restart`` of the session's operator, until the old pod is gone."""
    cluster.kubectl("rollout", "restart", f"deployment/{RELEASE}", "-n", OPERATOR_NAMESPACE)
    cluster.kubectl(
        "rollout", "status", f"deployment/{RELEASE}", "-n", OPERATOR_NAMESPACE, "--timeout=180s", timeout=190
    )
    wait_until(
        lambda: _one_operator_pod(cluster), timeout=150, interval=2.0, message="the old operator pod gone"
    )


def _operator_log(cluster: Cluster) -> str:
    return cluster.kubectl(
        "logs", "-n", OPERATOR_NAMESPACE, f"deployment/{RELEASE}", "--tail=200", check=False
    ).stdout


def _capacity_probe(s: ServiceView, q: Queries) -> tuple[float, float]:
    """Phase 1: three Ready replicas, scraped; a closed-loop probe for the s(b) fit. Returns the steady
    load's rate, ``RHO`` x one replica's SLO capacity (requests/s), and when the probe started (Unix s)."""
    targets = wait_until(
        lambda: (t := s.ready_targets()) and len(t) == MIN_REPLICAS and t,
        timeout=420,
        interval=2.0,
        message=f"{MIN_REPLICAS} ready runtime pods",
    )
    for target in targets:
        wait_until(lambda t=target: s.scraped(t), timeout=60, interval=1.0, message=f"{target} scraped")
    probe_started = time.time()
    # Closed loop, four clients per replica, for at most PROBE_SECONDS: batches of several sizes for the
    # fit (without warmup the runtime fits s(b) from the batches it serves). Longer, the probe's rate
    # would stand long enough to be a level, and the drop to the load a level left, held for 30 minutes.
    with Load(s.url(), concurrency=4 * MIN_REPLICAS, text=TEXT):
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: _value(s.prometheus, q.service_time_c) is not None, timeout=PROBE_SECONDS - 10)
        time.sleep(10)
    wait_until(
        lambda: _value(s.prometheus, q.service_time_c) is not None,
        timeout=30,
        interval=2.0,
        message="the runtimes' s(b) fit (kubeinfer_service_time_slope_seconds)",
    )
    a, c, capacity = _slo_capacity(s, q)
    rate = RHO * capacity
    print(f"s(b) = {a * 1000:.1f} ms + {c * 1000:.2f} ms*b: {capacity:.1f}/s per replica; load {rate:.1f}/s")
    assert rate <= 150, f"one replica's SLO capacity is {capacity:.0f}/s: too fast for this test's load"
    return rate, probe_started


def _demand_ratio(s: ServiceView, q: Queries) -> float | None:
    """The demand the SLO-capacity rule plans for (``plan.demand``: arrivals or completions, plus the
    requests in flight drained over ``BACKLOG_DRAIN_SECONDS``) over one replica's SLO capacity, from the
    operator's own queries: the median of 5 readings 2 s apart (one reading moves by 10 %: the arrival
    rate is an irate); ``None`` while a signal is unknown."""
    ratios = []
    for _ in range(5):
        arrival, completion = _value(s.prometheus, q.arrival_rate), _value(s.prometheus, q.request_rate)
        inflight = _value(s.prometheus, q.inflight)
        if arrival is None or completion is None or inflight is None:
            return None
        _, _, capacity = _slo_capacity(s, q)
        ratios.append((max(arrival, completion) + inflight / BACKLOG_DRAIN_SECONDS) / capacity)
        time.sleep(2)
    return statistics.median(ratios)


def _control(s: ServiceView, q: Queries, signals: PrometheusSignals, load: Load) -> float:
    """Phase 2, under the steady load: its rate is brought to ``RHO`` replicas' SLO capacity as the
    operator counts it (a loaded replica's s(b) is not the probe's: the CPU is shared), then the rule
    asks three replicas and keeps them for 30 s (a scale-out on the load's first rise, its trend carried
    ahead, is undone after the 30 s stabilization window). Returns the arrival rate the operator's query
    reads, requests/s."""
    settled = 0
    deadline = time.monotonic() + 360
    while settled < 2:
        assert time.monotonic() < deadline, f"the load did not settle at {RHO} replicas' capacity"
        time.sleep(5)
        ratio = _demand_ratio(s, q)
        print(
            f"load {load.rate:.1f}/s: demand over one replica's SLO capacity {ratio}, {s.replicas()} replicas"
        )
        if ratio is None:
            continue
        if abs(ratio / RHO - 1) > RHO_TOLERANCE:
            load.rate *= min(1.2, max(0.8, RHO / ratio)) ** 0.5  # half the step: the fit moves with the load
            settled = 0
        else:
            settled = settled + 1 if s.replicas() == MIN_REPLICAS else 0
    wall = dt.datetime.now(dt.UTC)
    arrivals = [v for _, v in signals.history(q.arrival_rate, wall - dt.timedelta(seconds=30), wall, 1.0)]
    live = statistics.median(arrivals)
    print(f"arrival rate under the load: {live:.1f}/s (sent at {load.rate:.1f}/s)")
    assert s.replicas() == MIN_REPLICAS, s.last_decision()
    return live


def _scaled_to(s: ServiceView, replicas: int) -> dict[str, Any] | None:
    """``status`` when its last decision scales to ``replicas`` and ``observed`` is that decision's (one
    read: a later tick rewrites both), else ``None``."""
    status = dict(s.isvc().get("status") or {})
    decision, observed = status.get("lastDecision") or {}, status.get("observed") or {}
    scaled = decision.get("replicas") == replicas and f"→ {replicas} replicas" in str(decision.get("reason"))
    return status if scaled and observed.get("time") == decision.get("time") else None


class _FirstStatus:
    """The first ``status`` that ``_scaled_to(s, replicas)`` accepts with a decision made at or after
    ``since``, read every 0.5 s by a thread while the block runs (``found``: ``None`` until then)."""

    def __init__(self, s: ServiceView, since: dt.datetime, replicas: int) -> None:
        self.s, self.since, self.replicas = s, since.replace(microsecond=0), replicas
        self.found: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="headroom-status", daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set() and self.found is None:
            with contextlib.suppress(Exception):  # a transient API error: the next read
                status = _scaled_to(self.s, self.replicas)
                when = (status or {}).get("lastDecision", {}).get("time", "")
                if status and dt.datetime.fromisoformat(when.replace("Z", "+00:00")) >= self.since:
                    self.found = status
            self._stop.wait(0.5)

    def __enter__(self) -> _FirstStatus:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _restarted_onto_a_bursty_past(
    cluster: Cluster,
    s: ServiceView,
    q: Queries,
    signals: PrometheusSignals,
    live: float,
    started: tuple[float, float],
) -> dict[str, Any]:
    """Phase 3: the past written, the operator restarted; it scales to four naming the burst headroom
    while the P99 is under target. ``started``: when the probe and the load started (Unix s). Returns
    ``status`` as that decision wrote it (``lastDecision``, ``observed``)."""
    probe_started, load_started = started
    # From RESTART_MARGIN inside the memory to one arrival window (two scrapes of irate) before the
    # load, where the past hands over to it; its bursts end a minute before the probe.
    start = time.time() - MEMORY_SECONDS + RESTART_MARGIN
    s.prometheus.backfill(_past(s.namespace, live, start, load_started - 2 * INTERVAL, probe_started - 60))
    history = signals.history(
        q.arrival_rate,
        dt.datetime.fromtimestamp(start, dt.UTC),
        dt.datetime.fromtimestamp(probe_started - 10, dt.UTC),
        INTERVAL,
    )
    peak, level = max(v for _, v in history), statistics.median(v for _, v in history)
    print(f"the past read back: {len(history)} samples, level {level:.1f}/s, peak {peak:.1f}/s")
    assert abs(level / live - 1) < 0.02 and abs(peak / (BURST * live) - 1) < 0.02, history
    restarted = dt.datetime.now(dt.UTC)
    # Watched from before the restart: the new operator decides on its first tick, often while the old
    # pod is still terminating, and its next tick (a max queue delay step) replaces lastDecision.
    with _FirstStatus(s, restarted, MAX_REPLICAS) as scaled:
        _restart_operator(cluster)
        pattern = rf"autoscale {re.escape(s.namespace)}/{NAME}: (\d+) arrival-rate samples of the last"
        read_back = wait_until(
            lambda: re.findall(pattern, _operator_log(cluster)),
            timeout=120,
            message="the restarted operator reading the arrival history back",
        )
        assert int(read_back[-1]) >= 0.5 * (MEMORY_SECONDS - RESTART_MARGIN) / INTERVAL, read_back
        status = wait_until(lambda: scaled.found, timeout=120, message="the burst headroom's 4th replica")
    decision, observed = status["lastDecision"], status["observed"]
    print(f"decision: {decision}")
    assert dt.datetime.fromisoformat(decision["time"].replace("Z", "+00:00")) >= restarted.replace(
        microsecond=0
    )
    reason = str(decision.get("reason", ""))
    learned = re.search(r"burst headroom x([0-9.]+) learned from (\d+) bursts", reason)
    assert learned, reason
    factor, bursts = float(learned.group(1)), int(learned.group(2))
    assert 0.9 * BURST <= factor <= 2.0 and bursts >= 2, reason
    assert observed.get("p99Seconds") is not None and observed["p99Seconds"] < TARGET_P99, observed
    return status


def _decided_at(status: dict[str, Any]) -> dt.datetime:
    """When ``status``'s last decision was made: its tick's wall clock (whole seconds, the fraction
    dropped)."""
    return dt.datetime.fromisoformat(status["lastDecision"]["time"].replace("Z", "+00:00"))


def _pure_decision(
    s: ServiceView,
    q: Queries,
    signals: PrometheusSignals,
    status: dict[str, Any],
    replicas: int,
    history: bool,
    *,
    observed_since: dt.datetime | None = None,
    phase: int = 0,
) -> Decision:
    """The pure policy's decision on the signals of ``status``'s last decision (``observed``) with
    ``replicas`` standing and ready, and the arrival history Prometheus holds (``history``) or none, as
    the operator knew them when it decided.

    The history ends one interval before the decision (``_decided_at``), not at the test's clock: read
    later, it would hold what came after (the rest of a live burst) and lose what aged out of the memory
    since. Its samples are ``INTERVAL`` apart, ``phase`` seconds earlier than the decision's grid: the
    operator read the arrival rate at its ticks, which drift off any grid of whole seconds, and with a
    1 s scrape each second's irate is a different reading. ``observed_since`` (the restarted
    operator's first decision): the operator has observed since then, so a scale-in does not wait for
    a first stabilization window as a fresh ``State`` (a restarted controller) makes it do; ``None``:
    the decision is the restarted operator's first."""
    isvc = api.InferenceService.from_body(s.isvc())
    decision, observed = status["lastDecision"], status["observed"]
    policy = policy_from_spec(isvc.spec.autoscaling, stale_after_seconds=20.0)
    now = 10_000.0  # the policy's clock; the samples' ages count back from the decision's wall clock
    decided = _decided_at(status)
    observed_for = None if observed_since is None else (decided - observed_since).total_seconds()
    state = State(first_seen=None if observed_for is None else now - observed_for)
    if history:
        end = decided - dt.timedelta(seconds=INTERVAL + phase)
        samples = signals.history(
            q.arrival_rate,
            end - dt.timedelta(seconds=policy.burst_memory_seconds - INTERVAL),
            end,
            INTERVAL,
        )
        state = restore_arrivals(
            state, [(decided.timestamp() - ts, v) for ts, v in samples], now=now, policy=policy
        )
    current = Current(
        replicas=replicas,
        max_queue_delay_seconds=isvc.spec.max_queue_delay_in_force(
            api.AutoscalerDecisionStatus.model_validate(decision).max_queue_delay
        ),
        ready_replicas=replicas,
    )
    return decide(_observation(observed), current, policy, state, now)


def _pure_policy_agrees(
    s: ServiceView, q: Queries, signals: PrometheusSignals, status: dict[str, Any]
) -> None:
    """The pure policy on the decision's signals (``status.observed``) and the history Prometheus holds:
    four with the history read back, three without it."""
    with_history = _pure_decision(s, q, signals, status, MIN_REPLICAS, history=True)
    without = _pure_decision(s, q, signals, status, MIN_REPLICAS, history=False)
    print(
        f"pure policy: {with_history.replicas} ({with_history.reason}); "
        f"without the history: {without.replicas}"
    )
    assert with_history.replicas == MAX_REPLICAS and "burst headroom" in with_history.reason
    assert without.replicas == MIN_REPLICAS, without.reason


def _scale_in_is_the_policys(
    s: ServiceView,
    q: Queries,
    signals: PrometheusSignals,
    scaled_in: _FirstStatus,
    restarted: dict[str, Any],
) -> None:
    """The operator scaled in from four: that must be what the pure policy gives on the same signals
    with the burst history (the headroom still learned, the operator's estimate of a replica's capacity
    moved: 250m replicas under CPU quotas read up to twice as fast with four standing as with three,
    27/s -> 53/s in one run), never the count of a policy that forgot the bursts. ``restarted``: the
    restarted operator's first decision (``_restarted_onto_a_bursty_past``), since when it has observed.

    The operator's own arrival readings are not in Prometheus, only the 1 s irate they were read from:
    the history is replayed on each of the ``INTERVAL`` grids of whole seconds its ticks may have read
    (``_pure_decision``'s ``phase``), and the scale-in is the policy's when one of them scales in. Inside
    a burst the headroom stands on the lowest reading of the last ``burst_lead_seconds`` (the floor), so
    one reading 10 % under the level can take the count from four to three, and another grid's readings
    need not hold it (one run: x1.95 still learned from 6 bursts, a replica's capacity read 28.8/s, the
    operator's floor under 44/s for a level of 49/s). A policy that forgot the bursts scales in before
    the live burst, where every grid keeps four."""
    status = wait_until(lambda: scaled_in.found, timeout=30, message="the scale-in decision's status")
    assert status is not None
    since = _decided_at(restarted)
    replays = [
        _pure_decision(s, q, signals, status, MAX_REPLICAS, history=True, observed_since=since, phase=phase)
        for phase in range(int(INTERVAL))
    ]
    print(f"scaled in: {status['lastDecision']['reason']}; the pure policy on each grid:")
    for phase, replay in enumerate(replays):
        print(f"  {phase} s earlier: {replay.reason}")
    assert any(replay.replicas < MAX_REPLICAS for replay in replays), (
        status["lastDecision"],
        status["observed"],
        [replay.reason for replay in replays],
    )


def _headroom_stands(
    s: ServiceView, q: Queries, signals: PrometheusSignals, load: Load, restarted: dict[str, Any]
) -> None:
    """Phase 4: the fourth replica turns Ready and stays through more than the 30 s stabilization
    window under the steady load (the rule alone would scale in to three: standing capacity, not a
    reaction), unless the pure policy on the operator's own signals and history no longer asks four
    (``_scale_in_is_the_policys``); then a burst of x``LIVE_BURST`` for 30 s is served."""
    wait_until(
        lambda: len(s.ready_targets()) == MAX_REPLICAS, timeout=420, interval=2.0, message="4 ready pods"
    )
    with _FirstStatus(s, dt.datetime.now(dt.UTC), MAX_REPLICAS - 1) as scaled_in:
        held_until = time.monotonic() + 45
        while time.monotonic() < held_until and s.replicas() == MAX_REPLICAS:
            time.sleep(2)
        if s.replicas() != MAX_REPLICAS:
            _scale_in_is_the_policys(s, q, signals, scaled_in, restarted)
        rate = load.rate
        load.rate = LIVE_BURST * rate
        burst_started = time.monotonic()
        time.sleep(BURST_SECONDS)
        p99, count = load.p99_since(burst_started)
        load.rate = rate
        # The client's P99 is printed, not asserted: on this shared 2-core machine it moves with whatever
        # else runs (0.67 s, 1.39 s, 1.02 s and 1.74 s in four runs against the 1 s target).
        replicas = s.replicas()
        print(
            f"x{LIVE_BURST} for {BURST_SECONDS} s on {replicas} replicas: "
            f"P99 {p99 * 1000:.0f} ms, {count} responses"
        )
        assert count >= 0.7 * LIVE_BURST * rate * BURST_SECONDS
        if replicas != MAX_REPLICAS:
            _scale_in_is_the_policys(s, q, signals, scaled_in, restarted)


def test_burst_headroom_scales_before_the_breach(
    cluster: Cluster,
    operator_release: str,
    node_prometheus: PrometheusServer,
    namespace: str,
    graph_cache: GraphCache,
) -> None:
    s = ServiceView(cluster, namespace, node_prometheus, NAME)
    q = _queries(namespace)
    signals = PrometheusSignals(PrometheusConfig(url=node_prometheus.url))
    cluster.apply(isvc_manifest(namespace, graph_cache.claim(namespace)))
    try:
        rate, probe_started = _capacity_probe(s, q)
        with Load(s.url(), rate=rate, text=TEXT) as load:
            load_started = time.time()
            live = _control(s, q, signals, load)
            status = _restarted_onto_a_bursty_past(
                cluster, s, q, signals, live, (probe_started, load_started)
            )
            _pure_policy_agrees(s, q, signals, status)
            _headroom_stands(s, q, signals, load, status)
    except BaseException:
        with contextlib.suppress(Exception):
            print(f"isvc status: {s.isvc().get('status')}")
            print("operator log tail:")
            print(_operator_log(cluster)[-6000:])
            print(cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout)
        raise
    finally:
        signals.close()
        if not node_prometheus.running:
            node_prometheus.start()
        with contextlib.suppress(TimeoutError):  # a failure during the restart: leave one operator pod
            wait_until(
                lambda: _one_operator_pod(cluster), timeout=150, interval=2.0, message="one operator pod"
            )
