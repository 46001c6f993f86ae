"""kubeinfer against the HPA at every GPU-utilization target: SLO at equal cost, cost at equal SLO.

    .venv/bin/python bench/autoscaler_frontier.py                  # every CSV in bench/traces/
    .venv/bin/python bench/autoscaler_frontier.py --traces DIR --out results.json

``bench/autoscaler_sim.py`` compares kubeinfer with the HPA at the usual 70 % GPU-utilization target.
That target is a knob too: a platform engineer who finds the HPA at 70 % too expensive lowers its
standing headroom by raising the target, and one who finds it breaching lowers the target. The fair
question is then the one of a cost-performance frontier: *for the replica-seconds kubeinfer spends,
what SLO attainment does the best HPA target reach, and for the SLO attainment kubeinfer reaches, what
does the cheapest HPA target cost?* This benchmark runs the HPA (the same simulated replicas, scrape
delay and cold start, ``autoscaler_sim.make_hpa``) at each target of ``HPA_TARGETS`` and kubeinfer once
(its defaults, or ``--policy`` overrides), three seeds each, medians, and reports per trace:

- ``cost_matched``: among the HPA targets whose replica-seconds are at most kubeinfer's, the one with
  the highest SLO attainment (``best_within_cost``); ``None`` when every target costs more. The HPA
  is tuned per trace here, kubeinfer is not: a baseline stronger than any one HPA configuration.
- ``slo_matched``: among the HPA targets whose SLO attainment is at least kubeinfer's, the cheapest
  (``cheapest_at_slo``); ``None`` when no target reaches it.

and, in ``summary.by_target``, each target alone over all traces: on how many kubeinfer's SLO
attainment is at least the HPA's, its replica-seconds at most the HPA's, both, and the ratio of
kubeinfer's replica-seconds to the HPA's summed over all traces.

The JSON goes to ``bench/results/autoscaler_frontier.json`` (``--out``), the table to the ``.md``
beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import autoscaler_sim as sim

DEFAULT_OUT = sim.ROOT / "bench" / "results" / "autoscaler_frontier.json"
#: GPU-utilization targets of the HPA, ratios (0.7 is the one ``autoscaler_sim`` uses). Over 0.9 the
#: HPA never scales up: utilization is at most 1, inside the 10 % tolerance of the target.
HPA_TARGETS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)


def best_within_cost(points: dict[float, dict[str, float]], cost: float) -> float | None:
    """The key of ``points`` (target -> figures with ``slo_attainment`` and ``replica_seconds``) with the
    highest SLO attainment among those costing at most ``cost`` replica-seconds (the cheaper on a tie),
    ``None`` when every one costs more."""
    within = [k for k, f in points.items() if f["replica_seconds"] <= cost]
    if not within:
        return None
    return max(within, key=lambda k: (points[k]["slo_attainment"], -points[k]["replica_seconds"]))


def cheapest_at_slo(points: dict[float, dict[str, float]], slo: float) -> float | None:
    """The key of ``points`` with the fewest replica-seconds among those whose SLO attainment is at least
    ``slo`` (the higher SLO on a tie), ``None`` when none reaches it."""
    reaching = [k for k, f in points.items() if f["slo_attainment"] >= slo]
    if not reaching:
        return None
    return min(reaching, key=lambda k: (points[k]["replica_seconds"], -points[k]["slo_attainment"]))


def _figures(tcfg: sim.SimConfig, trace: sim.Trace, seeds: Sequence[int], make: Any) -> dict[str, float]:
    """The SLO attainment and replica-seconds of ``make()``'s controller, medians over ``seeds``."""
    runs = []
    for seed in seeds:
        arrivals, high, start_n = sim._seed_inputs(trace, tcfg, seed)
        res = sim.Simulator(tcfg, arrivals, start_n, high=high).run(make())
        fig = sim.figures(tcfg, res)
        runs.append({"slo_attainment": fig["slo_attainment"], "replica_seconds": fig["replica_seconds"]})
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def compare_trace(cfg: sim.SimConfig, trace: sim.Trace, seeds: Sequence[int]) -> dict[str, Any]:
    """kubeinfer's figures, the HPA's at each target, and the cost- and SLO-matched targets of one trace."""
    tcfg = replace(cfg, horizon=float(len(trace.rates)))
    ki = _figures(tcfg, trace, seeds, lambda: sim.make_kubeinfer(tcfg))
    hpa = {
        target: _figures(tcfg, trace, seeds, lambda target=target: sim.make_hpa(tcfg, "gpu", target))
        for target in HPA_TARGETS
    }
    cost_k = best_within_cost(hpa, ki["replica_seconds"])
    slo_k = cheapest_at_slo(hpa, ki["slo_attainment"])
    row = {
        "kubeinfer": ki,
        "hpa_gpu_by_target": {f"{t:.2f}": f for t, f in hpa.items()},
        "cost_matched": None if cost_k is None else {"target": cost_k, **hpa[cost_k]},
        "slo_matched": None if slo_k is None else {"target": slo_k, **hpa[slo_k]},
    }
    print(f"{trace.name:18s} {_line(row)}", flush=True)
    return row


