"""Tiny models for fast runtime-model tests (runtime models team).

``tiny_hf_dir(path)`` writes a 2-layer, 32-wide BERT with random (seeded) weights and the bundled
MiniLM tokenizer into ``path`` as a Hugging Face model directory (config.json, safetensors,
tokenizer files): loads in well under a second; ``tiny_hf_classifier(path, labels)`` and
``tiny_hf_cross_encoder(path)`` write the same BERT with a sequence-classification head (a text
classifier; a one-label cross-encoder reranker); ``tiny_hf_token_classifier(path)`` the same BERT with
a token-classification head of BIO labels (an NER tagger). ``tiny_torchscript(path)`` saves a scripted
two-input module. ``simple_onnx(path)`` writes Triton's ``simple`` add/sub model as ONNX and
``tiny_onnx_mlp(path)`` a small ONNX model of two outputs, every tensor declared by the model;
``simple_pt2(path)`` and ``tiny_pt2_mlp(path)`` the same two as ``torch.export`` programs (``.pt2``,
optionally compiled by AOTInductor).
"""

from __future__ import annotations

from pathlib import Path

import torch
from kubeinfer.runtime.config import RuntimeConfig
from torch import nn


def tiny_hf_dir(path: Path, init_std: float = 0.02) -> Path:
    """Write the tiny BERT + bundled tokenizer to ``path``; return ``path``. ``init_std``: the weights'
    standard deviation (BERT's ``initializer_range``): at BERT's 0.02 the residual stream drowns what the
    layers add, and int8-dynamic stays within 1e-7 of fp32 (mean cosine); at 0.3 it measurably does not
    (about 0.9975 on short English texts), for a quality gate to refuse."""
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
        initializer_range=init_std,
    )
    BertModel(config).eval().save_pretrained(str(path))
    AutoTokenizer.from_pretrained(str(bundled_model_dir()), local_files_only=True).save_pretrained(str(path))
    return path


def _tiny_bert_config(**extra: object) -> object:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        **extra,
    )


def _save_with_tokenizer(model: object, path: Path) -> Path:
    from kubeinfer.runtime.models.huggingface import bundled_model_dir
    from transformers import AutoTokenizer

    model.eval().save_pretrained(str(path))  # type: ignore[attr-defined]
    AutoTokenizer.from_pretrained(str(bundled_model_dir()), local_files_only=True).save_pretrained(str(path))
    return path


def tiny_hf_classifier(
    path: Path, labels: list[str] | tuple[str, ...] = ("negative", "positive"), *, multi_label: bool = False
) -> Path:
    """Write the tiny BERT with a seeded sequence-classification head of ``labels`` (``id2label``) and
    the bundled tokenizer to ``path``; ``multi_label``: ``problem_type: multi_label_classification``.
    Returns ``path``."""
    from transformers import BertForSequenceClassification

    torch.manual_seed(1)
    config = _tiny_bert_config(
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        problem_type="multi_label_classification" if multi_label else "single_label_classification",
    )
    return _save_with_tokenizer(BertForSequenceClassification(config), path)  # type: ignore[arg-type]


def tiny_hf_cross_encoder(
    path: Path, activation: str | None = "Sigmoid", head_std: float | None = None
) -> Path:
    """Write the tiny BERT with a seeded one-label head (a cross-encoder reranker) and the bundled
    tokenizer to ``path``; ``config.json`` names ``activation`` (``Sigmoid``, ``Identity``) as
    sentence-transformers' CrossEncoder does (None: no sentence-transformers entry). ``head_std``
    redraws the head's weights that wide (BERT's 0.02 gives every pair nearly the same score; 0.5
    spreads them, so a check can tell the pairs apart). Returns ``path``."""
    from transformers import BertForSequenceClassification

    torch.manual_seed(2)
    extra: dict[str, object] = {"num_labels": 1}
    if activation is not None:
        extra["sentence_transformers"] = {"activation_fn": f"torch.nn.modules.activation.{activation}"}
    model = BertForSequenceClassification(_tiny_bert_config(**extra))  # type: ignore[arg-type]
    if head_std is not None:
        with torch.no_grad():
            model.classifier.weight.normal_(0.0, head_std)
    return _save_with_tokenizer(model, path)


#: The tiny token classifier's labels (``id2label`` order): CoNLL-style BIO tags of two entity types.
TOKEN_LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")


def tiny_hf_token_classifier(path: Path, labels: list[str] | tuple[str, ...] = TOKEN_LABELS) -> Path:
    """Write the tiny BERT with a seeded token-classification head of ``labels`` (``id2label``; an NER
    tagger, ``BertForTokenClassification``) and the bundled fast tokenizer (character offsets) to
    ``path``. The head's weights are drawn 25x wider than BERT's initialisation so each token's
    label wins by a clear margin (a random head at std 0.02 gives near-ties that padding noise
    could flip). Returns ``path``."""
    from transformers import BertForTokenClassification

    torch.manual_seed(3)
    config = _tiny_bert_config(
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    model = BertForTokenClassification(config)
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 0.5)
        model.classifier.bias.normal_(0.0, 0.5)
    return _save_with_tokenizer(model, path)


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


