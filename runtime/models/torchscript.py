"""TorchScript loader: a ``torch.jit`` file with inputs and outputs declared in the config.

TorchScript is deprecated by torch (``torch.jit.script``/``save`` warn on every call); its successor is
``torch.export`` (``model.format: pt2``, ``kubeinfer.runtime.models.pt2``), whose programs carry their
tensors. TorchScript stays for existing models.

``model.source`` is the file, or a directory with exactly one ``*.pt``, ``*.ts``, ``*.torchscript``
or ``*.pth`` file in it (what ``kubeinfer-runtime fetch`` leaves in ``/mnt/models``); hidden files
are skipped.

The module is called as ``module(*inputs)`` with one tensor per declared input, in declared order,
each with the batch dimension first. It returns one tensor (one declared output), or a tuple/list
(declared outputs in order), or a dict keyed by output name. Only numeric and BOOL datatypes are
supported (a TorchScript module cannot take text).

Quantization: ``none``, ``bf16``, ``fp16`` (CUDA) cast the module's floating parameters and the
floating inputs; outputs are returned in their declared datatype. int8 modes are not supported
for TorchScript (eager-mode quantization swaps ``nn.Module`` objects, which a scripted module
does not have): quantize before scripting instead.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from kubeinfer.runtime.config import RuntimeConfig, TensorConfig
from kubeinfer.runtime.dtypes import DATATYPES, torch_dtype
from kubeinfer.runtime.models.base import (
    REPORT_COMPARE_SECONDS,
    REPORT_COSINE_MEAN,
    REPORT_LOAD_SECONDS,
    QuantizationError,
)
from kubeinfer.runtime.models.device import configure_torch, resolve_device, to_device
from kubeinfer.runtime.models.quantize import (
    INT8_MODES,
    check_supported,
    compare_embeddings,
    float_dtype,
)
from kubeinfer.runtime.models.tensors import TensorModel, stack

log = logging.getLogger(__name__)

#: Rows of seeded random inputs used to compare a cast model with the fp32 one.
COMPARE_ROWS = 64


@dataclass(frozen=True)
class TensorBatch:
    """A preprocessed batch: one CPU tensor per declared input, requests concatenated on dim 0."""

    tensors: list[torch.Tensor]
    rows: int


class TorchScriptModel(TensorModel):
    """A scripted module served with declared inputs and outputs.

    ``compute_dtype`` is the dtype floating inputs are cast to (the quantization's); None keeps each
    input's declared datatype. ``call`` runs the module on the batch's device tensors, one per input
    in declared order (``pt2`` programs override it).
    """

    def __init__(
        self,
        *,
        name: str,
        module: Callable[..., Any],
        inputs: list[TensorConfig],
        outputs: list[TensorConfig],
        device: torch.device,
        cfg: RuntimeConfig,
    ) -> None:
        self.name = name
        self.module = module
        self.inputs = inputs
        self.outputs = outputs
        self.torch_device = device
        self.device = str(device)
        self.limits = cfg.limits
        self.max_batch_size = 0
        self.compute_dtype: torch.dtype | None = float_dtype(cfg.quantization.mode)
        self._report: dict[str, float] = {}

    def preprocess(self, batch: Sequence[Mapping[str, np.ndarray]]) -> TensorBatch:
        """Concatenate each input over the requests (rows in request order) as CPU tensors.

        Raises:
            ValueError: the requests' non-batch dimensions differ (see ``batch_key``).
        """
        tensors = []
        for spec, array in zip(self.inputs, stack(self.inputs, batch), strict=True):
            tensor = torch.from_numpy(
                np.ascontiguousarray(array).astype(np.float32, copy=False)
                if array.dtype.name == "bfloat16"
                else np.ascontiguousarray(array)
            )
            tensor = tensor.to(torch_dtype(spec.datatype))
            if tensor.is_floating_point() and self.compute_dtype is not None:
                tensor = tensor.to(self.compute_dtype)
            tensors.append(tensor)
        return TensorBatch(tensors=tensors, rows=int(tensors[0].shape[0]))

    def execute(self, prepared: TensorBatch) -> dict[str, np.ndarray]:
        """Run the module; outputs by declared name, cast to their declared datatype.

        Raises:
            RuntimeError: the module's outputs do not match the declaration (count, rows).
        """
        with torch.inference_mode():
            result = self.call([to_device(t, self.torch_device) for t in prepared.tensors])
        if isinstance(result, torch.Tensor):
            values = [result]
        elif isinstance(result, (tuple, list)):
            values = list(result)
        elif isinstance(result, dict):
            missing = [s.name for s in self.outputs if s.name not in result]
            if missing:
                raise RuntimeError(f"model '{self.name}' returned no output named {missing}")
            values = [result[s.name] for s in self.outputs]
        else:
            raise RuntimeError(f"model '{self.name}' returned {type(result).__name__}, expected tensor(s)")
        if len(values) != len(self.outputs):
            raise RuntimeError(
                f"model '{self.name}' returned {len(values)} outputs, declared {len(self.outputs)}"
            )
        out: dict[str, np.ndarray] = {}
        for spec, value in zip(self.outputs, values, strict=True):
            if int(value.shape[0]) != prepared.rows:
                raise RuntimeError(
                    f"model '{self.name}' output '{spec.name}' has {value.shape[0]} rows "
                    f"for {prepared.rows} input rows"
                )
            host = value.detach().to("cpu")
            if host.dtype == torch.bfloat16:
                host = host.float()
            out[spec.name] = host.numpy().astype(DATATYPES[spec.datatype].host, copy=False)
        return out

    def call(self, tensors: list[torch.Tensor]) -> Any:
        """``module(*tensors)``: what the module returns (a tensor, a tuple or list, a dict by name)."""
        return self.module(*tensors)


#: File name endings of a TorchScript file in a model directory.
SUFFIXES = (".pt", ".ts", ".torchscript", ".pth")


def model_file(source: str) -> Path:
    """The TorchScript file ``source`` names: the file itself, or the one file of a directory whose
    name ends with a ``SUFFIXES`` ending (hidden files, such as the fetch step's report and temporary
    files, are skipped).

    Raises:
        FileNotFoundError: nothing there, or a directory with no such file or with several.
    """
    path = Path(source)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"model.source {source}: no such TorchScript file or directory")
    found = sorted(
        p
        for p in path.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.name.lower().endswith(SUFFIXES)
    )
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        kinds = ", ".join(f"*{s}" for s in SUFFIXES)
        raise FileNotFoundError(
            f"model.source {source}: expected exactly one TorchScript file ({kinds}) in the directory, "
            f"found {names}"
        )
    return found[0]


def load_torchscript(cfg: RuntimeConfig) -> TorchScriptModel:
    """Load ``cfg.model.source`` with ``torch.jit.load`` onto the resolved device.

    For ``bf16``/``fp16`` the first output on ``COMPARE_ROWS`` seeded random rows is compared with
    the fp32 module's (mean cosine per row, ``report()``).

    ``model.source`` is the file, or a directory holding exactly one (``model_file``).

    Raises:
        FileNotFoundError: no such file, or a directory without exactly one TorchScript file.
        QuantizationError: an int8 mode, or fp16 on a CPU.
        ValueError: a BYTES input (TorchScript modules take tensors only).
    """
    started = time.perf_counter()
    qcfg = cfg.quantization
    device = resolve_device(cfg.device)
    if qcfg.mode in INT8_MODES:
        raise QuantizationError(
            f"quantization '{qcfg.mode}' is not supported for TorchScript models (quantize before "
            "scripting); use 'none', 'bf16' or, on CUDA, 'fp16'"
        )
    check_supported(qcfg.mode, device, qcfg.skip_modules)
    for spec in (*cfg.model.inputs, *cfg.model.outputs):
        if spec.datatype == "BYTES":
            raise ValueError(f"TorchScript tensor '{spec.name}': datatype BYTES is not supported")
        if spec.shape[0] != -1:
            raise ValueError(f"TorchScript tensor '{spec.name}': the first dimension must be -1 (batch)")
    path = model_file(cfg.model.source)
    configure_torch(device)
    os.environ["HF_HUB_OFFLINE"] = "1"
    module = torch.jit.load(str(path), map_location=device).eval()  # type: ignore[no-untyped-call]
    model = TorchScriptModel(
        name=cfg.model.name,
        module=module,
        inputs=list(cfg.model.inputs),
        outputs=list(cfg.model.outputs),
        device=device,
        cfg=cfg,
    )
    if qcfg.mode != "none":
        t0 = time.perf_counter()
        example = [model.example_inputs(COMPARE_ROWS)]
        model.compute_dtype = torch.float32
        reference = model.execute(model.preprocess(example))[model.outputs[0].name]
        module.to(float_dtype(qcfg.mode))
        model.compute_dtype = float_dtype(qcfg.mode)
        served = model.execute(model.preprocess(example))[model.outputs[0].name]
        cosine, _ = compare_embeddings(
            reference.reshape(COMPARE_ROWS, -1).astype(np.float64),
            served.reshape(COMPARE_ROWS, -1).astype(np.float64),
        )
        model._report[REPORT_COSINE_MEAN] = cosine
        model._report[REPORT_COMPARE_SECONDS] = time.perf_counter() - t0
    model._report[REPORT_LOAD_SECONDS] = time.perf_counter() - started
    log.info(
        "loaded TorchScript %s from %s on %s, quantization %s, %s",
        cfg.model.name,
        path,
        device,
        qcfg.mode,
        model._report,
    )
    return model
