"""bench/peers_bench.py: its options and its pure parts (texts, requests, the peers' settings, the rate
search, the figures). No server is started, nothing is measured."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.bench import load_bench

peers = load_bench("peers_bench")
rb = load_bench("runtime_bench")


def test_defaults_visit_kubeinfer_first_and_last_and_every_peer() -> None:
    args = peers.parse_args([])
    assert args.order == list(peers.DEFAULT_ORDER)
    assert args.order[0] == args.order[-1] == "kubeinfer"
    assert set(peers.PEERS) <= set(args.order) and "kubeinfer-torch" in args.order
    assert (args.step_seconds, args.refine, args.texts, args.limit_repeats) == (6.0, 3, 512, 15)
    assert Path(args.out) == peers.ROOT / "bench" / "results" / "peers.json"
    assert args.noisy is False and args.quick is False


def test_quick_visits_every_server_once_with_tiny_durations_unless_told_otherwise() -> None:
    args = peers.parse_args(["--quick"])
    assert args.order == list(peers.QUICK_ORDER) and len(set(args.order)) == len(args.order)
    assert set(peers.PEERS) <= set(args.order)
    assert (args.step_seconds, args.refine, args.texts, args.limit_repeats) == (2.0, 0, 64, 0)
    told = peers.parse_args(["--quick", "--step-seconds", "4", "--order", "kubeinfer,litserve-onnx"])
    assert told.step_seconds == 4.0 and told.order == ["kubeinfer", "litserve-onnx"] and told.refine == 0


def test_pairs_match_precision_and_every_server_has_a_kubeinfer_reference() -> None:
    for _, kube, pair_peers in peers.PAIRS:
        engine, mode, _, instances = peers.KUBEINFER[kube]
        want = "onnxruntime" if mode == "int8-dynamic" else "torch"
        # each pair's kubeinfer runs as the operator configures a CPU replica of this machine
        assert engine == want and instances is None and all(peers.PEERS[p].engine == want for p in pair_peers)
        assert all(peers.KUBEINFER_REFERENCE[p] == kube for p in pair_peers)
    assert set(peers.KUBEINFER_REFERENCE) == set(peers.SERVERS)
    # one instance of the int8 graph: compared with the default and with each int8 peer
    assert peers.instances_of("kubeinfer-1instance") == 1
    one = {(num, den) for _, num, den in peers.RATIOS if "kubeinfer-1instance" in (num, den)}
    assert one == {("kubeinfer", "kubeinfer-1instance")} | {
        ("kubeinfer-1instance", p) for p in ("mlserver-onnx", "litserve-onnx")
    }


def test_the_default_configuration_has_the_operators_instances_for_a_cpu_replica_of_this_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kubeinfer.runtime.models import device

    for cpus, want in ((1, 1), (2, 2), (8, 2)):
        monkeypatch.setattr(device, "available_cpus", lambda cpus=cpus: cpus)
        assert peers.instances_of("kubeinfer") == want and peers.instances_of("kubeinfer-torch") == want


def test_peer_settings_cover_the_documented_knobs() -> None:
    for name, peer in peers.PEERS.items():
        settings = peers.peer_settings(name, threads=1)
        assert len(settings) >= 2 and len({json.dumps(s, sort_keys=True) for s in settings}) == len(settings)
        if peer.engine == "onnxruntime":  # the same intra-op threads as kubeinfer
            assert {s["threads"] for s in settings} == {1}
        else:
            assert {s["threads"] for s in settings} == {1, None}
    mlserver = peers.peer_settings("mlserver-onnx", 1)
    assert {s["parallel_workers"] for s in mlserver} == {0, 1, 2}
    assert len({(s["max_batch_size"], s["max_batch_time"]) for s in mlserver}) >= 3
    litserve = peers.peer_settings("litserve-onnx", 1)
    assert {s["workers_per_device"] for s in litserve} == {1, 2}
    assert len({(s["max_batch_size"], s["batch_timeout"]) for s in litserve}) >= 3
    assert {s["batch_size"] for s in peers.peer_settings("infinity-torch", 1)} == {8, 32}
    with pytest.raises(KeyError):
        peers.peer_settings("triton", 1)


def test_best_settings_per_kind_first_of_equals_failed_starts_skipped() -> None:
    def tried(sentences: float, passages: float) -> dict[str, Any]:
        return {"texts": {"sentences": {"max_slo_rps": sentences}, "passages": {"max_slo_rps": passages}}}

    runs = [tried(100, 20), {"setting": {}, "error": "exited"}, tried(300, 10), tried(300, 30)]
    assert peers.best_settings(runs) == {"sentences": 2, "passages": 3}
    assert peers.best_settings([{"error": "exited"}]) == {}


def test_contenders_add_the_runner_up_when_the_probe_cannot_tell_them_apart() -> None:
    def tried(sentences: float, passages: float) -> dict[str, Any]:
        return {"texts": {"sentences": {"max_slo_rps": sentences}, "passages": {"max_slo_rps": passages}}}

    # sentences: 105 and 103 within a ramp step of each other, 50 not; passages: 30 alone (20 * 1.4 < 30)
    runs = [tried(103, 20), {"setting": {}, "error": "exited"}, tried(105, 30), tried(50, 10)]
    assert peers.contenders(runs) == {"sentences": [2, 0], "passages": [2]}
    assert peers.best_settings(runs) == {"sentences": 2, "passages": 2}
    # exactly one step apart still contends; nothing served: the first setting alone
    assert peers.contenders([tried(100, 0), tried(100 * peers.STEP, 0)])["sentences"] == [1, 0]
    assert peers.contenders([tried(0, 0), tried(0, 0)]) == {"sentences": [0], "passages": [0]}


def test_same_model_check_against_kubeinfer_answers() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    off = np.array([[1.0, 0.0], [0.1, 1.0]], dtype=np.float32)
    check = peers.same_model_check({"sentences": a}, {"sentences": a}, {"sentences": off})
    s = check["sentences"]
    assert s["cosine_min"] == pytest.approx(1.0) and s["texts"] == 2
    assert (
        s["cosine_min_to_kubeinfer"] == pytest.approx(1 / np.sqrt(1.01)) and s["same_as_kubeinfer"] is False
    )
    assert peers.same_model_check({"sentences": a}, {"sentences": a}, {"sentences": a})["sentences"][
        "same_as_kubeinfer"
    ]
    assert (
        "same_as_kubeinfer" not in peers.same_model_check({"sentences": a}, {"sentences": a}, {})["sentences"]
    )


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
    setting = {"parallel_workers": 0, "max_batch_size": 16, "max_batch_time": 0.01, "threads": 1}
    model_dir, graph = Path("/models/minilm"), Path("/cache/minilm-int8.onnx")
    folder = peers.mlserver_folder(tmp_path / "t", ports, "torch", model_dir, graph, setting)
    settings = json.loads((folder / "settings.json").read_text())
    assert (
        settings["http_port"] == 1001 and settings["grpc_port"] == 1002 and settings["metrics_port"] == 1003
    )
    assert settings["parallel_workers"] == 0
    model = json.loads((folder / "minilm" / "model-settings.json").read_text())
    assert model["implementation"] == "mlserver_minilm.MiniLM"
    assert model["max_batch_size"] == 16 and model["max_batch_time"] == 0.01
    assert model["parameters"] == {"uri": "/models/minilm"}
    onnx = peers.mlserver_folder(
        tmp_path / "o", ports, "onnxruntime", model_dir, graph, {**setting, "threads": 3}
    )
    model = json.loads((onnx / "minilm" / "model-settings.json").read_text())
    assert model["implementation"] == "mlserver_onnx.MiniLMOnnx"
    assert model["parameters"] == {
        "uri": "/cache/minilm-int8.onnx", "extra": {"tokenizer": "/models/minilm", "threads": 3},
    }  # fmt: skip
    # the classes they name are the files the benchmark ships
    folder_of = peers.ROOT / "bench" / "peers"
    assert (folder_of / "mlserver_minilm.py").read_text().count("class MiniLM(") == 1
    assert (folder_of / "mlserver_onnx.py").read_text().count("class MiniLMOnnx(") == 1


def test_litserve_command() -> None:
    setting = {"workers_per_device": 2, "max_batch_size": 32, "batch_timeout": 0.005, "threads": 1}
    cmd = peers.litserve_command(Path("/v"), Path("/g.onnx"), Path("/models/minilm"), 8123, setting)
    assert cmd[:2] == ["/v/bin/python", str(peers.ROOT / "bench" / "peers" / "litserve_onnx.py")]
    flags = dict(zip(cmd[2::2], cmd[3::2], strict=True))
    assert flags == {
        "--graph": "/g.onnx", "--tokenizer": "/models/minilm", "--threads": "1", "--port": "8123",
        "--max-batch-size": "32", "--batch-timeout": "0.005", "--workers-per-device": "2",
    }  # fmt: skip
    assert peers.torch_threads_env(None) == {}
    assert peers.torch_threads_env(1)["OMP_NUM_THREADS"] == "1"


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


def _visit(server: str, sentences: float, passages: float, setting: Any = None) -> dict[str, Any]:
    def found(rate: float) -> dict[str, Any]:
        point = {"offered_rps": rate, "meets_slo": True, "p50_seconds": 0.02, "p99_seconds": 0.08}
        miss = {"offered_rps": rate * 1.2, "meets_slo": False, "p99_seconds": 0.3}
        return {"max_slo_rps": rate, "points": [miss, point]}

    texts = {"sentences": found(sentences), "passages": found(passages)}
    return {"server": server, "setting": setting, "texts": texts}


def test_summary_takes_the_median_of_visits_and_the_best_peer_of_each_pair() -> None:
    visits = [
        _visit("kubeinfer", 600, 120),
        _visit("mlserver-onnx", 300, 50, {"parallel_workers": 0}),
        _visit("litserve-onnx", 400, 40, {"workers_per_device": 1}),
        _visit("kubeinfer-torch", 250, 30),
        _visit("mlserver-torch", 200, 20),
        _visit("kubeinfer", 500, 100),
    ]
    summary = peers.summarize(visits)
    s = summary["sentences"]
    k = s["servers"]["kubeinfer"]
    assert k["by_visit"] == [600, 500] and k["max_slo_rps"] == 550
    assert k["at_max"]["offered_rps"] == 600 and "settings" not in k
    # every rate offered, in order, with its P99: the tail beside the peers'
    assert k["p99_by_rate"] == [
        [500, 0.08, True],
        [600, 0.08, True],
        [600.0, 0.3, False],
        [720.0, 0.3, False],
    ]
    assert s["servers"]["mlserver-onnx"]["settings"] == [{"parallel_workers": 0}]
    assert s["ratios"]["kubeinfer_to_mlserver_onnx"]["value"] == pytest.approx(550 / 300)
    assert s["ratios"]["kubeinfer_to_litserve_onnx"]["value"] == pytest.approx(550 / 400)
    assert s["pairs"]["int8"] == {"kubeinfer": "kubeinfer", "best_peer": "litserve-onnx", "value": 550 / 400}
    assert s["pairs"]["torch_fp32"]["best_peer"] == "mlserver-torch"
    assert s["pairs"]["torch_fp32"]["value"] == pytest.approx(1.25)
    assert "kubeinfer_torch_to_infinity_torch" not in s["ratios"]
    p = summary["passages"]
    assert p["pairs"]["int8"]["best_peer"] == "mlserver-onnx" and p["pairs"]["int8"][
        "value"
    ] == pytest.approx(2.2)
    lines = peers.table(summary)
    assert any("pair int8: kubeinfer / litserve-onnx (best peer) x1.38" in line for line in lines)
    assert any("P99 ms by rate: 500:80, 600:80, 600:300, 720:300" in line for line in lines)


def test_a_peer_visited_with_two_settings_counts_the_better_settings_median() -> None:
    a, b = {"parallel_workers": 1}, {"parallel_workers": 2}
    visits = [
        _visit("kubeinfer", 500, 100),
        _visit("mlserver-torch", 70, 9, a),
        _visit("mlserver-torch", 104, 8, b),
        _visit("mlserver-torch", 96, 8, b),
        _visit("kubeinfer", 520, 100),
    ]
    summary = peers.summarize(visits)
    m = summary["sentences"]["servers"]["mlserver-torch"]
    assert m["by_visit"] == [70, 104, 96] and m["by_setting"] == [[a, 70], [b, 100]]
    assert m["setting"] == b and m["max_slo_rps"] == 100 and m["settings"] == [a, b, b]
    assert summary["passages"]["servers"]["mlserver-torch"]["setting"] == a
    assert summary["sentences"]["servers"]["kubeinfer"]["setting"] is None
    lines = peers.table(summary)
    shown = "setting {'parallel_workers': 2} (also 70/s with {'parallel_workers': 1})"
    assert any(line.strip() == shown for line in lines)


def test_summary_skips_a_ratio_and_a_pair_whose_peers_did_not_run_or_served_nothing() -> None:
    summary = peers.summarize([_visit("kubeinfer", 600, 100), _visit("mlserver-onnx", 0, 0)])
    assert "kubeinfer_to_mlserver_onnx" not in summary["sentences"]["ratios"]
    assert "kubeinfer_to_litserve_onnx" not in summary["sentences"]["ratios"]
    assert summary["sentences"]["pairs"] == {}


def test_missing_peer_venv_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any) -> None:
    monkeypatch.setitem(peers.PEER_VENVS, "mlserver", tmp_path / "absent")
    assert peers.main(["--order", "kubeinfer,mlserver-onnx"]) == 1
    assert "make bench-peers" in capsys.readouterr().err


def test_summary_with_the_in_process_limit_gives_the_served_share_and_the_ceiling() -> None:
    limits = {"kubeinfer": {"sentences": {"rows_per_second": 640.0}, "passages": {"rows_per_second": 64.0}}}
    summary = peers.summarize([_visit("kubeinfer", 544, 48), _visit("mlserver-onnx", 320, 40)], limits)
    k = summary["sentences"]["servers"]["kubeinfer"]
    assert k["limit_rps"] == 640.0 and k["served_to_limit"] == pytest.approx(0.85)
    ratio = summary["sentences"]["ratios"]["kubeinfer_to_mlserver_onnx"]
    assert ratio["value"] == pytest.approx(1.7) and ratio["ceiling"] == pytest.approx(2.0)
    assert "limit_rps" not in summary["sentences"]["servers"]["mlserver-onnx"]
    assert any("x2.00 at its engine's in-process limit" in line for line in peers.table(summary))


class _CountingModel:
    """A model whose batch waits until ``instances`` batches run at once (at most 2 s: an engine's run
    releases the GIL), counting the rows and the most batches seen running together."""

    def __init__(self, instances: int) -> None:
        import threading

        self.rows = self.running = self.most = 0
        self.lock = threading.Lock()
        self.together = threading.Barrier(instances)

    def preprocess(self, requests: list[dict[str, Any]]) -> list[Any]:
        return [r["text"] for r in requests]

    def execute(self, batch: list[Any]) -> None:
        import threading

        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        with contextlib.suppress(threading.BrokenBarrierError):
            self.together.wait(timeout=2.0)  # the last batches may have no partner
        with self.lock:
            self.running -= 1
            self.rows += sum(len(b) for b in batch)


@pytest.mark.parametrize("instances", [1, 2])
def test_instances_rate_runs_every_batch_once_with_that_many_at_once(instances: int) -> None:
    batches = [np.array([b"x"] * 4, dtype=object) for _ in range(10)]
    model = _CountingModel(instances)
    rate = peers._instances_rate(model, batches, 1, instances)
    assert model.rows == 40 and model.most == instances and rate > 0
