"""Hugging Face tasks on the ONNX Runtime engine (tiny seeded models): a text classifier, a cross-encoder
reranker and a token classifier exported at load, cached, checked against the torch model; the same
labels, scores and entities as torch (only the forward pass moves), the same v2 tensors, batching
across requests as each request alone, and int8-dynamic's deviation report against torch fp32."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubeinfer.runtime.dataplane import model_metadata_doc
from kubeinfer.runtime.models import (
    REPORT_LABEL_AGREEMENT,
    REPORT_SCORE_DEVIATION_MAX,
    REPORT_SCORE_DEVIATION_MEAN,
    ServableModel,
    hf_onnx,
    load_model,
)
from kubeinfer.runtime.models.base import TOKEN_COUNTS, QuantizationError
from kubeinfer.runtime.models.hf_tasks import CrossEncoderModel, TextClassifierModel, TokenClassifierModel
from kubeinfer.runtime.models.quantize import compare_scores

from hack.devtools.runtime_tiny import (
    tiny_hf_classifier,
    tiny_hf_config,
    tiny_hf_cross_encoder,
    tiny_hf_token_classifier,
)
from tests.unit.runtime.runtime_fakes import texts

pytestmark = pytest.mark.timeout(300)

TASKS = ("text-classification", "reranking", "token-classification")
TEXTS = [
    "I love this film, it is wonderful.",
    "The service was terrible and slow.",
    "",
    "héllo wörld ✓ Paris and Berlin",
    "one two three four five six seven eight nine ten eleven twelve",
    "ok",
]
#: fp32 ONNX Runtime against fp32 torch: float rounding only.
ATOL = 1e-4


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        "text-classification": tiny_hf_classifier(
            tmp_path_factory.mktemp("classifier"), ["anger", "joy", "sadness"]
        ),
        "reranking": tiny_hf_cross_encoder(tmp_path_factory.mktemp("reranker")),
        "token-classification": tiny_hf_token_classifier(tmp_path_factory.mktemp("tagger")),
    }


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def _load(path: Path, cache: Path, engine: str, mode: str = "none") -> ServableModel:
    old = os.environ.get("KUBEINFER_CACHE_DIR")
    os.environ["KUBEINFER_CACHE_DIR"] = str(cache)
    try:
        model = {"name": "m", "source": str(path), "engine": engine}
        quantization = {"mode": mode, **({"calibration_path": "default"} if mode == "int8-static" else {})}
        return load_model(tiny_hf_config(path, model=model, quantization=quantization))
    finally:
        if old is None:
            del os.environ["KUBEINFER_CACHE_DIR"]
        else:
            os.environ["KUBEINFER_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def models(dirs: dict[str, Path], cache: Path) -> dict[tuple[str, str], ServableModel]:
    """Every task on both engines, fp32: ``(task, engine) -> model``."""
    return {(t, e): _load(dirs[t], cache, e) for t in TASKS for e in ("torch", "onnxruntime")}


def requests(task: str) -> list[dict[str, np.ndarray]]:
    """Three requests of the task's inputs, of different row counts and lengths."""
    if task == "reranking":
        return [
            {"query": texts("how do I bake bread", "bread"), "text": texts(TEXTS[0], TEXTS[4])},
            {"query": texts("cats"), "text": texts(TEXTS[5])},
            {"query": texts(*TEXTS[1:4]), "text": texts("a", "b c", TEXTS[0])},
        ]
    if task == "token-classification":
        strategy = np.array([b"simple"], dtype=object)
        return [
            {"text": texts(*TEXTS[:2])},
            {"text": texts(TEXTS[2]), "aggregation_strategy": strategy},
            {"text": texts(*TEXTS[3:])},
        ]
    return [{"text": texts(*TEXTS[:2])}, {"text": texts(TEXTS[2])}, {"text": texts(*TEXTS[3:])}]


