"""kubeinfer against every setting of its peers: the HPA, KEDA, Knative's KPA and Ray Serve.

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

**The peers** (``PEERS``), each swept over its main knob on the same simulated replicas, cold start
and bounds:

- ``hpa_gpu``: the HPA on GPU utilization, targets ``HPA_TARGETS`` (the fields above).
- ``keda_rate``: KEDA's prometheus scaler on the request rate, an AverageValue target per replica fed
  to the HPA algorithm (``make_hpa(cfg, "rate", target)``: tolerance 10 %, 300 s scale-down
  stabilization, scale-up by max(100 %, 4 pods) per 15 s sync), targets ``RATE_SHARES`` of ``mu``.
- ``knative_kpa``: Knative's KPA (``autoscaler_peers.make_kpa``: stable 60 s and panic 6 s windows,
  panic at 200 %, scale up by 1000x and down by 2x at most per 2 s tick, scale-down delay 0, 70 %
  target utilization, scale to zero off), soft targets whose 70 % is ``CONCURRENCY_SHARES`` of
  ``concurrency_scale`` requests per pod.
- ``ray_serve``: Ray Serve's default policy (``autoscaler_peers.make_ray_serve``: upscale delay 30 s,
  downscale delay 600 s, look-back 30 s, pushes every 10 s, factors 1), ``target_ongoing_requests`` at
  ``CONCURRENCY_SHARES`` of ``concurrency_scale``.

**Dominance** (``dominance``): kubeinfer is dominated on a trace when some peer setting is at least as
good on both SLO attainment and replica-seconds and better on one, that is (a) it reaches at least
kubeinfer's SLO attainment for fewer replica-seconds (``cheaper_at_slo``: the cheapest such setting,
and the replica-seconds it saves), or (b) it spends no more replica-seconds and has a better SLO
attainment (``better_within_cost``: the best such setting, and its SLO gain). Each trace's row carries
``dominance``; ``summary.dominated`` lists the dominated traces and ``summary.by_setting`` each setting
alone over every trace, trace by trace and over all of them at once (mean SLO attainment, total
replica-seconds: ``dominates_over_all``). The last line printed is "not dominated" or the dominated
traces with their figures.

The JSON goes to ``bench/results/autoscaler_frontier.json`` (``--out``), the table to the ``.md``
beside it. ``--combine RUN.json ... --out ALL.json`` summarizes the traces of several runs (the default
folder's and later batches') together, without simulating.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import autoscaler_peers as peers
import autoscaler_sim as sim
import quiet

DEFAULT_OUT = sim.ROOT / "bench" / "results" / "autoscaler_frontier.json"
#: GPU-utilization targets of the HPA, ratios (0.7 is the one ``autoscaler_sim`` uses). Over 0.9 the
#: HPA never scales up: utilization is at most 1, inside the 10 % tolerance of the target.
HPA_TARGETS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)
#: KEDA's request-rate targets per replica as shares of ``mu`` (the rate one replica sustains at the
#: SLO, 80 % of its full-batch rate): from well under it to past it.
RATE_SHARES = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1)
#: The KPA's ``TargetValue`` (70 % of its soft target) and Ray Serve's ``target_ongoing_requests`` as
#: shares of ``concurrency_scale``: one replica holds about 0.4 of it in flight at 0.8 ``mu`` and 0.7
#: at ``mu`` (the simulated service model), so the sweep runs from standing headroom to saturation.
CONCURRENCY_SHARES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.85)


def concurrency_scale(cfg: sim.SimConfig) -> float:
    """Requests: ``mu`` times a full batch's service time, the scale of a replica's in-flight count."""
    return cfg.mu * cfg.s(cfg.max_batch)


@dataclass(frozen=True)
class PeerSetting:
    """One setting of one peer: its family, its knob's value (requests/s per replica for
    ``keda_rate``, requests per pod for the KPA's soft target and Ray's ``target_ongoing_requests``, a
    ratio for ``hpa_gpu``), the controller's maker, and whether it ticks every ``PEER_TICK_SECONDS``
    (its own metric pipeline) instead of every 15 s sync."""

    family: str
    value: float
    make: Callable[[sim.SimConfig, float], sim.Controller]
    fast_tick: bool = False

    @property
    def label(self) -> str:
        """``family value``, e.g. ``knative_kpa 18.3``."""
        return f"{self.family} {self.key}"

    @property
    def key(self) -> str:
        """The value as the JSON keys it: two decimals for a ratio, one for requests."""
        return f"{self.value:.2f}" if self.family == "hpa_gpu" else f"{self.value:.1f}"


def peer_settings(cfg: sim.SimConfig) -> list[PeerSetting]:
    """Every setting of every peer, ``hpa_gpu`` first (``HPA_TARGETS``), then ``keda_rate``,
    ``knative_kpa`` and ``ray_serve`` (values rounded to 0.1)."""
    scale = concurrency_scale(cfg)
    kpa_util = peers.KpaSpec(1.0).target_utilization
    return [
        *(PeerSetting("hpa_gpu", t, lambda c, v: sim.make_hpa(c, "gpu", v)) for t in HPA_TARGETS),
        *(
            PeerSetting("keda_rate", round(share * cfg.mu, 1), lambda c, v: sim.make_hpa(c, "rate", v))
            for share in RATE_SHARES
        ),
        *(
            PeerSetting("knative_kpa", round(share * scale / kpa_util, 1), peers.make_kpa, fast_tick=True)
            for share in CONCURRENCY_SHARES
        ),
        *(
            PeerSetting("ray_serve", round(share * scale, 1), peers.make_ray_serve, fast_tick=True)
            for share in CONCURRENCY_SHARES
        ),
    ]


def dominance(ki: dict[str, float], points: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Whether any of ``points`` (label -> figures with ``slo_attainment`` and ``replica_seconds``)
    dominates kubeinfer's figures ``ki``, counting both halves:

    - ``cheaper_at_slo``: among the points with SLO attainment at least kubeinfer's and fewer
      replica-seconds, the cheapest (the higher SLO on a tie), with ``replica_seconds_saved`` and
      ``replica_seconds_ratio`` (its over kubeinfer's); ``None`` when there is none.
    - ``better_within_cost``: among the points spending at most kubeinfer's replica-seconds with a
      higher SLO attainment, the best (the cheaper on a tie), with ``slo_gain``; ``None`` when none.

    ``dominated`` is True when either is not ``None``.
    """
    slo, cost = ki["slo_attainment"], ki["replica_seconds"]
    cheaper = {k: f for k, f in points.items() if f["slo_attainment"] >= slo and f["replica_seconds"] < cost}
    better = {k: f for k, f in points.items() if f["replica_seconds"] <= cost and f["slo_attainment"] > slo}
    a = cheapest_at_slo(cheaper, slo) if cheaper else None
    b = best_within_cost(better, cost) if better else None
    return {
        "dominated": a is not None or b is not None,
        "cheaper_at_slo": None
        if a is None
        else {
            "setting": a,
            **points[a],
            "replica_seconds_saved": round(cost - points[a]["replica_seconds"], 1),
            "replica_seconds_ratio": round(points[a]["replica_seconds"] / cost, 4),
        },
        "better_within_cost": None
        if b is None
        else {
            "setting": b,
            **points[b],
            "slo_gain": round(points[b]["slo_attainment"] - slo, 5),
        },
    }


