"""Open Inference Protocol datatypes: one table of what each one is in numpy and in torch.

Every other table of datatypes in the runtime reads from ``DATATYPES``: the protocol codec
(``kubeinfer.runtime.protocol``: decoding, encoding, ``datatype_of``), the gRPC transport's typed
contents (``kubeinfer.runtime.grpc_server``), the input checks of
``ServableModel.validate`` (``kubeinfer.runtime.models.base``) and the TorchScript loader's casts
(``kubeinfer.runtime.models.torchscript``).

Sources: the datatypes of the Open Inference Protocol (``kserve/open-inference-protocol``,
"Tensor Data Types"), numpy, ``ml_dtypes.bfloat16`` for BF16 (numpy has no bfloat16).

Two sets of names:

- every protocol datatype (``ProtocolDatatype``, the table's keys): what a request may carry and the
  codec decodes;
- the datatypes a model may *declare* for its inputs and outputs (``kubeinfer.runtime.config.Datatype``,
  the entries with ``declarable``): the protocol's set without UINT16, UINT32 and UINT64, which
  torch cannot compute with. ``config`` keeps its own ``Literal`` so that the operator, which imports
  ``config``, needs no numpy; a unit test checks the two agree.

torch is imported lazily (``torch_dtype``): the codec and the batcher's unit tests stay cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    import torch

ProtocolDatatype = Literal[
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "BF16",
    "FP32",
    "FP64",
    "BYTES",
]


@dataclass(frozen=True)
class DatatypeInfo:
    """What one protocol datatype is on the host and on the device.

    Attributes:
        numpy: dtype of a decoded tensor (BYTES: ``object`` arrays of ``bytes``; BF16:
            ``ml_dtypes.bfloat16``).
        accepted: numpy dtype names a model accepts for an input declared with this datatype
            (BF16 also takes float32; BYTES also ``bytes`` arrays).
        torch: name of the ``torch`` attribute of the dtype a tensor of it becomes, or None where
            the runtime does not compute with it (BYTES, UINT16/32/64).
        host: numpy dtype a model's torch output of this datatype is returned as (BF16 widened to
            float32: ``torch.Tensor.numpy()`` has no bfloat16).
        declarable: a model may declare an input or output of this datatype
            (``kubeinfer.runtime.config.Datatype``).
        contents: the gRPC ``InferTensorContents`` field that holds its values when a request sends
            them typed rather than in ``raw_input_contents``, or None where the protocol has none
            (FP16, BF16: raw only).
        onnx: the ONNX Runtime type string of a tensor of it (``NodeArg.type``, ``tensor(float)``).
    """

    numpy: np.dtype[Any]
    accepted: tuple[str, ...]
    torch: str | None
    host: np.dtype[Any]
    declarable: bool
    contents: str | None = None
    onnx: str | None = None


def _plain(
    dtype: Any, torch_name: str | None, contents: str | None, onnx: str, *, declarable: bool = True
) -> DatatypeInfo:
    dt = np.dtype(dtype)
    return DatatypeInfo(dt, (dt.name,), torch_name, dt, declarable, contents, onnx)


#: Every protocol datatype, in the protocol's order (error messages list them in this order).
DATATYPES: dict[str, DatatypeInfo] = {
    "BOOL": _plain(np.bool_, "bool", "bool_contents", "tensor(bool)"),
    "UINT8": _plain(np.uint8, "uint8", "uint_contents", "tensor(uint8)"),
    "UINT16": _plain(np.uint16, None, "uint_contents", "tensor(uint16)", declarable=False),
    "UINT32": _plain(np.uint32, None, "uint_contents", "tensor(uint32)", declarable=False),
    "UINT64": _plain(np.uint64, None, "uint64_contents", "tensor(uint64)", declarable=False),
    "INT8": _plain(np.int8, "int8", "int_contents", "tensor(int8)"),
    "INT16": _plain(np.int16, "int16", "int_contents", "tensor(int16)"),
    "INT32": _plain(np.int32, "int32", "int_contents", "tensor(int32)"),
    "INT64": _plain(np.int64, "int64", "int64_contents", "tensor(int64)"),
    "FP16": _plain(np.float16, "float16", None, "tensor(float16)"),
    "BF16": DatatypeInfo(
        np.dtype(ml_dtypes.bfloat16),
        ("bfloat16", "float32"),
        "bfloat16",
        np.dtype(np.float32),
        True,
        None,
        "tensor(bfloat16)",
    ),
    "FP32": _plain(np.float32, "float32", "fp32_contents", "tensor(float)"),
    "FP64": _plain(np.float64, "float64", "fp64_contents", "tensor(double)"),
    "BYTES": DatatypeInfo(
        np.dtype(object),
        ("object", "bytes"),
        None,
        np.dtype(object),
        True,
        "bytes_contents",
        "tensor(string)",
    ),
}

#: numpy dtype of each protocol datatype (``DATATYPES[name].numpy``).
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {name: info.numpy for name, info in DATATYPES.items()}

#: Protocol datatype of an ONNX Runtime tensor type (``tensor(float)`` -> ``FP32``).
ONNX_TO_DATATYPE: dict[str, str] = {info.onnx: name for name, info in DATATYPES.items() if info.onnx}

#: Protocol datatype of a numpy dtype name (``float32`` -> ``FP32``, ``object`` -> ``BYTES``).
NUMPY_TO_DATATYPE: dict[str, str] = {info.numpy.name: name for name, info in DATATYPES.items()}


def datatype_of(array: np.ndarray) -> str:
    """The protocol datatype of a numpy array (object -> BYTES). Raises ``ValueError`` if none."""
    name = _DATATYPE_OF_DTYPE.get(array.dtype)  # a dtype's ``name`` is a Python property: slower
    if name is None:
        raise ValueError(f"no protocol datatype for numpy dtype {array.dtype}")
    return name


#: Protocol datatype of each numpy dtype of ``NUMPY_DTYPES`` (equal dtypes hash equal).
_DATATYPE_OF_DTYPE: dict[np.dtype[Any], str] = {info.numpy: name for name, info in DATATYPES.items()}


def torch_dtype(datatype: str) -> torch.dtype:
    """The torch dtype of a declared datatype. Raises ``ValueError`` for one torch cannot compute with
    (BYTES, UINT16/32/64) and ``KeyError`` for a name that is no protocol datatype."""
    name = DATATYPES[datatype].torch
    if name is None:
        raise ValueError(f"datatype {datatype} has no torch dtype")
    import torch

    dtype: torch.dtype = getattr(torch, name)
    return dtype
