"""The v2 codec: round trips with tritonclient's own encoders and decoders, and its error messages."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from kubeinfer.runtime.protocol import (
    InferRequest,
    ProtocolError,
    RegionRef,
    decode_request,
    deserialize_bytes,
    encode_response,
    serialize_bytes,
)
from tritonclient.http._utils import _get_inference_request
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

ARRAYS = {
    "FP32": np.array([[1.5, -2.0], [3.25, 4.0]], dtype=np.float32),
    "FP16": np.array([[0.5, 1.0, -3.0]], dtype=np.float16),
    "FP64": np.array([1e-300, 2.0], dtype=np.float64),
    "INT64": np.array([[1, -(2**40)]], dtype=np.int64),
    "INT32": np.array([7, -8, 9], dtype=np.int32),
    "UINT8": np.array([0, 255], dtype=np.uint8),
    "BOOL": np.array([[True, False], [False, True]]),
    "BYTES": np.array([b"hello", "caf\u00e9".encode(), b""], dtype=object),
}


def triton_request(
    arrays: dict[str, np.ndarray], binary: bool, outputs: list[str] | None = None
) -> tuple[bytes, int | None]:
    inputs = []
    for name, arr in arrays.items():
        dt = name.split("_")[0]
        inp = httpclient.InferInput(name, list(arr.shape), dt)
        inp.set_data_from_numpy(arr, binary_data=binary or dt == "BF16")
        inputs.append(inp)
    outs = [httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs] if outputs else None
    body, header = _get_inference_request(inputs, "req-1", outs, 0, False, False, 0, None, None)
    return (body if isinstance(body, bytes) else body.encode()), header


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_request_decodes_to_the_same_arrays(binary: bool) -> None:
    body, header = triton_request(ARRAYS, binary)
    req = decode_request(body, header)
    assert req.id == "req-1"
    assert req.binary_data_output  # tritonclient asks for binary outputs when it names none
    for name, arr in ARRAYS.items():
        got = req.inputs[name]
        assert got.shape == arr.shape and got.dtype == arr.dtype, name
        assert got.tolist() == arr.tolist(), name


def test_bf16_is_binary_and_roundtrips() -> None:
    arr = np.array([[1.0, -2.5, 3.0]], dtype=np.float32)
    body, header = triton_request({"BF16": arr.astype(ml_dtypes.bfloat16)}, True)
    req = decode_request(body, header)
    assert req.inputs["BF16"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(req.inputs["BF16"].astype(np.float32), arr)
    out_body, out_header = encode_response(
        "m", {"o": req.inputs["BF16"]}, InferRequest(None, {}, binary_data_output=True)
    )
    assert out_header is not None
    result = httpclient.InferResult.from_response_body(out_body, header_length=out_header)
    np.testing.assert_array_equal(result.as_numpy("o").astype(np.float32), arr)
    raw = np.frombuffer(out_body[out_header:], dtype="<u2").astype(np.uint32) << 16  # bf16 = top half of fp32
    np.testing.assert_array_equal(raw.view(np.float32).reshape(1, 3), arr)


def test_bytes_serialization_matches_tritonclient() -> None:
    arr = ARRAYS["BYTES"]
    assert serialize_bytes(arr) == serialize_byte_tensor(arr).item()
    assert (
        deserialize_bytes(serialize_bytes(arr), 3, "t").tolist()
        == deserialize_bytes_tensor(serialize_bytes(arr)).tolist()
    )


@pytest.mark.parametrize("binary", [False, True])
def test_responses_parse_with_tritonclient(binary: bool) -> None:
    outputs = {k.lower(): v for k, v in ARRAYS.items() if k != "BYTES"}
    outputs["text"] = ARRAYS["BYTES"]
    req = InferRequest("abc", {}, outputs={n: binary for n in outputs})
    body, header = encode_response("m", outputs, req)
    assert (header is not None) == binary
    result = httpclient.InferResult.from_response_body(body, header_length=header)
    assert result.get_response()["id"] == "abc"
    for name, arr in outputs.items():
        got = result.as_numpy(name)
        assert got is not None and got.shape == arr.shape, name
        if name == "text":
            assert [bytes(x) if isinstance(x, bytes) else x.encode() for x in got.reshape(-1)] == list(arr)
        else:
            assert got.tolist() == arr.tolist(), name


def test_an_output_in_shared_memory_has_neither_data_nor_parameters_as_triton_answers_it() -> None:
    # Triton's C++ client reads any output with parameters as binary data and then fails on the missing
    # binary_data_size; Triton's server gives a shared-memory output only its name, datatype and shape.
    outputs = {"a": np.ones((1, 2), np.float32), "b": np.zeros(1, np.int64)}
    req = InferRequest(None, {}, outputs={"a": True, "b": None}, shm_outputs={"a": RegionRef("r", 0, 8)})
    body, header = encode_response("m", outputs, req)
    assert header is None
    entries = {e["name"]: e for e in json.loads(body)["outputs"]}
    assert entries["a"] == {"name": "a", "datatype": "FP32", "shape": [1, 2]}
    assert entries["b"]["data"] == [0]


def test_only_requested_outputs_and_per_output_binary_flag() -> None:
    outputs = {"a": np.ones((1, 2), np.float32), "b": np.zeros(1, np.int64)}
    req = InferRequest(None, {}, outputs={"b": False}, binary_data_output=True)
    body, header = encode_response("m", outputs, req)
    assert header is None and b'"name":"b"' in body and b'"name":"a"' not in body


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"inputs": []}', "non-empty 'inputs'"),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP33", "shape": [1], "data": [1]}]}',
            "unknown datatype 'FP33'",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1]}]}',
            r"shape \[2\] needs 2 elements",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [1.5]}]}',
            "expects integers",
        ),
        (b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": [1]}]}', "must be strings"),
        (
            b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [4294967296]}]}',
            "out of range",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}]}',
            "non-negative integers",
        ),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}', "neither 'data' nor"),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], '
            b'"parameters": {"binary_data_size": 4}}]}',
            "runs past the end",
        ),
    ],
)
def test_malformed_requests_name_the_problem(doc: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message) as info:
        decode_request(doc)
    assert info.value.status == 400
    if b'"name": "x"' in doc:
        assert "'x'" in str(info.value)


def test_binary_size_mismatch_and_trailing_bytes() -> None:
    header = (
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], '
        + b'"parameters": {"binary_data_size": 4}}]}'
    )
    with pytest.raises(ProtocolError, match="needs 8 bytes"):
        decode_request(header + b"\0" * 4, len(header))
    with pytest.raises(ProtocolError, match="bytes after the last input"):
        decode_request(header.replace(b"[2]", b"[1]") + b"\0" * 6, len(header))
    bad_bytes = (
        b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [2], '
        b'"parameters": {"binary_data_size": 9}}]}'
    )
    huge = bad_bytes.replace(b"[2]", b"[1099511627776]")
    with pytest.raises(ProtocolError, match="need at least"):  # no allocation of 2**40 elements
        decode_request(huge + serialize_bytes(np.array([b"hello"], dtype=object)), len(huge))
    with pytest.raises(ProtocolError, match="BYTES data ends after 1 of 2"):
        decode_request(bad_bytes + serialize_bytes(np.array([b"hello"], dtype=object)), len(bad_bytes))


def test_nested_json_data_and_parameters() -> None:
    doc = (
        b'{"id": 5, "parameters": {"priority": 1, "timeout": 2000}, '
        b'"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]}'
    )
    req = decode_request(doc)
    assert req.id == "5" and req.priority == 1 and req.timeout_us == 2000
    assert req.inputs["x"].dtype == np.float32 and req.inputs["x"].tolist() == [[1, 2], [3, 4]]
