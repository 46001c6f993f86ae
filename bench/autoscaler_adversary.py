"""Adversarial steps: the unseen trace that beats each controller's standing headroom (issue 10).

    .venv/bin/python bench/autoscaler_adversary.py                  # every CSV in bench/traces/
    .venv/bin/python bench/autoscaler_adversary.py --trace FILE.csv --out results.json

Issue 10 asks for an autoscaler whose SLO attainment is at least the HPA-on-GPU's, at no more
replica-seconds, on every trace, including traces nobody tuned it on. A controller that is cheaper
than the HPA stands, at some moments, with fewer ready replicas than the HPA has. This benchmark writes
the unseen trace that finds such a moment: for each trace it runs ``kubeinfer`` and ``hpa_gpu``
(``bench/autoscaler_sim.py``, the same simulation), finds the tick at which the *victim* stands with
the most fewer ready replicas than the other controller while the trace's traffic is under the
victim's capacity (``weakest_moment``), and adds to the same arrivals a step up to halfway between the
two standing capacities for one reaction time (a tick plus a cold start and a tick: the oracle's
look-ahead), from that tick (``step_arrivals``). Nothing before the tick changes (superposed Poisson
arrivals from a stream of their own: the sum of two Poisson processes is the Poisson process of the
summed rate), so both controllers stand exactly as they stood in the original run when the step comes:
a step of that size (a tenant onboarded, a canary shifted, a retry storm) is the victim's breach and
within the other's capacity. Both run on the derived arrivals, for each seed; the tick is chosen on the
first seed.

It is done in both directions: against ``kubeinfer`` (where the HPA's standing headroom is larger) and
against ``hpa_gpu`` (where kubeinfer's is). ``headroom`` reports, per trace and controller, the
standing headroom over the traffic at each tick (ready replicas times a replica's full-batch rate,
over the trace's mean rate in the tick: a ratio) as a median and a 10th percentile, and the share of
ticks at which the controller stood with fewer ready replicas than the other. The JSON goes to
``bench/results/autoscaler_adversary.json`` (``--out``), the table to the ``.md`` beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import autoscaler_sim as sim

DEFAULT_OUT = sim.ROOT / "bench" / "results" / "autoscaler_adversary.json"
#: The two controllers compared (issue 10's baseline is the HPA on GPU utilization).
PAIR = ("kubeinfer", "hpa_gpu")
#: Ticks at the start of a trace that are not probed: the first cold start and the controllers'
#: first reaction (the initial replica count is the same for both).
WARMUP_SECONDS = 120.0


@dataclass(frozen=True)
class Step:
    """An added step of traffic.

    Attributes:
        start: seconds from the trace's start (a tick).
        seconds: how long the step lasts, seconds.
        level: the rate the step raises the traffic to, requests/s (seconds already over it keep theirs).
        victim: the controller whose standing capacity it exceeds.
        ready: each controller's ready replicas at ``start`` (in the probe run).
    """

    start: float
    seconds: float
    level: float
    victim: str
    ready: dict[str, int]


def replica_rate(cfg: sim.SimConfig) -> float:
    """A replica's rate at full batches within the SLO, requests/s (``SimConfig.mu`` without its 80 %
    margin): the most one ready replica serves before its queue grows."""
    return cfg.mu / 0.8


def tick_rates(rates: np.ndarray, sync: float, ticks: int) -> np.ndarray:
    """The trace's mean rate over each tick's interval ``[k*sync, (k+1)*sync)``, requests/s.

    Returns: float64, shape (ticks,); 0 for a tick past the trace's end."""
    width = int(sync)
    out = np.zeros(ticks)
    for k in range(ticks):
        chunk = rates[k * width : (k + 1) * width]
        out[k] = float(chunk.mean()) if chunk.size else 0.0
    return out