def dominance_words(name: str, d: dict[str, Any]) -> str:
    """One line for a trace's ``dominance``: "not dominated", or each half that holds with its figures."""
    if not d["dominated"]:
        return f"{name}: not dominated"
    parts = []
    if (a := d["cheaper_at_slo"]) is not None:
        parts.append(
            f"{a['setting']} reaches its SLO ({a['slo_attainment']:.4f}) for {a['replica_seconds']:.0f} "
            f"replica-s, {a['replica_seconds_saved']:.0f} fewer (x{a['replica_seconds_ratio']:.3f})"
        )
    if (b := d["better_within_cost"]) is not None:
        parts.append(
            f"{b['setting']} spends {b['replica_seconds']:.0f} replica-s (no more) for SLO "
            f"{b['slo_attainment']:.4f}, +{b['slo_gain']:.4f}"
        )
    return f"{name}: dominated: " + "; ".join(parts)


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


SeedInputs = dict[int, tuple[Any, Any, int]]


def _figures(
    tcfg: sim.SimConfig,
    trace: sim.Trace,
    seeds: Sequence[int],
    make: Any,
    *,
    fast_tick: bool = False,
    inputs: SeedInputs | None = None,
) -> dict[str, float]:
    """The SLO attainment and replica-seconds of ``make(cfg)``'s controller with ``fast_tick``
    (``make()`` without), medians over ``seeds``; with ``fast_tick`` the controller decides every
    ``peers.PEER_TICK_SECONDS`` on a scrape without the P99 histogram. ``inputs``: each seed's
    ``sim._seed_inputs``, drawn once for every controller of a trace (drawn here when absent)."""
    run_cfg = replace(tcfg, sync=peers.PEER_TICK_SECONDS) if fast_tick else tcfg
    runs = []
    for seed in seeds:
        arrivals, high, start_n = (inputs or {}).get(seed) or sim._seed_inputs(trace, tcfg, seed)
        controller = make(run_cfg) if fast_tick else make()
        res = sim.Simulator(run_cfg, arrivals, start_n, high=high, p99_signal=not fast_tick).run(controller)
        fig = sim.figures(tcfg, res)
        runs.append({"slo_attainment": fig["slo_attainment"], "replica_seconds": fig["replica_seconds"]})
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def compare_trace(cfg: sim.SimConfig, trace: sim.Trace, seeds: Sequence[int]) -> dict[str, Any]:
    """kubeinfer's figures, every peer setting's (``peer_settings``), the cost- and SLO-matched HPA GPU
    targets and the ``dominance`` over every setting, for one trace."""
    tcfg = replace(cfg, horizon=float(len(trace.rates)))
    inputs = {seed: sim._seed_inputs(trace, tcfg, seed) for seed in seeds}
    ki = _figures(tcfg, trace, seeds, lambda: sim.make_kubeinfer(tcfg), inputs=inputs)
    by_family: dict[str, dict[str, dict[str, float]]] = {}
    points: dict[str, dict[str, float]] = {}
    for p in peer_settings(cfg):
        if p.fast_tick:
            fig = _figures(
                tcfg, trace, seeds, lambda c, p=p: p.make(c, p.value), fast_tick=True, inputs=inputs
            )
        else:
            fig = _figures(tcfg, trace, seeds, lambda p=p: p.make(tcfg, p.value), inputs=inputs)
        by_family.setdefault(p.family, {})[p.key] = fig
        points[p.label] = fig
    hpa = {float(k): f for k, f in by_family["hpa_gpu"].items()}
    cost_k = best_within_cost(hpa, ki["replica_seconds"])
    slo_k = cheapest_at_slo(hpa, ki["slo_attainment"])
    row = {
        "kubeinfer": ki,
        "hpa_gpu_by_target": by_family["hpa_gpu"],
        "cost_matched": None if cost_k is None else {"target": cost_k, **hpa[cost_k]},
        "slo_matched": None if slo_k is None else {"target": slo_k, **hpa[slo_k]},
        "peers": by_family,
        "dominance": dominance(ki, points),
    }
    print(f"{trace.name:18s} {_line(row)}", flush=True)
    print(f"{'':18s} {dominance_words(trace.name, row['dominance'])}", flush=True)
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
    judged = {n: r["dominance"] for n, r in rows.items() if "dominance" in r}
    dominated = sorted(n for n, d in judged.items() if d["dominated"])
    return {
        "traces": len(rows),
        "by_target": by_target,
        "slo_at_least_cost_matched_hpa": len(slo_ok),
        "slo_under_cost_matched_hpa": sorted(set(rows) - set(slo_ok)),
        "cost_at_most_slo_matched_hpa": len(cost_ok),
        "cost_over_slo_matched_hpa": sorted(set(rows) - set(cost_ok)),
        "dominated": dominated,
        "dominated_count": len(dominated),
        "not_dominated_count": len(judged) - len(dominated),
        "dominated_by_half": {
            "cheaper_at_slo": sorted(n for n, d in judged.items() if d["cheaper_at_slo"] is not None),
            "better_within_cost": sorted(n for n, d in judged.items() if d["better_within_cost"] is not None),
        },
        "verdict": [dominance_words(n, judged[n]) for n in dominated] or ["not dominated"],
        "by_setting": by_setting(rows),
    }


