"""bench/token_budget.py: its options and its pure parts. No runtime is started, nothing is measured."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.support.bench import load_bench

token_budget = load_bench("token_budget")
quiet = load_bench("quiet")
rb = load_bench("runtime_bench")


@pytest.fixture(autouse=True)
def _private_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet, "LOCK_PATH", tmp_path / "bench.lock")


def test_defaults_fit_the_task() -> None:
    args = token_budget.parse_args([])
    assert args.model == "minilm" and args.quantization == "int8-dynamic"
    assert args.overflow == ["chunk", "truncate"] and args.budgets[0] is None and len(args.budgets) > 1
    assert args.long_share == 0.05 and args.long_chars == 10_000 and args.repeats >= 3
    assert Path(args.out) == Path(rb.ROOT) / "bench" / "results" / "token_budget.json"
    assert args.noisy is False and args.instances == [1]
    # load per mode: repeats x budgets x seconds, within the ~5 minutes a mode is sized for
    assert args.repeats * len(args.budgets) * args.seconds <= 300


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--budgets", "off,0"], "--budgets: 0: a token budget is at least 1"),
        (["--budgets", "off,off"], "--budgets: off given twice"),
        (["--budgets", "lots"], "--budgets: 'lots' is neither 'off' nor a token count"),
        (["--overflow", "refuse"], "--overflow: refuse"),
        (["--long-share", "1"], "--long-share"),
        (["--repeats", "0"], "--repeats"),
        (["--seconds", "0"], "--seconds"),
        (["--instances", "0"], "--instances: at least 1 each"),
        (["--instances", "two"], "--instances: whole numbers"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        token_budget.parse_args(argv)
    assert raised.value.code == 2
    assert words in capsys.readouterr().err.strip().splitlines()[-1]


def test_each_instance_count_is_a_runtime_of_its_own_keyed_by_mode_and_count(tmp_path: Path) -> None:
    args = token_budget.parse_args(["--model", "tiny", "--instances", "1,2"])
    assert args.instances == [1, 2]
    assert [token_budget.mode_name("chunk", n) for n in args.instances] == ["chunk", "chunk, 2 instances"]
    (tmp_path / "tiny").mkdir()  # the tiny model's directory exists: nothing is written
    assert token_budget.runtime_config(args, "chunk", tmp_path, 2).instances == 2
    assert token_budget.runtime_config(args, "chunk", tmp_path).instances == 1


def test_every_budget_of_a_repeat_gets_the_same_requests() -> None:
    sentences = ["a short one", "another short sentence", "a third"]
    args = token_budget.parse_args(["--rate", "40", "--seconds", "10", "--long-chars", "500"])
    bodies, long = token_budget.point_requests(sentences, args, seed=7)
    again, long_again = token_budget.point_requests(sentences, args, seed=7)
    assert bodies == again and long == long_again
    assert len(bodies) == token_budget.arrivals_bound(40, 10) and 0.02 < sum(long) / len(long) < 0.09
    texts = [json.loads(b)["inputs"][0]["data"][0] for b in bodies]
    assert all(len(t) == 500 for t, is_long in zip(texts, long, strict=True) if is_long)
    assert len({t for t, is_long in zip(texts, long, strict=True) if is_long}) == sum(long)  # each its own
    assert token_budget.point_requests(sentences, args, seed=8)[1] != long


def test_short_and_long_latencies_are_told_apart() -> None:
    long = [False, True, False, False, True]
    point = {"requests": 5.0, "latency_by_request": [[0, 0.01], [1, 0.5], [2, 0.03], [4, 0.7]]}
    split = token_budget.split_latencies(point, long)
    assert split["short"]["requests"] == 3 and split["short"]["errors"] == 1  # request 3 unanswered
    assert split["short"]["max_seconds"] == 0.03 and split["long"]["p50_seconds"] == pytest.approx(0.6)
    assert token_budget.split_latencies({"requests": 1.0, "latency_by_request": []}, [True])["long"] == {
        "requests": 1.0,
        "ok": 0.0,
        "errors": 1.0,
        "p50_seconds": None,
        "p99_seconds": None,
        "max_seconds": None,
    }


def test_medians_over_repeats_and_the_ratio_to_off() -> None:
    def point(short_p99: float, long_p50: float | None) -> dict[str, object]:
        return {
            "short": {"p50_seconds": 0.01, "p99_seconds": short_p99, "max_seconds": 0.2, "errors": 0.0},
            "long": {"p50_seconds": long_p50, "p99_seconds": None, "max_seconds": None, "errors": 0.0},
            "server": {"batch_size_mean": 4.0, "compute_duration_seconds_mean": 0.01},
        }

    summary = token_budget.summarize(
        {
            "off": [point(0.3, 0.5), point(0.1, 0.4), point(0.2, None)],
            "1024": [point(0.05, 0.6), point(0.04, 0.7), point(0.06, 0.5)],
        }
    )
    assert summary["budgets"]["off"]["median"]["short"]["p99_seconds"] == 0.2
    assert summary["budgets"]["off"]["median"]["long"]["p50_seconds"] == pytest.approx(0.45)
    assert summary["budgets"]["off"]["median"]["long"]["max_seconds"] is None
    assert summary["short_p99_ratio_to_off"] == {"off": 1.0, "1024": pytest.approx(0.25)}
    assert token_budget.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]


def test_a_noisy_run_writes_noisy_the_command_and_the_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (1.75, 2.0, 2.1))
    median = {
        "short": {"p50_seconds": 0.01, "p99_seconds": 0.05, "max_seconds": 0.1, "errors": 0.0},
        "long": {"p50_seconds": 0.3, "p99_seconds": 0.4, "max_seconds": 0.4, "errors": 0.0},
        "server": {"batch_size_mean": 3.0, "compute_duration_seconds_mean": 0.01},
    }

    async def fake_measure(_args: object, _workdir: Path) -> dict[str, object]:
        return {
            "by_overflow": {
                "chunk": {"budgets": {"off": {"median": median}}, "short_p99_ratio_to_off": {"off": 1.0}}
            }
        }

    monkeypatch.setattr(token_budget, "measure", fake_measure)
    out = tmp_path / "token_budget.json"
    assert token_budget.main(["--noisy", "--seconds", "5", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["noisy"] is True and written["machine"]["loadavg_before"] == [1.75, 2.0, 2.1]
    assert written["command"] == ["bench/token_budget.py", "--noisy", "--seconds", "5", "--out", str(out)]


def test_a_point_has_a_body_for_every_arrival() -> None:
    for rate in (5.0, 25.0, 97.3):
        bound = token_budget.arrivals_bound(rate, 15.0)
        gaps = np.random.default_rng(0).exponential(1.0 / rate, size=bound)
        assert (np.cumsum(gaps) < 15.0).sum() < bound
