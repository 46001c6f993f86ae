"""bench/pool.py: its options and its pure parts (the Zipf traffic, the memory-seconds integral, the
process tree), and its /proc readers on this process. No runtime is started, nothing is measured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.bench import load_bench

pool = load_bench("pool")
rb = load_bench("runtime_bench")


def test_defaults_fit_the_task() -> None:
    args = pool.parse_args([])
    assert args.models == 20 and args.zipf == 1.1 and args.repeats >= 3 and args.sample_interval == 0.5
    assert args.pin_hot and args.budget_bytes is None and args.noisy is False
    assert Path(args.out) == Path(rb.ROOT) / "bench" / "results" / "pool.json"
    assert pool.parse_args(["--no-pin-hot"]).pin_hot is False


@pytest.mark.parametrize(
    "argv", [["--models", "0"], ["--hot", "21"], ["--rate", "0"], ["--zipf", "-1"], ["--budget-share", "0"]]
)
def test_bad_options_exit_with_status_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        pool.parse_args(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_zipf_shares_fall_as_k_to_the_minus_s() -> None:
    shares = pool.zipf_shares(20, 1.1)
    assert shares.shape == (20,) and shares.sum() == pytest.approx(1.0)
    assert np.all(np.diff(shares) < 0)
    assert shares[0] / shares[1] == pytest.approx(2**1.1) and shares[0] / shares[19] == pytest.approx(20**1.1)
    assert pool.zipf_shares(4, 0.0) == pytest.approx([0.25] * 4)
    with pytest.raises(ValueError):
        pool.zipf_shares(0, 1.1)


def test_schedule_is_poisson_at_the_rate_with_models_drawn_by_share() -> None:
    shares = pool.zipf_shares(20, 1.1)
    offsets, picks = pool.schedule(50.0, 200.0, shares, seed=7)
    assert offsets.size == picks.size and np.all(np.diff(offsets) > 0)
    assert offsets[0] >= 0 and offsets[-1] < 200.0
    assert offsets.size == pytest.approx(50 * 200, rel=0.05)
    gaps = np.diff(offsets)
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.05)  # exponential gaps: std = mean
    counts = np.bincount(picks, minlength=20) / picks.size
    assert counts == pytest.approx(shares, abs=0.01)
    again = pool.schedule(50.0, 200.0, shares, seed=7)
    assert np.array_equal(again[0], offsets) and np.array_equal(again[1], picks)
    assert not np.array_equal(pool.schedule(50.0, 200.0, shares, seed=8)[1][:100], picks[:100])
    with pytest.raises(ValueError):
        pool.schedule(0.0, 10.0, shares, seed=0)


def test_hot_models_are_the_largest_shares() -> None:
    assert pool.hot_models(pool.zipf_shares(20, 1.1), 3) == [0, 1, 2]
    assert pool.hot_models([0.1, 0.5, 0.1, 0.3], 2) == [1, 3]


def test_memory_seconds_integrates_the_samples_over_the_window() -> None:
    flat = [(0.0, 100.0), (1.0, 100.0), (2.0, 100.0)]
    assert pool.memory_seconds(flat, 0.0, 2.0) == pytest.approx(200.0)
    ramp = [(0.0, 0.0), (10.0, 1000.0)]  # 100 bytes more every second
    assert pool.memory_seconds(ramp, 0.0, 10.0) == pytest.approx(5000.0)
    # a window between samples: the values there are interpolated, not the nearest samples'
    assert pool.memory_seconds(ramp, 2.0, 4.0) == pytest.approx(600.0)
    # beyond the samples the edge values hold
    assert pool.memory_seconds(ramp, -2.0, 0.0) == pytest.approx(0.0)
    assert pool.memory_seconds(ramp, 10.0, 12.0) == pytest.approx(2000.0)
    # a step between two samples half a second apart counts as half the step
    step = [(0.0, 0.0), (0.5, 0.0), (1.0, 1000.0), (2.0, 1000.0)]
    assert pool.memory_seconds(step, 0.0, 2.0) == pytest.approx(250.0 + 1000.0)
    assert pool.memory_seconds(flat, 2.0, 1.0) == 0.0
    with pytest.raises(ValueError):
        pool.memory_seconds([], 0.0, 1.0)


def test_tree_holds_the_roots_and_every_descendant_only() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 11, 20: 1, 21: 20, 30: 10}
    assert pool.tree(parents, [10]) == {10, 11, 12, 30}
    assert pool.tree(parents, [20, 12]) == {20, 21, 12}
    assert pool.tree(parents, [99]) == set()


def test_budget_is_a_share_of_the_services_resident_bytes() -> None:
    assert pool.budget_bytes([100, 300, 200, 1000], 0.25) == 400
    assert pool.budget_bytes([800] * 20, 0.25) == 5 * 800  # a quarter: 5 of 20 models of that size
    with pytest.raises(ValueError):
        pool.budget_bytes([], 0.25)
    with pytest.raises(ValueError):
        pool.budget_bytes([100], 0.0)


def test_latency_figures_and_medians() -> None:
    figures = pool.latency_figures([0.01] * 99 + [1.0])
    assert figures["requests"] == 100 and figures["p50_seconds"] == pytest.approx(0.01)
    assert figures["max_seconds"] == 1.0 and 0.01 < figures["p99_seconds"] < 1.0
    assert pool.latency_figures([])["p99_seconds"] is None
    assert pool.median_of([3.0, None, 1.0, 2.0]) == 2.0 and pool.median_of([None]) is None


def test_the_cold_probe_asks_the_least_popular_model_of_its_kind_not_loaded(tmp_path: Path) -> None:
    models = [
        pool.Model(f"m{i}", pool.KINDS[i % 4], i + 1, share, tmp_path)
        for i, share in enumerate(pool.zipf_shares(12, 1.1))
    ]
    assert pool.probe_target(models, "onnx", ["m1"]).name == "m9"
    assert pool.probe_target(models, "onnx", ["m9"]).name == "m5"
    assert pool.probe_target(models, "onnx", ["m1", "m5", "m9"]) is None


def test_the_services_config_is_an_inference_services(tmp_path: Path) -> None:
    model = pool.Model("m02-onnx", "onnx", 2, 0.1, tmp_path / "mlp.onnx")
    cfg = pool.service_config(model)
    assert (cfg.model.name, cfg.model.format, cfg.model.source) == ("m02-onnx", "onnx", str(model.source))
    assert cfg.device == "cpu" and cfg.server.http_workers == 1 and cfg.repository is None
    hf = pool.service_config(pool.Model("m01-hf-classifier", "hf-classifier", 1, 0.3, tmp_path / "c"))
    assert hf.model.format == "huggingface"


def test_verdict_compares_the_medians() -> None:
    services = {
        "memory": {"rss_byte_seconds": 400.0, "anon_byte_seconds": 200.0},
        "hot": {"p99_seconds": 0.05},
    }
    side_pool = {"memory": {"rss_byte_seconds": 90.0, "anon_byte_seconds": 60.0}, "hot": {"p99_seconds": 0.3}}
    v = pool.verdict({**services, "failed": 0}, {**side_pool, "failed": 1}, 0.2)
    assert v["memory_seconds_ratio_pool_to_services"] == pytest.approx(0.225) and v["memory_within_target"]
    assert v["anon_memory_seconds_ratio_pool_to_services"] == pytest.approx(0.3)
    assert v["hot_p99_within_target"] == {"services": True, "pool": False}
    assert v["failed_requests"] == {"services": 0, "pool": 1}


def test_proc_readers_see_this_process_and_its_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        parents = pool.process_parents()
        assert parents[os.getpid()] == os.getppid() and parents[child.pid] == os.getpid()
        rss, anon = pool.process_memory(os.getpid())
        assert rss > 0 and 0 < anon <= rss
        sampler = pool.MemorySampler(0.5)
        sampler.add(os.getpid())
        sampler.sample()
        assert sampler.processes >= 2  # this process and its child
        (t, total, _), own = sampler.samples[-1], pool.process_memory(child.pid)[0]
        assert total >= rss + own - (1 << 20) and sampler.by_root[os.getpid()] == total
        window = sampler.window(t - 1.0, t + 1.0)
        assert window["rss_byte_seconds"] == pytest.approx(2.0 * total)
    finally:
        child.kill()
        child.wait()
    assert pool.process_memory(child.pid) == (0, 0)