def simple_onnx(path: Path, elements: int | str = 16) -> Path:
    """Write Triton's ``simple`` model as ONNX to ``path``: INT32 ``INPUT0``, ``INPUT1`` of shape
    [batch, ``elements``] (a dynamic batch axis; ``elements`` a name: a second dynamic axis),
    ``OUTPUT0`` = their sum, ``OUTPUT1`` = their difference; every tensor is declared by the model
    itself."""
    import onnx
    from onnx import TensorProto, helper

    def tensor(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", elements])

    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "simple",
        [tensor("INPUT0"), tensor("INPUT1")],
        [tensor("OUTPUT0"), tensor("OUTPUT1")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every onnxruntime since 1.10 reads
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def simple_string_onnx(path: Path, elements: int = 16) -> Path:
    """Write Triton's ``simple_string`` model as ONNX to ``path``: BYTES (ONNX ``string``) ``INPUT0``,
    ``INPUT1`` of shape [batch, ``elements``], each element a decimal integer; ``OUTPUT0`` = their sum
    and ``OUTPUT1`` = their difference, as decimal strings (Cast to INT32, Add/Sub, Cast back). Every
    tensor is declared by the model itself."""
    import onnx
    from onnx import TensorProto, helper

    def tensor(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.STRING, ["batch", elements])

    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
            helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("Sub", ["a", "b"], ["difference"]),
            helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
            helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=TensorProto.STRING),
        ],
        "simple_string",
        [tensor("INPUT0"), tensor("INPUT1")],
        [tensor("OUTPUT0"), tensor("OUTPUT1")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every onnxruntime since 1.10 reads
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def tiny_onnx_mlp(path: Path, *, fixed_batch: bool = False) -> Path:
    """Write a small ONNX model to ``path``: ``x`` FP32 [batch, 3] -> ``y`` = x @ W + b FP32 [batch, 4]
    (seeded W, b) and ``top`` INT64 [batch] (the argmax of each row); with ``fixed_batch`` the batch
    dimension is 1 (a model exported without a dynamic axis)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    batch: str | int = 1 if fixed_batch else "batch"
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
            helper.make_node("ArgMax", ["y"], ["top"], axis=1, keepdims=0),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4]),
            helper.make_tensor_value_info("top", TensorProto.INT64, [batch]),
        ],
        initializer=[
            numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


class _Simple(nn.Module):
    """Triton's ``simple`` model: the element-wise sum and difference of two INT32 tensors, returned
    as a dict so that the program names its outputs."""

    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


#: The two ways an AOTInductor package is written: with its ``torch.export`` program, or without it.
AOTI_KINDS = ("with-program", "alone")


def _aoti_packages(program: torch.export.ExportedProgram, paths: dict[str, Path]) -> dict[str, Path]:
    """Compile ``program`` by AOTInductor for the CPU once and package it at ``paths[kind]`` for each
    kind of ``AOTI_KINDS`` given: with the program (``with-program``) or without it (``alone``)."""
    from torch.export.pt2_archive._package import package_pt2

    files = torch._inductor.aot_compile(  # type: ignore[attr-defined]
        program.module(), program.example_inputs[0], options={"aot_inductor.package": True}
    )
    for kind, path in paths.items():
        package_pt2(
            str(path), exported_programs=program if kind == "with-program" else None, aoti_files=files
        )
    return paths


def _save_pt2(program: torch.export.ExportedProgram, path: Path, aoti: str | None) -> Path:
    """Save ``program`` to ``path``: the program alone (``aoti`` None), compiled by AOTInductor for
    the CPU and packaged with it (``with-program``) or without it (``alone``)."""
    if aoti is None:
        torch.export.save(program, str(path))
        return path
    return _aoti_packages(program, {aoti: path})[aoti]


def _simple_program(elements: int) -> torch.export.ExportedProgram:
    # two distinct example tensors: export would take one tensor passed twice for one input
    examples = (torch.zeros(2, elements, dtype=torch.int32), torch.ones(2, elements, dtype=torch.int32))
    batch = torch.export.Dim("batch", min=1)
    return torch.export.export(_Simple().eval(), examples, dynamic_shapes=({0: batch}, {0: batch}))


def simple_pt2(path: Path, elements: int = 16, *, aoti: str | None = None) -> Path:
    """Write Triton's ``simple`` model as a ``torch.export`` program to ``path`` (``.pt2``): INT32
    ``INPUT0``, ``INPUT1`` of shape [batch, ``elements``] (``Dim("batch", min=1)``), ``OUTPUT0`` = their
    sum, ``OUTPUT1`` = their difference (a dict output names them); every tensor is read from the
    program. ``aoti``: see ``_save_pt2`` (an AOTInductor compile takes tens of seconds)."""
    return _save_pt2(_simple_program(elements), path, aoti)


def simple_aoti_packages(root: Path, elements: int = 16) -> dict[str, Path]:
    """``simple_pt2``'s model compiled by AOTInductor once (tens of seconds) and packaged both ways,
    ``root/<kind>.pt2`` for each kind of ``AOTI_KINDS``: ``{kind: path}``."""
    return _aoti_packages(_simple_program(elements), {kind: root / f"{kind}.pt2" for kind in AOTI_KINDS})


class _Mlp(nn.Module):
    """y = x @ W + b [n, 4] and each row's argmax [n] (INT64), as a tuple (unnamed outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.linear(x)
        return y, torch.argmax(y, dim=-1)


def tiny_pt2_mlp(path: Path, *, batch: str = "dynamic") -> Path:
    """Write a small ``torch.export`` program to ``path``: ``x`` FP32 [batch, 3] -> ``output_0`` FP32
    [batch, 4] (a seeded linear layer) and ``output_1`` INT64 [batch] (each row's argmax). ``batch``:
    ``dynamic`` (``Dim("batch", min=1)``), ``fixed`` (exported without a dynamic axis: 2 rows), or
    ``max4`` (at most 4 rows)."""
    torch.manual_seed(0)
    dims = {
        "dynamic": ({0: torch.export.Dim("batch", min=1)},),
        "fixed": None,
        "max4": ({0: torch.export.Dim("batch", min=1, max=4)},),
    }[batch]
    program = torch.export.export(_Mlp().eval(), (torch.zeros(2, 3),), dynamic_shapes=dims)
    torch.export.save(program, str(path))
    return path
