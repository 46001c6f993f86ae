"""Seeded discrete-event simulation of the autoscaler against HPA-style baselines (issue 4).

    .venv/bin/python bench/autoscaler_sim.py [--seed N] [--repeats R] [--horizon S] [--out PATH]

Model (what is simulated, and what is not):

- Arrivals: Poisson with a per-second rate lambda(t) from one of four traces: ``step`` (x4 at 25 % of
  the horizon), ``ramp`` (up, then hold), ``diurnal`` (one sine period over the horizon), ``mmpp``
  (bursty on/off, a two-state Markov-modulated Poisson process). Rates are in units of the sustainable
  per-replica rate ``mu`` (below), so the trace shapes do not depend on a and c. Every controller sees
  the same arrivals (same seed).
- Service: each replica runs one batch at a time taking s(b) = a + c*b seconds for b rows, b <= B.
  a and c come from ``bench/results/runtime.json`` (keys ``service_time_a_seconds`` and
  ``service_time_c_seconds``, or ``fit.a_seconds``/``fit.c_seconds``) when present, else the defaults
  below. The replicas share one FIFO queue (an ideal least-loaded balancer): a replica that is free takes
  the oldest request and fires the batch when B requests are there or the oldest has waited the batch
  timeout (the runtime's max queue delay), whichever is first.
- New replicas serve after a cold start (model load + warmup); they cost replica-seconds from creation.
  Removed replicas finish their batch and stop.
- Metrics reach the controller through a 15 s scrape: P99 is computed from histogram buckets (the
  runtime's ``DURATION_BUCKETS``) over a 60 s window as Prometheus' ``histogram_quantile`` does (linear
  interpolation inside the bucket holding the rank); GPU utilization is the busy fraction of the ready
  replicas over the last scrape interval (what DCGM's ``DCGM_FI_DEV_GPU_UTIL`` reports); request rate is
  completions per second over the window; queue size is the instantaneous queue.
- Controllers act every 15 s: ``kubeinfer`` (``kubeinfer.operator.autoscale.policy.decide``, unchanged,
  with the InferenceService API's default tunables), ``hpa_gpu`` (HPA on GPU utilization: target 70 %,
  tolerance 0.1, 300 s scale-down stabilization, scale-up limited to max(100 %, 4 pods) per sync),
  ``hpa_p99`` (the same HPA algorithm on the P99 metric with target = the SLO), ``fixed`` (replicas for
  the trace's peak, never changed) and ``oracle`` (clairvoyant: knows lambda(t) ahead and provisions, one
  cold start in advance, the replicas the capacity model needs for the coming peak; no stabilization).

Figures per trace and controller: ``slo_attainment`` (share of requests with latency <= target),
``window_attainment`` (share of 1-minute windows with traffic whose exact P99 <= target),
``replica_seconds``, ``scaling_actions`` (replica-count changes), ``recovery_seconds`` (the longest run
of consecutive 15 s windows whose exact P99 is over target: for ``step`` the time to recover after the
step). With ``--repeats R`` > 1 (default 3) each figure is the median over R seeds.

Beside ``traces`` (the five controllers, shaped as issue 4 asks), the JSON carries ``variants``: the
same figures for kubeinfer's policy with the batch-timeout lever off (``kubeinfer_replicas_only``,
the value of tuning the timeout) and with a 600 s stabilization window
(``kubeinfer_stabilization_600s``), and with the drained-backlog rule fed the queue size instead of
the requests in flight (``kubeinfer_drained_on_queue``); ``config`` (a, c, target, seeds) and
``summary`` (the targets).
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from kubeinfer.operator.autoscale.policy import Current, Observation, Policy, State, decide

try:
    from kubeinfer.runtime.metrics import DURATION_BUCKETS
except ImportError:  # pragma: no cover - the runtime's metrics module is part of the repository
    DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_RESULTS = ROOT / "bench" / "results" / "runtime.json"
DEFAULT_OUT = ROOT / "bench" / "results" / "autoscaler.json"

#: Default batch service-time model s(b) = a + c*b when runtime.json is absent: a MiniLM-sized
#: encoder on a modest GPU (fixed launch/transfer overhead 15 ms, 1.5 ms per row).
DEFAULT_A_SECONDS = 0.015
DEFAULT_C_SECONDS = 0.0015
CONTROLLERS = ("kubeinfer", "hpa_gpu", "hpa_p99", "fixed", "oracle")
#: Variants of kubeinfer's policy reported beside the main table (``variants`` in the JSON): the
#: batch-timeout lever switched off (replicas only: its bounds pinned to the start value), a 600 s
#: scale-down stabilization window instead of the HPA's 300 s default, and the drained-backlog rule fed
#: the queue size instead of the requests in flight.
VARIANTS: dict[str, Callable[[SimConfig], dict[str, Any]]] = {
    "kubeinfer_replicas_only": lambda cfg: {
        "batch_timeout_min_seconds": cfg.initial_timeout,
        "batch_timeout_max_seconds": cfg.initial_timeout,
    },
    "kubeinfer_stabilization_600s": lambda cfg: {"scale_down_stabilization_seconds": 600.0},
    # The drained-backlog rule on the queue alone (what the policy read before it read the requests in
    # flight): the queue leaves out requests executing in batches.
    "kubeinfer_drained_on_queue": lambda cfg: {"drained_signal": "queue"},
}
TRACES = ("step", "ramp", "diurnal", "mmpp")


@dataclass(frozen=True)
class SimConfig:
    """Simulation parameters. Times in seconds, rates in requests per second."""

    a: float = DEFAULT_A_SECONDS
    c: float = DEFAULT_C_SECONDS
    max_batch: int = 32
    cold_start: float = 30.0
    sync: float = 15.0
    window: float = 60.0
    horizon: float = 1200.0
    initial_timeout: float = 0.005
    timeout_bounds: tuple[float, float] = (0.001, 0.05)
    min_replicas: int = 1
    max_replicas: int = 12
    buckets: tuple[float, ...] = tuple(DURATION_BUCKETS)

    def s(self, b: int) -> float:
        """Batch service time for ``b`` rows, seconds."""
        return self.a + self.c * b

    @property
    def target_p99(self) -> float:
        """The SLO: 4 full-batch service times, rounded up to 10 ms (at least 50 ms)."""
        return max(0.05, math.ceil(4 * self.s(self.max_batch) * 100) / 100)

    @property
    def mu(self) -> float:
        """Sustainable rate of one replica at the SLO, requests/s (the oracle's capacity model).

        A request waits for at most the batch in progress plus its own: 2*s(b) + timeout <= target gives
        the largest admissible b; one replica then sustains b/s(b) at full occupancy; 80 % of that
        leaves room for Poisson bursts.
        """
        b = 1
        for cand in range(1, self.max_batch + 1):
            if 2 * self.s(cand) + self.initial_timeout <= self.target_p99:
                b = cand
        return 0.8 * b / self.s(b)


# --------------------------------------------------------------------------------------------------
# traces


def trace_rates(name: str, cfg: SimConfig, rng: np.random.Generator) -> np.ndarray:
    """Rate per second, requests/s, for each second of the horizon (float64, shape (horizon,))."""
    n = int(cfg.horizon)
    t = np.arange(n, dtype=np.float64)
    mu = cfg.mu
    if name == "step":
        return np.where(t < 0.25 * n, 0.8 * mu, 3.2 * mu)
    if name == "ramp":
        return np.minimum(0.5 * mu + (5.0 - 0.5) * mu * t / (0.6 * n), 5.0 * mu)
    if name == "diurnal":
        return mu * (2.75 - 2.25 * np.cos(2 * np.pi * t / n))
    if name == "mmpp":
        out = np.empty(n)
        high, i = False, 0
        while i < n:
            stay = max(1, int(rng.exponential(45.0 if high else 90.0)))
            out[i : i + stay] = 4.0 * mu if high else 0.8 * mu
            i += stay
            high = not high
        return out
    raise ValueError(f"unknown trace {name!r}; expected one of {TRACES}")


def poisson_arrivals(rates: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Sorted arrival times (seconds, float64) of a Poisson process with piecewise-constant rates."""
    counts = rng.poisson(rates)
    starts = np.repeat(np.arange(len(rates), dtype=np.float64), counts)
    return np.sort(starts + rng.random(starts.size))


# --------------------------------------------------------------------------------------------------
# Prometheus-like P99


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """PromQL ``histogram_quantile`` over non-cumulative bucket ``counts`` (last = +Inf bucket).

    ``bounds`` are the finite upper bounds (len(counts) == len(bounds) + 1). Linear interpolation inside
    the bucket that holds rank q*total, lower bound 0 for the first bucket; a rank in the +Inf bucket
    returns the largest finite bound; no observations → NaN (as Prometheus).
    """
    total = float(sum(counts))
    if total <= 0:
        return math.nan
    rank = q * total
    cum = 0.0
    for i, cnt in enumerate(counts):
        if cum + cnt >= rank and cnt > 0:
            if i == len(bounds):
                return float(bounds[-1])
            lo = 0.0 if i == 0 else float(bounds[i - 1])
            return lo + (float(bounds[i]) - lo) * (rank - cum) / cnt
        cum += cnt
    return float(bounds[-1])


@dataclass(frozen=True)
class Metrics:
    """One scrape as a controller sees it. NaN = no data."""

    p99: float
    utilization: float
    rate: float
    queue: float
    ready: int
    inflight: float = math.nan


# --------------------------------------------------------------------------------------------------
# the simulator


@dataclass
class Result:
    """Per-request outcome and the control trajectory of one run."""

    arrivals: np.ndarray
    done: np.ndarray
    replicas: list[int]
    timeouts: list[float]
    replica_seconds: float
    scaling_actions: int
    timeout_changes: int

    @property
    def latency(self) -> np.ndarray:
        return self.done - self.arrivals


Controller = Callable[[float, Metrics, int, float], tuple[int, float]]


@dataclass
class _Replica:
    ready_at: float
    removed: bool = False


@dataclass
class Simulator:
    """Runs one controller over one arrival sequence."""

    cfg: SimConfig
    arrivals: np.ndarray
    initial_replicas: int
    busy: np.ndarray = field(init=False)
    ready_secs: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        size = int(self.cfg.horizon) + 3600
        self.busy = np.zeros(size)
        self.ready_secs = np.zeros(size)

    def run(self, controller: Controller, progress: Callable[[str], None] | None = None) -> Result:
        cfg, arr = self.cfg, self.arrivals
        arr_list: list[float] = arr.tolist()
        n_req = len(arr_list)
        done = np.full(n_req, np.nan)
        head = 0
        reps: dict[int, _Replica] = {}
        heap: list[tuple[float, int]] = []
        next_id = 0

        def add(k: int, ready_at: float) -> None:
            nonlocal next_id
            for _ in range(k):
                reps[next_id] = _Replica(ready_at)
                heapq.heappush(heap, (ready_at, next_id))
                next_id += 1

        def remove(k: int, now: float) -> None:
            # Pending (not yet ready) replicas go first, newest first; then ready ones.
            alive = sorted((r.ready_at, i) for i, r in reps.items() if not r.removed)
            for _, i in reversed(alive[-k:] if k else []):
                reps[i].removed = True

        def alive_count() -> int:
            return sum(1 for r in reps.values() if not r.removed)

        add(self.initial_replicas, 0.0)
        timeout = cfg.initial_timeout
        bounds = np.asarray(cfg.buckets)
        head_at: list[int] = []
        replicas_traj: list[int] = []
        timeouts_traj: list[float] = []
        replica_seconds = 0.0
        actions = 0
        t_changes = 0
        a, c, B = cfg.a, cfg.c, cfg.max_batch

        def process(until: float) -> None:
            nonlocal head
            while heap and head < n_req:
                f, rid = heap[0]
                if reps[rid].removed:
                    heapq.heappop(heap)
                    continue
                first = arr_list[head]
                full_idx = head + B - 1
                full_t = arr_list[full_idx] if full_idx < n_req else math.inf
                start = max(f, min(first + timeout, full_t))
                if start >= until:
                    return
                heapq.heappop(heap)
                hi = bisect.bisect_right(arr_list, start, head, min(n_req, head + B))
                count = hi - head
                s = a + c * count
                end = start + s
                done[head:hi] = end
                head = hi
                sec = int(start)
                self.busy[sec] += s
                heapq.heappush(heap, (end, rid))

        steps = int(cfg.horizon / cfg.sync)
        for k in range(steps):
            t = k * cfg.sync
            head_at.append(head)
            m = self._scrape(t, arr, done, head, head_at, bounds, arr_list)
            m = replace(m, ready=sum(1 for r in reps.values() if not r.removed and r.ready_at <= t))
            provisioned = alive_count()
            want, new_timeout = controller(t, m, provisioned, timeout) if k > 0 else (provisioned, timeout)
            want = min(max(want, cfg.min_replicas), cfg.max_replicas)
            if want > provisioned:
                add(want - provisioned, t + cfg.cold_start)
            elif want < provisioned:
                remove(provisioned - want, t)
            if want != provisioned:
                actions += 1
            if not math.isclose(new_timeout, timeout):
                t_changes += 1
            timeout = new_timeout
            replicas_traj.append(want)
            timeouts_traj.append(timeout)
            replica_seconds += want * cfg.sync
            for r in reps.values():
                if not r.removed:
                    lo = max(r.ready_at, t)
                    for sec in range(int(lo), int(t + cfg.sync)):
                        self.ready_secs[sec] += min(1.0, t + cfg.sync - sec, sec + 1 - lo)
            process(t + cfg.sync)
            if progress is not None and k % 20 == 0:
                progress(f"t={t:.0f}s replicas={want} timeout={timeout * 1000:.1f}ms")
        process(math.inf)
        assert head == n_req and not np.isnan(done).any(), "every request must complete"
        return Result(arr, done, replicas_traj, timeouts_traj, replica_seconds, actions, t_changes)

    def _scrape(
        self,
        t: float,
        arr: np.ndarray,
        done: np.ndarray,
        head: int,
        head_at: list[int],
        bounds: np.ndarray,
        arr_list: list[float],
    ) -> Metrics:
        cfg = self.cfg
        back = int(cfg.window / cfg.sync) + 2
        lo = head_at[max(0, len(head_at) - 1 - back)]
        d = done[lo:head]
        mask = (d > t - cfg.window) & (d <= t)
        lat = d[mask] - arr[lo:head][mask]
        counts = np.bincount(np.searchsorted(bounds, lat, side="left"), minlength=len(bounds) + 1)
        p99 = histogram_quantile(0.99, bounds.tolist(), counts.tolist())
        rate = float(mask.sum()) / cfg.window
        s0, s1 = int(max(0.0, t - cfg.sync)), int(t)
        ready = float(self.ready_secs[s0:s1].sum())
        util = float(self.busy[s0:s1].sum()) / ready if ready > 0 else math.nan
        arrived = bisect.bisect_right(arr_list, t)
        queue = float(arrived - head)
        # In flight = queued + executing (kubeinfer_inflight_requests): arrived and not yet answered.
        # Requests dispatched before ``lo`` finished more than a window ago.
        inflight = queue + float(np.count_nonzero(done[lo:head] > t))
        return Metrics(
            p99=p99,
            utilization=min(1.0, util) if util == util else util,
            rate=rate,
            queue=queue,
            inflight=inflight,
            ready=0,  # replaced by the instantaneous ready count in run()
        )


# --------------------------------------------------------------------------------------------------
# controllers


def kubeinfer_policy(cfg: SimConfig) -> Policy:
    """The policy with the InferenceService API's default tunables, bounded by the simulation's."""
    return Policy(
        min_replicas=cfg.min_replicas,
        max_replicas=cfg.max_replicas,
        target_p99_seconds=cfg.target_p99,
        batch_timeout_min_seconds=cfg.timeout_bounds[0],
        batch_timeout_max_seconds=cfg.timeout_bounds[1],
        stale_after_seconds=2 * cfg.window,
    )


def make_kubeinfer(cfg: SimConfig, drained_signal: str = "inflight", **overrides: Any) -> Controller:
    """``policy.decide`` fed with the scraped metrics, unchanged (``overrides``: Policy fields).

    ``drained_signal``: what the observation's ``inflight_requests`` carries: ``"inflight"`` (queued +
    executing, as ``kubeinfer_inflight_requests``) or ``"queue"`` (the queue alone, for comparison).
    """
    if drained_signal not in ("inflight", "queue"):
        raise ValueError(f"drained_signal must be 'inflight' or 'queue', got {drained_signal!r}")
    policy = replace(kubeinfer_policy(cfg), **overrides)
    state = State()

    def tick(t: float, m: Metrics, n: int, timeout: float) -> tuple[int, float]:
        nonlocal state
        p99 = None if math.isnan(m.p99) else m.p99
        util = None if math.isnan(m.utilization) else m.utilization
        obs = Observation(
            p99_seconds=p99,
            gpu_utilization=util,
            request_rate=m.rate,
            queue_size=m.queue,
            inflight_requests=m.queue
            if drained_signal == "queue"
            else (None if math.isnan(m.inflight) else m.inflight),
            sample_age_seconds=0.0,
        )
        d = decide(obs, Current(n, timeout, ready_replicas=m.ready), policy, state, t)
        state = d.state
        return d.replicas, d.batch_timeout_seconds

    return tick


def make_hpa(cfg: SimConfig, metric: str) -> Controller:
    """The Kubernetes HPA algorithm on one metric (``"gpu"``: target 0.7; ``"p99"``: target = SLO).

    desired = ceil(ready * value / target) unless |value/target - 1| <= 0.1; scale-up limited to
    max(100 %, 4 pods) per sync; scale-down to the highest recommendation of the last 300 s.
    NaN metrics: hold (HPA skips the metric).
    """
    history: list[tuple[float, int]] = []
    target = 0.7 if metric == "gpu" else cfg.target_p99

    def tick(t: float, m: Metrics, n: int, timeout: float) -> tuple[int, float]:
        value = m.utilization if metric == "gpu" else m.p99
        base = m.ready if metric == "gpu" else n
        if math.isnan(value):
            if metric == "p99" and m.rate == 0:
                value = 0.0
            else:
                return n, timeout
        ratio = value / target
        desired = n if abs(ratio - 1) <= 0.1 else max(1, math.ceil(max(base, 1) * ratio))
        desired = min(desired, max(2 * n, n + 4))
        history.append((t, desired))
        history[:] = [(ht, r) for ht, r in history if t - ht <= 300.0]
        if desired < n:
            desired = min(n, max(r for _, r in history))
        return desired, timeout

    return tick


def replicas_needed(cfg: SimConfig, rate: float) -> int:
    """Replicas the capacity model needs for ``rate`` requests/s."""
    return min(cfg.max_replicas, max(cfg.min_replicas, math.ceil(rate / cfg.mu - 1e-9)))


def make_fixed(cfg: SimConfig, rates: np.ndarray) -> Controller:
    """Replicas for the trace's peak, never changed."""
    n_fixed = replicas_needed(cfg, float(rates.max()))
    return lambda t, m, n, timeout: (n_fixed, timeout)


def make_oracle(cfg: SimConfig, rates: np.ndarray) -> Controller:
    """Clairvoyant: replicas for the highest rate from now until one cold start + one sync ahead."""

    def tick(t: float, m: Metrics, n: int, timeout: float) -> tuple[int, float]:
        lo = int(t)
        hi = min(len(rates), int(t + cfg.cold_start + 2 * cfg.sync))
        return replicas_needed(cfg, float(rates[lo:hi].max())), timeout

    return tick


# --------------------------------------------------------------------------------------------------
# figures


def figures(cfg: SimConfig, res: Result) -> dict[str, float]:
    """The five figures of one run (see the module docstring)."""
    lat, arr = res.latency, res.arrivals
    target = cfg.target_p99
    slo = float((lat <= target).mean()) if lat.size else 1.0

    def window_p99s(width: float) -> list[float]:
        idx = (arr // width).astype(np.int64)
        out = []
        for w in range(math.ceil(cfg.horizon / width)):
            lo, hi = np.searchsorted(idx, w), np.searchsorted(idx, w + 1)
            out.append(float(np.quantile(lat[lo:hi], 0.99)) if hi > lo else math.nan)
        return out

    minute = [p for p in window_p99s(60.0) if not math.isnan(p)]
    window_att = sum(p <= target for p in minute) / len(minute) if minute else 1.0
    longest = run = 0
    for p in window_p99s(cfg.sync):
        run = run + 1 if (not math.isnan(p) and p > target) else 0
        longest = max(longest, run)
    return {
        "slo_attainment": round(slo, 5),
        "window_attainment": round(window_att, 4),
        "replica_seconds": round(res.replica_seconds, 1),
        "scaling_actions": res.scaling_actions,
        "recovery_seconds": longest * cfg.sync,
    }


def load_service_model() -> tuple[float, float, int | None, str]:
    """(a, c, max batch size or None, source) from bench/results/runtime.json, else the defaults.

    runtime.json (bench/runtime_bench.py) carries ``a_seconds``, ``c_seconds`` and ``max_batch_size``
    at the top level.
    """
    try:
        data = json.loads(RUNTIME_RESULTS.read_text())
        a, c = float(data["a_seconds"]), float(data["c_seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_A_SECONDS, DEFAULT_C_SECONDS, None, "defaults (no a/c fit in runtime.json)"
    if not (a > 0 and c > 0):
        return DEFAULT_A_SECONDS, DEFAULT_C_SECONDS, None, f"defaults (runtime.json fit a={a}, c={c} not > 0)"
    batch = data.get("max_batch_size")
    return a, c, int(batch) if isinstance(batch, int) and batch > 0 else None, "bench/results/runtime.json"


def run_all(cfg: SimConfig, seeds: Sequence[int], log: Callable[[str], None]) -> dict[str, Any]:
    """Every trace x controller x seed; medians over seeds."""
    names = (*CONTROLLERS, *VARIANTS)
    overrides = {v: make(cfg) for v, make in VARIANTS.items()}
    per: dict[str, dict[str, list[dict[str, float]]]] = {t: {c: [] for c in names} for t in TRACES}
    for seed in seeds:
        for trace in TRACES:
            rng = np.random.default_rng([seed, TRACES.index(trace)])
            rates = trace_rates(trace, cfg, rng)
            arrivals = poisson_arrivals(rates, rng)
            start_n = replicas_needed(cfg, float(rates[: int(cfg.cold_start)].max()))
            makers: dict[str, Callable[[], Controller]] = {
                "kubeinfer": lambda: make_kubeinfer(cfg),
                "hpa_gpu": lambda: make_hpa(cfg, "gpu"),
                "hpa_p99": lambda: make_hpa(cfg, "p99"),
                "fixed": lambda rates=rates: make_fixed(cfg, rates),
                "oracle": lambda rates=rates: make_oracle(cfg, rates),
                **{v: (lambda kw=overrides[v]: make_kubeinfer(cfg, **kw)) for v in VARIANTS},
            }
            for name in names:
                t0 = time.perf_counter()
                init = replicas_needed(cfg, float(rates.max())) if name == "fixed" else start_n
                res = Simulator(cfg, arrivals, init).run(makers[name]())
                fig = figures(cfg, res)
                per[trace][name].append(fig)
                log(
                    f"seed {seed} {trace:8s} {name:28s} slo {fig['slo_attainment']:.4f} "
                    f"win {fig['window_attainment']:.3f} rs {fig['replica_seconds']:8.0f} "
                    f"actions {fig['scaling_actions']:3d} recovery {fig['recovery_seconds']:5.0f}s "
                    f"peak {max(res.replicas)} timeout-changes {res.timeout_changes} "
                    f"({len(arrivals)} req, {time.perf_counter() - t0:.1f}s)"
                )

    def medians(trace: str, name: str) -> dict[str, float]:
        return {k: statistics.median(f[k] for f in per[trace][name]) for k in per[trace][name][0]}

    out: dict[str, Any] = {"traces": {}, "variants": {}}
    for trace in TRACES:
        out["traces"][trace] = {name: medians(trace, name) for name in CONTROLLERS}
    for variant in VARIANTS:
        out["variants"][variant] = {trace: medians(trace, variant) for trace in TRACES}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="seeds seed..seed+R-1; figures are medians")
    ap.add_argument("--horizon", type=float, default=1200.0, help="simulated seconds per run")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    a, c, batch, source = load_service_model()
    cfg = SimConfig(a=a, c=c, horizon=args.horizon, max_batch=batch or SimConfig.max_batch)
    print(
        f"s(b) = {a * 1000:.2f} ms + {c * 1000:.3f} ms*b ({source}); B={cfg.max_batch}; "
        f"target P99 {cfg.target_p99 * 1000:.0f} ms; mu {cfg.mu:.1f} req/s/replica; "
        f"cold start {cfg.cold_start:.0f}s; horizon {cfg.horizon:.0f}s",
        flush=True,
    )
    t0 = time.perf_counter()
    result = run_all(cfg, range(args.seed, args.seed + args.repeats), lambda s: print(s, flush=True))
    result["config"] = {
        "service_time_a_seconds": a,
        "service_time_c_seconds": c,
        "service_time_source": source,
        "max_batch_size": cfg.max_batch,
        "target_p99_seconds": cfg.target_p99,
        "replica_rate_mu": round(cfg.mu, 3),
        "cold_start_seconds": cfg.cold_start,
        "scrape_and_sync_seconds": cfg.sync,
        "query_window_seconds": cfg.window,
        "horizon_seconds": cfg.horizon,
        "seeds": list(range(args.seed, args.seed + args.repeats)),
    }
    summary = {}
    for trace, rows in result["traces"].items():
        k, h, o = rows["kubeinfer"], rows["hpa_gpu"], rows["oracle"]
        summary[trace] = {
            "kubeinfer_slo_ge_99pct": k["slo_attainment"] >= 0.99,
            "kubeinfer_vs_hpa_gpu_replica_seconds": round(k["replica_seconds"] / h["replica_seconds"], 3),
            "kubeinfer_vs_oracle_replica_seconds": round(k["replica_seconds"] / o["replica_seconds"], 3),
        }
    result["summary"] = summary
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out} in {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
