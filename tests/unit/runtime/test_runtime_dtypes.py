"""The one datatype table (kubeinfer.runtime.dtypes) agrees with the config's Literal and with numpy/torch."""

from __future__ import annotations

from typing import get_args

import ml_dtypes
import numpy as np
import pytest
import torch
from kubeinfer.runtime.config import Datatype
from kubeinfer.runtime.dtypes import (
    DATATYPES,
    NUMPY_TO_DATATYPE,
    ProtocolDatatype,
    datatype_of,
    torch_dtype,
)


def test_table_keys_are_the_protocol_datatypes_and_declarable_ones_the_config_literal() -> None:
    assert list(DATATYPES) == list(get_args(ProtocolDatatype))
    assert {name for name, info in DATATYPES.items() if info.declarable} == set(get_args(Datatype))
    assert set(DATATYPES) - set(get_args(Datatype)) == {"UINT16", "UINT32", "UINT64"}


@pytest.mark.parametrize("name", list(DATATYPES))
def test_numpy_dtype_round_trips_through_datatype_of(name: str) -> None:
    array = np.zeros(3, dtype=DATATYPES[name].numpy)
    assert datatype_of(array) == name
    assert NUMPY_TO_DATATYPE[DATATYPES[name].numpy.name] == name
    assert DATATYPES[name].numpy.name in DATATYPES[name].accepted


def test_bf16_is_ml_dtypes_on_the_host_float32_out_and_accepts_float32() -> None:
    assert DATATYPES["BF16"].numpy == np.dtype(ml_dtypes.bfloat16)
    assert DATATYPES["BF16"].accepted == ("bfloat16", "float32")
    assert DATATYPES["BF16"].host == np.dtype(np.float32)
    assert DATATYPES["BYTES"].accepted == ("object", "bytes")


@pytest.mark.parametrize("name", [n for n, i in DATATYPES.items() if i.torch is not None])
def test_torch_dtype_has_the_numpy_dtypes_width(name: str) -> None:
    dtype = torch_dtype(name)
    assert isinstance(dtype, torch.dtype)
    assert dtype.itemsize == DATATYPES[name].numpy.itemsize


def test_no_torch_dtype_for_bytes_and_wide_unsigned() -> None:
    for name in ("BYTES", "UINT16", "UINT32", "UINT64"):
        with pytest.raises(ValueError, match=name):
            torch_dtype(name)


def test_datatype_of_refuses_a_dtype_outside_the_protocol() -> None:
    with pytest.raises(ValueError, match="complex128"):
        datatype_of(np.zeros(1, dtype=np.complex128))
    with pytest.raises(ValueError, match="no protocol datatype"):
        datatype_of(np.zeros(1, dtype=">f4"))
