"""Models of declared tensors (TorchScript, ONNX, torch.export): what they share apart from their engine.

A model that declares its own tensors (ONNX, torch.export) becomes ``TensorConfig`` s through
``model_tensor`` (the first dimension must be dynamic: it is the batch) and ``refine`` (the
configuration's ``model.inputs/outputs`` may only fix what the model leaves dynamic).

A tensor model takes and gives tensors whose first dimension is the batch; requests batch together
when every input's other dimensions agree (``batch_key``), and a batch is each input's requests
concatenated on that dimension (``stack``). Warmup runs seeded random inputs (``random_inputs``) at
batch sizes 1, 2, 4, ..., the maximum, once for each size of ``warmup_dims`` (``warmup.dims``) that the
variable non-batch dimensions take, so that the first request at a warmed length finds the
engine's allocations and kernels for it ready. The engine's part is ``preprocess`` (the stacked arrays to its
own tensors) and ``execute``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from kubeinfer.runtime.config import TensorConfig
from kubeinfer.runtime.dtypes import DATATYPES
from kubeinfer.runtime.models.base import (
    REPORT_WARMUP_SECONDS,
    ServableModel,
    WarmupPass,
    batch_buckets,
    run_warmup,
)

#: Size of a variable (-1) non-batch dimension in warmup and example inputs.
EXAMPLE_DIM = 8


def model_tensor(
    kind: str, what: str, name: str, datatype: str, dims: Sequence[int | None], shown: object
) -> TensorConfig:
    """The ``TensorConfig`` of a tensor a model declares: dimensions ``dims`` (None: dynamic, served
    as -1), the first of which must be dynamic (the batch). ``kind`` (``ONNX``, ``pt2``) and ``what``
    (``input``, ``output``) name it in errors, ``shown`` is the model's own rendering of its shape.

    Raises:
        ValueError: no dimensions, or a fixed first dimension, naming the tensor.
    """
    shape = [-1 if d is None or d < 0 else d for d in dims]
    if not shape or shape[0] != -1:
        raise ValueError(
            f"{kind} {what} '{name}': shape {shown} has a fixed first dimension; the first "
            "dimension is the batch: export the model with a dynamic batch axis"
        )
    return TensorConfig.model_validate({"name": name, "datatype": datatype, "shape": shape})


def refine(model: list[TensorConfig], given: list[TensorConfig], what: str, kind: str) -> list[TensorConfig]:
    """The model's tensors, refined by ``given`` (the configuration's ``model.<what>``, when not
    empty): the same names and datatypes, the same rank, -1 first, and any dimension the model fixes
    kept. ``kind`` (``ONNX``, ``pt2``) names the model in errors.

    Raises:
        ValueError: a name the model does not have (or lacks one it has), another datatype or rank,
            or a dimension that contradicts the model's.
    """
    if not given:
        return model
    by_name = {t.name: t for t in model}
    if sorted(by_name) != sorted(t.name for t in given):
        raise ValueError(
            f"model.{what} names {sorted(t.name for t in given)}, the {kind} model has {sorted(by_name)}"
        )
    for t in given:
        own = by_name[t.name]
        if t.datatype != own.datatype:
            raise ValueError(
                f"model.{what} '{t.name}': datatype {t.datatype}, the {kind} model has {own.datatype}"
            )
        if (
            len(t.shape) != len(own.shape)
            or t.shape[0] != -1
            or any(o != -1 and g != o for g, o in zip(t.shape, own.shape, strict=True))
        ):
            raise ValueError(
                f"model.{what} '{t.name}': shape {t.shape} does not fit the {kind} model's {own.shape}"
            )
    return [t for t in given]


def stack(specs: Sequence[TensorConfig], batch: Sequence[Mapping[str, np.ndarray]]) -> list[np.ndarray]:
    """Each declared input over the requests, concatenated on the batch dimension (request order).

    Raises:
        ValueError: the requests' non-batch dimensions differ (``TensorModel.batch_key`` keeps such
            requests apart).
    """
    arrays = []
    for spec in specs:
        parts = [np.asarray(request[spec.name]) for request in batch]
        shapes = {p.shape[1:] for p in parts}
        if len(shapes) > 1:
            raise ValueError(f"input tensor '{spec.name}': requests in one batch differ in shape {shapes}")
        arrays.append(np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0])
    return arrays


def random_inputs(
    specs: Sequence[TensorConfig], rows: int, seed: int = 0, dim: int = EXAMPLE_DIM
) -> dict[str, np.ndarray]:
    """Seeded random inputs of ``rows`` rows for ``specs``; -1 non-batch dimensions take ``dim``;
    BYTES inputs are short ASCII strings."""
    rng = np.random.default_rng(seed)
    data: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = [rows] + [dim if d == -1 else d for d in spec.shape[1:]]
        if spec.datatype in ("FP16", "BF16", "FP32", "FP64"):
            array = rng.standard_normal(shape).astype(np.float16 if spec.datatype == "FP16" else np.float32)
            if spec.datatype == "FP64":
                array = array.astype(np.float64)
        elif spec.datatype == "BOOL":
            array = rng.integers(0, 2, shape).astype(np.bool_)
        elif spec.datatype == "BYTES":
            array = np.array(
                [f"x{v}".encode() for v in rng.integers(0, 100, int(np.prod(shape)))], dtype=object
            )
            array = array.reshape(shape)
        else:
            array = rng.integers(0, 100, shape).astype(DATATYPES[spec.datatype].host)
        data[spec.name] = array
    return data


class TensorModel(ServableModel):
    """The part of a declared-tensor model its engine does not change (see the module docstring).

    Subclasses set the ``ServableModel`` attributes and ``_report``, and implement ``preprocess`` and
    ``execute``.
    """

    _report: dict[str, float]
    #: The sizes the variable non-batch dimensions take in warmup (``warmup.dims``, set by ``load_model``).
    warmup_dims: tuple[int, ...] = (EXAMPLE_DIM,)

    def batch_key(self, inputs: Mapping[str, np.ndarray]) -> Any:
        """Requests batch together only if every input has the same non-batch dimensions."""
        return tuple(tuple(inputs[spec.name].shape[1:]) for spec in self.inputs)

    def example_inputs(self, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded random inputs of ``rows`` rows (``random_inputs``)."""
        return random_inputs(self.inputs, rows, seed)

    def warmup_passes(self, max_batch_size: int) -> list[WarmupPass]:
        """Batch sizes 1, 2, 4, ..., ``max_batch_size`` at each size of ``warmup_dims`` of the variable
        non-batch dimensions (once when there is none), in that order. A pass the model refuses raises
        ``ValueError`` naming ``warmup.dims``, the size and the input shapes (the engine's error is its
        cause): a size its variable dimensions cannot take (a fixed or bounded dimension the model
        declares dynamic, two that must agree)."""
        variable = any(d == -1 for spec in self.inputs for d in spec.shape[1:])
        return [
            WarmupPass(rows, dim if variable else None, functools.partial(self._warm, rows, dim, variable))
            for dim in (self.warmup_dims if variable else self.warmup_dims[:1])
            for rows in batch_buckets(max_batch_size)
        ]

    def _warm(self, rows: int, dim: int, variable: bool) -> object:
        inputs = random_inputs(self.inputs, rows, dim=dim)
        try:
            return self.execute(self.preprocess([inputs]))
        except Exception as exc:
            shapes = ", ".join(f"'{n}' {list(a.shape)}" for n, a in inputs.items())
            hint = (
                f"; if the model cannot take {dim} there, set warmup.dims to sizes every variable "
                "(-1) dimension of the inputs can take (or fix the dimension in model.inputs)"
                if variable
                else ""
            )
            raise ValueError(
                f"{f'warmup.dims size {dim}' if variable else 'warmup'}: the model refuses a warmup "
                f"batch of {rows} row(s) with inputs {shapes}: {type(exc).__name__}: "
                f"{str(exc).strip()[:500]}{hint}"
            ) from exc

    def warmup(self, max_batch_size: int, steps: int) -> float:
        """Run ``warmup_passes`` ``steps`` times each; return seconds.

        Raises:
            ValueError: the model refuses a warmup batch (see ``warmup_passes``).
        """
        seconds = run_warmup(self.warmup_passes(max_batch_size), steps)
        self.max_batch_size = max_batch_size
        self._report[REPORT_WARMUP_SECONDS] = seconds
        return seconds

    def report(self) -> dict[str, float]:
        """Load, comparison and warmup seconds, and the deviation figures that apply."""
        return dict(self._report)
