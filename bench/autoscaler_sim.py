"""Seeded discrete-event simulation of the autoscaler against HPA-style baselines.

    .venv/bin/python bench/autoscaler_sim.py                       # every CSV in bench/traces/
    .venv/bin/python bench/autoscaler_sim.py --trace FILE.csv      # one trace (repeatable)
    .venv/bin/python bench/autoscaler_sim.py --traces DIR --out results.json
    .venv/bin/python bench/autoscaler_sim.py --write-traces bench/traces   # regenerate the built-ins

Model (what is simulated, and what is not):

- Arrivals: Poisson with a per-second rate lambda(t) read from a trace CSV (``seconds,requests_per_second``,
  any step; see ``read_trace``). The built-in traces (``BUILTIN``, written to ``bench/traces/`` by
  ``--write-traces``, their construction in ``bench/traces/README.md``) are shaped in units of the
  sustainable per-replica rate ``mu`` (below) and written in requests/s. Every controller sees the same
  arrivals (same seed); each seed draws new arrivals from the same rates. An optional third column,
  ``high_priority_share``, is the share of each second's arrivals sent with ``priority`` 1 (the rest
  have the default level 2); each arrival's level is drawn from it (``_priorities``).
- Service: each replica runs one batch at a time taking s(b) = a + c*b seconds for b rows, b <= B.
  a and c come from ``bench/results/runtime.json`` (``a_seconds``, ``c_seconds``, ``max_batch_size``)
  when present, else the defaults below. The replicas share one queue (an ideal least-loaded
  balancer): a replica that is free fires a batch when B requests are queued or the oldest has waited the
  max queue delay (the runtime's batch timeout), whichever is first, and takes the queued requests in the
  runtime's order (``kubeinfer.runtime.batching``): priority level first, then arrival (FIFO when the
  trace has no priority column).
- New replicas serve after a cold start (model load + warmup); they cost replica-seconds from creation.
  Removed replicas finish their batch and stop.
- Metrics reach the controller every 15 s: P99 is computed from histogram buckets (the runtime's
  ``DURATION_BUCKETS``) over a 60 s window as Prometheus' ``histogram_quantile`` does; GPU utilization
  is the busy fraction of the ready replicas over the last 15 s (``DCGM_FI_DEV_GPU_UTIL``); request rate
  is completions per second over the window; arrival rate is arrivals per second over the last 15 s
  (one scrape interval: what ``irate(kubeinfer_requests_total[30s]) + deriv(kubeinfer_inflight_requests
  [30s])`` gives, completions plus the growth of the requests in flight); queue
  size and requests in flight are instantaneous; s(b)'s a and c and B are what the runtime exports.
- Controllers act every 15 s: ``kubeinfer`` (``kubeinfer.operator.autoscale.policy.decide``, unchanged,
  with the InferenceService API's default tunables), ``hpa_gpu`` (HPA on GPU utilization: target 70 %,
  tolerance 0.1, 300 s scale-down stabilization, scale-up limited to max(100 %, 4 pods) per sync),
  ``hpa_p99`` (the same HPA algorithm on the P99 metric with target = the SLO), ``fixed`` (replicas for
  the trace's peak, never changed) and ``oracle`` (clairvoyant: knows lambda(t) ahead and provisions, one
  cold start in advance, the replicas the capacity model needs for the coming peak; no stabilization).

Figures per trace and controller: ``slo_attainment`` (share of requests with latency <= target),
``window_attainment`` (share of 1-minute windows with traffic whose exact P99 <= target),
``replica_seconds``, ``scaling_actions`` (replica-count changes), ``recovery_seconds`` (time to
recover: the longest run of consecutive 15 s windows whose exact P99 is over target),
``direction_changes_per_hour`` (a scale-up followed by a scale-down or the reverse, per hour of trace:
flapping). Each figure is the median over ``--repeats`` seeds (default 3). A trace with a priority column
adds ``slo_attainment_high_priority`` and ``slo_attainment_low_priority`` (the same share per level).
``per_seed`` in the JSON keeps every seed's SLO attainment per trace and controller (medians of three
seeds can hide a controller that wins one seed by luck; the summary counts the seeds on which kubeinfer
meets HPA-on-GPU's SLO).

Beside ``traces`` the JSON carries ``variants`` (kubeinfer's policy with a part switched off, per trace),
``faults`` (Prometheus down, or answering NaN, in the middle of a trace: actions while the signal is
missing must be 0, and the controller acts again once it returns), ``restarts`` (kubeinfer's operator
restarting half-way through compressed_day, with and without the arrival history read back),
``config``, ``tuned_on`` (the traces the policy's tunables were chosen on; the others are held out)
and ``summary`` (the autoscaler's targets per trace: SLO attainment and replica-seconds against
HPA-on-GPU and the oracle, with every miss stated). ``bench/results/autoscaler.md`` gets the same
table as printed.

A simulation: no figure depends on the machine's load or speed (wall time appears only in progress
lines), so there is no load check; the run (this script's, and ``run_per_trace``'s for the adversary
and the frontier) holds ``bench/quiet.py``'s bench lock *shared*, so it never runs under a benchmark
that measures time (it keeps the cores busy for minutes), nor one of those under it. The JSON's
``machine`` records the CPU and the load all the same.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import dataclasses
import heapq
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import quiet
from kubeinfer.operator.autoscale.policy import (
    Current,
    Observation,
    Policy,
    State,
    decide,
    restore_arrivals,
    restore_state,
)

from kubeinfer.shared.hold import HoldLimits

try:
    from kubeinfer.runtime.metrics import DURATION_BUCKETS
except ImportError:  # pragma: no cover - the runtime's metrics module is part of the repository
    DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_RESULTS = ROOT / "bench" / "results" / "runtime.json"
DEFAULT_OUT = ROOT / "bench" / "results" / "autoscaler.json"
TRACES_DIR = ROOT / "bench" / "traces"
#: In a trace folder: the service model its traces were shaped for (``write_service_model``).
SERVICE_MODEL_FILE = "service_model.json"

#: Default batch service-time model s(b) = a + c*b when runtime.json is absent: a MiniLM-sized
#: encoder on a modest GPU (fixed launch/transfer overhead 15 ms, 1.5 ms per row).
DEFAULT_A_SECONDS = 0.015
DEFAULT_C_SECONDS = 0.0015
CONTROLLERS = ("kubeinfer", "hpa_gpu", "hpa_p99", "fixed", "oracle")
#: The traces kubeinfer's tunables were chosen on (the first four written); every other trace is held out.
TUNED_ON = ("step", "ramp", "diurnal", "mmpp")
#: Traces written after the policy's last change and run with it once: never seen in tuning.
UNSEEN = ("canary_shift", "retry_leak", "heavy_tail_spikes")
HELD_OUT_NOTE = (
    "flash_crowd, slow_ramp, sawtooth and compressed_day were held out in the first pass only; two changes "
    "(surge_factor 4 -> 5, arrival rate over 15 s instead of 30 s) were made after seeing them, a third "
    "(the burst headroom, policy.burst_*) in a third pass and a fourth (the burst factor from the bursts' "
    "peaks, standing on the arrival rate) in a fourth; cron_jobs, varied_bursts and noisy_plateau were "
    "written after the fourth and run once unseen, then a fifth change (the noise floor of a burst) was "
    "made after seeing noisy_plateau's miss; noisy_bursts, lunch_peak and weekend_low were written after "
    "the fifth and run once, unseen; interactive_batch, recurring_herd and failover were written after "
    "the fifth, then a sixth change (no scale-in while the arrivals rise) was chosen on the fourteen "
    "others, and they were run once with it, unseen; client_restart, tenant_onboarding and "
    "business_hours were written before a seventh change (a level the traffic left suddenly is held for "
    "its return) was run on any of them, then run once with it, unseen; an eighth (a small fleet's step "
    "floor once bursts are learned) was chosen after seeing them; canary_shift, retry_leak and "
    "heavy_tail_spikes were written before it ran on any of them, then run once with it, unseen: "
    "bench/traces/README.md gives each pass's figures"
)


@dataclass(frozen=True)
class SimConfig:
    """Simulation parameters. Times in seconds, rates in requests per second."""

    a: float = DEFAULT_A_SECONDS
    c: float = DEFAULT_C_SECONDS
    max_batch: int = 32
    cold_start: float = 30.0
    sync: float = 15.0
    window: float = 60.0
    arrival_window: float = 15.0
    horizon: float = 1200.0
    initial_max_queue_delay: float = 0.005
    max_queue_delay_bounds: tuple[float, float] = (0.001, 0.05)
    min_replicas: int = 1
    max_replicas: int = 12
    buckets: tuple[float, ...] = tuple(DURATION_BUCKETS)
    #: ``(Policy field, value)`` pairs applied to every kubeinfer controller (``--policy``).
    policy_overrides: tuple[tuple[str, Any], ...] = ()

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
            if 2 * self.s(cand) + self.initial_max_queue_delay <= self.target_p99:
                b = cand
        return 0.8 * b / self.s(b)


# --------------------------------------------------------------------------------------------------
# traces


@dataclass(frozen=True)
class Trace:
    """A request-rate trace on a 1 s grid.

    Attributes:
        name: the CSV file's stem.
        rates: requests/s for each second, float64, shape (horizon,).
        high_priority_share: the optional third column on the same grid, or ``None``.
    """

    name: str
    rates: np.ndarray
    high_priority_share: np.ndarray | None = None


def _ar1_log_noise(n: int, rng: np.random.Generator, phi: float, sigma: float) -> np.ndarray:
    """exp(AR(1)) multiplicative noise: ``sigma`` standard deviation (log), correlation ``phi`` per second."""
    noise = np.empty(n)
    x = 0.0
    for i, e in enumerate(rng.standard_normal(n)):
        x = phi * x + math.sqrt(1 - phi * phi) * sigma * e
        noise[i] = x
    return np.exp(noise)


def _poisson_bursts(
    n: int,
    rng: np.random.Generator,
    gap: float,
    length: tuple[float, float],
    factor: float | Callable[[np.random.Generator], float],
    *,
    compound: bool = False,
) -> np.ndarray:
    """Multipliers, shape (n,): bursts of uniform(``length``) seconds at Poisson times (mean ``gap`` s),
    each of ``factor`` (or ``factor(rng)``, drawn after its length), else 1. Overlapping bursts take the
    larger factor, or multiply with ``compound``."""
    out = np.ones(n)
    at = 0.0
    while True:
        at += rng.exponential(gap)
        if at >= n:
            return out
        span = slice(int(at), int(at) + int(rng.uniform(*length)))
        f = factor(rng) if callable(factor) else factor
        out[span] = out[span] * f if compound else np.maximum(out[span], f)


def _step(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    return np.where(t < 0.25 * n, 0.8, 3.2)


def _ramp(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    return np.minimum(0.5 + (5.0 - 0.5) * t / (0.6 * n), 5.0)


def _diurnal(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    return 2.75 - 2.25 * np.cos(2 * np.pi * t / n)


def _two_state(
    n: int, rng: np.random.Generator, stays: tuple[float, float], levels: tuple[float, float]
) -> np.ndarray:
    """Shape (n,): a two-state Markov chain on a 1 s grid, from state 0: state k holds ``levels[k]`` for
    Exp(``stays[k]``) seconds (at least 1), then the other state."""
    out = np.empty(n)
    state, i = 0, 0
    while i < n:
        stay = max(1, int(rng.exponential(stays[state])))
        out[i : i + stay] = levels[state]
        i += stay
        state = 1 - state
    return out


def _mmpp(n: int, rng: np.random.Generator) -> np.ndarray:
    return _two_state(n, rng, (90.0, 45.0), (0.8, 4.0))


def _flash_crowd(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    base, peak, start, rise, tau = 0.6, 4.8, 120.0, 10.0, 75.0
    up = base + (peak - base) * np.clip((t - start) / rise, 0.0, 1.0)
    decay = base + (peak - base) * np.exp(-(t - start - rise) / tau)
    return np.where(t < start + rise, up, decay)


def _slow_ramp(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    return (0.5 + 4.5 * t / n) * _ar1_log_noise(n, rng, 0.97, 0.1)  # 10 %, ~30 s correlation


def _sawtooth(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    period = 300.0  # the stabilization window of the HPA and of kubeinfer
    return 1.0 + 3.0 * (t % period) / period


def _compressed_day(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    hour = 24.0 * t / n
    shape = 0.4 + 2.6 * np.exp(-(((hour - 10.5) / 2.5) ** 2)) + 2.2 * np.exp(-(((hour - 19.5) / 2.0) ** 2))
    return shape * _poisson_bursts(n, rng, 200.0, (20.0, 40.0), 1.8, compound=True)


def _cron_jobs(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    period, start, length, edge = 420.0, 120.0, 120.0, 5.0  # a batch job every 7 minutes, 2 minutes long
    phase = (t - start) % period
    on = np.clip(phase / edge, 0.0, 1.0) * (phase < length) + np.clip(
        (length + edge - phase) / edge, 0.0, 1.0
    ) * ((phase >= length) & (phase < length + edge))
    return 1.0 + 2.0 * np.where(t >= start, on, 0.0)


def _varied_bursts(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    shape = 1.8 - 1.2 * np.cos(2 * np.pi * t / n)
    return shape * _poisson_bursts(n, rng, 150.0, (10.0, 50.0), lambda r: float(r.uniform(1.3, 2.4)))


def _noisy_plateau(n: int, rng: np.random.Generator) -> np.ndarray:
    return 2.0 * _ar1_log_noise(n, rng, 0.9, 0.25)  # 25 %, ~10 s correlation


def _noisy_bursts(n: int, rng: np.random.Generator) -> np.ndarray:
    return 1.5 * _ar1_log_noise(n, rng, 0.9, 0.15) * _poisson_bursts(n, rng, 180.0, (20.0, 40.0), 1.9)


def _lunch_peak(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    shape = np.interp(t, [0, 600, 900, 960, 1100, 1160, 1400, 1800], [0.8, 3.5, 3.5, 2.0, 2.0, 3.5, 3.5, 0.8])
    storm = np.where((t >= 1300) & (t < 1315), 2.5, 1.0)  # a retry storm, once
    return shape * _ar1_log_noise(n, rng, 0.9, 0.05) * storm


def _weekend_low(n: int, rng: np.random.Generator) -> np.ndarray:
    return 0.3 * _poisson_bursts(n, rng, 300.0, (25.0, 35.0), 3.0)


def _interactive_batch(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(n, dtype=np.float64)
    interactive = (1.0 + 1.5 * np.sin(np.pi * t / n)) * _ar1_log_noise(n, rng, 0.9, 0.08)
    jobs = np.interp(t, [0, 400, 410, 700, 710, 1200, 1210, 1500, 1510, n], [0, 0, 1, 1, 0, 0, 1, 1, 0, 0])
    backfill = 1.5 * jobs  # a low-priority backfill job, twice, 5 minutes each
    return interactive + backfill, interactive / (interactive + backfill)


def _recurring_herd(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    herd = np.where((t % 480.0 >= 240.0) & (t % 480.0 < 260.0), 2.6, 1.0)  # every 8 minutes, 20 s
    return 1.5 * _ar1_log_noise(n, rng, 0.9, 0.05) * herd


def _failover(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    level = np.where((t >= 600) & (t < 1200), 0.8, 3.0)  # traffic leaves for another region, then returns
    return level * _ar1_log_noise(n, rng, 0.95, 0.1)


def _job_ends(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    level = np.where(t < 900, 3.0, 1.0)  # a job's traffic ends at once and does not come back
    return level * _ar1_log_noise(n, rng, 0.95, 0.1)


def _client_restart(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    shape = np.full(n, 2.2)
    for start in (600.0, 1500.0):  # a rolling restart of the calling service, twice
        shape = np.where((t >= start) & (t < start + 45.0), 0.66, shape)  # callers gone: 30 % for 45 s
        shape = np.where((t >= start + 45.0) & (t < start + 105.0), 2.2 * 1.4, shape)  # their retries
    return shape * _ar1_log_noise(n, rng, 0.9, 0.08)


def _tenant_onboarding(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    shape = 1.0 + 0.8 * np.clip((t - 600.0) / 20.0, 0.0, 1.0) + 1.2 * np.clip((t - 1500.0) / 20.0, 0.0, 1.0)
    return shape * _ar1_log_noise(n, rng, 0.9, 0.08)


def _business_hours(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    shape = np.interp(t, [0, 600, 780, 2400, 2580, n], [0.4, 0.4, 3.0, 3.0, 0.6, 0.6])
    return shape * _ar1_log_noise(n, rng, 0.95, 0.1)


def _canary_shift(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    weight = np.select([t < 300, t < 600, t < 900, t < 1200], [0.1, 0.25, 0.5, 0.75], 1.0)  # setWeight
    return 3.5 * weight * _ar1_log_noise(n, rng, 0.9, 0.06)


def _retry_leak(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    leak = np.where(t < 1500, 1.5 ** (t / 300.0), 1.0)  # a retry bug grows x1.5 every 5 min, fixed at 1500 s
    return 0.5 * leak * _ar1_log_noise(n, rng, 0.95, 0.08)


def _heavy_tail_spikes(n: int, rng: np.random.Generator) -> np.ndarray:
    spikes = _poisson_bursts(n, rng, 60.0, (5.0, 15.0), lambda r: 1.0 + 0.3 * float(r.pareto(2.5)))
    return 2.0 * spikes * _ar1_log_noise(n, rng, 0.9, 0.05)


def _flash_sale(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    base = np.where(t < 600, 1.2, 1.5 + 2.5 * np.exp(-(t - 605.0) / 240.0))  # the sale leaves a new level
    opening = np.clip((t - 600.0) / 5.0, 0.0, 1.0)  # 1.2 mu -> 4 mu in 5 s
    shape = np.where(t < 605, 1.2 + (4.0 - 1.2) * opening, base)
    email = 1.0 + 0.8 * np.clip(np.minimum(t - 1400.0, 1460.0 - t) / 10.0, 0.0, 1.0)  # x1.8 for 60 s
    return shape * email * _ar1_log_noise(n, rng, 0.9, 0.06)


def _fanout_cron(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    fanout = np.where((t >= 45) & ((t - 45) % 90.0 < 8.0), 1.2, 0.0)  # +1.2 mu for 8 s every 90 s
    return (1.8 + fanout) * _ar1_log_noise(n, rng, 0.9, 0.08)


def _backfill_window(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    backfill = 2.5 * np.interp(t, [0, 600, 660, 1560, 1620, n], [0, 0, 1, 1, 0, 0])
    return (0.5 + backfill) * _ar1_log_noise(n, rng, 0.95, 0.1)


def _morning_ramp_bursts(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    ramp = 0.4 + 2.6 / (1.0 + np.exp(-(t - 900.0) / 150.0))
    bursts = _poisson_bursts(n, rng, 240.0, (10.0, 30.0), 1.6)
    return ramp * bursts * _ar1_log_noise(n, rng, 0.9, 0.08)


def _push_notification(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    # A push notification at 900 s: x3 within 20 s, users trickling away with a 3-minute time constant.
    rise = np.clip((t - 900.0) / 20.0, 0.0, 1.0)
    decay = np.where(t < 920.0, 1.0, np.exp(-(t - 920.0) / 180.0))
    return 1.2 * (1.0 + 2.0 * rise * decay) * _ar1_log_noise(n, rng, 0.9, 0.1)


def _evening_winddown(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    # 3.5 mu for 5 minutes, then a 25-minute linear fall to 0.6 mu that stays.
    shape = np.interp(t, [0, 300, 1800, n], [3.5, 3.5, 0.6, 0.6])
    return shape * _ar1_log_noise(n, rng, 0.95, 0.08)


def _scraper_onoff(n: int, rng: np.random.Generator) -> np.ndarray:
    # 1.5 mu of users plus a scraper of 1 mu that is on for Exp(120 s) and off for Exp(240 s).
    scraper = _two_state(n, rng, (240.0, 120.0), (0.0, 1.0))
    return (1.5 + scraper) * _ar1_log_noise(n, rng, 0.9, 0.1)


def _two_region_waves(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    # Two regions' busy hours, one after the other, with x1.4 bursts of 15-25 s (mean gap 300 s).
    waves = 0.6 + 1.8 * np.exp(-(((t - 900.0) / 500.0) ** 2)) + 1.5 * np.exp(-(((t - 2100.0) / 500.0) ** 2))
    bursts = _poisson_bursts(n, rng, 300.0, (15.0, 25.0), 1.4)
    return waves * bursts * _ar1_log_noise(n, rng, 0.9, 0.08)


def _idle_spike(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    # 0.4 mu for 5 minutes, then 15 minutes without a request, then a spike: 2.5 mu within 10 s at
    # 1200 s, settling to 0.6 mu with a 150 s time constant.
    rise = np.clip((t - 1200.0) / 10.0, 0.0, 1.0)
    spike = np.where(t < 1210.0, 2.5 * rise, 0.6 + 1.9 * np.exp(-(t - 1210.0) / 150.0))
    shape = np.where(t < 300.0, 0.4, np.where(t < 1200.0, 0.0, spike))
    return shape * _ar1_log_noise(n, rng, 0.9, 0.08)


def _sparse_sessions(n: int, rng: np.random.Generator) -> np.ndarray:
    # An internal tool: sessions at Poisson times (mean gap 8 minutes), each 1 to 3 minutes of 0.002 to
    # 0.005 mu (2 to 5 requests/s at the committed service model's mu), nothing between them.
    out = np.zeros(n)
    at = 0.0
    while True:
        at += rng.exponential(480.0)
        if at >= n:
            return out
        span = slice(int(at), int(at + rng.uniform(60.0, 180.0)))
        out[span] = np.maximum(out[span], rng.uniform(0.002, 0.005))


def _batch_gaps(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    # A batch job every 15 minutes from 120 s: 3 minutes at 1.5 mu with 10 s ramps, nothing between.
    period, start, length, edge = 900.0, 120.0, 180.0, 10.0
    phase = (t - start) % period
    on = np.clip(np.minimum(phase, length + edge - phase) / edge, 0.0, 1.0)
    return 1.5 * np.where(t >= start, on, 0.0) * _ar1_log_noise(n, rng, 0.9, 0.05)


Shape = Callable[[int, np.random.Generator], np.ndarray | tuple[np.ndarray, np.ndarray]]


#: Built-in traces: generator (shape in units of mu), horizon in seconds. Construction in words:
#: bench/traces/README.md. MMPP, slow_ramp and compressed_day draw from a generator seeded per trace.
BUILTIN: dict[str, tuple[Shape, int]] = {
    "step": (_step, 1200),
    "ramp": (_ramp, 1200),
    "diurnal": (_diurnal, 1200),
    "mmpp": (_mmpp, 1200),
    "flash_crowd": (_flash_crowd, 900),
    "slow_ramp": (_slow_ramp, 3600),
    "sawtooth": (_sawtooth, 1800),
    "compressed_day": (_compressed_day, 2400),
    "cron_jobs": (_cron_jobs, 1800),
    "varied_bursts": (_varied_bursts, 2400),
    "noisy_plateau": (_noisy_plateau, 1800),
    "noisy_bursts": (_noisy_bursts, 2400),
    "lunch_peak": (_lunch_peak, 1800),
    "weekend_low": (_weekend_low, 1800),
    "interactive_batch": (_interactive_batch, 1800),
    "recurring_herd": (_recurring_herd, 2400),
    "failover": (_failover, 1800),
    "job_ends": (_job_ends, 2700),
    "client_restart": (_client_restart, 2100),
    "tenant_onboarding": (_tenant_onboarding, 2400),
    "business_hours": (_business_hours, 3000),
    "canary_shift": (_canary_shift, 1800),
    "retry_leak": (_retry_leak, 2400),
    "heavy_tail_spikes": (_heavy_tail_spikes, 2400),
}


#: Later batches of natural traces, each written to a folder of its own before any policy change runs on
#: them (``--write-traces DIR --batch NAME``, run with ``--traces DIR``), so that bench/traces/ stays the
#: set the passes of bench/traces/README.md describe. ``peers_batch``: written after the peers' frontier
#: (bench/autoscaler_frontier.py) and before any policy change was tried against it; ``batch6``: written
#: after the policy became typed rules (41827a4) and before any controller ran on it; ``idle``: traces
#: with spells of no request at all, for scale to zero (``bench/autoscaler_zero.py``).
BATCHES: dict[str, dict[str, tuple[Shape, int]]] = {
    "peers_batch": {
        "flash_sale": (_flash_sale, 1800),
        "fanout_cron": (_fanout_cron, 2400),
        "backfill_window": (_backfill_window, 2400),
        "morning_ramp_bursts": (_morning_ramp_bursts, 3000),
    },
    "batch6": {
        "push_notification": (_push_notification, 2400),
        "evening_winddown": (_evening_winddown, 2400),
        "scraper_onoff": (_scraper_onoff, 2400),
        "two_region_waves": (_two_region_waves, 3000),
    },
    # Traces with spells of no request at all, for scale to zero (bench/autoscaler_zero.py).
    "idle": {
        "idle_spike": (_idle_spike, 2400),
        "sparse_sessions": (_sparse_sessions, 3600),
        "batch_gaps": (_batch_gaps, 3600),
    },
}


def trace_rates(name: str, cfg: SimConfig, rng: np.random.Generator) -> np.ndarray:
    """A built-in shape over ``cfg.horizon`` seconds in requests/s (float64, shape (horizon,)); the rates
    only, for a shape with a priority share."""
    if name not in BUILTIN:
        raise ValueError(f"unknown trace {name!r}; expected one of {tuple(BUILTIN)}")
    shape = BUILTIN[name][0](int(cfg.horizon), rng)
    return cfg.mu * (shape[0] if isinstance(shape, tuple) else shape)


def builtin_trace(name: str, mu: float, shapes: dict[str, tuple[Shape, int]] | None = None) -> Trace:
    """A built-in trace (of ``shapes``, default ``BUILTIN``) in requests/s (its shape times ``mu``),
    from a generator seeded by its name; a shape that returns ``(rates, share)`` gives the trace its
    ``high_priority_share``."""
    make, n = (BUILTIN if shapes is None else shapes)[name]
    rng = np.random.default_rng([sum(name.encode()), len(name)])
    shape = make(n, rng)
    if isinstance(shape, tuple):
        return Trace(name, np.round(mu * shape[0], 1), np.round(shape[1], 3))
    return Trace(name, np.round(mu * shape, 1))


def write_trace(trace: Trace, path: Path) -> None:
    """Write ``seconds,requests_per_second`` rows, one per second, with ``high_priority_share`` as a
    third column when the trace has one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        share = trace.high_priority_share
        if share is None:
            w.writerow(["seconds", "requests_per_second"])
            w.writerows((i, f"{r:.1f}") for i, r in enumerate(trace.rates))
            return
        w.writerow(["seconds", "requests_per_second", "high_priority_share"])
        w.writerows(
            (i, f"{r:.1f}", f"{h:.3f}") for i, (r, h) in enumerate(zip(trace.rates, share, strict=True))
        )


