"""torch.export programs (``model.format: pt2``): tensors read from the program's signature and fake
tensors, overrides that refine them, the refusals (a fixed batch, a batch range too small, nested
and non-tensor values, quantization, files), batching and warmup along the dynamic first dimension,
requests checked against the program with errors naming the tensor. AOTInductor packages (a C++
compile of tens of seconds) are tested in ``tests/integration/runtime/test_runtime_pt2.py``."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.dataplane import model_metadata_doc
from kubeinfer.runtime.errors import InputError
from kubeinfer.runtime.models import load_model
from kubeinfer.runtime.models.base import QuantizationError
from kubeinfer.runtime.models.pt2 import (
    Pt2Model,
    archive_contents,
    check_batch_ranges,
    model_file,
    output_names,
    program_signature,
)
from torch import nn

from hack.devtools.runtime_tiny import simple_pt2, tiny_pt2_mlp

pytestmark = pytest.mark.timeout(300)

BATCH = torch.export.Dim("batch", min=1)


def cfg(source: Path, **model: object) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {"model": {"name": "m", "source": str(source), "format": "pt2", **model}, "device": "cpu"}
    )


@pytest.fixture(scope="module")
def simple(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return simple_pt2(tmp_path_factory.mktemp("pt2") / "simple.pt2")


def test_tensors_come_from_the_program_and_requests_batch_along_the_first_dimension(simple: Path) -> None:
    model = load_model(cfg(simple))
    assert isinstance(model, Pt2Model)
    meta = model_metadata_doc(model)
    assert meta["inputs"] == [
        {"name": n, "datatype": "INT32", "shape": [-1, 16]} for n in ("INPUT0", "INPUT1")
    ]
    assert meta["outputs"] == [
        {"name": n, "datatype": "INT32", "shape": [-1, 16]} for n in ("OUTPUT0", "OUTPUT1")
    ]
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((1, 16), 5, np.int32)
    requests = [{"INPUT0": a, "INPUT1": a}, {"INPUT0": b, "INPUT1": b * 3}]
    assert [model.validate(r) for r in requests] == [2, 1]
    out = model.execute(model.preprocess(requests))
    np.testing.assert_array_equal(out["OUTPUT0"], np.concatenate([a + a, b + b * 3]))
    np.testing.assert_array_equal(out["OUTPUT1"], np.concatenate([a - a, b - b * 3]))
    assert out["OUTPUT0"].dtype == np.int32


def test_warmup_runs_every_batch_bucket(simple: Path) -> None:
    model = load_model(cfg(simple))
    seen: list[int] = []
    call = model.call
    model.call = lambda tensors: (seen.append(int(tensors[0].shape[0])), call(tensors))[1]  # type: ignore[method-assign]
    assert model.warmup(8, 2) >= 0 and model.max_batch_size == 8
    assert seen == [1, 1, 2, 2, 4, 4, 8, 8]
    assert model.report()["warmup_seconds"] > 0


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"INPUT0": np.ones((1, 16), np.int32)}, "input tensor 'INPUT1' is missing"),
        (
            {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.float32)},
            "input tensor 'INPUT1': expected datatype INT32, got FP32",
        ),
        (
            {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 15), np.int32)},
            r"input tensor 'INPUT1': expected shape \[-1, 16\]",
        ),
        (
            {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones(16, np.int32)},
            r"input tensor 'INPUT1': expected shape \[-1, 16\] \(-1 = any\), got \[16\]",
        ),
        (
            {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.int32), "X": np.ones(1)},
            "unexpected input tensor 'X'",
        ),
    ],
)
def test_a_request_that_does_not_fit_the_program_is_refused_naming_the_tensor(
    simple: Path, request_: dict[str, np.ndarray], message: str
) -> None:
    model = load_model(cfg(simple))
    with pytest.raises(InputError, match=message) as info:
        model.validate(request_)
    assert info.value.status == 400


def test_tuple_outputs_are_numbered_and_overrides_refine_the_program(tmp_path: Path) -> None:
    path = tiny_pt2_mlp(tmp_path / "mlp.pt2")
    model = load_model(cfg(path))
    assert [(t.name, t.datatype, t.shape) for t in (*model.inputs, *model.outputs)] == [
        ("x", "FP32", [-1, 3]),
        ("output_0", "FP32", [-1, 4]),
        ("output_1", "INT64", [-1]),
    ]
    out = model.execute(model.preprocess([{"x": np.eye(3, dtype=np.float32)}]))
    assert out["output_0"].shape == (3, 4) and out["output_1"].dtype == np.int64
    np.testing.assert_array_equal(out["output_1"], out["output_0"].argmax(axis=1))
    torch.manual_seed(0)
    expected = nn.Linear(3, 4)(torch.eye(3)).detach().numpy()  # the maker's seeded layer
    np.testing.assert_allclose(out["output_0"], expected, rtol=1e-6)
    reversed_ = load_model(
        cfg(
            path,
            outputs=[
                {"name": "output_1", "datatype": "INT64", "shape": [-1]},
                {"name": "output_0", "datatype": "FP32", "shape": [-1, 4]},
            ],
        )
    )
    assert [t.name for t in reversed_.outputs] == ["output_0", "output_1"]  # tuple outputs by position
    again = reversed_.execute(reversed_.preprocess([{"x": np.eye(3, dtype=np.float32)}]))
    np.testing.assert_array_equal(again["output_1"], out["output_1"])
    for bad, message in (
        (
            {"inputs": [{"name": "z", "datatype": "FP32", "shape": [-1, 3]}]},
            r"model\.inputs names \['z'\], the pt2 model has \['x'\]",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "INT32", "shape": [-1, 3]}]},
            r"model\.inputs 'x': datatype INT32, the pt2 model has FP32",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 5]}]},
            r"model\.inputs 'x': shape \[-1, 5\] does not fit the pt2 model's \[-1, 3\]",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            load_model(cfg(path, **bad))


class _Dynamic(nn.Module):
    """Sums a [batch, n] tensor over n, both dimensions dynamic; ``scale`` is a keyword argument."""

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1, keepdim=True) * scale


def test_other_dynamic_dimensions_are_minus_one_and_keyword_inputs_are_named(tmp_path: Path) -> None:
    n = torch.export.Dim("n", min=1)
    program = torch.export.export(
        _Dynamic(),
        (torch.ones(2, 5),),
        {"scale": torch.ones(2, 1)},
        dynamic_shapes={"x": {0: BATCH, 1: n}, "scale": {0: BATCH}},
    )
    signature = program_signature(program)
    assert [(t.name, t.shape) for t in signature.inputs] == [("x", [-1, -1]), ("scale", [-1, 1])]
    assert [(t.name, t.shape) for t in signature.outputs] == [("output_0", [-1, 1])]
    assert signature.keywords == 1 and signature.batch_ranges == {"x": (1, None), "scale": (1, None)}
    torch.export.save(program, str(tmp_path / "dyn.pt2"))
    model = load_model(cfg(tmp_path / "dyn.pt2"))
    wide, narrow = np.ones((1, 6), np.float32), np.ones((2, 2), np.float32)
    assert model.batch_key({"x": wide, "scale": np.ones((1, 1), np.float32)}) != model.batch_key(
        {"x": narrow, "scale": np.ones((2, 1), np.float32)}
    )
    out = model.execute(model.preprocess([{"x": wide, "scale": np.full((1, 1), 2, np.float32)}]))
    np.testing.assert_array_equal(out["output_0"], [[12.0]])
    # overrides listed in another order: the program's order stays (inputs are passed by position)
    fixed = load_model(
        cfg(
            tmp_path / "dyn.pt2",
            inputs=[
                {"name": "scale", "datatype": "FP32", "shape": [-1, 1]},
                {"name": "x", "datatype": "FP32", "shape": [-1, 6]},
            ],
        )
    )
    assert [(t.name, t.shape) for t in fixed.inputs] == [("x", [-1, 6]), ("scale", [-1, 1])]
    with pytest.raises(InputError, match=r"input tensor 'x': expected shape \[-1, 6\]"):
        fixed.validate({"x": narrow, "scale": np.ones((2, 1), np.float32)})
    scale = np.full((1, 1), 3, np.float32)
    out = fixed.execute(fixed.preprocess([{"scale": scale, "x": wide}]))
    np.testing.assert_array_equal(out["output_0"], [[18.0]])


def test_a_warmup_size_outside_the_programs_range_is_refused_naming_warmup_dims(tmp_path: Path) -> None:
    seq = torch.export.Dim("seq", min=2, max=64)
    program = torch.export.export(
        _Dynamic(),
        (torch.ones(2, 5),),
        {"scale": torch.ones(2, 1)},
        dynamic_shapes={"x": {0: BATCH, 1: seq}, "scale": {0: BATCH}},
    )
    torch.export.save(program, str(tmp_path / "seq.pt2"))
    sized = RuntimeConfig.model_validate(
        {**cfg(tmp_path / "seq.pt2").model_dump(), "warmup": {"dims": [64, 1000]}}
    )
    with pytest.raises(ValueError, match=r"warmup\.dims size 1000: .*'x' \[1, 1000\]"):
        load_model(sized).warmup(2, 1)


def test_a_fixed_or_bounded_batch_is_refused_naming_the_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"pt2 input 'x': shape \[2, 3\] has a fixed first dimension"):
        load_model(cfg(tiny_pt2_mlp(tmp_path / "fixed.pt2", batch="fixed")))
    bounded = tiny_pt2_mlp(tmp_path / "max4.pt2", batch="max4")
    with pytest.raises(
        ValueError, match=r"pt2 input 'x': the program admits batches of \[1, 4\] rows.*\(32\)"
    ):
        load_model(cfg(bounded))
    small = RuntimeConfig.model_validate({**cfg(bounded).model_dump(), "batching": {"max_batch_size": 4}})
    assert load_model(small).inputs[0].shape == [-1, 3]  # 4 rows fit
    signature = program_signature(torch.export.load(str(bounded)))
    check_batch_ranges(signature, 4)
    with pytest.raises(ValueError, match=r"\[2, inf\]"):
        check_batch_ranges(type(signature)(signature.inputs, signature.outputs, 0, {"x": (2, None)}), 1)


class _Nested(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        return x, (x + 1, x - 1)


class _Pair(nn.Module):
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return pair[0] + pair[1]


class _Half(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.complex64)


def test_nested_values_and_unserved_dtypes_are_refused_naming_them() -> None:
    x = torch.ones(2, 3)
    nested = torch.export.export(_Nested(), (x,), dynamic_shapes=({0: BATCH},))
    with pytest.raises(ValueError, match=r"pt2 output 'output_1' is a tuple of 2 values"):
        program_signature(nested)
    pair = torch.export.export(_Pair(), ((x, x.clone()),), dynamic_shapes=(({0: BATCH}, {0: BATCH}),))
    with pytest.raises(ValueError, match=r"pt2 input 'pair' is a tuple of 2 values; every input must be one"):
        program_signature(pair)
    complex_ = torch.export.export(_Half(), (x,), dynamic_shapes=({0: BATCH},))
    with pytest.raises(ValueError, match=r"pt2 output 'output_0': dtype torch.complex64 is not served"):
        program_signature(complex_)


def test_output_names_of_a_dict_a_tuple_and_a_tensor(simple: Path) -> None:
    program = torch.export.load(str(simple))
    assert output_names(program.call_spec.out_spec) == ["OUTPUT0", "OUTPUT1"]
    single = torch.export.export(_Half(), (torch.ones(2, 3),))
    assert output_names(single.call_spec.out_spec) == ["output_0"]


def test_quantization_engines_and_files_are_refused(tmp_path: Path, simple: Path) -> None:
    with pytest.raises(QuantizationError, match="not supported for pt2 models; quantize before export"):
        load_model(
            RuntimeConfig.model_validate({**cfg(simple).model_dump(), "quantization": {"mode": "bf16"}})
        )
    with pytest.raises(ValueError, match=r"model\.engine onnxruntime does not run pt2 models"):
        RuntimeConfig.model_validate({"model": {"format": "pt2", "engine": "onnxruntime", "source": "/m"}})
    with pytest.raises(FileNotFoundError, match="no such pt2 file or directory"):
        load_model(cfg(tmp_path / "nope.pt2"))
    (tmp_path / "junk.pt2").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"not a \.pt2 archive"):
        load_model(cfg(tmp_path / "junk.pt2"))
    with zipfile.ZipFile(tmp_path / "other.pt2", "w") as z:
        z.writestr("other/readme.txt", "hello")
    with pytest.raises(ValueError, match="neither an ExportedProgram"):
        archive_contents(tmp_path / "other.pt2")


def test_the_model_file_of_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    simple_pt2(tmp_path / "a" / "model.pt2")
    simple_pt2(tmp_path / "a" / "other.pt2")
    assert model_file(str(tmp_path / "a")) == tmp_path / "a" / "model.pt2"
    (tmp_path / "b").mkdir()
    simple_pt2(tmp_path / "b" / "add_sub.pt2")
    (tmp_path / "b" / ".add_sub.pt2.partial.pt2").write_bytes(b"half")  # a fetch's temporary file
    assert model_file(str(tmp_path / "b")).name == "add_sub.pt2"
    simple_pt2(tmp_path / "b" / "second.pt2")
    with pytest.raises(
        FileNotFoundError, match=r"expected model\.pt2 or exactly one \.pt2 file, found add_sub"
    ):
        model_file(str(tmp_path / "b"))
