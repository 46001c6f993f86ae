"""A Hugging Face text embedder on the ONNX Runtime engine: exported at load, cached, checked against
the torch model, served with the same tokenization, pooling, token counts and metadata shape."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.dataplane import model_metadata_doc
from kubeinfer.runtime.models import REPORT_COSINE_MEAN, REPORT_RETRIEVAL_AGREEMENT, hf_onnx, load_model
from kubeinfer.runtime.models.base import TOKEN_COUNTS, QuantizationError
from kubeinfer.runtime.models.huggingface import read_calibration
from kubeinfer.runtime.models.quantize import QuantizationBelowGate

from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir

pytestmark = pytest.mark.timeout(300)

TEXTS = ["A man is playing a guitar.", "The new movie is awesome.", "word", ""]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_dir(tmp_path_factory.mktemp("tiny"))


def rows(texts: list[str]) -> dict[str, np.ndarray]:
    array = np.empty(len(texts), dtype=object)
    array[:] = [t.encode() for t in texts]
    return {"text": array}


def test_the_onnxruntime_engine_gives_the_torch_embeddings_and_caches_its_export(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBEINFER_CACHE_DIR", str(tmp_path / "cache"))
    torch_model = load_model(tiny_hf_config(tiny))
    ort_model = load_model(
        tiny_hf_config(tiny, model={"name": "tiny", "source": str(tiny), "engine": "onnxruntime"})
    )
    assert (
        getattr(ort_model, "engine", None) == "onnxruntime"
        and getattr(torch_model, "engine", None) == "torch"
    )
    exported = list((tmp_path / "cache").glob("*.onnx"))
    assert len(exported) == 1 and not list((tmp_path / "cache").glob("*.partial"))
    report = ort_model.report()
    assert report[REPORT_COSINE_MEAN] > 0.9999 and report[REPORT_RETRIEVAL_AGREEMENT] == 1.0
    meta = model_metadata_doc(ort_model)
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == model_metadata_doc(torch_model)["inputs"]
    assert meta["outputs"] == model_metadata_doc(torch_model)["outputs"]
    batch = [rows(TEXTS[:2]), rows(TEXTS[2:])]
    want = torch_model.execute(torch_model.preprocess(batch))
    got = ort_model.execute(ort_model.preprocess(batch))
    np.testing.assert_allclose(got["embedding"], want["embedding"], atol=1e-5)
    np.testing.assert_array_equal(got[TOKEN_COUNTS], want[TOKEN_COUNTS])
    assert ort_model.warmup(4, 1) >= 0 and ort_model.max_batch_size == 4
    # a second load reuses the export: same file, untouched
    mtime = os.stat(exported[0]).st_mtime_ns
    load_model(tiny_hf_config(tiny, model={"name": "tiny", "source": str(tiny), "engine": "onnxruntime"}))
    assert list((tmp_path / "cache").glob("*.onnx")) == exported and os.stat(exported[0]).st_mtime_ns == mtime


def test_what_the_engine_does_not_serve_yet_is_refused(tiny: Path) -> None:
    model = {"name": "tiny", "source": str(tiny), "engine": "onnxruntime"}
    with pytest.raises(QuantizationError, match="not supported on engine onnxruntime yet"):
        load_model(tiny_hf_config(tiny, model=model, quantization={"mode": "bf16"}))
    io = [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]
    with pytest.raises(ValueError, match=r"model\.engine onnxruntime does not run torchscript"):
        RuntimeConfig.model_validate(
            {
                "model": {
                    "format": "torchscript",
                    "engine": "onnxruntime",
                    "source": "/x",
                    "inputs": io,
                    "outputs": io,
                }
            }
        )
    with pytest.raises(ValueError, match=r"model\.engine torch does not run onnx"):
        RuntimeConfig.model_validate({"model": {"format": "onnx", "engine": "torch", "source": "/x"}})
    assert "engine" not in RuntimeConfig().to_yaml()  # unset: the file reads as before


def test_int8_dynamic_on_onnxruntime_quantizes_the_graph_and_reports_its_deviation(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBEINFER_CACHE_DIR", str(tmp_path / "cache"))
    model = {"name": "tiny", "source": str(tiny), "engine": "onnxruntime"}
    quantized = load_model(tiny_hf_config(tiny, model=model, quantization={"mode": "int8-dynamic"}))
    files = sorted(p.name for p in (tmp_path / "cache").glob("*.onnx"))
    assert len(files) == 2 and any("int8dyn-matmul-perchannel-7bit" in f for f in files)
    session_file = quantized.session._model_path  # type: ignore[attr-defined]
    assert "int8dyn" in str(session_file)
    report = quantized.report()
    # a random tiny BERT is no test of the recipe's quality (MiniLM's is in the module docstring):
    # the figures are measured and reported, not assumed
    assert 0.0 < report[REPORT_COSINE_MEAN] <= 1.0 and 0.0 <= report[REPORT_RETRIEVAL_AGREEMENT] <= 1.0
    out = quantized.execute(quantized.preprocess([rows(TEXTS)]))
    assert out["embedding"].shape == (len(TEXTS), 32)
    np.testing.assert_allclose(np.linalg.norm(out["embedding"], axis=1), 1.0, atol=1e-5)


def test_int8_static_on_onnxruntime_calibrates_on_the_texts_and_keeps_the_outlier_matmuls_float(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnx

    monkeypatch.setenv("KUBEINFER_CACHE_DIR", str(tmp_path / "cache"))
    model = {"name": "tiny", "source": str(tiny), "engine": "onnxruntime"}
    quantized = load_model(
        tiny_hf_config(tiny, model=model, quantization={"mode": "int8-static", "calibration_path": "default"})
    )
    session_file = Path(quantized.session._model_path)  # type: ignore[attr-defined]
    texts = read_calibration("default")
    key = hf_onnx.calibration_key(texts, quantized.max_sequence_length)  # type: ignore[attr-defined]
    assert session_file.name.endswith(f"{hf_onnx.INT8_STATIC_RECIPE}-{key}.onnx")
    assert key != hf_onnx.calibration_key(texts, 128)  # a truncation length of its own, another graph
    fp32 = next(p for p in (tmp_path / "cache").glob("*.onnx") if hf_onnx.INT8_STATIC_RECIPE not in p.name)
    kept = hf_onnx.float_kept_matmuls(onnx.load(str(fp32)).graph)
    graph = onnx.load(str(session_file)).graph
    ops = [n.op_type for n in graph.node]
    # tiny BERT, 2 layers: Q, K, V, attention output, FFN up quantized; scores, context, FFN down float
    assert ops.count("QLinearMatMul") == 2 * 5 and ops.count("MatMul") == len(kept) == 2 * 3
    assert sorted(n.name for n in graph.node if n.op_type == "MatMul") == sorted(kept)
    report = quantized.report()
    assert 0.0 < report[REPORT_COSINE_MEAN] < 1.0 and 0.0 <= report[REPORT_RETRIEVAL_AGREEMENT] <= 1.0
    out = quantized.execute(quantized.preprocess([rows(TEXTS)]))
    np.testing.assert_allclose(np.linalg.norm(out["embedding"], axis=1), 1.0, atol=1e-5)
    # other calibration texts make another graph; the same texts reuse it
    other = tmp_path / "calibration.txt"
    other.write_text("\n".join(f"calibration sentence number {i}" for i in range(40)))
    again = load_model(
        tiny_hf_config(
            tiny, model=model, quantization={"mode": "int8-static", "calibration_path": str(other)}
        )
    )
    assert Path(again.session._model_path) != session_file  # type: ignore[attr-defined]
    assert len(list((tmp_path / "cache").glob(f"*{hf_onnx.INT8_STATIC_RECIPE}*.onnx"))) == 2


def test_float_kept_matmuls_are_those_without_a_weight_and_the_down_projections() -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def weight(name: str, rows: int, cols: int) -> onnx.TensorProto:
        return numpy_helper.from_array(np.zeros((rows, cols), np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "up"], ["h"], name="up"),  # [4, 16]: quantized
        helper.make_node("MatMul", ["h", "down"], ["y"], name="down"),  # [16, 4]: float
        helper.make_node("MatMul", ["y", "square"], ["z"], name="square"),  # [4, 4]: quantized
        helper.make_node("MatMul", ["z", "zt"], ["scores"], name="scores"),  # two activations: float
        helper.make_node("Add", ["scores", "scores"], ["out"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=[weight("up", 4, 16), weight("down", 16, 4), weight("square", 4, 4)],
    )
    assert hf_onnx.float_kept_matmuls(graph) == ["down", "scores"]


def test_a_calibration_file_that_is_not_utf8_is_refused_naming_the_field(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café au lait\n".encode("latin-1") * 20)
    with pytest.raises(QuantizationError, match=r"quantization\.calibration_path .*latin1\.txt: not UTF-8"):
        read_calibration(str(latin1))
    with pytest.raises(FileNotFoundError, match=r"quantization\.calibration_path: a directory, not a file"):
        read_calibration(str(tmp_path))
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\t\n" * 20)
    with pytest.raises(QuantizationError, match=r"calibration_path .*: 0 samples; need at least 10"):
        read_calibration(str(blank))


@pytest.mark.parametrize(
    "quantization", [{"mode": "none"}, {"mode": "int8-static", "calibration_path": "default"}]
)
def test_a_truncated_or_empty_cached_graph_is_made_again(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quantization: dict[str, str]
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("KUBEINFER_CACHE_DIR", str(cache))
    config = tiny_hf_config(
        tiny, model={"name": "tiny", "source": str(tiny), "engine": "onnxruntime"}, quantization=quantization
    )
    first = load_model(config)
    want = first.execute(first.preprocess([rows(TEXTS)]))["embedding"]
    files = sorted(cache.glob("*.onnx"))
    for cut in files:  # a copy cut short, a full disk: each cached graph in turn
        cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
        again = load_model(config)
        np.testing.assert_allclose(
            again.execute(again.preprocess([rows(TEXTS)]))["embedding"], want, atol=1e-5
        )
        cut.write_bytes(b"")
        load_model(config)
    assert sorted(cache.glob("*.onnx")) == files and not list(cache.glob("*.partial"))


def test_a_cached_graph_that_does_not_load_and_cannot_be_removed_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = tmp_path / "m.onnx"
    graph.write_bytes(b"not a graph")

    def refuse(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", refuse)  # a read-only cache directory (chmod does not stop root)
    with pytest.raises(ValueError, match=r"the cached graph .*m\.onnx does not load .*delete it"):
        hf_onnx._cached_session(graph, lambda: None)


def test_a_graph_that_cannot_be_written_is_refused_naming_the_file_and_the_cache_setting(
    tmp_path: Path,
) -> None:
    def read_only() -> None:
        raise PermissionError(13, "Permission denied", str(tmp_path / "m.123.partial"))

    with pytest.raises(ValueError, match=r"cannot write its graph .*m\.onnx .*KUBEINFER_CACHE_DIR"):
        hf_onnx._cached_session(tmp_path / "m.onnx", read_only)


def test_a_start_that_finds_the_graph_and_its_comparison_cached_loads_no_torch_model(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers
    from kubeinfer.runtime.models import REPORT_RETRIEVAL_AGREEMENT_ALL

    cache = tmp_path / "cache"
    monkeypatch.setenv("KUBEINFER_CACHE_DIR", str(cache))
    model = {"name": "tiny", "source": str(tiny), "engine": "onnxruntime"}
    cfg = tiny_hf_config(tiny, model=model, quantization={"mode": "int8-dynamic"})
    first = load_model(cfg)
    (kept,) = cache.glob("*.compare-*.json")
    assert first.graph_cache == "miss" and kept.name.startswith(Path(first.session._model_path).stem)  # type: ignore[attr-defined]

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the torch model was loaded")

    with monkeypatch.context() as patched:
        patched.setattr(transformers.AutoModel, "from_pretrained", refuse)
        second = load_model(cfg)
        assert second.graph_cache == "hit" and second.module is None  # type: ignore[attr-defined]
        figures = (REPORT_COSINE_MEAN, REPORT_RETRIEVAL_AGREEMENT, REPORT_RETRIEVAL_AGREEMENT_ALL)
        assert [second.report()[k] for k in figures] == [first.report()[k] for k in figures]
        batch = [rows(TEXTS)]
        want, got = first.execute(first.preprocess(batch)), second.execute(second.preprocess(batch))
        np.testing.assert_array_equal(got["embedding"], want["embedding"])
        np.testing.assert_array_equal(got[TOKEN_COUNTS], want[TOKEN_COUNTS])
        assert model_metadata_doc(second) == model_metadata_doc(first)
        # the quality gate judges the kept figures: a bar they do not reach refuses the cached start too
        gated = tiny_hf_config(
            tiny, model=model, quantization={"mode": "int8-dynamic", "gate": {"min_cosine": 1.0}}
        )
        with pytest.raises(QuantizationBelowGate, match="min_cosine"):
            load_model(gated)
        # other texts (a gate's own) are compared again: the torch model is needed
        texts = tmp_path / "gate.txt"
        texts.write_text("\n".join(f"gate text number {i}" for i in range(12)))
        own = tiny_hf_config(
            tiny, model=model, quantization={"mode": "int8-dynamic", "gate": {"texts_path": str(texts)}}
        )
        with pytest.raises(AssertionError, match="the torch model was loaded"):
            load_model(own)
    # a kept comparison that does not read is made again, and kept again
    kept.write_text("{")
    again = load_model(cfg)
    assert again.module is not None and again.graph_cache == "hit"  # type: ignore[attr-defined]
    assert again.report()[REPORT_COSINE_MEAN] == first.report()[REPORT_COSINE_MEAN]
    assert json.loads(kept.read_text())[REPORT_COSINE_MEAN] == first.report()[REPORT_COSINE_MEAN]


def test_a_comparison_is_kept_per_texts_onnxruntime_and_cpu(tmp_path: Path) -> None:
    graph = tmp_path / "m-0123-int8dyn.onnx"
    one = hf_onnx.comparison_path(graph, ["a", "b"], flags="avx2 fma")
    assert one.parent == tmp_path and one.name.startswith("m-0123-int8dyn.compare-")
    assert one == hf_onnx.comparison_path(graph, ["a", "b"], flags="avx2 fma")
    assert one != hf_onnx.comparison_path(graph, ["a", "c"], flags="avx2 fma")
    assert one != hf_onnx.comparison_path(graph, ["a", "b"], flags="avx2 avx512_vnni fma")
    cpuinfo = "processor\t: 0\nflags\t\t: sse avx2 fma\nprocessor\t: 1\nflags\t\t: sse avx2 fma\n"
    assert hf_onnx.cpu_flags(cpuinfo) == "avx2 fma sse" and hf_onnx.cpu_flags("") == ""
    hf_onnx.write_comparison(one, {"x": 0.5, "y": 1.0})
    assert hf_onnx.read_comparison(one, ["x", "y"]) == {"x": 0.5, "y": 1.0}
    assert hf_onnx.read_comparison(one, ["x", "z"]) is None  # a figure missing: compared again
    assert hf_onnx.read_comparison(tmp_path / "absent.json", ["x"]) is None
    assert not list(tmp_path.glob("*.partial"))
