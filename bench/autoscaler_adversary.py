"""Adversarial steps: the unseen trace that beats each controller's standing headroom.

    .venv/bin/python bench/autoscaler_adversary.py                  # every CSV in bench/traces/
    .venv/bin/python bench/autoscaler_adversary.py --traces DIR --out results.json

(As in ``bench/autoscaler_sim.py``, a ``--traces`` folder's ``service_model.json`` sets s(b); ``--trace
FILE`` alone simulates the runtime as measured now, ``bench/results/runtime.json``, whose replicas are
slower than the ones bench/traces/ was shaped for: pass ``--service-model`` for those.)

The autoscaler's target is an SLO attainment at least the HPA-on-GPU's, at no more
replica-seconds, on every trace, including traces nobody tuned it on. A controller that is cheaper
than the HPA stands, at some moments, with fewer replicas than the HPA has. This benchmark writes the
unseen trace that finds such a moment: for each trace it runs ``kubeinfer`` and ``hpa_gpu`` (the same
simulation), and after each tick's decision notes what each controller stands with for what comes next
(``Standing``): its ready replicas that survive the decision (removals are immediate) and every replica
it has, starting ones included (they may come up during a step). It finds the tick at which the
*victim*, even with all its replicas up and 100 % busy (``ceiling``: full batches back to back), serves
less than the other controller's ready replicas sustain at the SLO (``SimConfig.mu``, 80 % of that
ceiling), while the trace's own traffic over the step's span is under what the victim's ready replicas
sustain (not its own breach): ``weakest_moment``, the widest such gap. It then adds to the same
arrivals a step to halfway between those two rates for one reaction time (a cold start and two ticks:
the oracle's look-ahead), from that tick (``step_arrivals``). Nothing before the tick changes
(superposed Poisson arrivals from a stream of their own: the sum of two Poisson processes is the Poisson
process of the summed rate), so both controllers stand exactly as they stood when the step comes: a step
of that size (a tenant onboarded, a canary shifted, a retry storm) is over the victim's ceiling and
within what the other sustains. Both run on the derived arrivals, for each seed; the tick is chosen on
the first seed, and each seed's gap at it is recorded.

It is done in both directions: against ``kubeinfer`` (where the HPA stands higher) and against
``hpa_gpu`` (where kubeinfer does). Per step: both controllers' SLO attainment over the whole trace,
with and without the step (medians over the seeds, and per seed), and over the requests arriving from
the step's start to one minute after its end (``window``). A step *turns* the comparison when the
victim's whole-trace SLO is under the other's with the step and was not without it. ``headroom``
reports, per trace and controller, the standing sustainable rate over the traffic at each tick (ready
replicas times ``mu`` over the trace's mean rate in the tick: a ratio) as a median and a 10th
percentile, and the share of ticks at which the controller stood with fewer ready replicas than the
other. The JSON goes to ``bench/results/autoscaler_adversary.json`` (``--out``), the table to the
``.md`` beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import autoscaler_sim as sim

DEFAULT_OUT = sim.ROOT / "bench" / "results" / "autoscaler_adversary.json"
#: The two controllers compared (the autoscaler's baseline is the HPA on GPU utilization).
PAIR = ("kubeinfer", "hpa_gpu")
#: Ticks at the start of a trace that are not probed: the first cold start and the controllers'
#: first reaction (the initial replica count is the same for both).
WARMUP_SECONDS = 120.0
#: How long after a step's end its requests still count in the ``window`` attainment, seconds.
DRAIN_SECONDS = 60.0


@dataclass(frozen=True)
class Standing:
    """What a controller stands with after one tick's decision.

    Attributes:
        ready: ready replicas that survive the decision (a scale-in removes starting ones first, then
            ready ones, at once).
        provisioned: every replica after the decision, starting ones included.
    """

    ready: int
    provisioned: int


@dataclass(frozen=True)
class Step:
    """An added step of traffic.

    Attributes:
        start: seconds from the trace's start (a tick).
        seconds: how long the step lasts, seconds.
        level: the rate the step raises the traffic to, requests/s (seconds already over it keep theirs).
        victim: the controller whose ceiling it exceeds.
    """

    start: float
    seconds: float
    level: float
    victim: str


def ceiling(cfg: sim.SimConfig) -> float:
    """One replica's rate at full batches back to back within the SLO, requests/s (``SimConfig.mu``
    without its 80 % margin): more than this, and its queue grows whatever the batching."""
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
    victim: Sequence[Standing],
    other: Sequence[Standing],
    peaks: Sequence[float],
    *,
    sustained: float,
    top: float,
    first: int,
    last: int,
) -> tuple[int, float] | None:
    """The tick with the widest gap between what ``other`` sustains and what ``victim`` can serve at most.

    Args:
        victim, other: what each stands with after each tick's decision (same ticks).
        peaks: the trace's highest rate over the step's span from each tick, requests/s.
        sustained: one ready replica's rate at the SLO, requests/s (``SimConfig.mu``).
        top: one replica's ceiling, requests/s (``ceiling``).
        first, last: the ticks that may be chosen, ``first <= k < last``.

    Returns:
        ``(tick, level)``: the earliest tick on a tie, and the rate halfway between the victim's ceiling
        (every replica it has, up and 100 % busy) and what the other's ready replicas sustain; ``None``
        when the other never sustains more than the victim's ceiling while the traffic over the span is
        under what the victim's ready replicas sustain (then a breach would be its own, not the step's).
    """
    best: tuple[float, int] | None = None
    for k in range(max(first, 0), min(last, len(victim), len(other), len(peaks))):
        gap = other[k].ready * sustained - victim[k].provisioned * top
        if gap <= 0 or peaks[k] >= victim[k].ready * sustained:
            continue
        if best is None or gap > best[0]:
            best = (gap, k)
    if best is None:
        return None
    k = best[1]
    return k, (victim[k].provisioned * top + other[k].ready * sustained) / 2


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


def _standing_recorder(controller: sim.Controller, into: list[Standing]) -> sim.Controller:
    """``controller``, noting what it stands with after each tick's decision (tick 0 is not called)."""

    def tick(t: float, m: sim.Metrics, n: int, timeout: float) -> tuple[int, float]:
        want, new_timeout = controller(t, m, n, timeout)
        into.append(Standing(min(m.ready, want), want))
        return want, new_timeout

    return tick


