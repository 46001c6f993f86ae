"""bench/peers_bench.py: its options and its pure parts (texts, requests, the peers' settings, the rate
search, the figures). No server is started, nothing is measured."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.bench import load_bench

peers = load_bench("peers_bench")
rb = load_bench("runtime_bench")


def test_defaults_visit_kubeinfer_and_mlserver_twice_a_b_a() -> None:
    args = peers.parse_args([])
    assert args.order == list(peers.DEFAULT_ORDER)
    assert args.order[0] == args.order[-1] == "kubeinfer"
    assert args.order.count("mlserver") == 2 and "infinity" in args.order and "kubeinfer-fp32" in args.order
    assert Path(args.out) == peers.ROOT / "bench" / "results" / "peers.json"
    assert args.noisy is False


def test_unknown_server_in_order_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        peers.parse_args(["--order", "kubeinfer,triton"])
    assert "triton" in capsys.readouterr().err


def test_passages_reach_the_token_count_and_are_deterministic() -> None:
    sentences = ["one two three", "four five", "six"]
    words = lambda text: len(text.split())  # noqa: E731
    a = peers.make_passages(sentences, words, 20, seed=3)
    assert len(a) == 20 and all(words(p) >= peers.PASSAGE_TOKENS for p in a)
    assert a == peers.make_passages(sentences, words, 20, seed=3)
    assert a != peers.make_passages(sentences, words, 20, seed=4)
    with pytest.raises(ValueError, match="no sentences"):
        peers.make_passages([], words, 1, seed=0)


def test_request_bodies_and_answers() -> None:
    v2 = json.loads(peers.v2_body("héllo"))
    assert v2 == {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["héllo"]}]}
    assert json.loads(peers.openai_body("x")) == {"model": "minilm", "input": ["x"]}
    answer = {"outputs": [{"name": "embedding", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    assert peers.v2_embeddings(answer).tolist() == [[1.0, 2.0, 3.0]]
    openai = {"data": [{"index": 1, "embedding": [0, 1]}, {"index": 0, "embedding": [1, 0]}]}
    assert peers.openai_embeddings(openai).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    cos = peers.cosines(np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([[2.0, 0.0], [-1.0, -1.0]]))
    assert cos == pytest.approx([1.0, -1.0])


def test_mlserver_settings(tmp_path: Path) -> None:
    ports = {"http": 1001, "grpc": 1002, "metrics": 1003}
    folder = peers.mlserver_folder(tmp_path / "m", Path("/models/minilm"), ports, batch=16, delay=0.01)
    settings = json.loads((folder / "settings.json").read_text())
    assert (
        settings["http_port"] == 1001 and settings["grpc_port"] == 1002 and settings["metrics_port"] == 1003
    )
    model = json.loads((folder / "minilm" / "model-settings.json").read_text())
    assert model["implementation"] == "mlserver_minilm.MiniLM"
    assert model["max_batch_size"] == 16 and model["max_batch_time"] == 0.01
    assert model["parameters"]["uri"] == "/models/minilm"
    # the class it names is the file the benchmark ships
    assert (peers.ROOT / "bench" / "peers" / "mlserver_minilm.py").read_text().count("class MiniLM(") == 1


def test_infinity_command() -> None:
    cmd = peers.infinity_command(Path("/v"), Path("/models/minilm"), 8123, 32)
    assert cmd[:2] == ["/v/bin/infinity_emb", "v2"]
    flags = dict(zip(cmd[2::2], cmd[3::2], strict=True))
    assert flags["--model-id"] == "/models/minilm" and flags["--served-model-name"] == "minilm"
    assert flags["--engine"] == "torch" and flags["--device"] == "cpu"
    assert flags["--batch-size"] == "32" and flags["--port"] == "8123"


def _server(capacity: float) -> Any:
    """A fake server that meets the SLO below ``capacity`` req/s; records what it was asked."""
    asked: list[tuple[float, float]] = []

    async def measure(rate: float, seconds: float) -> dict[str, Any]:
        asked.append((rate, seconds))
        ok = rate < capacity
        return {
            "offered_rps": rate,
            "requests": 100.0,
            "ok": 100.0,
            "p50_seconds": 0.01,
            "p99_seconds": 0.05 if ok else 0.5,
        }

    measure.asked = asked  # type: ignore[attr-defined]
    return measure


def test_search_ramps_then_bisects() -> None:
    measure = _server(300.0)
    found = asyncio.run(peers.max_slo_rate(measure, 40.0, 6.0, refine=3, refine_seconds=10.0))
    rates = [r for r, _ in measure.asked]
    # ramp x1.4 from 40 until the first miss, then 3 bisections at 10 s
    ramp = [r for r, s in measure.asked if s == 6.0]
    assert ramp[0] == 40.0 and all(b == pytest.approx(a * peers.STEP) for a, b in itertools.pairwise(ramp))
    assert ramp[-1] >= 300.0 > ramp[-2]
    assert [s for _, s in measure.asked[len(ramp) :]] == [10.0] * 3
    assert found["max_slo_rps"] < 300.0 < found["first_miss_rps"]
    assert found["first_miss_rps"] / found["max_slo_rps"] < peers.STEP ** (1 / 4)
    assert len(found["points"]) == len(rates) and found["points"][0]["meets_slo"] is True


def test_search_halves_a_start_that_misses_and_reports_zero_when_nothing_passes() -> None:
    measure = _server(15.0)
    found = asyncio.run(peers.max_slo_rate(measure, 40.0, 1.0, refine=0, refine_seconds=1.0))
    assert [r for r, _ in measure.asked][:3] == [40.0, 20.0, 10.0]
    assert found["max_slo_rps"] == pytest.approx(14.0)  # 10 passed, 14 passed, 19.6 missed
    nothing = asyncio.run(peers.max_slo_rate(_server(0.0), 40.0, 1.0, refine=2, refine_seconds=1.0))
    assert nothing["max_slo_rps"] == 0.0 and len(nothing["points"]) == 7


def _visit(server: str, sentences: float, passages: float) -> dict[str, Any]:
    def found(rate: float) -> dict[str, Any]:
        point = {"offered_rps": rate, "meets_slo": True, "p50_seconds": 0.02, "p99_seconds": 0.08}
        return {"max_slo_rps": rate, "points": [point, {"offered_rps": rate * 1.2, "meets_slo": False}]}

    return {"server": server, "texts": {"sentences": found(sentences), "passages": found(passages)}}


def test_summary_takes_the_median_of_visits_and_states_the_targets() -> None:
    visits = [
        _visit("kubeinfer", 600, 120),
        _visit("mlserver", 300, 50),
        _visit("kubeinfer-fp32", 450, 80),
        _visit("infinity", 100, 20),
        _visit("mlserver", 200, 40),
        _visit("kubeinfer", 500, 100),
    ]
    summary = peers.summarize(visits)
    s = summary["sentences"]
    assert s["servers"]["kubeinfer"]["by_visit"] == [600, 500]
    assert s["servers"]["kubeinfer"]["max_slo_rps"] == 550
    assert s["servers"]["mlserver"]["max_slo_rps"] == 250
    assert s["servers"]["kubeinfer"]["at_max"]["offered_rps"] == 600
    ratio = s["ratios"]["kubeinfer_to_mlserver"]
    assert ratio["value"] == pytest.approx(2.2) and ratio["target"] == 4.0 and ratio["meets_target"] is False
    fp32 = s["ratios"]["kubeinfer_fp32_to_mlserver"]
    assert fp32["value"] == pytest.approx(1.8) and fp32["meets_target"] is True
    assert s["ratios"]["kubeinfer_to_infinity"]["meets_target"] is None
    assert summary["passages"]["ratios"]["kubeinfer_to_mlserver"]["value"] == pytest.approx(110 / 45)
    lines = peers.table(summary)
    assert any("kubeinfer_to_mlserver: x2.20 (target >= 4.0: not met)" in line for line in lines)


def test_summary_skips_a_ratio_whose_denominator_did_not_run_or_served_nothing() -> None:
    summary = peers.summarize([_visit("kubeinfer", 600, 100), _visit("mlserver", 0, 0)])
    assert "kubeinfer_to_mlserver" not in summary["sentences"]["ratios"]
    assert "kubeinfer_to_infinity" not in summary["sentences"]["ratios"]


def test_missing_peer_venv_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any) -> None:
    monkeypatch.setitem(peers.PEER_VENVS, "mlserver", tmp_path / "absent")
    assert peers.main(["--order", "kubeinfer,mlserver"]) == 1
    assert "make bench-peers" in capsys.readouterr().err


def test_summary_with_the_in_process_limit_gives_the_served_share_and_the_ceiling() -> None:
    limits = {"kubeinfer": {"sentences": {"rows_per_second": 640.0}, "passages": {"rows_per_second": 64.0}}}
    summary = peers.summarize([_visit("kubeinfer", 544, 48), _visit("mlserver", 320, 40)], limits)
    k = summary["sentences"]["servers"]["kubeinfer"]
    assert k["limit_rps"] == 640.0 and k["served_to_limit"] == pytest.approx(0.85)
    ratio = summary["sentences"]["ratios"]["kubeinfer_to_mlserver"]
    assert ratio["value"] == pytest.approx(1.7) and ratio["ceiling"] == pytest.approx(2.0)
    assert "limit_rps" not in summary["sentences"]["servers"]["mlserver"]
    assert any("x2.00 at its engine's in-process limit" in line for line in peers.table(summary))
