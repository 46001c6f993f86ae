"""bench/cache_bench.py: its options and its pure parts. No runtime is started, nothing is measured."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.support.bench import load_bench

cache_bench = load_bench("cache_bench")
quiet = load_bench("quiet")
rb = load_bench("runtime_bench")


@pytest.fixture(autouse=True)
def _private_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet, "LOCK_PATH", tmp_path / "bench.lock")


def test_defaults_fit_the_task() -> None:
    args = cache_bench.parse_args([])
    assert args.model == "minilm" and args.quantization == "int8-dynamic"
    assert args.repeat_share == 0.5 and args.hot_texts >= 1
    assert Path(args.out) == Path(rb.ROOT) / "bench" / "results" / "cache.json"
    assert args.noisy is False and args.settle_seconds == quiet.SETTLE_SECONDS
    # the sweep's share of the run time stays within the ~5 minutes the benchmark is sized for
    assert args.budget + args.refine_budget <= 200


def test_options_parse() -> None:
    args = cache_bench.parse_args(
        [
            "--model",
            "tiny",
            "--noisy",
            "--repeat-share",
            "0.25",
            "--out",
            "/tmp/x.json",
            "--lock-timeout",
            "0",
        ]
    )
    assert args.model == "tiny" and args.noisy and args.repeat_share == 0.25 and args.lock_timeout == 0
    assert cache_bench.stream_name(0.0) == "repeat_0"
    assert cache_bench.stream_name(args.repeat_share) == "repeat_25"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--repeat-share", "1"], "--repeat-share"),
        (["--repeat-share", "0"], "--repeat-share"),
        (["--hot-texts", "0"], "--hot-texts"),
        (["--cache-bytes", "10"], "--cache-bytes"),
        (["--rate-factor", "1"], "--rate-factor"),
        (["--start-rate", "0"], "--start-rate"),
        (["--latency-pairs", "0"], "--latency-pairs"),
        (["--model", "gpt"], "invalid choice"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        cache_bench.parse_args(argv)
    assert raised.value.code == 2
    assert words in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_busy_machine_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (1.75, 2.0, 2.1))

    def never(*_args: object) -> None:
        raise AssertionError("measured on a busy machine")

    monkeypatch.setattr(cache_bench, "measure", never)
    out = tmp_path / "cache.json"
    with pytest.raises(SystemExit) as raised:
        cache_bench.main(["--settle-seconds", "0", "--out", str(out)])
    assert raised.value.code == 2
    assert "1-minute load average 1.75" in capsys.readouterr().err
    assert not out.exists()


def test_a_noisy_run_writes_noisy_and_the_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (1.75, 2.0, 2.1))
    figures = {
        "hit_latency": {"hit": {"p50_seconds": 0.002}, "model": {"p50_seconds": 0.012}},
        "max_slo_rps": {"repeat_0": 100.0, "repeat_50": 180.0},
        "ratio_repeat_to_no_repeat": 1.8,
        "streams": {"repeat_50": {"hit_rate_at_max": 0.5}},
    }

    async def fake_measure(_args: object, _workdir: Path) -> dict[str, object]:
        return dict(figures)

    monkeypatch.setattr(cache_bench, "measure", fake_measure)
    out = tmp_path / "cache.json"
    assert cache_bench.main(["--noisy", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["noisy"] is True
    assert written["machine"]["loadavg_before"] == [1.75, 2.0, 2.1]
    assert {"cpu_model", "cpus", "loadavg_after", "lock"} <= set(written["machine"])
    assert written["ratio_repeat_to_no_repeat"] == 1.8


def test_texts_never_repeat_and_the_stream_repeats_its_share() -> None:
    texts = cache_bench.Texts(["a sentence", "another one"], seed=0)
    hot = [texts.fresh() for _ in range(4)]
    rng = np.random.default_rng(0)
    stream = cache_bench.stream_texts(texts, hot, 0.5, 4000, rng)
    repeats = [t for t in stream if t in hot]
    assert 0.45 < len(repeats) / len(stream) < 0.55
    fresh = [t for t in stream if t not in hot]
    assert len(set(fresh)) == len(fresh)  # a new text is new
    none = cache_bench.stream_texts(texts, hot, 0.0, 500, rng)
    assert not set(none) & set(stream) and len(set(none)) == 500


def test_a_point_has_a_body_for_every_arrival() -> None:
    for rate in (10.0, 97.3, 400.0):
        bound = cache_bench.arrivals_bound(rate, 4.0)
        gaps = np.random.default_rng(0).exponential(1.0 / rate, size=bound)
        assert (np.cumsum(gaps) < 4.0).sum() < bound


def test_cache_counts_and_hit_rate_from_metrics() -> None:
    text = (
        "# TYPE kubeinfer_cache_hits counter\n"
        'kubeinfer_cache_hits_total{model="minilm"} 30.0\n'
        'kubeinfer_cache_hits_created{model="minilm"} 1.7e9\n'
        'kubeinfer_cache_hits_total{model="other"} 999.0\n'
        "# TYPE kubeinfer_cache_misses counter\n"
        'kubeinfer_cache_misses_total{model="minilm"} 70.0\n'
    )
    counts = cache_bench.cache_counts(text)
    assert counts == {"hits": 30.0, "misses": 70.0, "evictions": 0.0}
    assert cache_bench.cache_counts(text, "other")["hits"] == 999.0
    later = {"hits": 80.0, "misses": 120.0, "evictions": 2.0}
    delta = cache_bench.cache_delta(counts, later)
    assert delta == {"hits": 50.0, "misses": 50.0, "evictions": 2.0, "hit_rate": 0.5}
    assert cache_bench.cache_delta(counts, counts)["hit_rate"] is None


def test_stream_figures() -> None:
    def point(rate: float, ok: bool, hits: float, misses: float, **extra: object) -> dict[str, object]:
        return {
            "offered_rps": rate,
            "meets_slo": ok,
            "p99_seconds": 0.05 if ok else 0.2,
            "cache": {"hits": hits, "misses": misses, "hit_rate": hits / (hits + misses)},
            **extra,
        }

    points = [point(50, True, 10, 40), point(65, True, 30, 30), point(84.5, False, 40, 40)]
    fig = cache_bench.stream_figures(points)
    assert fig["max_slo_rps"] == 65 and fig["bounded"] is True
    assert fig["hit_rate_at_max"] == 0.5 and fig["p99_seconds_at_max"] == 0.05
    assert fig["hit_rate_all_points"] == pytest.approx(80 / 190)
    refined = [*points, point(74.1, True, 20, 20, refinement=True)]
    assert cache_bench.stream_figures(refined)["max_slo_rps"] == 74.1
    unbounded = cache_bench.stream_figures(points[:2])
    assert unbounded["bounded"] is False and unbounded["max_slo_rps"] == 65


def test_the_runtime_config_turns_the_cache_on() -> None:
    args = cache_bench.parse_args(["--cache-bytes", "2048"])
    cfg = cache_bench.runtime_config(args, Path("/nonexistent"))
    assert cfg.cache.enabled and cfg.cache.max_bytes == 2048
    assert cfg.quantization.mode == "int8-dynamic" and cfg.device == "cpu"
    assert cfg.batching.max_queue_size == 4096
    assert cfg.batching.max_batch_size == type(cfg.batching)().max_batch_size  # default batching


def test_request_bodies_opt_out_with_the_cache_parameter() -> None:
    plain = json.loads(rb.request_body("hello"))
    opted_out = json.loads(rb.request_body("hello", {"cache": False}))
    assert "parameters" not in plain
    assert opted_out["parameters"] == {"cache": False}
    assert (
        opted_out["inputs"]
        == plain["inputs"]
        == [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hello"]}]
    )
