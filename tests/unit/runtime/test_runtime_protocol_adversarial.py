"""Adversarial request bodies against the v2 codec: each is a 400 ``ProtocolError``, never another
exception (which the server would turn into a 500)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from kubeinfer.runtime.protocol import ProtocolError, decode_request


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # an array is refused as one before its nesting is read
        (b"[" * 100_000 + b"]" * 100_000, "must be a JSON object"),
        (
            b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":'
            + b"[" * 5_000
            + b'"a"'
            + b"]" * 5_000
            + b"}]}",
            "nested too deeply",
        ),
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "nested too deeply"),
    ],
    ids=["nested-arrays", "nested-data", "nested-objects"],
)
def test_deeply_nested_json_is_a_protocol_error(body: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_request(body)


@pytest.mark.parametrize(
    ("datatype", "value"), [("FP32", 1e300), ("FP16", 70000.0), ("BF16", 1e39), ("FP32", -1e39)]
)
def test_json_float_beyond_the_datatype_is_a_protocol_error(datatype: str, value: float) -> None:
    # it became inf silently, and the model's output went back as JSON null
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [1], "data": [value]}]})
    with pytest.raises(ProtocolError, match=f"'x': value .* is out of range for {datatype}"):
        decode_request(body.encode())


@pytest.mark.parametrize(("datatype", "value"), [("FP32", 3.4e38), ("FP16", 65000.0), ("FP64", 1e308)])
def test_json_float_within_the_datatype_passes(datatype: str, value: float) -> None:
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [1], "data": [value]}]})
    assert np.isfinite(decode_request(body.encode()).inputs["x"].astype(np.float64)).all()
