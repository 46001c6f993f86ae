"""A Hugging Face text embedder on the ONNX Runtime engine: exported at load, cached, checked against
the torch model, served with the same tokenization, pooling, token counts and metadata shape."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.dataplane import model_metadata_doc
from kubeinfer.runtime.models import REPORT_COSINE_MEAN, REPORT_RETRIEVAL_AGREEMENT, load_model
from kubeinfer.runtime.models.base import TOKEN_COUNTS
from kubeinfer.runtime.models.quantize import QuantizationError

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