def assert_same_outputs(task: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """Labels, entities and token counts equal; scores and logits within ``ATOL``."""
    assert set(got) == set(want)
    np.testing.assert_array_equal(got[TOKEN_COUNTS], want[TOKEN_COUNTS])
    if task == "token-classification":
        for g, w in zip(got["entities"], want["entities"], strict=True):
            ge, we = json.loads(g.decode("utf-8")), json.loads(w.decode("utf-8"))
            assert [{k: v for k, v in e.items() if k != "score"} for e in ge] == [
                {k: v for k, v in e.items() if k != "score"} for e in we
            ]
            np.testing.assert_allclose([e["score"] for e in ge], [e["score"] for e in we], atol=ATOL)
        return
    np.testing.assert_allclose(got["score"], want["score"], atol=ATOL)
    assert got["score"].dtype == np.float32
    if task == "text-classification":
        assert list(got["label"]) == list(want["label"])
        np.testing.assert_allclose(got["logits"], want["logits"], atol=ATOL)


@pytest.mark.parametrize("task", TASKS)
def test_onnxruntime_gives_the_torch_outputs_and_metadata(
    task: str, models: dict[tuple[str, str], ServableModel]
) -> None:
    torch_model, ort_model = models[task, "torch"], models[task, "onnxruntime"]
    kinds = {
        "text-classification": TextClassifierModel,
        "reranking": CrossEncoderModel,
        "token-classification": TokenClassifierModel,
    }
    assert isinstance(ort_model, kinds[task]) and isinstance(torch_model, kinds[task])
    assert getattr(ort_model, "engine", None) == "onnxruntime" and ort_model.session is not None
    assert getattr(torch_model, "engine", None) == "torch"
    report = ort_model.report()
    assert report[REPORT_LABEL_AGREEMENT] == 1.0 and report[REPORT_SCORE_DEVIATION_MAX] < 1e-4
    meta, torch_meta = model_metadata_doc(ort_model), model_metadata_doc(torch_model)
    assert meta["platform"] == "onnxruntime_onnx" and torch_meta["platform"] == "pytorch"
    assert meta["inputs"] == torch_meta["inputs"] and meta["outputs"] == torch_meta["outputs"]
    batch = requests(task)
    assert_same_outputs(
        task,
        ort_model.execute(ort_model.preprocess(batch)),
        torch_model.execute(torch_model.preprocess(batch)),
    )


@pytest.mark.parametrize("task", TASKS)
def test_a_batch_of_requests_gives_each_request_alone(
    task: str, models: dict[tuple[str, str], ServableModel]
) -> None:
    model = models[task, "onnxruntime"]
    batch = requests(task)
    together = model.execute(model.preprocess(batch))
    start = 0
    for request in batch:
        alone = model.execute(model.preprocess([request]))
        rows = len(alone[TOKEN_COUNTS])
        part = {k: v[start : start + rows] for k, v in together.items()}
        if task == "text-classification":  # the batch pads to its longest row; logits as alone
            assert part["logits"].shape == alone["logits"].shape
        assert_same_outputs(task, part, alone)
        start += rows
    assert start == len(together[TOKEN_COUNTS])
    assert model.warmup(4, 1) >= 0 and model.max_batch_size == 4


def test_the_export_is_cached_per_model_and_kind(
    models: dict[tuple[str, str], ServableModel], dirs: dict[str, Path], cache: Path
) -> None:
    assert models  # every task loaded once on onnxruntime
    exported = sorted(cache.glob("*.onnx"))
    assert len([p for p in exported if hf_onnx.INT8_RECIPE not in p.name]) >= 3
    assert not list(cache.glob("*.partial"))
    # the key differs per graph kind: the same directory exported as another kind is another file
    path = dirs["text-classification"]
    assert hf_onnx.export_key(path, hf_onnx.SEQUENCE_LOGITS.version) != hf_onnx.export_key(
        path, hf_onnx.TOKEN_LOGITS.version
    )
    before = {p: os.stat(p).st_mtime_ns for p in cache.glob("*.onnx")}
    _load(path, cache, "onnxruntime")  # a second load reuses the export, untouched
    assert {p: os.stat(p).st_mtime_ns for p in cache.glob("*.onnx")} == before


@pytest.mark.parametrize(
    ("mode", "recipe"), [("int8-dynamic", hf_onnx.INT8_RECIPE), ("int8-static", hf_onnx.INT8_STATIC_RECIPE)]
)
@pytest.mark.parametrize("task", TASKS)
def test_int8_is_compared_with_torch_fp32(
    task: str,
    mode: str,
    recipe: str,
    models: dict[tuple[str, str], ServableModel],
    dirs: dict[str, Path],
    cache: Path,
) -> None:
    quantized = _load(dirs[task], cache, "onnxruntime", mode)
    assert getattr(quantized, "engine", None) == "onnxruntime"
    assert recipe in str(quantized.session._model_path)  # type: ignore[attr-defined]
    report = quantized.report()
    reference: Any = models[task, "torch"]
    served: Any = quantized
    agreement, mean, largest = compare_scores(reference.comparison(), served.comparison())
    assert report[REPORT_LABEL_AGREEMENT] == pytest.approx(agreement)
    assert report[REPORT_SCORE_DEVIATION_MEAN] == pytest.approx(mean)
    assert report[REPORT_SCORE_DEVIATION_MAX] == pytest.approx(largest)
    assert largest > 0.0 and 0.0 <= agreement <= 1.0  # int8, not the fp32 graph
    batch = requests(task)
    got = quantized.execute(quantized.preprocess(batch))
    assert set(got) == set(reference.execute(reference.preprocess(batch)))


def test_an_export_that_deviates_is_refused(
    dirs: dict[str, Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hf_onnx, "MAX_EXPORT_SCORE_DEVIATION", -1.0)
    with pytest.raises(ValueError, match=r"\(reranking\) deviates from the torch model.*engine torch"):
        _load(dirs["reranking"], cache, "onnxruntime")


def test_what_the_engine_does_not_serve_is_refused(dirs: dict[str, Path], cache: Path) -> None:
    with pytest.raises(QuantizationError, match="not supported on engine onnxruntime yet"):
        _load(dirs["text-classification"], cache, "onnxruntime", "bf16")
    path = dirs["reranking"]
    model = {"name": "m", "source": str(path), "engine": "onnxruntime"}
    skipping = {"mode": "int8-dynamic", "skip_modules": ["bert.encoder.layer.1"]}
    with pytest.raises(QuantizationError, match="skip_modules applies to engine torch"):
        load_model(tiny_hf_config(path, model=model, quantization=skipping))


def test_a_copy_of_the_model_finds_its_graph_and_a_changed_one_does_not(
    dirs: dict[str, Path], tmp_path: Path
) -> None:
    # another pod fetches the same model again (new files, new modification times): the same key, so a
    # cache volume shared by the pods serves it the graph; one changed weight byte is another model
    path = dirs["text-classification"]
    copy = tmp_path / path.name
    shutil.copytree(path, copy)
    for f in copy.iterdir():
        os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    key = hf_onnx.export_key(path)
    assert hf_onnx.export_key(copy) == key
    weights = next(copy.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert hf_onnx.export_key(copy) != key


def test_partial_names_are_unique_per_write(tmp_path: Path) -> None:
    # pods sharing a cache volume often run the runtime under the same pid
    target = tmp_path / "m.onnx"
    assert hf_onnx.partial_path(target) != hf_onnx.partial_path(target)
    assert hf_onnx.partial_path(target).name.endswith(".partial")
