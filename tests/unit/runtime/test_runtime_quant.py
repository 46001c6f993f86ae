"""Quantization modes on a tiny model: what each mode does to the Linear layers, errors, skips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from kubeinfer.runtime.models import load_model
from kubeinfer.runtime.models.base import QuantizationError
from kubeinfer.runtime.models.huggingface import TextEmbeddingModel, read_calibration
from kubeinfer.runtime.models.quantize import (
    compare_embeddings,
    is_skipped,
    quantize_module,
)
from torch import nn

from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir

CPU = torch.device("cpu")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def linear_kinds(module: nn.Module) -> dict[str, str]:
    """Each linear layer by name: fp32, int8-dynamic or int8-static."""
    import torch.ao.nn.quantized as nnq
    import torch.ao.nn.quantized.dynamic as nnqd

    kinds = {}
    for name, child in module.named_modules():
        if isinstance(child, nnqd.Linear):
            kinds[name] = "int8-dynamic"
        elif isinstance(child, nnq.Linear):
            kinds[name] = "int8-static"
        elif type(child) is nn.Linear:
            kinds[name] = "fp32"
    return kinds


def test_none_is_unchanged() -> None:
    net = Net().eval()
    assert quantize_module(net, "none", device=CPU) is net


def test_bf16_casts_parameters() -> None:
    net = quantize_module(Net().eval(), "bf16", device=CPU)
    assert {p.dtype for p in net.parameters()} == {torch.bfloat16}


def test_fp16_on_cpu_suggests_bf16_or_int8_dynamic() -> None:
    with pytest.raises(QuantizationError) as info:
        quantize_module(Net().eval(), "fp16", device=CPU)
    message = str(info.value)
    assert "CUDA" in message and "'bf16'" in message and "'int8-dynamic'" in message


def test_int8_dynamic_is_per_channel_on_every_linear() -> None:
    x = torch.randn(4, 16)
    ref = Net().eval()(x)
    net = quantize_module(Net().eval(), "int8-dynamic", device=CPU)
    kinds = linear_kinds(net)
    assert kinds == {"encoder.0": "int8-dynamic", "encoder.2": "int8-dynamic", "head": "int8-dynamic"}
    for name in ("encoder.0", "encoder.2", "head"):
        assert net.get_submodule(name).weight().qscheme() == torch.per_channel_affine
    cosine = torch.nn.functional.cosine_similarity(net(x), ref).mean().item()
    assert cosine > 0.99


def test_skip_modules_keeps_named_modules_fp32() -> None:
    net = quantize_module(Net().eval(), "int8-dynamic", device=CPU, skip_modules=["encoder"])
    kinds = linear_kinds(net)
    assert kinds == {"encoder.0": "fp32", "encoder.2": "fp32", "head": "int8-dynamic"}
    assert is_skipped("encoder.layer.5.output.dense", ["encoder.layer.5"])
    assert not is_skipped("encoder.layer.50", ["encoder.layer.5"])


def test_skip_modules_errors() -> None:
    with pytest.raises(QuantizationError, match="no module named \\['encodr'\\]"):
        quantize_module(Net().eval(), "int8-dynamic", device=CPU, skip_modules=["encodr"])
    with pytest.raises(QuantizationError, match="int8-dynamic and int8-static only"):
        quantize_module(Net().eval(), "bf16", device=CPU, skip_modules=["head"])
    with pytest.raises(QuantizationError, match=r"no nn\.Linear layer left"):
        quantize_module(Net().eval(), "int8-dynamic", device=CPU, skip_modules=["encoder", "head"])


def test_int8_static_needs_calibration() -> None:
    with pytest.raises(QuantizationError, match="calibration"):
        quantize_module(Net().eval(), "int8-static", device=CPU)


def test_int8_static_calibrates_and_converts() -> None:
    seen: list[int] = []
    samples = torch.randn(64, 16)

    def calibrate(module: nn.Module) -> None:
        seen.append(1)
        with torch.inference_mode():
            module(samples)

    ref = Net().eval()(samples)
    net = quantize_module(Net().eval(), "int8-static", device=CPU, skip_modules=["head"], calibrate=calibrate)
    assert seen == [1]
    kinds = linear_kinds(net)
    assert kinds == {"encoder.0.module": "int8-static", "encoder.2.module": "int8-static", "head": "fp32"}
    assert type(net.encoder[0].quant).__name__ == "Quantize"  # input quantized with calibrated scale
    assert net.encoder[0].quant.scale.item() > 0
    with torch.inference_mode():
        cosine = torch.nn.functional.cosine_similarity(net(samples), ref).mean().item()
    assert cosine > 0.98


def test_compare_embeddings() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((20, 8))
    assert compare_embeddings(ref, ref) == pytest.approx((1.0, 1.0))
    noisy = ref + 0.01 * rng.standard_normal((20, 8))
    cosine, agreement = compare_embeddings(ref, noisy)
    assert 0.99 < cosine < 1.0
    assert agreement == 1.0
    swapped = ref.copy()
    swapped[0] = -ref[0]  # row 0 points the other way: cosine -1 for it, its neighbour changes
    cosine, agreement = compare_embeddings(ref, swapped, queries=[0])
    assert cosine == pytest.approx((19 - 1) / 20)
    assert agreement == 0.0
    with pytest.raises(ValueError, match="equal shape"):
        compare_embeddings(ref, ref[:5])


# --- through the Hugging Face loader ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_dir(tmp_path_factory.mktemp("tiny-bert-q"))


@pytest.mark.parametrize("mode", ["bf16", "int8-dynamic", "int8-static"])
def test_loader_quantizes_and_reports_deviation(tiny_dir: Path, mode: str) -> None:
    quant: dict[str, object] = {"mode": mode}
    if mode == "int8-static":
        quant["calibration_path"] = "default"
    model = load_model(tiny_hf_config(tiny_dir, quantization=quant))
    assert isinstance(model, TextEmbeddingModel)
    report = model.report()
    assert 0.5 < report["quantization_cosine_mean_ratio"] <= 1.0 + 1e-6
    assert 0.0 <= report["quantization_retrieval_agreement_ratio"] <= 1.0
    assert report["quantization_compare_seconds"] > 0
    out = model.execute(model.preprocess([model.example_inputs(3)]))["embedding"]
    assert out.dtype == np.float32 and out.shape == (3, 32)


def test_loader_fp16_on_cpu_fails_before_loading(tiny_dir: Path) -> None:
    with pytest.raises(QuantizationError, match="'bf16'"):
        load_model(tiny_hf_config(tiny_dir, quantization={"mode": "fp16"}))


def test_calibration_file(tmp_path: Path) -> None:
    assert 100 <= len(read_calibration("default")) <= 200
    with pytest.raises(FileNotFoundError, match=r"missing\.txt"):
        read_calibration(str(tmp_path / "missing.txt"))
    few = tmp_path / "few.txt"
    few.write_text("one\ntwo\n\n", encoding="utf-8")
    with pytest.raises(QuantizationError, match="2 samples"):
        read_calibration(str(few))
    many = tmp_path / "many.txt"
    many.write_text("\n".join(f"sample {i}" for i in range(300)), encoding="utf-8")
    assert len(read_calibration(str(many))) == 200
