"""kubeinfer against the HPA at every GPU-utilization target (bench/autoscaler_frontier.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.support.bench import load_bench

fr = load_bench("autoscaler_frontier")
sim = fr.sim

POINTS = {
    0.5: {"slo_attainment": 1.0, "replica_seconds": 9000.0},
    0.7: {"slo_attainment": 0.99, "replica_seconds": 7000.0},
    0.8: {"slo_attainment": 0.99, "replica_seconds": 6500.0},
    0.9: {"slo_attainment": 0.95, "replica_seconds": 5000.0},
}


def test_autoscale_frontier_best_target_within_a_cost() -> None:
    assert fr.best_within_cost(POINTS, 7000.0) == 0.8  # 0.7 and 0.8 tie on SLO: the cheaper
    assert fr.best_within_cost(POINTS, 9000.0) == 0.5
    assert fr.best_within_cost(POINTS, 5000.0) == 0.9
    assert fr.best_within_cost(POINTS, 4999.0) is None


def test_autoscale_frontier_cheapest_target_at_an_slo() -> None:
    assert fr.cheapest_at_slo(POINTS, 0.99) == 0.8
    assert fr.cheapest_at_slo(POINTS, 0.999) == 0.5
    assert fr.cheapest_at_slo(POINTS, 0.9) == 0.9
    assert fr.cheapest_at_slo(POINTS, 1.01) is None


def test_autoscale_frontier_summary_counts_each_side() -> None:
    rows = {
        "a": {  # kubeinfer cheaper than every target, and at the SLO the cheapest needs 6500
            "kubeinfer": {"slo_attainment": 0.99, "replica_seconds": 4000.0},
            "cost_matched": None,
            "slo_matched": {"target": 0.8, **POINTS[0.8]},
            "hpa_gpu_by_target": {"0.80": POINTS[0.8], "0.90": POINTS[0.9]},
        },
        "b": {  # the HPA at 0.9 is as cheap and better; at kubeinfer's SLO it is cheaper
            "kubeinfer": {"slo_attainment": 0.94, "replica_seconds": 5500.0},
            "cost_matched": {"target": 0.9, **POINTS[0.9]},
            "slo_matched": {"target": 0.9, **POINTS[0.9]},
            "hpa_gpu_by_target": {"0.80": POINTS[0.8], "0.90": POINTS[0.9]},
        },
    }
    s = fr.summarize(rows)
    assert s["slo_at_least_cost_matched_hpa"] == 1 and s["slo_under_cost_matched_hpa"] == ["b"]
    assert s["cost_at_most_slo_matched_hpa"] == 1 and s["cost_over_slo_matched_hpa"] == ["b"]
    assert "under it: b" in fr.table({"traces": rows, "summary": s})
    # one target on both traces: at 0.8 kubeinfer's SLO is at least its on a only, cheaper on both
    assert s["by_target"]["0.80"] == {
        "slo_at_least": 1,
        "cost_at_most": 2,
        "both": 1,
        "replica_seconds_ratio": round(9500 / 13000, 3),
    }
    assert s["by_target"]["0.90"]["slo_at_least"] == 1 and s["by_target"]["0.90"]["cost_at_most"] == 1


def test_autoscale_frontier_hpa_target_sets_its_standing_headroom() -> None:
    cfg = sim.SimConfig(a=0.004, c=0.0008, max_batch=16)
    rng = np.random.default_rng(5)
    trace = sim.Trace("plateau", 2.5 * cfg.mu * np.exp(0.05 * rng.standard_normal(900)))
    tcfg = replace(cfg, horizon=float(len(trace.rates)))
    low = fr._figures(tcfg, trace, [1], lambda: sim.make_hpa(tcfg, "gpu", 0.5))
    default = fr._figures(tcfg, trace, [1], lambda: sim.make_hpa(tcfg, "gpu"))
    at_70 = fr._figures(tcfg, trace, [1], lambda: sim.make_hpa(tcfg, "gpu", 0.7))
    high = fr._figures(tcfg, trace, [1], lambda: sim.make_hpa(tcfg, "gpu", 0.9))
    assert default == at_70
    assert low["replica_seconds"] > default["replica_seconds"] > high["replica_seconds"]


def test_autoscale_frontier_bad_input_is_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("seconds,requests_per_second\n0,abc\n")
    for argv, words in (
        (["--trace", str(bad)], "not a number"),
        (["--trace", str(tmp_path / "absent.csv")], "No such file"),
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--policy", "plan_utilization=3"], "plan_utilization"),
    ):
        try:
            fr.main([*argv, "--out", str(tmp_path / "out.json")])
        except SystemExit as exc:
            assert exc.code == 2
        else:
            raise AssertionError(f"{argv} was accepted")
        assert words in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
