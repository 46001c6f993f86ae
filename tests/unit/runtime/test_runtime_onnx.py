"""ONNX models on ONNX Runtime: tensors read from the model, overrides that refine them, batching
along a dynamic first dimension, and requests checked against the model with errors naming the tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.dataplane import model_metadata_doc
from kubeinfer.runtime.errors import InputError
from kubeinfer.runtime.models import load_model
from kubeinfer.runtime.models.base import QuantizationError
from kubeinfer.runtime.models.onnx import OnnxModel, model_file

from hack.devtools.runtime_tiny import simple_onnx, tiny_onnx_mlp


def cfg(source: Path, **model: object) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {"model": {"name": "m", "source": str(source), "format": "onnx", **model}, "device": "cpu"}
    )


def test_tensors_come_from_the_model_and_requests_batch_along_the_first_dimension(tmp_path: Path) -> None:
    model = load_model(cfg(simple_onnx(tmp_path / "simple.onnx")))
    assert isinstance(model, OnnxModel)
    meta = model_metadata_doc(model)
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [
        {"name": n, "datatype": "INT32", "shape": [-1, 16]} for n in ("INPUT0", "INPUT1")
    ]
    assert [o["name"] for o in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((1, 16), np.int32)
    requests = [{"INPUT0": a, "INPUT1": a}, {"INPUT0": b, "INPUT1": b * 3}]
    assert all(model.validate(r) in (1, 2) for r in requests)
    out = model.execute(model.preprocess(requests))
    np.testing.assert_array_equal(out["OUTPUT0"], np.concatenate([a + a, b + b * 3]))
    np.testing.assert_array_equal(out["OUTPUT1"], np.concatenate([a - a, b - b * 3]))
    assert out["OUTPUT0"].dtype == np.int32
    assert model.warmup(8, 1) >= 0 and model.max_batch_size == 8


def _warmed_shapes(model: OnnxModel, max_batch_size: int) -> list[tuple[int, ...]]:
    """The INPUT0 shapes warmup runs, in order."""
    seen: list[tuple[int, ...]] = []
    execute = model.execute

    def recording(prepared: object) -> dict[str, np.ndarray]:
        seen.append(tuple(prepared["INPUT0"].shape))  # type: ignore[index]
        return execute(prepared)  # type: ignore[arg-type]

    model.execute = recording  # type: ignore[method-assign]
    assert model.warmup(max_batch_size, 1) >= 0
    return seen


def test_warmup_runs_every_batch_bucket_at_each_size_of_the_variable_dimensions(tmp_path: Path) -> None:
    path = simple_onnx(tmp_path / "seq.onnx", "sequence")
    model = load_model(cfg(path))
    assert isinstance(model, OnnxModel)
    assert _warmed_shapes(model, 4) == [(1, 8), (2, 8), (4, 8)]  # unset: one size, 8
    sized = RuntimeConfig.model_validate({**cfg(path).model_dump(), "warmup": {"dims": [16, 128]}})
    model = load_model(sized)
    assert isinstance(model, OnnxModel) and model.warmup_dims == (16, 128)
    assert _warmed_shapes(model, 4) == [(1, 16), (2, 16), (4, 16), (1, 128), (2, 128), (4, 128)]
    # no variable dimension: the sizes do not multiply the passes
    fixed = RuntimeConfig.model_validate(
        {**cfg(simple_onnx(tmp_path / "simple.onnx")).model_dump(), "warmup": {"dims": [16, 128]}}
    )
    model = load_model(fixed)
    assert isinstance(model, OnnxModel)
    assert _warmed_shapes(model, 2) == [(1, 16), (2, 16)]


@pytest.mark.parametrize(
    ("warmup", "message"),
    [
        ({"dims": [0]}, "greater than or equal to 1"),
        ({"dims": []}, "at least 1 item"),
        ({"dims": list(range(1, 18))}, "at most 16 items"),
    ],
)
def test_bad_warmup_dims_are_refused_naming_the_field(warmup: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=rf"warmup\.dims[\s\S]*{message}"):
        RuntimeConfig.model_validate({"model": {"format": "onnx", "source": "/m.onnx"}, "warmup": warmup})


def test_warmup_dims_are_refused_for_a_huggingface_model_and_left_out_of_the_file_when_unset() -> None:
    with pytest.raises(ValueError, match=r"warmup\.dims applies to onnx, pt2 and torchscript"):
        RuntimeConfig.model_validate({"warmup": {"dims": [16]}})
    assert "dims" not in RuntimeConfig().to_yaml()
    on = RuntimeConfig.model_validate(
        {"model": {"format": "onnx", "source": "/m.onnx"}, "warmup": {"dims": [64]}}
    )
    assert RuntimeConfig.from_yaml(on.to_yaml()).warmup.dims == [64]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"INPUT0": np.ones((1, 16), np.int32)}, "INPUT1"),  # missing input
        (
            {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.float32)},
            "expected datatype INT32",
        ),
        (
            {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 15), np.int32)},
            "input tensor 'INPUT1'",
        ),
        ({"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones(16, np.int32)}, "input tensor 'INPUT1'"),
        (
            {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.int32), "X": np.ones(1)},
            "'X'",
        ),
    ],
)
def test_a_request_that_does_not_fit_the_model_is_refused_naming_the_tensor(
    tmp_path: Path, request_: dict[str, np.ndarray], message: str
) -> None:
    model = load_model(cfg(simple_onnx(tmp_path / "simple.onnx")))
    with pytest.raises(InputError, match=message) as info:
        model.validate(request_)
    assert info.value.status == 400


def test_overrides_refine_the_model_and_anything_else_is_refused(tmp_path: Path) -> None:
    path = tiny_onnx_mlp(tmp_path / "mlp.onnx")
    io = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]}
    outputs = [
        {"name": "y", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "top", "datatype": "INT64", "shape": [-1]},
    ]
    model = load_model(cfg(path, **io, outputs=outputs))
    assert [(t.name, t.shape) for t in model.outputs] == [("y", [-1, 4]), ("top", [-1])]
    for bad, message in (
        (
            {"inputs": [{"name": "z", "datatype": "FP32", "shape": [-1, 3]}]},
            r"names \['z'\], the ONNX model has \['x'\]",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "INT32", "shape": [-1, 3]}]},
            "datatype INT32, the ONNX model has FP32",
        ),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 5]}]}, r"shape \[-1, 5\] does not fit"),
    ):
        with pytest.raises(ValueError, match=message):
            load_model(cfg(path, **bad))
    out = model.execute(model.preprocess([{"x": np.eye(3, dtype=np.float32)}]))
    assert out["y"].shape == (3, 4) and out["top"].dtype == np.int64
    np.testing.assert_array_equal(out["top"], out["y"].argmax(axis=1))


def test_a_fixed_batch_dimension_quantization_and_missing_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fixed first dimension; the first dimension is the batch"):
        load_model(cfg(tiny_onnx_mlp(tmp_path / "fixed.onnx", fixed_batch=True)))
    simple = simple_onnx(tmp_path / "simple.onnx")
    with pytest.raises(QuantizationError, match="not supported for ONNX models yet"):
        load_model(
            RuntimeConfig.model_validate(
                {**cfg(simple).model_dump(), "quantization": {"mode": "int8-dynamic"}}
            )
        )
    with pytest.raises(FileNotFoundError, match="no such ONNX file or directory"):
        load_model(cfg(tmp_path / "nope.onnx"))


def test_the_model_file_of_a_directory(tmp_path: Path) -> None:
    (tmp_path / "hub" / "onnx").mkdir(parents=True)
    simple_onnx(tmp_path / "hub" / "onnx" / "model.onnx")  # a Hugging Face repository's layout
    assert model_file(str(tmp_path / "hub")) == tmp_path / "hub" / "onnx" / "model.onnx"
    (tmp_path / "one").mkdir()
    simple_onnx(tmp_path / "one" / "add_sub.onnx")
    assert model_file(str(tmp_path / "one")).name == "add_sub.onnx"
    simple_onnx(tmp_path / "one" / "other.onnx")
    with pytest.raises(FileNotFoundError, match=r"expected model\.onnx or exactly one \.onnx file"):
        model_file(str(tmp_path / "one"))


def _fixed_inner_onnx(path: Path) -> Path:
    """x FP32 [batch, n] @ W [8, 4]: ``n`` is declared dynamic, yet only 8 fits the weight."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "fixed-inner",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(np.ones((8, 4), np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_warmup_size_the_model_cannot_take_is_refused_naming_warmup_dims_and_the_tensor(
    tmp_path: Path,
) -> None:
    path = _fixed_inner_onnx(tmp_path / "inner.onnx")
    assert load_model(cfg(path)).warmup(2, 1) >= 0  # unset: 8, which fits
    sized = RuntimeConfig.model_validate({**cfg(path).model_dump(), "warmup": {"dims": [8, 16]}})
    with pytest.raises(ValueError, match=r"warmup\.dims size 16: .*'x' \[1, 16\].*MatMul") as info:
        load_model(sized).warmup(2, 1)
    assert info.value.__cause__ is not None  # the engine's own error stays attached