def _run(
    tcfg: sim.SimConfig,
    trace: sim.Trace,
    name: str,
    arrivals: np.ndarray,
    high: np.ndarray | None,
    start_n: int,
) -> tuple[sim.Result, list[Standing]]:
    """One controller's run over ``arrivals``, and what it stood with after each tick's decision."""
    standing = [Standing(start_n, start_n)]
    controller = _standing_recorder(sim.controller_for(name, tcfg, trace.rates), standing)
    return sim.Simulator(tcfg, arrivals, start_n, high=high).run(controller), standing


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


def window_attainment(res: sim.Result, target: float, start: float, end: float) -> float | None:
    """The share of the requests arriving in ``[start, end)`` answered within ``target`` seconds;
    ``None`` when none arrived."""
    sel = (res.arrivals >= start) & (res.arrivals < end)
    return round(float((res.latency[sel] <= target).mean()), 5) if sel.any() else None


def headroom_figures(
    ready: dict[str, list[int]], rates: np.ndarray, sustained: float
) -> dict[str, dict[str, float | None]]:
    """Per controller: the median and 10th percentile of ``ready * sustained / traffic`` over the ticks
    with traffic (``None`` when none has any), and the share of ticks at which it had fewer ready
    replicas than the other controller."""
    out: dict[str, dict[str, float | None]] = {}
    names = list(ready)
    for name in names:
        other = next(n for n in names if n != name)
        mine, theirs = ready[name], ready[other]
        ticks = min(len(mine), len(theirs), len(rates))
        ratios = [mine[k] * sustained / rates[k] for k in range(ticks) if rates[k] > 0]
        out[name] = {
            "median_headroom": round(float(statistics.median(ratios)), 3) if ratios else None,
            "p10_headroom": round(float(np.quantile(ratios, 0.1)), 3) if ratios else None,
            "share_of_ticks_below_other": (
                round(sum(mine[k] < theirs[k] for k in range(ticks)) / ticks, 3) if ticks else None
            ),
        }
    return out


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def probe_trace(
    cfg: sim.SimConfig, trace: sim.Trace, seeds: Sequence[int], log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The headroom figures and both adversarial steps of one trace (module docstring).

    Raises:
        ValueError: when ``seeds`` is empty.
    """
    if not seeds:
        raise ValueError("adversary: at least one seed is needed")
    tcfg = replace(cfg, horizon=float(len(trace.rates)))
    span = tcfg.cold_start + 2 * tcfg.sync
    ticks = int(tcfg.horizon / tcfg.sync)
    if ticks < 2:
        log(f"{trace.name:18s} skipped: shorter than two ticks ({len(trace.rates)} s)")
        return {"skipped": f"shorter than two ticks ({len(trace.rates)} s)"}
    inputs = {seed: sim._seed_inputs(trace, tcfg, seed) for seed in seeds}
    base = {(seed, name): _run(tcfg, trace, name, *inputs[seed]) for seed in seeds for name in PAIR}
    standing = {name: base[(seeds[0], name)][1] for name in PAIR}
    peaks = [float(trace.rates[int(k * tcfg.sync) : int(k * tcfg.sync + span)].max()) for k in range(ticks)]
    result: dict[str, Any] = {
        "headroom": headroom_figures(
            {name: [s.ready for s in standing[name]] for name in PAIR},
            tick_rates(trace.rates, tcfg.sync, ticks),
            tcfg.mu,
        ),
        "original": {
            name: _slo_rs([sim.figures(tcfg, base[(seed, name)][0]) for seed in seeds]) for name in PAIR
        },
    }
    first, last = int(WARMUP_SECONDS / tcfg.sync), ticks - int(span / tcfg.sync)
    for victim in PAIR:
        other = next(n for n in PAIR if n != victim)
        found = weakest_moment(
            standing[victim],
            standing[other],
            peaks,
            sustained=tcfg.mu,
            top=ceiling(tcfg),
            first=first,
            last=last,
        )
        key = f"against_{victim}"
        if found is None:
            result[key] = None
            log(f"{trace.name:18s} against {victim:9s}: no tick where {other} sustains more than its ceiling")
            continue
        k, level = found
        step = Step(k * tcfg.sync, span, level, victim)
        runs: dict[str, list[tuple[dict[str, float], float | None]]] = {name: [] for name in PAIR}
        for seed in seeds:
            arrivals, high = _with_step(trace, step, seed, inputs[seed][0], inputs[seed][1])
            for name in PAIR:
                res, _ = _run(tcfg, trace, name, arrivals, high, inputs[seed][2])
                end = step.start + step.seconds + DRAIN_SECONDS
                runs[name].append(
                    (sim.figures(tcfg, res), window_attainment(res, tcfg.target_p99, step.start, end))
                )
        result[key] = {
            "at_seconds": step.start,
            "seconds": step.seconds,
            "level_requests_per_second": round(step.level, 1),
            "trace_rate_requests_per_second": round(float(trace.rates[int(step.start)]), 1),
            "standing": {
                name: {
                    "ready": [base[(seed, name)][1][k].ready for seed in seeds],
                    "provisioned": [base[(seed, name)][1][k].provisioned for seed in seeds],
                }
                for name in PAIR
            },
            **{
                name: {
                    **_slo_rs([f for f, _ in rows]),
                    "per_seed_slo_attainment": [f["slo_attainment"] for f, _ in rows],
                    "window_attainment": _median([w for _, w in rows]),
                }
                for name, rows in runs.items()
            },
        }
        r = result[key]
        v, o = standing[victim][k], standing[other][k]
        log(
            f"{trace.name:18s} against {victim:9s}: t={step.start:.0f}s {victim} {v.provisioned} up to "
            f"{v.provisioned * ceiling(tcfg):.0f}/s, {other} {o.ready} ready sustain "
            f"{o.ready * tcfg.mu:.0f}/s; step to {step.level:.0f}/s for {span:.0f}s: "
            f"SLO kubeinfer {r['kubeinfer']['slo_attainment']:.4f}, "
            f"hpa_gpu {r['hpa_gpu']['slo_attainment']:.4f} (window {r['kubeinfer']['window_attainment']} / "
            f"{r['hpa_gpu']['window_attainment']})"
        )
    return result


def _slo_rs(figs: Sequence[dict[str, float]]) -> dict[str, float]:
    """The medians of the SLO attainment and replica-seconds of ``figs`` (one per seed)."""
    return {
        "slo_attainment": statistics.median(f["slo_attainment"] for f in figs),
        "replica_seconds": statistics.median(f["replica_seconds"] for f in figs),
    }


def _x(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


def table(result: dict[str, Any]) -> str:
    """The Markdown table of ``result`` (per trace: headroom, then each adversarial step)."""
    lines = [
        "| trace | kubeinfer headroom (median / p10) | hpa_gpu headroom (median / p10) | kubeinfer ticks "
        "below hpa_gpu | step against kubeinfer: SLO kubeinfer / hpa_gpu (without the step) | step "
        "against hpa_gpu: SLO kubeinfer / hpa_gpu (without the step) |",
        "|---|---|---|---|---|---|",
    ]

    def cell(row: dict[str, Any] | None, original: dict[str, Any], victim: str) -> str:
        if row is None:
            return "no moment"
        other = next(n for n in PAIR if n != victim)
        st = row["standing"]
        return (
            f"t={row['at_seconds']:.0f}s, {victim} {st[victim]['provisioned'][0]} vs {other} "
            f"{st[other]['ready'][0]} ready, to {row['level_requests_per_second']:.0f}/s: "
            f"{row['kubeinfer']['slo_attainment']:.4f} / {row['hpa_gpu']['slo_attainment']:.4f} "
            f"({original['kubeinfer']['slo_attainment']:.4f} / {original['hpa_gpu']['slo_attainment']:.4f})"
        )

    for name, row in result["traces"].items():
        if "skipped" in row:
            lines.append(f"| {name} | {row['skipped']} | | | | |")
            continue
        h, o = row["headroom"], row["original"]
        below = h["kubeinfer"]["share_of_ticks_below_other"]
        share = "-" if below is None else f"{below:.0%}"
        lines.append(
            f"| {name} | {_x(h['kubeinfer']['median_headroom'])} / {_x(h['kubeinfer']['p10_headroom'])} | "
            f"{_x(h['hpa_gpu']['median_headroom'])} / {_x(h['hpa_gpu']['p10_headroom'])} | "
            f"{share} | {cell(row['against_kubeinfer'], o, 'kubeinfer')} | "
            f"{cell(row['against_hpa_gpu'], o, 'hpa_gpu')} |"
        )
    lines.append("")
    for victim in PAIR:
        s = result["summary"][f"against_{victim}"]
        lines.append(
            f"Steps against {victim}: {s['steps']}; its SLO under the other's with the step on {s['worse']} "
            f"(already under it without the step on {s['already_worse']}: "
            f"{', '.join(s['already_worse_traces']) or 'none'}), so the step turned {s['turned']} of "
            f"{s['steps'] - s['already_worse']}."
        )
    lines.append("")
    return "\n".join(lines)


def summarize(traces: dict[str, Any]) -> dict[str, Any]:
    """Per direction: how many traces had a step, on how many the victim's SLO is under the other's with
    it, on how many it already was without it, and how many the step turned."""
    out: dict[str, Any] = {}
    for victim in PAIR:
        other = next(n for n in PAIR if n != victim)
        steps = worse = turned = 0
        already: list[str] = []
        for name, r in traces.items():
            row = r.get(f"against_{victim}")
            if row is None:
                continue
            steps += 1
            under = row[victim]["slo_attainment"] < row[other]["slo_attainment"]
            was_under = r["original"][victim]["slo_attainment"] < r["original"][other]["slo_attainment"]
            worse += under
            turned += under and not was_under
            if was_under:
                already.append(name)
        out[f"against_{victim}"] = {
            "steps": steps,
            "worse": worse,
            "already_worse": len(already),
            "already_worse_traces": already,
            "turned": turned,
        }
    return out


def _log(line: str) -> None:
    print(line, flush=True)


def _probe(trace: sim.Trace, cfg: sim.SimConfig, seeds: Sequence[int]) -> dict[str, Any]:
    return probe_trace(cfg, trace, seeds, _log)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    args, cfg, source, traces = sim.parse_run_args(ap, argv, DEFAULT_OUT, jobs_help="traces probed at once")
    a, c = cfg.a, cfg.c
    print(
        f"s(b) = {a * 1000:.2f} ms + {c * 1000:.3f} ms*b ({source}); one replica sustains {cfg.mu:.0f}/s "
        f"at the SLO, {ceiling(cfg):.0f}/s at most",
        flush=True,
    )
    command = "bench/autoscaler_adversary.py " + " ".join(sys.argv[1:] if argv is None else argv)
    return sim.run_per_trace(
        args,
        cfg,
        source,
        traces,
        _probe,
        summarize,
        table,
        command,
        {
            "sustained_requests_per_second": round(cfg.mu, 1),
            "ceiling_requests_per_second": round(ceiling(cfg), 1),
            "step_seconds": cfg.cold_start + 2 * cfg.sync,
            "drain_seconds": DRAIN_SECONDS,
            "warmup_seconds": WARMUP_SECONDS,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
