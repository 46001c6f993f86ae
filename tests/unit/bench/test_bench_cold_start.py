"""bench/cold_start.py: its options and its pure parts. No cluster is started, nothing is measured."""

from __future__ import annotations

from pathlib import Path

from tests.support.bench import load_bench

cold = load_bench("cold_start")
quiet = load_bench("quiet")

METRICS = """# HELP kubeinfer_cold_start_stage_seconds ...
kubeinfer_cold_start_stage_seconds_bucket{graph_cache="hit",le="0.1",model="minilm",stage="fetched"} 0.0
kubeinfer_cold_start_stage_seconds_sum{graph_cache="hit",model="minilm",stage="fetched"} 0.7
kubeinfer_cold_start_stage_seconds_sum{graph_cache="hit",model="minilm",stage="loaded"} 5.1
kubeinfer_cold_start_stage_seconds_sum{graph_cache="hit",model="minilm",stage="warmed"} 5.25
kubeinfer_cold_start_stage_seconds_sum{graph_cache="hit",model="minilm",stage="first_answer"} 5.3
kubeinfer_model_load_seconds{model="minilm"} 2.05
kubeinfer_warmup_seconds{model="minilm"} 0.14
"""


def test_defaults_fit_the_task() -> None:
    args = cold.parse_args([])
    assert args.runs >= 3 and args.cpu == "500m" and args.before_ready is None and args.origin == "demand"
    assert Path(args.out) == Path(cold.ROOT) / "bench" / "results" / "cold_start.json"
    assert args.noisy is False and args.settle_seconds == quiet.SETTLE_SECONDS


def test_the_runtime_s_stages_and_gauges_are_read_from_its_metrics() -> None:
    figures = cold.runtime_figures(METRICS)
    assert figures == {
        "stages_since_process_start_s": {"fetched": 0.7, "loaded": 5.1, "warmed": 5.25, "first_answer": 5.3},
        "graph_cache": "hit",
        "model_load_seconds": 2.05,
        "warmup_seconds": 0.14,
    }
    assert cold.runtime_figures("")["stages_since_process_start_s"] == {}


def test_the_medians_and_the_breakdown_of_the_stages() -> None:
    runs = [
        {"stages_s": {"replicas_1": 0.03, "pod_created": 0.06, "pod_ready": 6.4, "runtime_warmed": 5.8}},
        {"stages_s": {"replicas_1": 0.05, "pod_created": 0.10, "pod_ready": 6.0, "runtime_warmed": 5.6}},
        {"stages_s": {"replicas_1": 0.04, "pod_created": 0.08, "pod_ready": 7.0}},
    ]
    med = cold.median_stages(runs)
    assert med == {"replicas_1": 0.04, "pod_created": 0.08, "runtime_warmed": 5.7, "pod_ready": 6.4}
    parts = cold.breakdown(med)
    assert parts["operator: demand to replicas 1"] == 0.04
    assert parts["controllers: replicas 1 to pod created"] == 0.04
    assert parts["kubelet: runtime ready to pod Ready (probes)"] == 0.7
    assert "runtime: model load (fetched to loaded)" not in parts  # stages not seen