def _on_grid(times: np.ndarray, values: np.ndarray, end: float) -> np.ndarray:
    """Piecewise-constant ``values`` (from each time to the next, the last until ``end``) averaged over
    each 1 s of the grid ``[0, ceil(end))`` (a second past ``end`` counts as 0 there)."""
    horizon = max(1, math.ceil(end))
    edges = np.append(times, end)
    area = np.concatenate([[0.0], np.cumsum(values * np.diff(edges))])
    grid = np.arange(horizon + 1, dtype=np.float64)
    return np.diff(np.interp(grid, edges, area))


def read_trace(path: Path) -> Trace:
    """Read a trace CSV: ``seconds,requests_per_second[,high_priority_share]`` with a header row.

    Rows give the rate from their time to the next row's (any step, not necessarily regular); the last
    row lasts as long as the step before it. Rates are averaged onto a 1 s grid, and the share of the
    level-1 requests is weighted by the rate (the share of each second's requests).

    Raises:
        ValueError: naming the file and row, when a row does not parse, times do not increase, a rate
            is negative, a share is outside [0, 1], or there are fewer than two rows.
    """
    rows: list[list[float]] = []
    with path.open(newline="") as f:
        for k, row in enumerate(csv.reader(f), start=1):
            if not row or row[0].strip().startswith("#") or (k == 1 and not _is_number(row[0])):
                continue
            try:
                rows.append([float(x) for x in row])
            except ValueError as exc:
                raise ValueError(f"{path}:{k}: not a number: {row!r}") from exc
    if len(rows) < 2:
        raise ValueError(f"{path}: needs at least two rows of seconds,requests_per_second")
    data = np.array([r[:2] for r in rows])
    times, rates = data[:, 0] - data[0, 0], data[:, 1]
    if (np.diff(times) <= 0).any() or (rates < 0).any() or not np.isfinite(data).all():
        raise ValueError(f"{path}: seconds must increase and rates be finite and >= 0")
    end = float(times[-1] + (times[-1] - times[-2]))
    grid = _on_grid(times, rates, end)
    share = None
    if all(len(r) >= 3 for r in rows):
        level_one = np.array([r[2] for r in rows])
        if not (np.isfinite(level_one).all() and ((level_one >= 0) & (level_one <= 1)).all()):
            raise ValueError(f"{path}: high_priority_share must be in [0, 1]")
        # the share of each second's arrivals: level-1 requests over all requests in that second
        high = _on_grid(times, rates * level_one, end)
        share = np.divide(high, grid, out=np.zeros_like(grid), where=grid > 0)
    return Trace(path.stem, grid, share)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


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
    """One scrape as a controller sees it. NaN = no data; ``down``: Prometheus did not answer."""

    p99: float
    utilization: float
    rate: float
    queue: float
    ready: int
    inflight: float = math.nan
    arrival_rate: float = math.nan
    down: bool = False
    #: Requests in flight (queued + in service, all replicas) averaged over the last sync interval
    #: [t - sync, t]: the integral of the in-flight count over it, divided by its length (requests).
    #: With an ``Activator``, the requests it holds count too (Knative's activator reports them).
    concurrency: float = math.nan
    #: Arrivals per second over the query window (t - window, t], as a proxy in front of the replicas
    #: counts them (KEDA's http-add-on interceptor), held and refused ones included.
    offered_rate: float = math.nan
    #: The time of the last arrival at or before t, seconds (NaN: none yet).
    last_arrival: float = math.nan


