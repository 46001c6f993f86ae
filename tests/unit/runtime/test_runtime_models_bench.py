"""The runtime benchmark's pure helpers and the GPU check's CPU dry run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_service_time_fit_recovers_a_and_c() -> None:
    bench = load_script("runtime_bench")
    rows = [{"batch_size": b, "service_seconds": 0.004 + 0.0015 * b} for b in range(1, 33)]
    a, c = bench.fit_service_time(rows)
    assert a == pytest.approx(0.004)
    assert c == pytest.approx(0.0015)
    gpu = load_script("gpu_check")
    assert gpu.fit_line([1.0, 2.0, 3.0], [3.0, 5.0, 7.0]) == pytest.approx((1.0, 2.0))


def test_slo_rate_and_gauges() -> None:
    bench = load_script("runtime_bench")
    ok = {"p99_seconds": 0.05, "ok": 100.0, "requests": 100.0}
    assert bench.meets_slo(ok)
    assert not bench.meets_slo({**ok, "p99_seconds": 0.1})
    assert not bench.meets_slo({**ok, "ok": 98.0})  # 2 % unanswered
    points = [
        {"offered_rps": 20.0, "meets_slo": True},
        {"offered_rps": 28.0, "meets_slo": True},
        {"offered_rps": 39.0, "meets_slo": False},
    ]
    assert bench.max_slo_rate(points) == 28.0
    assert bench.max_slo_rate([]) == 0.0
    # refinement between 28 and 39: 33 passes, then 30.4 fails -> the bound is below 30.4 (28 stays)
    refined = [{"offered_rps": 33.0, "meets_slo": True, "refinement": True}]
    assert bench.max_slo_rate(points + refined) == 33.0
    refined.append({"offered_rps": 30.4, "meets_slo": False, "refinement": True})
    assert bench.max_slo_rate(points + refined) == 28.0
    text = (
        "# TYPE kubeinfer_max_batch_size gauge\n"
        'kubeinfer_max_batch_size{model="minilm"} 32.0\n'
        "# TYPE kubeinfer_max_queue_delay_seconds gauge\n"
        'kubeinfer_max_queue_delay_seconds{model="minilm"} 0.002\n'
        'kubeinfer_max_queue_delay_seconds{model="other"} 9.0\n'
    )
    assert bench.gauge_values(text) == {
        "kubeinfer_max_batch_size": 32.0,
        "kubeinfer_max_queue_delay_seconds": 0.002,
    }
    assert bench.config_name(1, 0.0) == "unbatched"
    assert bench.config_name(32, 0.002) == "batched_delay_2ms"


def test_ideal_slo_rate_bounds_what_batching_can_hold() -> None:
    """The ideal batching server's max rate at P99 <= 100 ms: below X(B), higher batched than not,
    and batching pays in proportion to the fixed cost a (with c = 0 a batch of 32 costs one row's time)."""
    bench = load_script("runtime_bench")
    a, c = 0.008, 0.005
    batched = bench.ideal_slo_rate(a, c, 32, requests=4000)
    unbatched = bench.ideal_slo_rate(a, c, 1, requests=4000)
    assert unbatched < 1 / (a + c)  # M/D/1 at P99 <= 100 ms: short of full utilization
    assert unbatched < batched < 32 / (a + 32 * c)
    assert batched / unbatched < 3  # a small fixed cost: batching cannot triple the rate
    fixed_only = bench.ideal_slo_rate(0.01, 0.0, 32, requests=4000)
    assert fixed_only > 10 * bench.ideal_slo_rate(0.01, 0.0, 1, requests=4000)


def test_gpu_check_dry_run_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the dry run does not apply")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["cuda"] is False
    assert "no CUDA device" in result["message"]
    assert result["modes"] == {}
