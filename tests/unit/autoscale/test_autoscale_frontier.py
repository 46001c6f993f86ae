"""kubeinfer against the HPA at every GPU-utilization target (bench/autoscaler_frontier.py)."""

from __future__ import annotations

import json
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


KI = {"slo_attainment": 0.99, "replica_seconds": 5000.0}


def test_autoscale_frontier_dominance_counts_both_halves() -> None:
    # (a) as good an SLO for fewer replica-seconds: the cheapest such setting, and what it saves
    points = {
        "cheap": {"slo_attainment": 0.99, "replica_seconds": 4000.0},
        "cheaper_but_worse": {"slo_attainment": 0.98, "replica_seconds": 3000.0},
        "dearer_and_better": {"slo_attainment": 1.0, "replica_seconds": 6000.0},
        "equal": dict(KI),
    }
    d = fr.dominance(KI, points)
    assert d["dominated"] and d["better_within_cost"] is None
    assert d["cheaper_at_slo"] == {
        "setting": "cheap",
        **points["cheap"],
        "replica_seconds_saved": 1000.0,
        "replica_seconds_ratio": 0.8,
    }
    # (b) no more replica-seconds for a better SLO: the best such setting, and its gain
    points = {
        "same_cost_better": {"slo_attainment": 0.995, "replica_seconds": 5000.0},
        "cheaper_a_bit_better": {"slo_attainment": 0.992, "replica_seconds": 4500.0},
    }
    d = fr.dominance(KI, points)
    assert d["better_within_cost"] == {
        "setting": "same_cost_better",
        **points["same_cost_better"],
        "slo_gain": 0.005,
    }
    assert d["cheaper_at_slo"]["setting"] == "cheaper_a_bit_better"  # it is also cheaper at the SLO
    # neither: equal on both, or better on one axis and worse on the other
    d = fr.dominance(KI, {"equal": dict(KI), "trade": {"slo_attainment": 0.999, "replica_seconds": 5001.0}})
    assert d == {"dominated": False, "cheaper_at_slo": None, "better_within_cost": None}
    assert fr.dominance_words("t", d) == "t: not dominated"
    words = fr.dominance_words("t", fr.dominance(KI, points))
    assert words.startswith(
        "t: dominated: cheaper_a_bit_better reaches its SLO (0.9920) for 4500 replica-s, 500 fewer"
    )
    assert "same_cost_better spends 5000 replica-s (no more) for SLO 0.9950, +0.0050" in words


def test_autoscale_frontier_summary_lists_the_dominated_traces() -> None:
    def row(ki: dict[str, float], kpa: dict[str, float]) -> dict[str, object]:
        peers_rows = {"hpa_gpu": {"0.80": POINTS[0.8]}, "knative_kpa": {"18.3": kpa}}
        points = {"hpa_gpu 0.80": POINTS[0.8], "knative_kpa 18.3": kpa}
        return {
            "kubeinfer": ki,
            "hpa_gpu_by_target": {"0.80": POINTS[0.8]},
            "cost_matched": None,
            "slo_matched": None,
            "peers": peers_rows,
            "dominance": fr.dominance(ki, points),
        }

    rows = {
        "calm": row(
            {"slo_attainment": 0.999, "replica_seconds": 6000.0},
            {"slo_attainment": 0.95, "replica_seconds": 5000.0},
        ),
        "bursty": row(
            {"slo_attainment": 0.97, "replica_seconds": 6000.0},
            {"slo_attainment": 0.98, "replica_seconds": 6000.0},
        ),
    }
    s = fr.summarize(rows)
    assert s["dominated"] == ["bursty"] and s["dominated_count"] == 1 and s["not_dominated_count"] == 1
    assert s["dominated_by_half"] == {"cheaper_at_slo": [], "better_within_cost": ["bursty"]}
    assert s["verdict"] == [fr.dominance_words("bursty", rows["bursty"]["dominance"])]
    # one setting alone: the KPA at 18.3 dominates on bursty; kubeinfer is at least as good on both on calm
    assert s["by_setting"]["knative_kpa 18.3"] == {
        "traces": 2,
        "dominates": ["bursty"],
        "kubeinfer_at_least_on_both": 0,
        "replica_seconds_ratio": round(12000 / 11000, 3),
        # over both traces at once it is cheaper but its mean SLO is lower: not dominated
        "mean_slo": 0.965,
        "kubeinfer_mean_slo": 0.9845,
        "dominates_over_all": False,
    }
    assert list(s["by_setting"]) == ["hpa_gpu 0.80", "knative_kpa 18.3"]
    text = fr.table({"traces": rows, "summary": s})
    assert "Dominated on 1 of 2 traces (bursty)" in text and text.rstrip().endswith(s["verdict"][0])
    assert (
        "Over all traces at once (mean SLO attainment, total replica-seconds), no setting dominates" in text
    )
    # a setting better on the mean and cheaper in total dominates over all, though not on calm
    rows["bursty"] = row(
        {"slo_attainment": 0.90, "replica_seconds": 6000.0},
        {"slo_attainment": 0.99, "replica_seconds": 5500.0},
    )
    over_all = fr.summarize(rows)["by_setting"]["knative_kpa 18.3"]
    assert over_all["dominates"] == ["bursty"] and over_all["dominates_over_all"] is True
    assert "dominated by knative_kpa 18.3." in fr.table({"traces": rows, "summary": fr.summarize(rows)})
    calm_only = fr.summarize({"calm": rows["calm"]})
    assert calm_only["dominated"] == [] and calm_only["verdict"] == ["not dominated"]