#: A fault: (start, end, kind) with kind ``"down"`` (no answer) or ``"nan"`` (every value NaN).
Fault = tuple[float, float, str]


# --------------------------------------------------------------------------------------------------
# scale to zero: what holds the requests while no replica is ready


@dataclass(frozen=True)
class Activator:
    """What holds a service's requests while it has no ready replica, and asks for one.

    With an activator a ``Simulator`` lets the controller take the replicas to 0. A request that arrives
    while no replica is ready is held; the first one held while no replica is provisioned asks for one at
    once (0 -> 1: kubeinfer's activator demand, Knative's activator poke, KEDA's push of an active
    trigger; each takes well under a second, simulated as none). The held requests are released to the
    replicas when the first one is Ready (the cold start), their latency counting the wait.

    Attributes:
        name: whose activator (the results name it).
        max_held: the most requests held at once; an arrival over it is refused (lost: ``overflow``).
            ``None``: no bound.
        hold_timeout: the longest a request is held, seconds; past it, it is refused (lost: ``timed
            out``). ``None``: no deadline.
    """

    name: str
    max_held: int | None
    hold_timeout: float | None

    def __post_init__(self) -> None:
        if self.max_held is not None and self.max_held < 1:
            raise ValueError(f"activator {self.name}: max_held must be at least 1 (got {self.max_held})")
        if self.hold_timeout is not None and not self.hold_timeout > 0:
            raise ValueError(f"activator {self.name}: hold_timeout must be > 0 (got {self.hold_timeout})")