def _line(row: dict[str, Any]) -> str:
    ki, cm, sm = row["kubeinfer"], row["cost_matched"], row["slo_matched"]
    cost = (
        "every HPA target costs more"
        if cm is None
        else f"HPA at {cm['target']:.2f} within its cost: SLO {cm['slo_attainment']:.4f} "
        f"at {cm['replica_seconds']:.0f}"
    )
    slo = (
        "no HPA target reaches its SLO"
        if sm is None
        else f"cheapest HPA at its SLO: {sm['target']:.2f}, {sm['replica_seconds']:.0f} replica-s"
    )
    return f"kubeinfer SLO {ki['slo_attainment']:.4f} at {ki['replica_seconds']:.0f}; {cost}; {slo}"


def _compare(trace: sim.Trace, cfg: sim.SimConfig, seeds: Sequence[int]) -> dict[str, Any]:
    return compare_trace(cfg, trace, seeds)


def summarize(rows: dict[str, Any]) -> dict[str, Any]:
    """How many traces kubeinfer's SLO is at least the cost-matched HPA's (or no HPA target is as cheap),
    how many its replica-seconds are at most the SLO-matched HPA's (or no target reaches its SLO), and,
    for each HPA target alone (``by_target``), on how many traces kubeinfer's SLO is at least its, its
    replica-seconds at most its, both, and kubeinfer's replica-seconds over all traces over the HPA's."""
    slo_ok = [
        n
        for n, r in rows.items()
        if r["cost_matched"] is None
        or r["kubeinfer"]["slo_attainment"] >= r["cost_matched"]["slo_attainment"]
    ]
    cost_ok = [
        n
        for n, r in rows.items()
        if r["slo_matched"] is None
        or r["kubeinfer"]["replica_seconds"] <= r["slo_matched"]["replica_seconds"]
    ]
    by_target: dict[str, dict[str, Any]] = {}
    for target in sorted({t for r in rows.values() for t in r["hpa_gpu_by_target"]}):
        pairs = [(r["kubeinfer"], r["hpa_gpu_by_target"][target]) for r in rows.values()]
        slo_ge = [k["slo_attainment"] >= h["slo_attainment"] for k, h in pairs]
        cost_le = [k["replica_seconds"] <= h["replica_seconds"] for k, h in pairs]
        by_target[target] = {
            "slo_at_least": sum(slo_ge),
            "cost_at_most": sum(cost_le),
            "both": sum(a and b for a, b in zip(slo_ge, cost_le, strict=True)),
            "replica_seconds_ratio": round(
                sum(k["replica_seconds"] for k, _ in pairs) / sum(h["replica_seconds"] for _, h in pairs), 3
            ),
        }
    return {
        "traces": len(rows),
        "by_target": by_target,
        "slo_at_least_cost_matched_hpa": len(slo_ok),
        "slo_under_cost_matched_hpa": sorted(set(rows) - set(slo_ok)),
        "cost_at_most_slo_matched_hpa": len(cost_ok),
        "cost_over_slo_matched_hpa": sorted(set(rows) - set(cost_ok)),
    }


def table(result: dict[str, Any]) -> str:
    """The Markdown table of ``result``."""
    lines = [
        "| trace | kubeinfer SLO | kubeinfer replica-s | best HPA target within that cost: target, SLO, "
        "replica-s | cheapest HPA target at that SLO: target, replica-s |",
        "|---|---|---|---|---|",
    ]
    for name, r in result["traces"].items():
        ki, cm, sm = r["kubeinfer"], r["cost_matched"], r["slo_matched"]
        cost = (
            "none (every target costs more)"
            if cm is None
            else (f"{cm['target']:.2f}, {cm['slo_attainment']:.4f}, {cm['replica_seconds']:.0f}")
        )
        slo = (
            "none (no target reaches it)"
            if sm is None
            else f"{sm['target']:.2f}, {sm['replica_seconds']:.0f}"
        )
        lines.append(
            f"| {name} | {ki['slo_attainment']:.4f} | {ki['replica_seconds']:.0f} | {cost} | {slo} |"
        )
    s = result["summary"]
    lines += [
        "",
        f"kubeinfer's SLO attainment is at least that of the best HPA target costing no more on "
        f"{s['slo_at_least_cost_matched_hpa']} of {s['traces']} traces (under it: "
        f"{', '.join(s['slo_under_cost_matched_hpa']) or 'none'}); its replica-seconds are at most those of "
        f"the cheapest HPA target reaching its SLO on {s['cost_at_most_slo_matched_hpa']} of {s['traces']} "
        f"(over: {', '.join(s['cost_over_slo_matched_hpa']) or 'none'}).",
        "",
        "| one HPA target on every trace | kubeinfer's SLO at least its | kubeinfer's replica-s at most its "
        "| both | kubeinfer's replica-s over all traces / its |",
        "|---|---|---|---|---|",
        *(
            f"| {t} | {b['slo_at_least']} | {b['cost_at_most']} | {b['both']} | "
            f"{b['replica_seconds_ratio']:.3f} |"
            for t, b in s["by_target"].items()
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    args, cfg, source, traces = sim.parse_run_args(ap, argv, DEFAULT_OUT, jobs_help="traces run at once")
    a, c = cfg.a, cfg.c
    print(f"s(b) = {a * 1000:.2f} ms + {c * 1000:.3f} ms*b ({source}); HPA targets {HPA_TARGETS}", flush=True)
    command = "bench/autoscaler_frontier.py " + " ".join(sys.argv[1:] if argv is None else argv)
    return sim.run_per_trace(
        args, cfg, source, traces, _compare, summarize, table, command, {"hpa_targets": list(HPA_TARGETS)}
    )


if __name__ == "__main__":
    sys.exit(main())
