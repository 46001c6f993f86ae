"""Adversarial request bodies against the v2 codec: each is a 400 ``ProtocolError``, never another
exception (which the server would turn into a 500)."""

from __future__ import annotations

import json
import re

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


def _with(**fields: object) -> bytes:
    """A valid request of one FP32 input ``x`` with ``fields`` set on the request (``input_parameters``,
    ``output_parameters``: on its input, on its one output ``y``)."""
    tensor: dict[str, object] = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}
    if "input_parameters" in fields:
        tensor["parameters"] = fields.pop("input_parameters")
    if "output_parameters" in fields:
        fields["outputs"] = [{"name": "y", "parameters": fields.pop("output_parameters")}]
    return json.dumps({"inputs": [tensor], **fields}).encode()


# Found by the fuzz test of the Open Inference Protocol's REST spec (test_runtime_openapi_fuzz.py): a falsy
# value of the wrong type was read as the field's absence (`"outputs": false` as all outputs), an id of any
# JSON type was sent back as its Python text (`"id": false` as "False"); each was answered 200.
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"outputs": False}, "request 'outputs' must be a list"),
        ({"outputs": {}}, "request 'outputs' must be a list"),
        ({"outputs": 0}, "request 'outputs' must be a list"),
        ({"parameters": False}, "request 'parameters' must be a JSON object"),
        ({"parameters": []}, "request 'parameters' must be a JSON object"),
        ({"parameters": ""}, "request 'parameters' must be a JSON object"),
        ({"input_parameters": False}, "input tensor 'x': 'parameters' must be an object"),
        ({"input_parameters": []}, "input tensor 'x': 'parameters' must be an object"),
        ({"output_parameters": 0}, "output 'y': 'parameters' must be an object"),
        ({"output_parameters": []}, "output 'y': 'parameters' must be an object"),
        ({"id": False}, "request 'id' must be a string, got bool"),
        ({"id": []}, "request 'id' must be a string, got list"),
        ({"id": {"a": 1}}, "request 'id' must be a string, got dict"),
        # a binary flag is JSON true or false, as Triton's server takes it: "false" is not false
        ({"parameters": {"binary_data_output": "false"}}, "'binary_data_output' must be true or false"),
        ({"parameters": {"binary_data_output": 1}}, "'binary_data_output' must be true or false"),
        ({"output_parameters": {"binary_data": "false"}}, "output 'y': parameter 'binary_data' must be"),
        ({"output_parameters": {"binary_data": 0}}, "output 'y': parameter 'binary_data' must be"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else None,
)
def test_a_field_of_the_wrong_type_is_a_protocol_error_even_when_falsy(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ProtocolError, match=re.escape(message)):
        decode_request(_with(**fields))


@pytest.mark.parametrize(
    ("fields", "rid", "outputs"),
    [
        ({"outputs": None, "parameters": None, "id": None}, None, {}),  # JSON null: the field is absent
        ({"input_parameters": None, "output_parameters": None}, None, {"y": None}),
        ({"id": "a-1"}, "a-1", {}),
        ({"id": 7}, "7", {}),  # a number is kept as its text
        ({"outputs": []}, None, {}),
        ({"parameters": {}, "input_parameters": {}, "output_parameters": {}}, None, {"y": None}),
        (
            {"parameters": {"binary_data_output": None}, "output_parameters": {"binary_data": True}},
            None,
            {"y": True},
        ),
        ({"output_parameters": {"binary_data": False}}, None, {"y": False}),
    ],
)
def test_null_and_empty_fields_of_the_right_type_pass(
    fields: dict[str, object], rid: str | None, outputs: dict[str, object]
) -> None:
    req = decode_request(_with(**fields))
    assert (req.id, req.outputs, req.inputs["x"].tolist()) == (rid, outputs, [1.0])