#: kubeinfer's activator (``kubeinfer.shared.hold.HoldLimits`` defaults: 100 requests held per
#: target, the cold-start budget ``--cold-start-timeout`` 60 s).
KUBEINFER_ACTIVATOR = Activator("kubeinfer", HoldLimits().max_requests, HoldLimits().cold_start_timeout_s)


@dataclass(frozen=True)
class HoldOutcome:
    """What an activator did with the requests that arrived while no replica was ready, each a bool
    array of their shape: ``held`` (released at the release time), ``overflow`` (refused on arrival: the
    hold was full), ``timed_out`` (refused at its arrival + ``hold_timeout``); ``leave``: when each left
    the activator, seconds (the release, its arrival, or its deadline)."""

    held: np.ndarray
    overflow: np.ndarray
    timed_out: np.ndarray
    leave: np.ndarray


def hold(arrivals: np.ndarray, release: float, activator: Activator) -> HoldOutcome:
    """The activator's bounded hold over ``arrivals`` (sorted seconds, all before ``release``), released
    at ``release`` (the first replica Ready).

    Each arrival first drops the held requests whose deadline (arrival + ``hold_timeout``) has come,
    then is held if fewer than ``max_held`` are, else refused. At ``release`` the requests still held
    whose deadline has not passed are released (a deadline equal to the release counts as met).

    Raises:
        ValueError: when an arrival is not before ``release``.
    """
    arrivals = np.asarray(arrivals, dtype=np.float64)
    if arrivals.size and arrivals[-1] >= release:
        raise ValueError(f"every held arrival must be before the release at {release} s")
    n = arrivals.size
    overflow, timed_out = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    leave = arrivals.copy()
    limit, deadline = activator.max_held, activator.hold_timeout
    queue: deque[int] = deque()
    for i, a in enumerate(arrivals.tolist()):
        while deadline is not None and queue and arrivals[queue[0]] + deadline <= a:
            j = queue.popleft()
            timed_out[j], leave[j] = True, arrivals[j] + deadline
        if limit is None or len(queue) < limit:
            queue.append(i)
        else:
            overflow[i] = True
    held = np.zeros(n, dtype=bool)
    for j in queue:
        if deadline is not None and arrivals[j] + deadline < release:
            timed_out[j], leave[j] = True, arrivals[j] + deadline
        else:
            held[j], leave[j] = True, release
    return HoldOutcome(held, overflow, timed_out, leave)


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
    actions_at: list[float] = field(default_factory=list)
    high: np.ndarray | None = None
    #: With an ``Activator`` (bool, shape of ``arrivals``): the requests held and then served, those
    #: refused because the hold was full, those refused past its deadline. A refused request's ``done``
    #: is +inf: its latency is unbounded.
    held: np.ndarray | None = None
    overflow: np.ndarray | None = None
    timed_out: np.ndarray | None = None
    #: (first request held, first replica Ready) of each spell without a ready replica, seconds.
    activations: list[tuple[float, float]] = field(default_factory=list)
    #: Seconds of the horizon with no replica provisioned.
    zero_seconds: float = 0.0

    @property
    def latency(self) -> np.ndarray:
        return self.done - self.arrivals

    @property
    def lost(self) -> np.ndarray:
        """The refused requests (bool, shape of ``arrivals``): none without an activator."""
        if self.overflow is None or self.timed_out is None:
            return np.zeros(self.arrivals.shape, dtype=bool)
        return self.overflow | self.timed_out


Controller = Callable[[float, Metrics, int, float], tuple[int, float]]


@dataclass
class _Replica:
    ready_at: float
    removed: bool = False


@dataclass
class _Fleet:
    """The replicas and the batches they run over one arrival sequence (one shared queue).

    ``head``: every request before this index has been dispatched (FIFO: exactly the dispatched ones).
    ``high``: True for the arrivals at priority level 1, ``None`` for a trace without priorities.
    """

    cfg: SimConfig
    arrivals: list[float]
    busy: np.ndarray
    ready_secs: np.ndarray
    done: np.ndarray
    head: int = 0
    reps: dict[int, _Replica] = field(default_factory=dict)
    heap: list[tuple[float, int]] = field(default_factory=list)
    next_id: int = 0
    high: np.ndarray | None = None
    levels: list[list[int]] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.high is not None:  # the indices of each level's arrivals, level 1 first
            self.levels = [np.flatnonzero(self.high).tolist(), np.flatnonzero(~self.high).tolist()]
            self.heads = [0, 0]

    def add(self, k: int, ready_at: float) -> None:
        for _ in range(k):
            self.reps[self.next_id] = _Replica(ready_at)
            heapq.heappush(self.heap, (ready_at, self.next_id))
            self.next_id += 1

    def remove(self, k: int) -> None:
        """Pending (not yet ready) replicas go first, newest first; then ready ones."""
        alive = sorted((r.ready_at, i) for i, r in self.reps.items() if not r.removed)
        for _, i in reversed(alive[-k:] if k else []):
            self.reps[i].removed = True

    def alive(self) -> int:
        return sum(1 for r in self.reps.values() if not r.removed)

    def first_ready(self) -> float:
        """When the first of the provisioned replicas is (or was) Ready, seconds; +inf with none."""
        return min((r.ready_at for r in self.reps.values() if not r.removed), default=math.inf)

    def ready(self, t: float) -> int:
        return sum(1 for r in self.reps.values() if not r.removed and r.ready_at <= t)

    def account_ready(self, t: float) -> None:
        """Ready replica-seconds per second of [t, t + sync) (the utilization's denominator)."""
        end = t + self.cfg.sync
        for r in self.reps.values():
            if not r.removed:
                lo = max(r.ready_at, t)
                for sec in range(int(lo), int(end)):
                    self.ready_secs[sec] += min(1.0, end - sec, sec + 1 - lo)

    def process(self, until: float, timeout: float) -> None:
        """Run every batch that starts before ``until``."""
        if self.high is not None:
            self._process_levels(until, timeout)
            return
        arr, n_req, B = self.arrivals, len(self.arrivals), self.cfg.max_batch
        heap, reps = self.heap, self.reps
        while heap and self.head < n_req:
            free_at, rid = heap[0]
            if reps[rid].removed:
                heapq.heappop(heap)
                continue
            head = self.head
            full_t = arr[head + B - 1] if head + B - 1 < n_req else math.inf
            start = max(free_at, min(arr[head] + timeout, full_t))
            if start >= until:
                return
            heapq.heappop(heap)
            hi = bisect.bisect_right(arr, start, head, min(n_req, head + B))
            s = self.cfg.a + self.cfg.c * (hi - head)
            self.done[head:hi] = start + s
            self.head = hi
            self.busy[int(start)] += s
            heapq.heappush(heap, (start + s, rid))

    def _process_levels(self, until: float, timeout: float) -> None:
        """``process`` with two priority levels: a batch fires when B requests of any level are queued
        or the oldest queued one has waited the max queue delay, and takes the queued requests of level 1
        first, then level 2, each in arrival order (the runtime's ``plan_batch`` order)."""
        arr, B, heap, reps = self.arrivals, self.cfg.max_batch, self.heap, self.reps
        levels, heads = self.levels, self.heads
        while heap and (heads[0] < len(levels[0]) or heads[1] < len(levels[1])):
            free_at, rid = heap[0]
            if reps[rid].removed:
                heapq.heappop(heap)
                continue
            nxt = [[arr[i] for i in lv[h : h + B]] for lv, h in zip(levels, heads, strict=True)]
            merged = sorted(nxt[0] + nxt[1])
            full_t = merged[B - 1] if len(merged) >= B else math.inf
            start = max(free_at, min(merged[0] + timeout, full_t))
            if start >= until:
                return
            heapq.heappop(heap)
            picked: list[int] = []
            for k, times in enumerate(nxt):  # level 1's queued requests first, then level 2's
                take = min(B - len(picked), bisect.bisect_right(times, start))
                picked += levels[k][heads[k] : heads[k] + take]
                heads[k] += take
            s = self.cfg.a + self.cfg.c * len(picked)
            self.done[picked] = start + s
            self.head = min(
                (lv[h] for lv, h in zip(levels, heads, strict=True) if h < len(lv)), default=len(arr)
            )
            self.busy[int(start)] += s
            heapq.heappush(heap, (start + s, rid))


@dataclass
class _Door:
    """The way in with an ``Activator``: admits each arrival to the fleet's queue (``_Fleet.arrivals``
    holds when each reached it, ``index`` which arrival it was), at once while a replica is ready, else
    through the activator's ``hold``; the first request held while no replica is provisioned asks for
    one (``demands``)."""

    cfg: SimConfig
    activator: Activator
    arrivals: np.ndarray
    arr_list: list[float]
    fleet: _Fleet
    avail: np.ndarray = field(init=False)
    index: np.ndarray = field(init=False)
    held: np.ndarray = field(init=False)
    overflow: np.ndarray = field(init=False)
    timed_out: np.ndarray = field(init=False)
    next: int = 0
    release: float = -math.inf
    #: (arrival, leave) of the requests each spell held (the refused-at-once ones spend no time there).
    spells: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    activations: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.arr_list)
        self.avail = np.empty(n)
        self.index = np.empty(n, dtype=np.int64)
        self.held, self.overflow, self.timed_out = (np.zeros(n, dtype=bool) for _ in range(3))

    def activating(self, t: float) -> bool:
        """Whether requests are held at ``t`` waiting for a replica (which must then stay)."""
        return self.release > t

    def admit(self, until: float) -> list[float]:
        """Admit the arrivals before ``until`` (a spell without a ready replica is resolved whole, up to
        its release, even past ``until``). Returns the times a replica was asked for from zero."""
        demands: list[float] = []
        arr_list, n = self.arr_list, len(self.arr_list)
        while self.next < n and arr_list[self.next] < until:
            i = self.next
            a, first = arr_list[i], self.fleet.first_ready()
            if first <= a:  # a replica is ready, and stays so until the next tick
                j = bisect.bisect_left(arr_list, until, i)
                self._push(np.arange(i, j), self.arrivals[i:j])
                self.next = j
                continue
            if math.isinf(first):  # nothing provisioned: the first request held asks for a replica
                first = a + self.cfg.cold_start
                self.fleet.add(1, first)
                demands.append(a)
            j = bisect.bisect_left(arr_list, first, i)
            out = hold(self.arrivals[i:j], first, self.activator)
            self.held[i:j], self.overflow[i:j], self.timed_out[i:j] = out.held, out.overflow, out.timed_out
            stayed = ~out.overflow
            self.spells.append((self.arrivals[i:j][stayed], out.leave[stayed]))
            self.activations.append((a, first))
            released = np.flatnonzero(out.held) + i
            self._push(released, np.full(released.size, first))
            self.release, self.next = first, j
        return demands

    def _push(self, idx: np.ndarray, at: np.ndarray) -> None:
        m, k = len(self.fleet.arrivals), idx.size
        self.fleet.arrivals.extend(at.tolist())
        self.avail[m : m + k] = at
        self.index[m : m + k] = idx

    def held_in_flight(self, t0: float, t: float) -> float:
        """The integral over [t0, t] of the count of requests held (request-seconds)."""
        total = 0.0
        for arr, leave in reversed(self.spells):
            if leave.size == 0:
                continue
            if leave.max() <= t0:
                break  # spells come in time order: every earlier one left before t0 too
            overlap = np.minimum(leave, t) - np.maximum(arr, t0)
            total += float(overlap[overlap > 0].sum())
        return total