def test_autoscale_frontier_peer_settings_sweep_each_knob() -> None:
    cfg = sim.SimConfig(a=0.004, c=0.0008, max_batch=16)
    settings = fr.peer_settings(cfg)
    families = [p.family for p in settings]
    assert families == ["hpa_gpu"] * 9 + ["keda_rate"] * 6 + ["knative_kpa"] * 6 + ["ray_serve"] * 6
    rate = [p.value for p in settings if p.family == "keda_rate"]
    assert rate == [round(share * cfg.mu, 1) for share in fr.RATE_SHARES]
    scale = cfg.mu * cfg.s(cfg.max_batch)
    kpa = next(p for p in settings if p.family == "knative_kpa")
    assert (
        kpa.value == round(0.3 * scale / 0.7, 1)
        and kpa.fast_tick
        and kpa.label == f"knative_kpa {kpa.value:.1f}"
    )
    assert next(p for p in settings if p.family == "hpa_gpu").label == "hpa_gpu 0.50"


def _result(path: Path, names: list[str], seeds: list[int], settings: object = None) -> Path:
    row = {
        "kubeinfer": {"slo_attainment": 1.0, "replica_seconds": 1000.0},
        "hpa_gpu_by_target": {"0.80": POINTS[0.8]},
        "cost_matched": None,
        "slo_matched": None,
        "peers": {"hpa_gpu": {"0.80": POINTS[0.8]}},
        "dominance": fr.dominance(
            {"slo_attainment": 1.0, "replica_seconds": 1000.0}, {"hpa_gpu 0.80": POINTS[0.8]}
        ),
    }
    config = {"command": f"run {path.stem}", "seeds": seeds, "peer_settings": settings}
    data = {"config": config, "traces": dict.fromkeys(names, row)}
    path.write_text(json.dumps(data))
    return path


def test_autoscale_frontier_combine_summarizes_several_runs_together(tmp_path: Path) -> None:
    a = _result(tmp_path / "a.json", ["step", "ramp"], [1])
    b = _result(tmp_path / "b.json", ["flash_sale"], [1, 2, 3])
    combined = fr.combine([a, b])
    assert list(combined["traces"]) == ["step", "ramp", "flash_sale"]
    assert combined["summary"]["traces"] == 3 and combined["summary"]["dominated"] == []
    assert combined["config"]["combined"] == [
        {"file": str(a), "command": "run a", "seeds": [1]},
        {"file": str(b), "command": "run b", "seeds": [1, 2, 3]},
    ]
    out = tmp_path / "all.json"
    assert fr.main(["--combine", str(a), str(b), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["summary"]["traces"] == 3
    assert "Over all traces at once" in out.with_suffix(".md").read_text()


def test_autoscale_frontier_combine_refuses_a_trace_twice_a_bad_file_and_its_own_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _result(tmp_path / "a.json", ["step"], [1])
    again = _result(tmp_path / "again.json", ["step"], [1])
    bad = tmp_path / "bad.json"
    bad.write_text('{"traces": {}}')
    with pytest.raises(ValueError, match=r"again.json: trace 'step' is also in an earlier file"):
        fr.combine([a, again])
    with pytest.raises(ValueError, match=r"bad.json: not a result of bench/autoscaler_frontier.py"):
        fr.combine([bad])
    bad.write_text('{"traces": [], "config": {}}')
    with pytest.raises(ValueError, match=r"bad.json: not a result .*traces and config must be objects"):
        fr.combine([bad])
    other = _result(tmp_path / "other.json", ["ramp"], [1], settings={"hpa_gpu": [0.7]})
    with pytest.raises(ValueError, match=r"other.json: its peer settings differ from the first file's"):
        fr.combine([a, other])
    for argv, words in (
        (["--combine", str(a), "--out", str(a)], "give --out another file"),
        (["--combine", str(a)], "give --out another file"),
        (["--combine", str(a), str(again), "--out", str(tmp_path / "o.json")], "also in an earlier file"),
        (["--combine", str(tmp_path / "absent.json"), "--out", str(tmp_path / "o.json")], "No such file"),
    ):
        with pytest.raises(SystemExit) as exc:
            fr.main(argv)
        assert exc.value.code == 2
        assert words in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()