def by_setting(rows: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each peer setting alone over every trace that has ``peers`` (one configuration for all traces, as
    a user runs it): on how many traces it dominates kubeinfer (``dominates``, the names), on how many
    kubeinfer is at least as good on both axes (``kubeinfer_at_least_on_both``), kubeinfer's
    replica-seconds over all those traces over the setting's, and over all of them at once: the mean SLO
    attainment of the setting and of kubeinfer (``mean_slo``, ``kubeinfer_mean_slo``: each trace counts
    once, whatever its length) and whether the setting dominates kubeinfer on (mean SLO attainment, total
    replica-seconds) (``dominates_over_all``); ``traces``: how many traces the setting ran on."""
    out: dict[str, dict[str, Any]] = {}
    with_peers = {n: r for n, r in rows.items() if "peers" in r}
    families = list(dict.fromkeys(fam for r in with_peers.values() for fam in r["peers"]))
    labels = sorted(
        {(fam, key) for r in with_peers.values() for fam, fs in r["peers"].items() for key in fs},
        key=lambda fk: (families.index(fk[0]), float(fk[1])),
    )
    for fam, key in labels:
        pairs = {
            n: (r["kubeinfer"], r["peers"][fam][key]) for n, r in with_peers.items() if key in r["peers"][fam]
        }
        dom = [n for n, (k, p) in pairs.items() if dominance(k, {"p": p})["dominated"]]
        both = [
            n
            for n, (k, p) in pairs.items()
            if k["slo_attainment"] >= p["slo_attainment"] and k["replica_seconds"] <= p["replica_seconds"]
        ]
        ki_cost = sum(k["replica_seconds"] for k, _ in pairs.values())
        cost = sum(p["replica_seconds"] for _, p in pairs.values())
        ki_slo = sum(k["slo_attainment"] for k, _ in pairs.values()) / len(pairs)
        slo = sum(p["slo_attainment"] for _, p in pairs.values()) / len(pairs)
        over_all = dominance(
            {"slo_attainment": ki_slo, "replica_seconds": ki_cost},
            {"p": {"slo_attainment": slo, "replica_seconds": cost}},
        )
        out[f"{fam} {key}"] = {
            "traces": len(pairs),
            "dominates": sorted(dom),
            "kubeinfer_at_least_on_both": len(both),
            "replica_seconds_ratio": round(ki_cost / cost, 3),
            "mean_slo": round(slo, 4),
            "kubeinfer_mean_slo": round(ki_slo, 4),
            "dominates_over_all": bool(over_all["dominated"]),
        }
    return out


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
    if "dominated" in s and s["by_setting"]:
        lines += [
            "Dominance over every peer setting (hpa_gpu, keda_rate, knative_kpa, ray_serve): a setting "
            "reaching at least kubeinfer's SLO attainment for fewer replica-seconds, or spending no more "
            "with a better SLO attainment.",
            "",
            "| trace | kubeinfer SLO | kubeinfer replica-s | cheapest setting at its SLO: setting, SLO, "
            "replica-s, saved | best setting within its cost: setting, SLO, replica-s, gain |",
            "|---|---|---|---|---|",
        ]
        for name, r in result["traces"].items():
            d, ki = r.get("dominance"), r["kubeinfer"]
            if d is None:
                continue
            a, b = d["cheaper_at_slo"], d["better_within_cost"]
            cheap = (
                "none"
                if a is None
                else f"{a['setting']}, {a['slo_attainment']:.4f}, {a['replica_seconds']:.0f}, "
                f"{a['replica_seconds_saved']:.0f} (x{a['replica_seconds_ratio']:.3f})"
            )
            best = (
                "none"
                if b is None
                else f"{b['setting']}, {b['slo_attainment']:.4f}, {b['replica_seconds']:.0f}, "
                f"+{b['slo_gain']:.4f}"
            )
            lines.append(
                f"| {name} | {ki['slo_attainment']:.4f} | {ki['replica_seconds']:.0f} | {cheap} | {best} |"
            )
        lines += [
            "",
            f"Dominated on {s['dominated_count']} of {s['traces']} traces "
            f"({', '.join(s['dominated']) or 'none'}); not dominated on {s['not_dominated_count']}.",
            "",
            "| one peer setting on every trace | dominates kubeinfer on | kubeinfer at least as good on both "
            "| kubeinfer's replica-s over all traces / its | its mean SLO (kubeinfer's) | dominates over all "
            "traces |",
            "|---|---|---|---|---|---|",
            *(
                f"| {label} | {len(b['dominates'])} ({', '.join(b['dominates']) or '-'}) | "
                f"{b['kubeinfer_at_least_on_both']} | {b['replica_seconds_ratio']:.3f} | "
                f"{b['mean_slo']:.4f} ({b['kubeinfer_mean_slo']:.4f}) | "
                f"{'yes' if b['dominates_over_all'] else 'no'} |"
                for label, b in s["by_setting"].items()
            ),
            "",
            "Over all traces at once (mean SLO attainment, total replica-seconds), "
            + (
                "dominated by "
                + ", ".join(label for label, b in s["by_setting"].items() if b["dominates_over_all"])
                if any(b["dominates_over_all"] for b in s["by_setting"].values())
                else "no setting dominates kubeinfer"
            )
            + ".",
            "",
            *s["verdict"],
            "",
        ]
    return "\n".join(lines)


def combine(paths: Sequence[Path]) -> dict[str, Any]:
    """The traces of several runs' JSON (``--out`` files of this script) summarized together, without
    simulating: ``{"traces", "summary", "config": {"combined": [{"file", "command", "seeds"}, ...]}}``.
    Each run keeps its own seeds (every controller of a run saw the same arrivals).

    Raises ValueError naming the file when one is not such a JSON, two runs share a trace name or ran
    other peer settings (another service model or sweep: their settings would be judged on part of the
    traces), and OSError when one cannot be read.
    """
    traces: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    settings: Any = None  # the first file's
    for path in paths:
        try:
            data = json.loads(path.read_text())
            rows, config = data["traces"], data["config"]
            if not isinstance(rows, dict) or not isinstance(config, dict):
                raise TypeError("traces and config must be objects")
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a result of bench/autoscaler_frontier.py ({exc!r})") from exc
        if runs and config.get("peer_settings") != settings:
            raise ValueError(
                f"{path}: its peer settings differ from the first file's: {config.get('peer_settings')}"
            )
        settings = config.get("peer_settings")
        for name, row in rows.items():
            if name in traces:
                raise ValueError(f"{path}: trace {name!r} is also in an earlier file")
            traces[name] = row
        runs.append({"file": str(path), "command": config.get("command"), "seeds": config.get("seeds")})
    return {"config": {"combined": runs}, "traces": traces, "summary": summarize(traces)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="summarize the traces of these runs together, without simulating (e.g. the default run and "
        "those of later batches); needs --out",
    )
    args, cfg, source, traces = sim.parse_run_args(ap, argv, DEFAULT_OUT, jobs_help="traces run at once")
    if args.combine:
        if args.out.resolve() in {DEFAULT_OUT.resolve(), *(c.resolve() for c in args.combine)}:
            ap.error("--combine: give --out another file than the runs' and the default result")
        try:
            result = combine(args.combine)
        except (OSError, ValueError) as exc:
            ap.error(f"--combine: {exc}")
        result["config"]["command"] = "bench/autoscaler_frontier.py " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        # Nothing is simulated or timed here: each run's own JSON records the load it ran at.
        result["machine"] = {
            **quiet.machine(),
            "loadavg": list(os.getloadavg()),
            "load_check": "not applied (combined from the runs' JSON; no simulation, no timing)",
        }
        sim.write_results(args.out, result, table(result))
        return 0
    a, c = cfg.a, cfg.c
    settings = peer_settings(cfg)
    print(f"s(b) = {a * 1000:.2f} ms + {c * 1000:.3f} ms*b ({source}); peer settings:", flush=True)
    for fam in dict.fromkeys(p.family for p in settings):
        print(f"  {fam}: {', '.join(p.key for p in settings if p.family == fam)}", flush=True)
    command = "bench/autoscaler_frontier.py " + " ".join(sys.argv[1:] if argv is None else argv)
    config = {
        "hpa_targets": list(HPA_TARGETS),
        "peer_settings": {
            fam: [p.value for p in settings if p.family == fam]
            for fam in dict.fromkeys(p.family for p in settings)
        },
        "rate_shares_of_mu": list(RATE_SHARES),
        "concurrency_shares": list(CONCURRENCY_SHARES),
        "concurrency_scale_requests": round(concurrency_scale(cfg), 2),
        "peer_tick_seconds": peers.PEER_TICK_SECONDS,
        "knative_serving_commit": peers.KNATIVE_COMMIT,
        "ray_commit": peers.RAY_COMMIT,
    }
    status = sim.run_per_trace(args, cfg, source, traces, _compare, summarize, table, command, config)
    verdict = json.loads(args.out.read_text())["summary"]["verdict"]
    print("\n".join(verdict))
    return status


if __name__ == "__main__":
    sys.exit(main())
