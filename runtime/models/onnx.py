"""ONNX models on the ONNX Runtime engine (``model.format: onnx``).

``model.source`` is a ``.onnx`` file, or a directory holding ``model.onnx`` (or exactly one ``.onnx``
file, or ``onnx/model.onnx`` as Hugging Face repositories lay it out). The model's inputs and
outputs (names, datatypes, shapes) are read from the model itself; the first dimension of every
input and output must be dynamic (a symbolic or unknown dimension): it is the batch, along which
requests are stacked. Other dynamic dimensions are served as -1 (requests batch together when they
agree on them). ``model.inputs`` / ``model.outputs``, when given, refine what the model declares:
the same names and datatypes, and shapes that fix a dynamic dimension (``[-1, 16]`` for a model
declaring ``[batch, n]``); anything else is refused at load, naming the tensor.

The session: ``CPUExecutionProvider`` (or ``CUDAExecutionProvider`` on a CUDA device, when this
onnxruntime build has it), every graph optimization (``ORT_ENABLE_ALL``), sequential execution,
``intra_op_num_threads`` as torch's (``KUBEINFER_TORCH_THREADS``, else the CPUs less one: one core stays
for the event loop), one inter-op thread. Quantization: ``none`` only for now (a model quantized
before export is served as it is).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from kubeinfer.runtime.config import RuntimeConfig, TensorConfig
from kubeinfer.runtime.dtypes import DATATYPES, ONNX_TO_DATATYPE
from kubeinfer.runtime.models.base import REPORT_LOAD_SECONDS, QuantizationError
from kubeinfer.runtime.models.device import THREADS_ENV, default_threads, resolve_engine_device
from kubeinfer.runtime.models.tensors import TensorModel, model_tensor, refine, stack

log = logging.getLogger(__name__)

#: Triton's platform name for an ONNX model (v2 model metadata ``platform``).
PLATFORM = "onnxruntime_onnx"


def model_file(source: str) -> Path:
    """The ``.onnx`` file ``source`` names (a file, or a directory holding it; see the module docstring).

    Raises:
        FileNotFoundError: nothing there, or a directory without exactly one model file.
    """
    path = Path(source)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"model.source {source}: no such ONNX file or directory")
    for candidate in (path / "model.onnx", path / "onnx" / "model.onnx"):
        if candidate.is_file():
            return candidate
    found = sorted(
        p for p in path.glob("*.onnx") if not p.name.startswith(".")
    )  # hidden: a fetch's temp files
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise FileNotFoundError(
            f"model.source {source}: expected model.onnx or exactly one .onnx file, found {names}"
        )
    return found[0]


def declared_tensors(args: Sequence[Any], what: str) -> list[TensorConfig]:
    """TensorConfigs of a session's inputs or outputs (``NodeArg``: name, type, shape), dynamic
    dimensions as -1.

    Raises:
        ValueError: a datatype the protocol cannot carry or a model cannot declare, or a first
            dimension that is fixed (it must be the batch).
    """
    tensors = []
    for arg in args:
        datatype = ONNX_TO_DATATYPE.get(arg.type)
        if datatype is None or not DATATYPES[datatype].declarable:
            raise ValueError(f"ONNX {what} '{arg.name}': type {arg.type} is not served")
        dims = [d if isinstance(d, int) and d >= 0 else None for d in arg.shape]
        tensors.append(model_tensor("ONNX", what, arg.name, datatype, dims, arg.shape))
    return tensors


class OnnxModel(TensorModel):
    """An ONNX model served by an ``onnxruntime.InferenceSession`` (see the module docstring)."""

    platform = PLATFORM

    def __init__(
        self,
        *,
        name: str,
        session: ort.InferenceSession,
        inputs: list[TensorConfig],
        outputs: list[TensorConfig],
        device: str,
        cfg: RuntimeConfig,
    ) -> None:
        self.name = name
        self.session = session
        self.inputs = inputs
        self.outputs = outputs
        self.device = device
        self.limits = cfg.limits
        self.max_batch_size = 0
        self._report: dict[str, float] = {}

    def preprocess(self, batch: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Each input stacked over the requests, as the session takes it (BYTES as ``str``).

        Raises:
            ValueError: the requests' non-batch dimensions differ (see ``batch_key``).
        """
        feeds: dict[str, np.ndarray] = {}
        for spec, array in zip(self.inputs, stack(self.inputs, batch), strict=True):
            if spec.datatype == "BYTES":
                text = np.empty(array.shape, dtype=object)
                text.reshape(-1)[:] = [
                    v.decode("utf-8") if isinstance(v, bytes) else v for v in array.reshape(-1)
                ]
                array = text
            else:
                array = np.ascontiguousarray(array, dtype=DATATYPES[spec.datatype].numpy)
            feeds[spec.name] = array
        return feeds

    def execute(self, prepared: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the session; every declared output by name, in its declared datatype.

        Raises:
            RuntimeError: an output whose rows are not the batch's.
        """
        names = [spec.name for spec in self.outputs]
        values = self.session.run(names, prepared)
        rows = next(iter(prepared.values())).shape[0]
        out: dict[str, np.ndarray] = {}
        for spec, value in zip(self.outputs, values, strict=True):
            array = np.asarray(value)
            if array.ndim == 0 or array.shape[0] != rows:
                raise RuntimeError(
                    f"model '{self.name}' output '{spec.name}' has shape {list(array.shape)} "
                    f"for {rows} input rows"
                )
            if spec.datatype == "BYTES":
                out[spec.name] = np.array(
                    [str(v).encode("utf-8") for v in array.reshape(-1)], dtype=object
                ).reshape(array.shape)
            else:
                out[spec.name] = array.astype(DATATYPES[spec.datatype].host, copy=False)
        return out


def session_options() -> ort.SessionOptions:
    """Session options for serving (see the module docstring)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    raw = os.environ.get(THREADS_ENV)
    options.intra_op_num_threads = int(raw) if raw and raw.isdigit() and int(raw) > 0 else default_threads()
    options.inter_op_num_threads = 1
    return options


def load_onnx(cfg: RuntimeConfig) -> OnnxModel:
    """Load ``cfg.model.source`` into an ONNX Runtime session on the resolved device.

    Raises:
        FileNotFoundError: no model file there.
        QuantizationError: a quantization mode other than ``none``.
        ValueError: a tensor that cannot be served or an override that does not fit the model; CUDA
            asked for where this onnxruntime has no CUDA provider.
    """
    started = time.perf_counter()
    if cfg.quantization.mode != "none":
        raise QuantizationError(
            f"quantization '{cfg.quantization.mode}' is not supported for ONNX models yet; quantize "
            "before export, or use 'none'"
        )
    path = model_file(cfg.model.source)
    device = resolve_engine_device(cfg.device)
    providers = ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise ValueError(
                "device cuda: this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
            )
        providers.insert(0, "CUDAExecutionProvider")
    session = ort.InferenceSession(str(path), sess_options=session_options(), providers=providers)
    inputs = refine(declared_tensors(session.get_inputs(), "input"), list(cfg.model.inputs), "inputs", "ONNX")
    outputs = refine(
        declared_tensors(session.get_outputs(), "output"), list(cfg.model.outputs), "outputs", "ONNX"
    )
    model = OnnxModel(
        name=cfg.model.name, session=session, inputs=inputs, outputs=outputs, device=device, cfg=cfg
    )
    model._report[REPORT_LOAD_SECONDS] = time.perf_counter() - started
    log.info(
        "loaded ONNX %s from %s on %s (%s), inputs %s, outputs %s",
        cfg.model.name,
        path,
        device,
        ", ".join(session.get_providers()),
        [(t.name, t.datatype, t.shape) for t in inputs],
        [(t.name, t.datatype, t.shape) for t in outputs],
    )
    return model
