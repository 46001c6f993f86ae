"""bench/runtime_bench.py's engine axis: ``--engines`` and the engine comparison (its ratios and its
table) from fake measurements. No model is loaded, no runtime is started, nothing is measured."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.bench import load_bench

rb = load_bench("runtime_bench")


# --- the options ------------------------------------------------------------------------------------


def test_default_runs_the_four_configurations_on_one_thread_axis() -> None:
    args = rb.parse_args([])
    assert args.variants == [
        ("torch", "none"),
        ("torch", "int8-dynamic"),
        ("onnxruntime", "none"),
        ("onnxruntime", "int8-dynamic"),
    ]
    assert args.batches == [1, 8, 32, 64]
    assert args.max_batch == 32 and args.threads == [args.primary_threads]
    assert args.budget == rb.BUDGET_SECONDS and args.refine_budget == rb.REFINE_BUDGET_SECONDS
    assert args.noisy is False


def test_engines_cross_the_quantization_modes_in_order() -> None:
    args = rb.parse_args(
        ["--engines", "onnxruntime", "--quantization", "int8-dynamic, none", "--threads", "1"]
    )
    assert args.variants == [("onnxruntime", "int8-dynamic"), ("onnxruntime", "none")]
    assert args.threads == [1] and args.primary_threads == 1
    args = rb.parse_args(["--engines", "torch", "--quantization", "bf16", "--batches", "64,1,8,8"])
    assert args.variants == [("torch", "bf16")]
    assert args.batches == [1, 8, 64]  # sorted, once each


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engines", "tensorrt"], "unknown engine 'tensorrt'"),
        (["--engines", "torch,torch"], "--engines names a value twice"),
        (["--engines", ""], "at least one value"),
        (
            ["--quantization", "none,bf16"],
            "onnxruntime serves quantization none, int8-dynamic, int8-static only, not bf16",
        ),
        (["--batches", "0,8"], "--batches needs positive batch sizes"),
        (["--batches", "eight"], "--delays, --batches, --threads"),
        (["--threads", "0"], "--threads needs positive thread counts"),
    ],
)
def test_bad_options_exit_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        rb.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_service_batch_sizes_add_those_above_b_only() -> None:
    assert rb.service_batch_sizes(4, [1, 8, 32, 64]) == [1, 2, 3, 4, 8, 32, 64]
    assert rb.service_batch_sizes(32, [1, 8, 32]) == list(range(1, 33))


# --- the comparison from fake measurements ---------------------------------------------------------------


def fake_result(
    engine: str, mode: str, speed: float, served: float, cosine: float, **extra: Any
) -> dict[str, Any]:
    """A ``run_mode`` result as far as the comparison reads it: s(b) = (4 ms + 2 ms·b) / speed on 1
    thread, at b = 1..32 and 64; a served max rate; a load report."""
    a, c = 0.004 / speed, 0.002 / speed
    rows = [{"batch_size": b, "service_seconds": a + c * b} for b in [*range(1, 33), 64]]
    figures = {
        "threads": 1,
        "a_seconds": a,
        "c_seconds": c,
        "limit_rps": 32 / (a + 32 * c),
        "max_slo_rps": {"batched": served, "unbatched": served / 2},
        "best_batched_config": "batched_delay_2ms",
        "service_time": rows,
    }
    report = {
        "quantization_cosine_mean_ratio": cosine,
        "quantization_retrieval_agreement_ratio": 1.0 if cosine > 0.99 else 0.95,
        "quantization_retrieval_agreement_all_ratio": 0.97,
    }
    return {
        "engine": engine,
        "quantization": mode,
        "report": report,
        "a_seconds": a,
        "by_threads": {"1": figures},
        "budget_exhausted": False,
        **extra,
    }


FAKE = {
    ("torch", "none"): fake_result("torch", "none", 1.0, 60.0, 1.0),
    ("torch", "int8-dynamic"): fake_result("torch", "int8-dynamic", 1.5, 120.0, 0.985),
    ("onnxruntime", "none"): fake_result("onnxruntime", "none", 2.0, 90.0, 0.99999),
    ("onnxruntime", "int8-dynamic"): fake_result(
        "onnxruntime", "int8-dynamic", 4.0, 180.0, 0.9923, budget_exhausted=True
    ),
}


def test_ratios_to_torch_fp32_of_the_same_run() -> None:
    engines = rb.assemble(FAKE, 1, [1, 8, 32, 64])["engines"]
    assert engines["reference"] == "torch/none"
    assert engines["threads"] == 1 and engines["batch_sizes"] == [1, 8, 32, 64]
    assert list(engines["variants"]) == [
        "torch/none",
        "torch/int8-dynamic",
        "onnxruntime/none",
        "onnxruntime/int8-dynamic",
    ]
    ref = engines["variants"]["torch/none"]
    assert ref["rows_per_second"]["1"] == pytest.approx(1 / 0.006)
    assert ref["rows_per_second"]["64"] == pytest.approx(64 / (0.004 + 0.128))
    assert ref["ratio_to_reference"]["max_slo_rps"] == 1.0
    ort8 = engines["variants"]["onnxruntime/int8-dynamic"]
    assert ort8["cosine_mean"] == 0.9923 and ort8["retrieval_agreement"] == 1.0
    assert ort8["max_slo_rps"] == 180.0 and ort8["max_slo_rps_unbatched"] == 90.0
    assert ort8["service_seconds"]["8"] == pytest.approx((0.004 + 0.016) / 4)
    ratio = ort8["ratio_to_reference"]
    # every s(b) is 4x faster: x4 rows/s at every batch size, x4 X(B); the served rate 180 / 60
    assert all(r == pytest.approx(4.0) for r in ratio["rows_per_second"].values())
    assert ratio["limit_rps"] == pytest.approx(4.0)
    assert ratio["max_slo_rps"] == pytest.approx(3.0) and ratio["max_slo_rps_unbatched"] == pytest.approx(3.0)
    assert ort8["budget_exhausted"] is True
    assert ort8["details"] == "by_engine.onnxruntime.int8-dynamic"
    assert engines["variants"]["torch/int8-dynamic"]["details"] == "by_quantization.int8-dynamic"


def test_results_layout_keeps_torch_int8_on_top() -> None:
    result = rb.assemble(FAKE, 1, [1, 8, 32, 64])
    # the top level stays torch int8-dynamic's (bench/autoscaler_sim.py reads its a and c)
    assert result["engine"] == "torch" and result["quantization"] == "int8-dynamic"
    assert result["a_seconds"] == FAKE[("torch", "int8-dynamic")]["a_seconds"]
    assert list(result["by_quantization"]) == ["none", "int8-dynamic"]
    assert result["by_quantization"]["none"] is FAKE[("torch", "none")]
    assert list(result["by_engine"]) == ["onnxruntime"]
    assert list(result["by_engine"]["onnxruntime"]) == ["none", "int8-dynamic"]
    # one engine alone: its int8-dynamic on top, nothing under by_engine
    only = rb.assemble({k: v for k, v in FAKE.items() if k[0] == "onnxruntime"}, 1, [1, 8])
    assert only["engine"] == "onnxruntime" and only["quantization"] == "int8-dynamic"
    assert only["by_engine"] == {}


def test_without_the_reference_the_ratios_are_null() -> None:
    engines = rb.assemble({k: v for k, v in FAKE.items() if k != ("torch", "none")}, 1, [1, 8])["engines"]
    assert engines["reference"] is None
    assert all(v["ratio_to_reference"] is None for v in engines["variants"].values())
    lines = rb.engine_table(engines)
    assert "torch/none did not run" in lines[0]
    assert "xn/a" in lines[2]


def test_a_missing_or_zero_figure_gives_a_null_ratio() -> None:
    zero = {**FAKE, ("torch", "none"): fake_result("torch", "none", 1.0, 0.0, 1.0)}
    engines = rb.assemble(zero, 1, [1, 128])["engines"]  # 128: not measured
    ort = engines["variants"]["onnxruntime/none"]
    assert (
        ort["rows_per_second"]["128"] is None and ort["ratio_to_reference"]["rows_per_second"]["128"] is None
    )
    assert ort["ratio_to_reference"]["max_slo_rps"] is None  # torch fp32 held no rate
    assert ort["ratio_to_reference"]["rows_per_second"]["1"] == pytest.approx(2.0)


def test_table_has_a_row_per_configuration_with_its_ratios() -> None:
    lines = rb.engine_table(rb.assemble(FAKE, 1, [1, 8, 32, 64])["engines"])
    assert "in one run, 1 intra-op thread(s)" in lines[0] and "ratio to torch/none" in lines[0]
    header, *rows = lines[1:]
    for column in ("engine", "mode", "cosine", "agree", "b=1 rows/s", "b=64 rows/s", "served/s P99<=100ms"):
        assert column in header
    assert len(rows) == 4
    assert rows[0].split()[:4] == ["torch", "none", "1.0000", "1.0000"]
    ort8 = rows[3].split()
    assert ort8[:4] == ["onnxruntime", "int8-dynamic", "0.9923", "1.0000"]
    assert ort8[4:6] == [f"{4 / 0.006:.0f}", "x4.00"]  # b=1: 667 rows/s, x4.00
    assert ort8[-2:] == [">=180", "x3.00"]  # its sweep ran out of budget: a lower bound
    assert all(len(line) == len(lines[1]) for line in lines[2:])  # aligned columns