def _without_pod_metrics(m: Metrics) -> Metrics:
    """``m`` as Prometheus answers it while no replica is ready: nothing the runtime pods export (P99,
    utilization, rates, queue, in flight); what the activator or a proxy in front counts stays."""
    nan = math.nan
    return replace(m, p99=nan, utilization=nan, rate=nan, queue=nan, inflight=nan, arrival_rate=nan)


@dataclass
class Simulator:
    """Runs one controller over one arrival sequence; ``fault`` blanks the metrics for a while;
    ``high`` (bool, shape of ``arrivals``) marks the arrivals at priority level 1 (``None``: FIFO);
    ``p99_signal`` False skips the P99 histogram (``Metrics.p99`` NaN) for a controller that never
    reads it (the peers on concurrency, which tick every 2 s: the histogram is most of a scrape's cost).

    ``activator``: scale to zero. The controller may then take the replicas to 0, and the arrivals while
    no replica is ready go through the activator (``Activator``, ``hold``): a replica is asked for at the
    first one held, and the last one stays while requests are held or queued at it. While no replica is
    ready the controller's metrics carry nothing the pods export (``_without_pod_metrics``). Priority
    levels are not simulated with an activator.
    """

    cfg: SimConfig
    arrivals: np.ndarray
    initial_replicas: int
    fault: Fault | None = None
    high: np.ndarray | None = None
    p99_signal: bool = True
    activator: Activator | None = None
    busy: np.ndarray = field(init=False)
    ready_secs: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        size = int(self.cfg.horizon) + 3600
        self.busy = np.zeros(size)
        self.ready_secs = np.zeros(size)
        if self.activator is not None and self.high is not None:
            raise ValueError("priority levels are not simulated with an activator")

    def run(self, controller: Controller, progress: Callable[[str], None] | None = None) -> Result:
        """Every tick: scrape, the controller's decision, the replicas added or removed, then the
        batches until the next tick. Returns the ``Result``.

        Raises:
            AssertionError: when a request is left neither answered nor refused.
        """
        cfg, arr = self.cfg, self.arrivals
        arr_list: list[float] = arr.tolist()
        done = np.full(len(arr_list), np.nan)
        door: _Door | None = None
        if self.activator is None:
            fleet = _Fleet(cfg, arr_list, self.busy, self.ready_secs, done, high=self.high)
            avail = arr
        else:  # the fleet's queue is filled as requests get through the door
            fleet = _Fleet(cfg, [], self.busy, self.ready_secs, np.full(len(arr_list), np.nan))
            door = _Door(cfg, self.activator, arr, arr_list, fleet)
            avail = door.avail
        fleet.add(self.initial_replicas, 0.0)
        timeout = cfg.initial_max_queue_delay
        head_at: list[int] = []
        res = Result(arr, done, [], [], 0.0, 0, 0, high=self.high)
        for k in range(int(cfg.horizon / cfg.sync)):
            t = k * cfg.sync
            head_at.append(fleet.head)
            ready = fleet.ready(t)
            m = replace(self._scrape(t, fleet, head_at, arr_list, avail, door), ready=ready)
            if door is not None and ready == 0:
                m = _without_pod_metrics(m)
            provisioned = fleet.alive()
            want, new_timeout = controller(t, m, provisioned, timeout) if k > 0 else (provisioned, timeout)
            want = self._bounded(want, t, fleet, door)
            self._scale(fleet, provisioned, want, t, res)
            if not math.isclose(new_timeout, timeout):
                res.timeout_changes += 1
            timeout = new_timeout
            res.timeouts.append(timeout)
            if door is not None:
                self._through_door(door, t, res)
            fleet.account_ready(t)
            fleet.process(t + cfg.sync, timeout)
            if progress is not None and k % 20 == 0:
                progress(f"t={t:.0f}s replicas={want} timeout={timeout * 1000:.1f}ms")
        if door is not None:
            door.admit(math.inf)
        fleet.process(math.inf, timeout)
        admitted = len(fleet.arrivals)
        assert fleet.head == admitted and not np.isnan(fleet.done[:admitted]).any(), "every request must end"
        if door is not None:
            done[door.index[:admitted]] = fleet.done[:admitted]
            res.held, res.overflow, res.timed_out = door.held, door.overflow, door.timed_out
            done[res.lost] = np.inf
            res.activations = door.activations
            assert not np.isnan(done).any(), "every request must be answered or refused"
        return res

    def _bounded(self, want: int, t: float, fleet: _Fleet, door: _Door | None) -> int:
        """``want`` within the bounds: [min_replicas, max_replicas]; with an activator the floor is 0, or
        1 while requests are held for a replica or queued at the replicas (the last one goes only with
        nothing in flight)."""
        if door is None:
            low = self.cfg.min_replicas
        else:
            low = int(door.activating(t) or fleet.head < len(fleet.arrivals))
        return min(max(want, low), self.cfg.max_replicas)

    def _scale(self, fleet: _Fleet, provisioned: int, want: int, t: float, res: Result) -> None:
        """Add or remove replicas to go from ``provisioned`` to ``want`` at ``t``, and count it."""
        if want > provisioned:
            fleet.add(want - provisioned, t + self.cfg.cold_start)
        elif want < provisioned:
            fleet.remove(provisioned - want)
        if want != provisioned:
            res.scaling_actions += 1
            res.actions_at.append(t)
        res.replicas.append(want)
        res.replica_seconds += want * self.cfg.sync
        if want == 0:
            res.zero_seconds += self.cfg.sync

    def _through_door(self, door: _Door, t: float, res: Result) -> None:
        """Admit the arrivals until the next tick; a replica asked for from zero costs its
        replica-seconds from then, and counts as a scaling action."""
        end = min(t + self.cfg.sync, self.cfg.horizon)
        for a in door.admit(t + self.cfg.sync):
            res.replica_seconds += max(0.0, end - a)
            res.zero_seconds -= max(0.0, end - a)
            res.scaling_actions += 1
            res.actions_at.append(a)

    def _concurrency(
        self, t: float, fleet: _Fleet, head_at: list[int], arrived: int, avail: np.ndarray, door: _Door | None
    ) -> float:
        """The in-flight count averaged over [t - sync, t] (``Metrics.concurrency``): each request that
        reached the replicas' queue (``avail``) before t and was not answered before t - sync counts the
        part of that interval between its arrival and its answer (or t, when it is still queued or in
        service at t); with a ``door``, the requests its activator held count their time there too."""
        t0 = max(0.0, t - self.cfg.sync)
        if t <= t0:
            return math.nan
        # Requests before the head of two ticks ago were dispatched by then and answered within one
        # batch's service time, before t0 (a sync interval is longer than s(B)).
        lo = head_at[-3] if len(head_at) >= 3 else 0
        a = avail[lo:arrived]
        d = np.nan_to_num(fleet.done[lo:arrived], nan=math.inf)
        overlap = np.minimum(d, t) - np.maximum(a, t0)
        held = 0.0 if door is None else door.held_in_flight(t0, t)
        return (float(overlap[overlap > 0].sum()) + held) / (t - t0)

    def _scrape(
        self,
        t: float,
        fleet: _Fleet,
        head_at: list[int],
        offered_list: list[float],
        avail: np.ndarray,
        door: _Door | None,
    ) -> Metrics:
        """One scrape at ``t``: what the replicas' queue saw (``fleet.arrivals``, ``avail``: the same as
        the arrivals without an activator) and, for ``offered_rate`` and ``last_arrival``, the arrivals
        themselves (``offered_list``)."""
        if self.fault is not None and self.fault[0] <= t < self.fault[1]:
            nan = math.nan
            return Metrics(nan, nan, nan, nan, 0, nan, nan, down=self.fault[2] == "down")
        offered = bisect.bisect_right(offered_list, t)
        offered_rate = (offered - bisect.bisect_right(offered_list, t - self.cfg.window)) / self.cfg.window
        last_arrival = offered_list[offered - 1] if offered else math.nan
        cfg, done, head = self.cfg, fleet.done, fleet.head
        arr, arr_list = avail, fleet.arrivals
        bounds = np.asarray(cfg.buckets)
        back = int(cfg.window / cfg.sync) + 2
        lo = head_at[max(0, len(head_at) - 1 - back)]
        arrived = bisect.bisect_right(arr_list, t)
        # Dispatched requests lie before ``arrived``; with priorities some after ``head`` are too.
        d = done[lo:arrived]
        mask = (d > t - cfg.window) & (d <= t)
        if self.p99_signal:
            lat = d[mask] - arr[lo:arrived][mask]
            counts = np.bincount(np.searchsorted(bounds, lat, side="left"), minlength=len(bounds) + 1)
            p99 = histogram_quantile(0.99, bounds.tolist(), counts.tolist())
        else:
            p99 = math.nan
        s0, s1 = int(max(0.0, t - cfg.sync)), int(t)
        ready = float(self.ready_secs[s0:s1].sum())
        util = float(self.busy[s0:s1].sum()) / ready if ready > 0 else math.nan
        since = bisect.bisect_right(arr_list, t - cfg.arrival_window)
        queue = float(arrived - head - np.count_nonzero(~np.isnan(done[head:arrived])))
        # In flight = queued + executing (kubeinfer_inflight_requests): arrived and not yet answered.
        # Requests dispatched before ``lo`` finished more than a window ago.
        inflight = queue + float(np.count_nonzero(d > t))
        return Metrics(
            concurrency=self._concurrency(t, fleet, head_at, arrived, avail, door),
            offered_rate=offered_rate,
            last_arrival=last_arrival,
            p99=p99,
            utilization=min(1.0, util) if util == util else util,
            rate=float(mask.sum()) / cfg.window,
            queue=queue,
            inflight=inflight,
            arrival_rate=(arrived - since) / min(cfg.arrival_window, max(t, cfg.sync)),
            ready=0,  # replaced by the instantaneous ready count in run()
        )


# --------------------------------------------------------------------------------------------------
# controllers


