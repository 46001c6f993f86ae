"""Tiny models for fast runtime-model tests (runtime models team).

``tiny_hf_dir(path)`` writes a 2-layer, 32-wide BERT with random (seeded) weights and the bundled
MiniLM tokenizer into ``path`` as a Hugging Face model directory (config.json, safetensors,
tokenizer files): loads in well under a second. ``tiny_torchscript(path)`` saves a scripted
two-input module.
"""

from __future__ import annotations

from pathlib import Path

import torch
from kubeinfer.runtime.config import RuntimeConfig
from torch import nn


def tiny_hf_dir(path: Path) -> Path:
    """Write the tiny BERT + bundled tokenizer to ``path``; return ``path``."""
    from kubeinfer.runtime.models.huggingface import bundled_model_dir
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    BertModel(config).eval().save_pretrained(str(path))
    AutoTokenizer.from_pretrained(str(bundled_model_dir()), local_files_only=True).save_pretrained(str(path))
    return path


def tiny_hf_config(path: Path, **overrides: object) -> RuntimeConfig:
    """A CPU ``RuntimeConfig`` serving the tiny BERT in ``path`` (sections overridable by key)."""
    data: dict[str, object] = {"model": {"name": "tiny", "source": str(path)}, "device": "cpu"}
    data.update(overrides)
    return RuntimeConfig.model_validate(data)


class _TwoInputs(nn.Module):
    """y = x @ W + bias_index-scaled offset; returns (y [n, 4] float, argmax [n] int64)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.linear(x) + k.to(x.dtype).unsqueeze(-1)
        return y, torch.argmax(y, dim=-1)


def tiny_torchscript(path: Path) -> Path:
    """Save a scripted module: inputs ``x`` FP32 [-1, 3], ``k`` INT64 [-1]; outputs ``y`` FP32
    [-1, 4], ``top`` INT64 [-1]."""
    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(_TwoInputs().eval()), str(path))
    return path


TORCHSCRIPT_IO = {
    "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "k", "datatype": "INT64", "shape": [-1]},
    ],
    "outputs": [
        {"name": "y", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "top", "datatype": "INT64", "shape": [-1]},
    ],
}