def weakest_moment(
    victim: Sequence[int],
    other: Sequence[int],
    peaks: Sequence[float],
    rate: float,
    *,
    first: int,
    last: int,
) -> int | None:
    """The tick at which ``victim`` stands with the most fewer ready replicas than ``other``.

    Args:
        victim, other: ready replicas at each tick of one run each (same ticks).
        peaks: the trace's highest rate over the step's span from each tick, requests/s.
        rate: one replica's rate, requests/s.
        first, last: the ticks that may be chosen, ``first <= k < last``.

    Returns:
        The tick index (the earliest on a tie), or ``None`` when the victim never stands under the other
        while the traffic over the span stays under 90 % of the victim's capacity (its own breach, not
        one a step would add).
    """
    best: tuple[int, int] | None = None
    for k in range(max(first, 0), min(last, len(victim), len(other), len(peaks))):
        gap = other[k] - victim[k]
        if gap <= 0 or peaks[k] >= 0.9 * victim[k] * rate:
            continue
        if best is None or gap > best[0]:
            best = (gap, k)
    return None if best is None else best[1]


def step_arrivals(rates: np.ndarray, step: Step, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Extra arrivals that raise ``rates`` to ``step.level`` over the step, and their seconds.

    Returns:
        (sorted arrival times in seconds, float64; the second of each, int64): a Poisson process of rate
        ``max(step.level - rates[s], 0)`` in each second ``s`` of ``[start, start + seconds)``.
    """
    lo = int(step.start)
    hi = min(len(rates), int(step.start + step.seconds))
    extra = np.zeros(len(rates))
    extra[lo:hi] = np.maximum(step.level - rates[lo:hi], 0.0)
    times = sim.poisson_arrivals(extra, rng)
    return times, times.astype(np.int64)


def _ready_recorder(controller: sim.Controller, into: list[int]) -> sim.Controller:
    """``controller``, noting the ready replicas it is shown at each tick (tick 0: not called)."""

    def tick(t: float, m: sim.Metrics, n: int, timeout: float) -> tuple[int, float]:
        into.append(m.ready)
        return controller(t, m, n, timeout)

    return tick


def _run(
    tcfg: sim.SimConfig,
    trace: sim.Trace,
    name: str,
    arrivals: np.ndarray,
    high: np.ndarray | None,
    start_n: int,
) -> tuple[dict[str, float], list[int]]:
    """One controller's figures over ``arrivals``, and its ready replicas at each tick."""
    ready = [start_n]
    controller = _ready_recorder(sim.controller_for(name, tcfg, trace.rates), ready)
    res = sim.Simulator(tcfg, arrivals, start_n, high=high).run(controller)
    return sim.figures(tcfg, res), ready


def _with_step(
    trace: sim.Trace, step: Step, seed: int, arrivals: np.ndarray, high: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """``arrivals`` (and their priority mask) with the step's extra arrivals merged in."""
    rng = np.random.default_rng([seed, sum(trace.name.encode()), 2])
    extra, seconds = step_arrivals(trace.rates, step, rng)
    merged = np.concatenate([arrivals, extra])
    order = np.argsort(merged, kind="stable")
    if high is None or trace.high_priority_share is None:
        return merged[order], None
    share = trace.high_priority_share[np.minimum(seconds, len(trace.high_priority_share) - 1)]
    extra_high = rng.random(extra.size) < share
    return merged[order], np.concatenate([high, extra_high])[order]


def headroom_figures(
    ready: dict[str, list[int]], rates: np.ndarray, rate: float
) -> dict[str, dict[str, float]]:
    """Per controller: the median and 10th percentile of ``ready * rate / traffic`` over the ticks with
    traffic, and the share of ticks at which it had fewer ready replicas than the other controller."""
    out: dict[str, dict[str, float]] = {}
    names = list(ready)
    for name in names:
        other = next(n for n in names if n != name)
        mine, theirs = ready[name], ready[other]
        ticks = min(len(mine), len(theirs), len(rates))
        ratios = [mine[k] * rate / rates[k] for k in range(ticks) if rates[k] > 0]
        out[name] = {
            "median_headroom": round(statistics.median(ratios), 3) if ratios else float("nan"),
            "p10_headroom": round(float(np.quantile(ratios, 0.1)), 3) if ratios else float("nan"),
            "share_of_ticks_below_other": round(sum(mine[k] < theirs[k] for k in range(ticks)) / ticks, 3),
        }
    return out


def probe_trace(
    cfg: sim.SimConfig, trace: sim.Trace, seeds: Sequence[int], log: Any = print
) -> dict[str, Any]:
    """The headroom figures and both adversarial steps of one trace (module docstring)."""
    tcfg = replace(cfg, horizon=float(len(trace.rates)))
    span = tcfg.cold_start + 2 * tcfg.sync
    ticks = int(tcfg.horizon / tcfg.sync)
    rate = replica_rate(tcfg)
    arrivals, high, start_n = sim._seed_inputs(trace, tcfg, seeds[0])
    base = {name: _run(tcfg, trace, name, arrivals, high, start_n) for name in PAIR}
    ready = {name: base[name][1] for name in PAIR}
    peaks = [float(trace.rates[int(k * tcfg.sync) : int(k * tcfg.sync + span)].max()) for k in range(ticks)]
    result: dict[str, Any] = {
        "headroom": headroom_figures(ready, tick_rates(trace.rates, tcfg.sync, ticks), rate),
        "original": {name: _slo_rs(base[name][0]) for name in PAIR},
    }
    for victim in PAIR:
        other = next(n for n in PAIR if n != victim)
        first = int(WARMUP_SECONDS / tcfg.sync)
        last = ticks - int(span / tcfg.sync)
        k = weakest_moment(ready[victim], ready[other], peaks, rate, first=first, last=last)
        key = f"against_{victim}"
        if k is None:
            result[key] = None
            log(f"{trace.name:18s} against {victim:9s}: never stands under {other} with room for a step")
            continue
        low, high_n = ready[victim][k], ready[other][k]
        step = Step(
            k * tcfg.sync, span, (low + (high_n - low) / 2) * rate, victim, {victim: low, other: high_n}
        )
        figs: dict[str, list[dict[str, float]]] = {name: [] for name in PAIR}
        for seed in seeds:
            arr, hi, n0 = sim._seed_inputs(trace, tcfg, seed)
            arr2, hi2 = _with_step(trace, step, seed, arr, hi)
            for name in PAIR:
                figs[name].append(_run(tcfg, trace, name, arr2, hi2, n0)[0])
        result[key] = {
            "at_seconds": step.start,
            "seconds": step.seconds,
            "level_requests_per_second": round(step.level, 1),
            "trace_rate_requests_per_second": round(float(trace.rates[int(step.start)]), 1),
            "ready_replicas": step.ready,
            **{name: _slo_rs(sim._medians(runs)) for name, runs in figs.items()},
        }
        r = result[key]
        log(
            f"{trace.name:18s} against {victim:9s}: t={step.start:.0f}s ready {step.ready} step to "
            f"{step.level:.0f}/s for {span:.0f}s: kubeinfer slo {r['kubeinfer']['slo_attainment']:.4f}, "
            f"hpa_gpu slo {r['hpa_gpu']['slo_attainment']:.4f}"
        )
    return result


def _slo_rs(fig: dict[str, float]) -> dict[str, float]:
    return {"slo_attainment": fig["slo_attainment"], "replica_seconds": fig["replica_seconds"]}


def table(result: dict[str, Any]) -> str:
    """The Markdown table of ``result`` (per trace: headroom, then each adversarial step)."""
    lines = [
        "| trace | kubeinfer headroom (median / p10) | hpa_gpu headroom (median / p10) | "
        "kubeinfer ticks below hpa_gpu | step against kubeinfer: SLO kubeinfer / hpa_gpu | "
        "step against hpa_gpu: SLO kubeinfer / hpa_gpu |",
        "|---|---|---|---|---|---|",
    ]

    def cell(row: dict[str, Any] | None) -> str:
        if row is None:
            return "no moment"
        return (
            f"t={row['at_seconds']:.0f}s, ready {row['ready_replicas']['kubeinfer']} vs "
            f"{row['ready_replicas']['hpa_gpu']}, to {row['level_requests_per_second']:.0f}/s: "
            f"{row['kubeinfer']['slo_attainment']:.4f} / {row['hpa_gpu']['slo_attainment']:.4f}"
        )

    for name, row in result["traces"].items():
        h = row["headroom"]
        lines.append(
            f"| {name} | x{h['kubeinfer']['median_headroom']:.2f} / x{h['kubeinfer']['p10_headroom']:.2f} | "
            f"x{h['hpa_gpu']['median_headroom']:.2f} / x{h['hpa_gpu']['p10_headroom']:.2f} | "
            f"{h['kubeinfer']['share_of_ticks_below_other']:.0%} | {cell(row['against_kubeinfer'])} | "
            f"{cell(row['against_hpa_gpu'])} |"
        )
    s = result["summary"]
    lines += [
        "",
        f"Steps against kubeinfer: kubeinfer's SLO under the HPA's on {s['against_kubeinfer']['worse']} of "
        f"{s['against_kubeinfer']['steps']}. Steps against hpa_gpu: the HPA's SLO under kubeinfer's on "
        f"{s['against_hpa_gpu']['worse']} of {s['against_hpa_gpu']['steps']}.",
        "",
    ]
    return "\n".join(lines)


def summarize(traces: dict[str, Any]) -> dict[str, Any]:
    """Per direction: how many traces had a step, and on how many the victim's SLO fell under the other's."""
    out: dict[str, Any] = {}
    for victim in PAIR:
        other = next(n for n in PAIR if n != victim)
        rows = [r[f"against_{victim}"] for r in traces.values() if r[f"against_{victim}"] is not None]
        worse = [r for r in rows if r[victim]["slo_attainment"] < r[other]["slo_attainment"]]
        out[f"against_{victim}"] = {"steps": len(rows), "worse": len(worse)}
    return out


def _log(line: str) -> None:
    print(line, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--trace", type=Path, action="append", help="a trace CSV (repeatable)")
    ap.add_argument("--traces", type=Path, action="append", help="a folder of trace CSVs (repeatable)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="seeds seed..seed+R-1; figures are medians")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--service-model",
        type=Path,
        help="JSON with a_seconds, c_seconds, max_batch_size (default: as bench/autoscaler_sim.py)",
    )
    ap.add_argument(
        "--policy",
        type=sim.parse_policy_override,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a kubeinfer Policy field, e.g. plan_utilization=0.7 (repeatable)",
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="traces probed at once")
    args = ap.parse_args(argv)
    args.write_traces = None  # what autoscaler_sim's helpers read
    a, c, batch, source = sim.load_service_model(args.service_model or sim._default_service_model(args))
    cfg = sim.SimConfig(
        a=a, c=c, max_batch=batch or sim.SimConfig.max_batch, policy_overrides=tuple(args.policy)
    )
    try:
        sim.kubeinfer_policy(cfg)
    except ValueError as exc:  # a value out of range, naming the field
        ap.error(str(exc))
    print(
        f"s(b) = {a * 1000:.2f} ms + {c * 1000:.3f} ms*b ({source}); one replica {replica_rate(cfg):.0f}/s",
        flush=True,
    )
    t0 = time.perf_counter()
    traces = sim.load_traces(args, cfg.mu)
    seeds = list(range(args.seed, args.seed + args.repeats))
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {name: pool.submit(probe_trace, cfg, tr, seeds, _log) for name, tr in traces.items()}
        rows = {name: future.result() for name, future in futures.items()}
    result: dict[str, Any] = {
        "traces": rows,
        "summary": summarize(rows),
        "config": {
            "seeds": seeds,
            "service_time_source": source,
            "replica_rate_requests_per_second": round(replica_rate(cfg), 1),
            "step_seconds": cfg.cold_start + 2 * cfg.sync,
            "warmup_seconds": WARMUP_SECONDS,
            "policy_overrides": dict(cfg.policy_overrides),
            "command": "bench/autoscaler_adversary.py " + " ".join(sys.argv[1:] if argv is None else argv),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    text = table(result)
    args.out.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')} in {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