def kubeinfer_policy(cfg: SimConfig) -> Policy:
    """The policy with the InferenceService API's default tunables, bounded by the simulation's, and
    ``cfg.policy_overrides`` applied."""
    policy = Policy(
        min_replicas=cfg.min_replicas,
        max_replicas=cfg.max_replicas,
        target_p99_seconds=cfg.target_p99,
        max_queue_delay_min_seconds=cfg.max_queue_delay_bounds[0],
        max_queue_delay_max_seconds=cfg.max_queue_delay_bounds[1],
        stale_after_seconds=cfg.window,
    )
    return replace(policy, **dict(cfg.policy_overrides))


def parse_policy_override(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` (a ``Policy`` field; VALUE an int, float or true/false) as a pair.

    Raises:
        argparse.ArgumentTypeError: naming the text, when it is not NAME=VALUE, NAME is not a field of
            ``Policy`` or VALUE is not a number or boolean.
    """
    name, sep, raw = text.partition("=")
    fields = {f.name for f in dataclasses.fields(Policy)}
    if not sep or name not in fields:
        raise argparse.ArgumentTypeError(f"--policy {text!r}: expected NAME=VALUE with NAME a Policy field")
    if raw.lower() in ("true", "false"):
        return name, raw.lower() == "true"
    try:
        return name, int(raw) if raw.lstrip("-").isdigit() else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--policy {text!r}: {raw!r} is not a number or true/false"
        ) from None


def observe(cfg: SimConfig, m: Metrics) -> Observation:
    """The ``Observation`` the operator's reader would build from one scrape (values as read)."""
    if m.down:
        return Observation.unknown("Prometheus unavailable (simulated outage)")
    return Observation(
        p99_seconds=None if math.isnan(m.p99) and m.rate == 0 else m.p99,
        gpu_utilization=m.utilization,
        request_rate=m.rate,
        queue_size=m.queue,
        inflight_requests=m.inflight,
        sample_age_seconds=0.0,
        arrival_rate=m.arrival_rate,
        service_time_a_seconds=cfg.a,
        service_time_c_seconds=cfg.c,
        max_batch_size=float(cfg.max_batch),
    )


def make_kubeinfer(
    cfg: SimConfig, *, restart_at: float | None = None, read_back: bool = True, **overrides: Any
) -> Controller:
    """``policy.decide`` fed with the scraped metrics, unchanged (``overrides``: Policy fields).

    ``restart_at``: the operator restarts on the first tick at or after that time, seconds: its memory
    is lost and rebuilt as ``loop.Autoscaler`` does, from the last action's time (status) and, with
    ``read_back``, the arrival samples read back from Prometheus (the same samples it had scraped).
    """
    policy = replace(kubeinfer_policy(cfg), **overrides)
    state = State()

    def restart(t: float) -> State:
        clocks = (state.last_scale_up, state.last_scale_down, state.last_max_queue_delay_change)
        acted = [x for x in clocks if x is not None]
        age = t - max(acted) if acted else None
        fresh = restore_state(
            now=t, last_scale_up_age=age, last_scale_down_age=age, last_max_queue_delay_change_age=age
        )
        if not read_back:
            return fresh
        return restore_arrivals(fresh, [(t - when, r) for when, r in state.arrivals], now=t, policy=policy)

    def tick(t: float, m: Metrics, n: int, timeout: float) -> tuple[int, float]:
        nonlocal state, restart_at
        if restart_at is not None and t >= restart_at:
            state, restart_at = restart(t), None
        d = decide(observe(cfg, m), Current(n, timeout, ready_replicas=m.ready), policy, state, t)
        state = d.state
        return d.replicas, d.max_queue_delay_seconds

    return tick


def make_hpa(cfg: SimConfig, metric: str, target: float | None = None) -> Controller:
    """The Kubernetes HPA algorithm on one metric (``"gpu"``: target 0.7, a ratio; ``"p99"``: target =
    the SLO, seconds; ``"rate"``: requests/s per replica, no default; ``"offered"``: the same on the
    arrivals a proxy in front counts, ``Metrics.offered_rate``), or on ``target`` when given.

    desired = ceil(ready * value / target) unless |value/target - 1| <= 0.1; scale-up limited to
    max(100 %, 4 pods) per sync; scale-down to the highest recommendation of the last 300 s.
    NaN metrics: hold (HPA skips the metric).

    ``"rate"`` is KEDA's prometheus scaler: it hands the HPA an external metric of type AverageValue,
    the query ``sum(rate(kubeinfer_requests_total[1m]))`` (``Metrics.rate``: answers per second over the
    60 s window); the HPA divides it by the current replica count (the scale's ``status.replicas``,
    starting ones included, as for every external metric), so desired = ceil(rate / target).
    """
    history: list[tuple[float, int]] = []
    if target is None:
        if metric in ("rate", "offered"):
            raise ValueError("an HPA on the request rate needs a target (requests/s per replica)")
        target = 0.7 if metric == "gpu" else cfg.target_p99

    def tick(t: float, m: Metrics, n: int, timeout: float) -> tuple[int, float]:
        per_replica = max(n, 1)
        values = {
            "rate": m.rate / per_replica,
            "offered": m.offered_rate / per_replica,
            "gpu": m.utilization,
            "p99": m.p99,
        }
        value = values[metric]
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


#: kubeinfer's policy with a part switched off (``variants`` in the JSON): the reactive control law
#: alone (no SLO-capacity rule, no cold-start timeout, no burst headroom), the cold-start timeout
#: off, the burst headroom off (the capacity rule as of the second pass), the max-queue-delay lever off
#: (its bounds pinned to the start value), the hold of a level the traffic left suddenly off (pass 7).
VARIANTS: dict[str, Callable[[SimConfig], dict[str, Any]]] = {
    "kubeinfer_reactive": lambda cfg: {
        "capacity_rule": False,
        "cold_start_timeout": False,
        "burst_headroom": False,
    },
    "kubeinfer_no_cold_start_timeout": lambda cfg: {"cold_start_timeout": False},
    "kubeinfer_no_burst_headroom": lambda cfg: {"burst_headroom": False},
    "kubeinfer_no_left_level_hold": lambda cfg: {"hold_left_level": False},
    "kubeinfer_replicas_only": lambda cfg: {
        "max_queue_delay_min_seconds": cfg.initial_max_queue_delay,
        "max_queue_delay_max_seconds": cfg.initial_max_queue_delay,
        "cold_start_timeout": False,
    },
}


def controller_for(name: str, cfg: SimConfig, rates: np.ndarray) -> Controller:
    """A fresh controller by name (``CONTROLLERS`` or ``VARIANTS``)."""
    if name in VARIANTS:
        return make_kubeinfer(cfg, **VARIANTS[name](cfg))
    makers: dict[str, Callable[[], Controller]] = {
        "kubeinfer": lambda: make_kubeinfer(cfg),
        "hpa_gpu": lambda: make_hpa(cfg, "gpu"),
        "hpa_p99": lambda: make_hpa(cfg, "p99"),
        "fixed": lambda: make_fixed(cfg, rates),
        "oracle": lambda: make_oracle(cfg, rates),
    }
    return makers[name]()


# --------------------------------------------------------------------------------------------------
# figures


def direction_changes(replicas: Sequence[int]) -> int:
    """Scale-ups followed by a scale-down, or the reverse, along a replica trajectory."""
    signs = [1 if b > a else -1 for a, b in itertools.pairwise(replicas) if b != a]
    return sum(1 for a, b in itertools.pairwise(signs) if a != b)


def figures(cfg: SimConfig, res: Result) -> dict[str, float]:
    """The figures of one run (see the module docstring)."""
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
    levels = {}
    if res.high is not None:  # a trace with a priority column: the SLO attainment of each level
        for name, sel in (("high", res.high), ("low", ~res.high)):
            levels[f"slo_attainment_{name}_priority"] = (
                round(float((lat[sel] <= target).mean()), 5) if sel.any() else 1.0
            )
    return {
        **levels,
        "slo_attainment": round(slo, 5),
        "window_attainment": round(window_att, 4),
        "replica_seconds": round(res.replica_seconds, 1),
        "scaling_actions": res.scaling_actions,
        "recovery_seconds": longest * cfg.sync,
        "direction_changes_per_hour": round(direction_changes(res.replicas) * 3600.0 / cfg.horizon, 2),
        "peak_replicas": max(res.replicas),
    }


def load_service_model(path: Path = RUNTIME_RESULTS) -> tuple[float, float, int | None, str]:
    """(a, c, max batch size or None, source) from ``path``, else the defaults.

    ``path`` is bench/results/runtime.json (bench/runtime_bench.py) or a trace folder's
    ``service_model.json`` (written by ``--write-traces``); both carry ``a_seconds``, ``c_seconds`` and
    ``max_batch_size`` at the top level.
    """
    name = str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)
    try:
        data = json.loads(path.read_text())
        a, c = float(data["a_seconds"]), float(data["c_seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_A_SECONDS, DEFAULT_C_SECONDS, None, f"defaults (no a/c fit in {name})"
    if not (a > 0 and c > 0):
        return DEFAULT_A_SECONDS, DEFAULT_C_SECONDS, None, f"defaults ({name} fit a={a}, c={c} not > 0)"
    batch = data.get("max_batch_size")
    return a, c, int(batch) if isinstance(batch, int) and batch > 0 else None, name


def write_service_model(cfg: SimConfig, source: str, folder: Path) -> Path:
    """``folder/service_model.json``: the s(b) and B the folder's traces were shaped for (their rates are
    in units of this model's mu), so a later change of runtime.json does not change what they mean."""
    path = folder / SERVICE_MODEL_FILE
    folder.mkdir(parents=True, exist_ok=True)
    data = {"a_seconds": cfg.a, "c_seconds": cfg.c, "max_batch_size": cfg.max_batch, "mu": round(cfg.mu, 3)}
    path.write_text(json.dumps({**data, "source": source}, indent=2, sort_keys=True) + "\n")
    return path


# --------------------------------------------------------------------------------------------------
# runs


def _arrivals(trace: Trace, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, sum(trace.name.encode())])
    return poisson_arrivals(trace.rates, rng)


def _medians(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the seeds' runs."""
    return {k: statistics.median(f[k] for f in runs) for k in runs[0]}


def _seed_inputs(trace: Trace, tcfg: SimConfig, seed: int) -> tuple[np.ndarray, np.ndarray | None, int]:
    """One seed's arrivals, their priority levels (``_priorities``) and the replicas to start with (for
    the first cold start's peak)."""
    arrivals = _arrivals(trace, seed)
    start_n = replicas_needed(tcfg, float(trace.rates[: int(tcfg.cold_start)].max()))
    return arrivals, _priorities(trace, arrivals, seed), start_n


def _priorities(trace: Trace, arrivals: np.ndarray, seed: int) -> np.ndarray | None:
    """Which ``arrivals`` are at priority level 1 (bool, same shape): each with the probability of its
    second's ``high_priority_share`` (from a stream of its own, so that the arrivals are those of a trace
    without the column); ``None`` when the trace has no priority column."""
    share = trace.high_priority_share
    if share is None:
        return None
    rng = np.random.default_rng([seed, sum(trace.name.encode()), 1])
    second = np.minimum(arrivals.astype(np.int64), len(share) - 1)
    return rng.random(arrivals.size) < share[second]


def run_trace(
    cfg: SimConfig, trace: Trace, names: Sequence[str], seeds: Iterable[int], log: Callable[[str], None]
) -> tuple[dict[str, dict[str, float]], dict[str, list[float]]]:
    """Every controller in ``names`` over ``trace`` for each seed: the figures' medians over the seeds,
    and each seed's SLO attainment (in seed order) per controller."""
    tcfg = replace(cfg, horizon=float(len(trace.rates)))
    per: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for seed in seeds:
        arrivals, high, start_n = _seed_inputs(trace, tcfg, seed)
        for name in names:
            t0 = time.perf_counter()
            init = replicas_needed(tcfg, float(trace.rates.max())) if name == "fixed" else start_n
            res = Simulator(tcfg, arrivals, init, high=high).run(controller_for(name, tcfg, trace.rates))
            fig = figures(tcfg, res)
            per[name].append(fig)
            log(
                f"seed {seed} {trace.name:14s} {name:32s} slo {fig['slo_attainment']:.4f} "
                f"rs {fig['replica_seconds']:8.0f} actions {fig['scaling_actions']:3d} "
                f"recovery {fig['recovery_seconds']:5.0f}s flips/h {fig['direction_changes_per_hour']:5.1f} "
                f"peak {fig['peak_replicas']} timeout-changes {res.timeout_changes} "
                f"({len(arrivals)} req, {time.perf_counter() - t0:.1f}s)"
            )
    medians = {name: _medians(runs) for name, runs in per.items()}
    return medians, {name: [f["slo_attainment"] for f in runs] for name, runs in per.items()}


#: Fault scenarios: on the diurnal trace's rising half, the metrics vanish for 150 s (t = 300..450).
FAULTS: dict[str, tuple[str, Fault]] = {
    "prometheus_down": ("diurnal", (300.0, 450.0, "down")),
    "metrics_nan": ("diurnal", (300.0, 450.0, "nan")),
}


#: Operator restarts: kubeinfer's operator restarts half-way through a bursty trace (its memory lost).
RESTARTS: dict[str, tuple[str, float]] = {"operator_restart": ("compressed_day", 0.5)}


def run_restarts(cfg: SimConfig, traces: dict[str, Trace], seeds: Iterable[int]) -> dict[str, Any]:
    """Each restart scenario: kubeinfer without a restart, restarted with the arrival history read back
    from Prometheus (what ``loop.Autoscaler`` does), and restarted without it; medians over ``seeds``."""
    out: dict[str, Any] = {}
    for scenario, (trace_name, at) in RESTARTS.items():
        trace = traces.get(trace_name) or builtin_trace(trace_name, cfg.mu)
        tcfg = replace(cfg, horizon=float(len(trace.rates)))
        when = tcfg.sync * round(at * tcfg.horizon / tcfg.sync)
        ways: dict[str, dict[str, Any]] = {
            "no_restart": {},
            "restart_history_read_back": {"restart_at": when},
            "restart_history_lost": {"restart_at": when, "read_back": False},
        }
        per: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
        for seed in seeds:
            arrivals, high, start_n = _seed_inputs(trace, tcfg, seed)
            for way, kwargs in ways.items():
                res = Simulator(tcfg, arrivals, start_n, high=high).run(make_kubeinfer(tcfg, **kwargs))
                per[way].append(figures(tcfg, res))
        rows: dict[str, Any] = {"trace": trace_name, "restart_seconds": when}
        for way, runs in per.items():
            rows[way] = _medians(runs)
        out[scenario] = rows
    return out


def run_faults(cfg: SimConfig, traces: dict[str, Trace], seed: int) -> dict[str, Any]:
    """Each fault scenario for kubeinfer and hpa_gpu: actions while the signal is missing (must be 0),
    seconds from its return to the first action, and the run's figures."""
    out: dict[str, Any] = {}
    for scenario, (trace_name, fault) in FAULTS.items():
        trace = traces.get(trace_name) or builtin_trace(trace_name, cfg.mu)
        tcfg = replace(cfg, horizon=float(len(trace.rates)))
        arrivals, high, start_n = _seed_inputs(trace, tcfg, seed)
        rows: dict[str, Any] = {"trace": trace_name, "from_seconds": fault[0], "to_seconds": fault[1]}
        for name in ("kubeinfer", "hpa_gpu"):
            sim = Simulator(tcfg, arrivals, start_n, fault=fault, high=high)
            res = sim.run(controller_for(name, tcfg, trace.rates))
            during = [t for t in res.actions_at if fault[0] <= t < fault[1]]
            after = [t for t in res.actions_at if t >= fault[1]]
            rows[name] = {
                **figures(tcfg, res),
                "actions_while_missing": len(during),
                "first_action_after_return_seconds": (after[0] - fault[1]) if after else None,
            }
        out[scenario] = rows
    return out


def summarize(
    traces: dict[str, dict[str, dict[str, float]]], per_seed: dict[str, dict[str, list[float]]] | None = None
) -> dict[str, Any]:
    """The autoscaler's targets per trace (SLO attainment and replica-seconds against HPA-on-GPU, SLO
    0.99, at most 1.3x the oracle's replica-seconds), and the misses in words with their figures; with
    ``per_seed`` (each seed's SLO attainment per trace and controller), on how many seeds kubeinfer's
    SLO attainment is at least HPA-on-GPU's."""
    summary: dict[str, Any] = {}
    for name, rows in traces.items():
        k, h, o = rows["kubeinfer"], rows["hpa_gpu"], rows["oracle"]
        vs_oracle = k["replica_seconds"] / o["replica_seconds"]
        seeds = (per_seed or {}).get(name)
        seed_wins = (
            None
            if seeds is None
            else sum(a >= b for a, b in zip(seeds["kubeinfer"], seeds["hpa_gpu"], strict=True))
        )
        misses = []
        if k["slo_attainment"] < h["slo_attainment"]:
            on = (
                ""
                if seeds is None
                else f" (at least HPA's on {seed_wins} of {len(seeds['kubeinfer'])} seeds)"
            )
            misses.append(f"SLO {k['slo_attainment']:.4f} < HPA-on-GPU {h['slo_attainment']:.4f}{on}")
        if k["replica_seconds"] > h["replica_seconds"]:
            misses.append(
                f"replica-seconds {k['replica_seconds']:.0f} > HPA-on-GPU {h['replica_seconds']:.0f}"
            )
        if o["slo_attainment"] >= 0.99 and k["slo_attainment"] < 0.99:
            misses.append(f"SLO {k['slo_attainment']:.4f} < 0.99 (oracle {o['slo_attainment']:.4f})")
        if vs_oracle > 1.3:
            misses.append(f"replica-seconds {vs_oracle:.2f}x the oracle's (> 1.3x)")
        if k["direction_changes_per_hour"] > h["direction_changes_per_hour"]:
            misses.append(
                f"direction changes {k['direction_changes_per_hour']:.1f}/h > HPA-on-GPU "
                f"{h['direction_changes_per_hour']:.1f}/h"
            )
        summary[name] = {
            "tuned_on": name in TUNED_ON,
            "kubeinfer_slo_ge_hpa_gpu": k["slo_attainment"] >= h["slo_attainment"],
            "kubeinfer_replica_seconds_le_hpa_gpu": k["replica_seconds"] <= h["replica_seconds"],
            "kubeinfer_slo_ge_99pct": k["slo_attainment"] >= 0.99,
            "oracle_slo_ge_99pct": o["slo_attainment"] >= 0.99,
            "kubeinfer_vs_hpa_gpu_replica_seconds": round(k["replica_seconds"] / h["replica_seconds"], 3),
            "kubeinfer_vs_oracle_replica_seconds": round(vs_oracle, 3),
            **({} if seeds is None else {"seeds_kubeinfer_slo_ge_hpa_gpu": seed_wins}),
            **{
                f"kubeinfer_{key}": k[key]
                for key in ("slo_attainment_high_priority", "slo_attainment_low_priority")
                if key in k
            },
            "misses": misses,
        }
    return summary


def table(result: dict[str, Any]) -> str:
    """The markdown table of ``result`` (per trace and controller), then the misses."""
    head = (
        "| trace | tuned on | controller | SLO attainment | replica-seconds | scaling actions "
        "| time to recover (s) | direction changes/h |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for name, rows in result["traces"].items():
        tuned = "yes" if name in TUNED_ON else "no, unseen" if name in UNSEEN else "no"
        for ctl in CONTROLLERS:
            f = rows[ctl]
            lines.append(
                f"| {name} | {tuned} | {ctl} | {f['slo_attainment']:.4f} | {f['replica_seconds']:.0f} "
                f"| {f['scaling_actions']:.0f} | {f['recovery_seconds']:.0f} "
                f"| {f['direction_changes_per_hour']:.1f} |"
            )
    lines.append("")
    for name, s in result["summary"].items():
        verdict = "; ".join(s["misses"]) if s["misses"] else "all targets met"
        levels = ""
        if "kubeinfer_slo_attainment_high_priority" in s:
            rows = result["traces"][name]
            levels = "; SLO by priority (level 1 / level 2): " + ", ".join(
                f"{ctl} {rows[ctl]['slo_attainment_high_priority']:.4f} / "
                f"{rows[ctl]['slo_attainment_low_priority']:.4f}"
                for ctl in ("kubeinfer", "hpa_gpu", "oracle")
            )
        lines.append(
            f"- {name}: kubeinfer/HPA-on-GPU replica-seconds "
            f"{s['kubeinfer_vs_hpa_gpu_replica_seconds']:.3f}, kubeinfer/oracle "
            f"{s['kubeinfer_vs_oracle_replica_seconds']:.3f}: {verdict}{levels}"
        )
    for scenario, rows in result.get("faults", {}).items():
        for ctl in ("kubeinfer", "hpa_gpu"):
            f = rows[ctl]
            lines.append(
                f"- fault {scenario} ({rows['trace']}, t = {rows['from_seconds']:.0f}.."
                f"{rows['to_seconds']:.0f} s): {ctl} {f['actions_while_missing']} actions while missing, "
                f"first action {f['first_action_after_return_seconds']} s after the signal returned, "
                f"SLO {f['slo_attainment']:.4f}, replica-seconds {f['replica_seconds']:.0f}"
            )
    for scenario, rows in result.get("restarts", {}).items():
        ways = ("no_restart", "restart_history_read_back", "restart_history_lost")
        lines.append(
            f"- {scenario} ({rows['trace']}, kubeinfer's operator restarts at "
            f"t = {rows['restart_seconds']:.0f} s): "
            + ", ".join(
                f"{way.replace('_', ' ')}: SLO {rows[way]['slo_attainment']:.4f}, "
                f"replica-seconds {rows[way]['replica_seconds']:.0f}"
                for way in ways
            )
        )
    return "\n".join(lines) + "\n"


def load_traces(args: argparse.Namespace, mu: float) -> dict[str, Trace]:
    """The traces named on the command line (``--trace``, ``--traces``), else bench/traces/ (written
    from ``BUILTIN`` first when that folder has no CSV)."""
    files: list[Path] = list(args.trace or [])
    for folder in args.traces or []:
        files += sorted(Path(folder).glob("*.csv"))
    if not files:
        if not any(TRACES_DIR.glob("*.csv")):
            for name in BUILTIN:
                write_trace(builtin_trace(name, mu), TRACES_DIR / f"{name}.csv")
        files = sorted(TRACES_DIR.glob("*.csv"))
    traces = {p.stem: read_trace(p) for p in files}
    # The tuned-on traces first, then the held-out ones, each in name order.
    return dict(sorted(traces.items(), key=lambda kv: (kv[0] not in TUNED_ON, kv[0])))


def _default_service_model(args: argparse.Namespace) -> Path:
    """The service model the traces were shaped for: the first ``--traces`` folder's
    ``service_model.json`` (``write_service_model``), bench/traces/'s when no trace is named, else
    bench/results/runtime.json (the runtime as measured now)."""
    folders = [Path(f) for f in args.traces or []]
    if not (args.trace or args.traces or args.write_traces):
        folders = [TRACES_DIR]
    for folder in folders:
        if (folder / SERVICE_MODEL_FILE).exists():
            return folder / SERVICE_MODEL_FILE
    return RUNTIME_RESULTS


def add_run_arguments(ap: argparse.ArgumentParser, default_out: Path) -> None:
    """The options every autoscaler benchmark takes: ``--trace``, ``--traces``, ``--seed``,
    ``--repeats``, ``--out`` (default ``default_out``), ``--policy`` and ``--service-model``."""
    ap.add_argument("--trace", type=Path, action="append", help="a trace CSV (repeatable)")
    ap.add_argument("--traces", type=Path, action="append", help="a folder of trace CSVs (repeatable)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="seeds seed..seed+R-1; figures are medians")
    ap.add_argument("--out", type=Path, default=default_out)
    ap.add_argument(
        "--policy",
        type=parse_policy_override,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a kubeinfer Policy field for this run, e.g. plan_utilization=0.7 (repeatable)",
    )
    ap.add_argument(
        "--service-model",
        type=Path,
        help="JSON with a_seconds, c_seconds, max_batch_size (default: the service_model.json of the "
        "first --traces folder that has one, bench/traces/'s when no trace is named, else "
        "bench/results/runtime.json)",
    )
    quiet.add_arguments(ap, simulation=True)


def config_from_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[SimConfig, str]:
    """The ``SimConfig`` of ``add_run_arguments``' options, and where its s(b) came from. Exits through
    ``ap.error`` (status 2, naming the field) on a Policy value out of range or ``--repeats`` under 1."""
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if not hasattr(args, "write_traces"):
        args.write_traces = None  # what _default_service_model reads
    a, c, batch, source = load_service_model(args.service_model or _default_service_model(args))
    cfg = SimConfig(a=a, c=c, max_batch=batch or SimConfig.max_batch, policy_overrides=tuple(args.policy))
    try:
        kubeinfer_policy(cfg)
    except ValueError as exc:  # a value out of range, naming the field
        ap.error(str(exc))
    return cfg, source


def over_traces(
    fn: Callable[..., dict[str, Any]], traces: dict[str, Trace], jobs: int, *args: Any
) -> dict[str, dict[str, Any]]:
    """``{name: fn(trace, *args)}`` for each trace, ``jobs`` processes at a time (``fn`` must be a
    module-level function: it is pickled), in the order of ``traces``."""
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {name: pool.submit(fn, trace, *args) for name, trace in traces.items()}
        return {name: future.result() for name, future in futures.items()}


def parse_run_args(
    ap: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    default_out: Path,
    *,
    jobs_help: str | None = None,
) -> tuple[argparse.Namespace, SimConfig, str, dict[str, Trace]]:
    """``add_run_arguments`` (and ``--jobs`` when ``jobs_help`` is given) parsed from ``argv``: the
    options, the ``SimConfig`` (``config_from_args``), where its s(b) came from, and the traces. Exits
    through ``ap.error`` (status 2, one line) on a bad option, a missing trace file or a malformed CSV."""
    add_run_arguments(ap, default_out)
    if jobs_help is not None:
        ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help=jobs_help)
    args = ap.parse_args(argv)
    cfg, source = config_from_args(ap, args)
    return args, cfg, source, load_traces_or_exit(ap, args, cfg.mu)


def load_traces_or_exit(ap: argparse.ArgumentParser, args: argparse.Namespace, mu: float) -> dict[str, Trace]:
    """``load_traces``, with a missing file or a malformed CSV reported through ``ap.error``."""
    try:
        return load_traces(args, mu)
    except (OSError, ValueError) as exc:
        ap.error(f"trace: {exc}")


def run_per_trace(
    args: argparse.Namespace,
    cfg: SimConfig,
    source: str,
    traces: dict[str, Trace],
    fn: Callable[[Trace, SimConfig, list[int]], dict[str, Any]],
    summarize: Callable[[dict[str, Any]], dict[str, Any]],
    table: Callable[[dict[str, Any]], str],
    command: str,
    config: dict[str, Any],
) -> int:
    """The body of a per-trace benchmark's ``main``: ``fn(trace, cfg, seeds)`` for each of ``traces``
    (``args.jobs`` processes at a time), then ``{"traces", "summary", "config"}`` written by
    ``write_results``; ``config`` adds to the seeds, s(b) source, Policy overrides and ``command``.
    Returns the exit status, 0."""
    t0 = time.perf_counter()
    seeds = list(range(args.seed, args.seed + args.repeats))
    with quiet.quiet_run(Path(command.split()[0]).stem, args, simulation=True) as run:
        rows = over_traces(fn, traces, args.jobs, cfg, seeds)
        result: dict[str, Any] = {
            "traces": rows,
            "summary": summarize(rows),
            "config": {
                "seeds": seeds,
                "service_time_source": source,
                "policy_overrides": dict(cfg.policy_overrides),
                "command": command,
                **config,
            },
        }
        result = run.stamp(result)
        write_results(args.out, result, table(result))
    print(f"in {time.perf_counter() - t0:.0f}s")
    return 0


def write_results(out: Path, result: dict[str, Any], text: str) -> None:
    """``result`` as JSON at ``out`` (strict: a NaN raises ``ValueError``) and ``text`` beside it as
    ``.md``; prints both paths."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True, allow_nan=False) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {out} and {out.with_suffix('.md')}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_run_arguments(ap, DEFAULT_OUT)
    ap.add_argument("--no-variants", action="store_true", help="only the five controllers")
    ap.add_argument("--no-faults", action="store_true", help="skip the Prometheus-fault scenarios")
    ap.add_argument("--write-traces", type=Path, help="write the built-in traces as CSV there and exit")
    ap.add_argument("--batch", choices=tuple(BATCHES), help="with --write-traces: write that later batch")
    args = ap.parse_args(argv)
    cfg, source = config_from_args(ap, args)
    a, c = cfg.a, cfg.c
    if args.write_traces:
        shapes = BUILTIN if args.batch is None else BATCHES[args.batch]
        for name in shapes:
            write_trace(builtin_trace(name, cfg.mu, shapes), args.write_traces / f"{name}.csv")
        write_service_model(cfg, source, args.write_traces)
        print(f"wrote {len(shapes)} traces to {args.write_traces} (mu {cfg.mu:.1f} req/s)")
        return 0
    print(
        f"s(b) = {a * 1000:.2f} ms + {c * 1000:.3f} ms*b ({source}); B={cfg.max_batch}; "
        f"target P99 {cfg.target_p99 * 1000:.0f} ms; mu {cfg.mu:.1f} req/s/replica; "
        f"cold start {cfg.cold_start:.0f}s",
        flush=True,
    )
    t0 = time.perf_counter()
    traces = load_traces_or_exit(ap, args, cfg.mu)
    with quiet.quiet_run("autoscaler_sim", args, simulation=True) as run:
        result = run.stamp(simulate(args, cfg, source, traces, argv))
        write_results(args.out, result, table(result))
    print(f"in {time.perf_counter() - t0:.0f}s")
    return 0


def simulate(
    args: argparse.Namespace,
    cfg: SimConfig,
    source: str,
    traces: dict[str, Trace],
    argv: Sequence[str] | None,
) -> dict[str, Any]:
    """``main``'s run: every controller (and variant) over ``traces``, the faults and restarts, the
    config and the summary; ``source`` says where s(b) came from."""
    a, c = cfg.a, cfg.c
    seeds = range(args.seed, args.seed + args.repeats)
    names = (*CONTROLLERS, *(() if args.no_variants else VARIANTS))
    runs, per_seed = {}, {}
    for name, tr in traces.items():
        runs[name], seed_slo = run_trace(cfg, tr, names, seeds, lambda s: print(s, flush=True))
        per_seed[name] = {n: seed_slo[n] for n in CONTROLLERS}
    result: dict[str, Any] = {
        "traces": {t: {n: rows[n] for n in CONTROLLERS} for t, rows in runs.items()},
        "per_seed": per_seed,
        "variants": {v: {t: rows[v] for t, rows in runs.items()} for v in names if v in VARIANTS},
        "tuned_on": [t for t in traces if t in TUNED_ON],
        "held_out": [t for t in traces if t not in TUNED_ON],
        "unseen": [t for t in traces if t in UNSEEN],
        "held_out_note": HELD_OUT_NOTE,
    }
    if not args.no_faults:
        result["faults"] = run_faults(cfg, traces, args.seed)
        result["restarts"] = run_restarts(cfg, traces, seeds)
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
        "arrival_rate_window_seconds": cfg.arrival_window,
        "horizon_seconds": {t: len(tr.rates) for t, tr in traces.items()},
        "seeds": list(seeds),
        "command": "bench/autoscaler_sim.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "policy_overrides": dict(cfg.policy_overrides),
    }
    result["summary"] = summarize(result["traces"], per_seed)
    return result


if __name__ == "__main__":
    sys.exit(main())
