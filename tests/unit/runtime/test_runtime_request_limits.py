"""Requests judged by their declared sizes before anything is built: the codec's limits and bounds
(``protocol.decode_request``, gRPC's ``decode_infer_request``), the JSON value counter
(``jsonscan``), the body reader (``rest.read_body``), and the malformed fields that were 500s.

Memory is measured with ``tracemalloc`` (numpy and msgspec allocate through it): the peak of a
refused request's decoding, against what a parse of its body would take (about 60 bytes per
one-character string: ~16 times its JSON).
"""

from __future__ import annotations

import gzip
import json
import random
import struct
import threading
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from kubeinfer.runtime import jsonscan
from kubeinfer.runtime.config import LimitsConfig
from kubeinfer.runtime.dataplane import DECODE_THREAD_BYTES, decode_off_loop, register_spec
from kubeinfer.runtime.errors import HTTPError, InferenceError, InputError, ProtocolError
from kubeinfer.runtime.grpc_contents import LazyModelInferRequest, count_values
from kubeinfer.runtime.grpc_server import decode_infer_request, max_message_bytes
from kubeinfer.runtime.openai_api import OpenAIError, parse_embeddings_request, parse_rerank_request
from kubeinfer.runtime.protocol import MAX_INPUTS, MAX_RANK, decode_request, serialize_bytes
from kubeinfer.runtime.rest import DECOMPRESS_STEP_BYTES, read_body
from starlette.requests import Request
from tritonclient.grpc import service_pb2

LIMITS = LimitsConfig(max_request_elements=1000, max_request_bytes=4096)


def peak_bytes(fn: Callable[[], Any]) -> int:
    """The peak of memory ``fn`` allocates (tracemalloc), whatever it raises."""
    tracemalloc.start()
    try:
        fn()
    except InferenceError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def strings_body(count: int, shape: list[int], item: bytes = b'"a"') -> bytes:
    data = b",".join([item] * count)
    return b'{"inputs":[{"name":"text","datatype":"BYTES","shape":%s,"data":[%s]}]}' % (
        json.dumps(shape).encode(),
        data,
    )


def binary_body(doc: dict[str, Any], raw: bytes) -> tuple[bytes, int]:
    header = json.dumps(doc).encode()
    return header + raw, len(header)


def bytes_input(shape: list[int], size: int) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "text", "datatype": "BYTES", "shape": shape, "parameters": {"binary_data_size": size}}
        ]
    }


# --- refused by the declared size, before anything is built --------------------------------------


def test_declared_elements_over_the_limit_are_refused_before_the_data_is_parsed() -> None:
    body = strings_body(200_000, [200_000])  # 800 KB of JSON: a parse would take ~12 MB
    with pytest.raises(
        InputError, match="'text': request has 200000 elements, over the limit of 1000"
    ) as info:
        decode_request(body, limits=LIMITS)
    assert info.value.status == 413 and info.value.tensor == "text"
    assert peak_bytes(lambda: decode_request(body, limits=LIMITS)) < 100_000  # a parse: ~12 MB


def test_a_shape_that_lies_is_refused_by_counting_not_parsing() -> None:
    body = strings_body(200_000, [1])
    with pytest.raises(ProtocolError, match=r"'text': shape \[1\] needs 1 elements, 'data' has 200000"):
        decode_request(body, limits=LIMITS)
    assert (
        peak_bytes(lambda: decode_request(body, limits=LIMITS)) < 2_000_000
    )  # the scan's blocks, not ~12 MB


def test_strings_full_of_commas_are_counted_exactly_and_decoded() -> None:
    texts = [", ".join(["[x]", "{y}", '"z"', "\\"]) * 20 for _ in range(10)]  # 10 texts, 1000s of commas
    doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [10], "data": texts}]}
    req = decode_request(json.dumps(doc).encode(), limits=LIMITS)
    assert [t.decode() for t in req.inputs["text"]] == texts


def test_data_nested_in_more_lists_than_rows_is_refused() -> None:
    body = b'{"inputs":[{"name":"t","datatype":"FP32","shape":[1],"data":[' + b"[]," * 5000 + b"1]}]}"
    with pytest.raises(
        ProtocolError,
        match="'t': 'data' holds its 1 elements in 5001 lists, more than the 1026 JSON values allowed",
    ):
        decode_request(body, limits=LIMITS)


def test_nested_rows_within_the_limits_decode() -> None:
    doc = {
        "inputs": [
            {
                "name": "x",
                "datatype": "INT8",
                "shape": [500, 2],
                "data": [[i % 100, i % 100] for i in range(500)],
            }
        ]
    }
    assert decode_request(json.dumps(doc).encode(), limits=LIMITS).inputs["x"].shape == (500, 2)


def test_the_limit_counts_every_input_together() -> None:
    doc = {
        "inputs": [
            {"name": "a", "datatype": "FP32", "shape": [600], "data": [0.0] * 600},
            {"name": "b", "datatype": "FP32", "shape": [600], "data": [0.0] * 600},
        ]
    }
    with pytest.raises(InputError, match="'b': request has 1200 elements"):
        decode_request(json.dumps(doc).encode(), limits=LIMITS)


def test_numeric_bytes_are_judged_by_the_declared_shape() -> None:
    doc = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [600], "data": [0.0] * 600}]}
    with pytest.raises(InputError, match="'x': request carries 4800 bytes, over the limit of 4096"):
        decode_request(json.dumps(doc).encode(), limits=LIMITS)


def test_json_strings_over_the_byte_limit_are_refused_before_they_are_encoded() -> None:
    doc = {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [2], "data": ["a" * 3000, "b" * 3000]}]}
    with pytest.raises(InputError, match="'t': request carries 6000 bytes"):
        decode_request(json.dumps(doc).encode(), limits=LIMITS)


def test_binary_bytes_elements_over_the_limit_are_refused_before_they_are_read() -> None:
    raw = struct.pack("<I", 0) * 100_000
    body, header = binary_body(bytes_input([100_000], len(raw)), raw)
    with pytest.raises(InputError, match="'text': request has 100000 elements"):
        decode_request(body, header, LIMITS)
    assert peak_bytes(lambda: decode_request(body, header, LIMITS)) < 100_000  # no object array
    payload = serialize_bytes(np.array([b"x" * 5000], dtype=object))
    body, header = binary_body(bytes_input([1], len(payload)), payload)
    with pytest.raises(InputError, match="'text': request carries 5000 bytes"):
        decode_request(body, header, LIMITS)


def test_without_limits_the_codec_still_decodes_large_requests() -> None:
    doc = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [5000], "data": list(range(5000))}]}
    assert decode_request(json.dumps(doc).encode()).inputs["x"].shape == (5000,)


# --- the codec's own bounds -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([1] * (MAX_RANK + 1), f"'text': shape has {MAX_RANK + 1} dimensions, at most {MAX_RANK}"),
        ([1] * 65, "'text': shape has 65 dimensions"),
        ([0, 2**64], r"'text': shape \[0, 18446744073709551616\] has more elements than an array can hold"),
        ([2**62, 4], "has more elements than an array can hold"),
    ],
    ids=["rank-33", "rank-65", "zero-by-2**64", "2**62-by-4"],
)
@pytest.mark.parametrize("encoding", ["json", "binary"])
def test_impossible_shapes_are_a_400_naming_the_tensor(shape: list[int], message: str, encoding: str) -> None:
    # they were numpy's ValueError in reshape: a 500 with a traceback
    if encoding == "json":
        doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape, "data": ["a"]}]}
        body, header = json.dumps(doc).encode(), None
    else:
        raw = serialize_bytes(np.array([b"a"], dtype=object))
        body, header = binary_body(bytes_input(shape, len(raw)), raw)
    with pytest.raises(ProtocolError, match=message) as info:
        decode_request(body, header)
    assert info.value.status == 400 and info.value.tensor == "text"


@pytest.mark.parametrize("datatype", [{}, [], 5, None], ids=["object", "list", "number", "null"])
def test_a_datatype_that_is_no_string_is_a_400(datatype: Any) -> None:
    doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": [1], "data": [1]}]}
    with pytest.raises(ProtocolError, match="'x': unknown datatype"):
        decode_request(json.dumps(doc).encode())


def test_more_inputs_than_allowed_are_counted_before_they_are_made() -> None:
    body = b'{"inputs":[' + b",".join([b"{}"] * (MAX_INPUTS + 1)) + b"]}"
    with pytest.raises(ProtocolError, match=f"{MAX_INPUTS + 1} inputs, more than the {MAX_INPUTS} allowed"):
        decode_request(body)
    # braces inside strings are no inputs
    doc = {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [5000], "data": ["{"] * 5000}]}
    assert decode_request(json.dumps(doc).encode()).inputs["t"].shape == (5000,)


def test_a_field_other_than_data_must_be_small() -> None:
    doc = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
        "parameters": {"p": "a" * 70_000},
    }
    with pytest.raises(
        ProtocolError, match=r"request 'parameters' has \d+ bytes of JSON, more than the 65536 allowed"
    ):
        decode_request(json.dumps(doc).encode())


BAD_VALUE_BODIES = [
    # a number outside the float range, in every field the outline reads (was a 500 with a traceback)
    (b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1e400],"data":[1]}]}', "input tensor 'x': 'shape'"),
    (b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1e400]}]}', "input tensor 'x': 'data'"),
    (
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],"parameters":{"priority":1e400}}',
        "request 'parameters'",
    ),
    (b'{"id":1e400,"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}]}', "request 'id'"),
    # invalid UTF-8 inside a string
    (b'{"inputs":[{"name":"x","datatype":"BYTES","shape":[1],"data":["\xff"]}]}', "input tensor 'x': 'data'"),
    (b'{"inputs":[{"name":"x","datatype":"FP\xff","shape":[1],"data":[1]}]}', "'datatype'"),
]


@pytest.mark.parametrize(("body", "field"), BAD_VALUE_BODIES)
def test_json_the_decoder_refuses_is_a_400_naming_the_field(body: bytes, field: str) -> None:
    with pytest.raises(ProtocolError, match="is not valid JSON") as info:
        decode_request(body)
    assert info.value.status == 400 and field in str(info.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"inputs": 5}', "non-empty 'inputs' list"),
        (b'{"inputs": [{"name": "x"}, 7]}', r"inputs\[1\] must be an object"),
        (b'{"inputs": [{"name": 7}]}', r"inputs\[0\] must be an object with a string 'name'"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": null}]}', "must be a"),
    ],
)
def test_the_outline_keeps_the_messages(body: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_request(body)


# --- gRPC ----------------------------------------------------------------------------------------


def grpc_request(
    shape: list[int], datatype: str = "BYTES", raw: bytes | None = None, typed: list[bytes] | None = None
) -> Any:
    """A ModelInferRequest as the server receives it (``LazyModelInferRequest``)."""
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "text", datatype
    tensor.shape.extend(shape)
    if raw is not None:
        request.raw_input_contents.append(raw)
    if typed is not None:
        tensor.contents.bytes_contents.extend(typed)
    return LazyModelInferRequest.FromString(request.SerializeToString())


@pytest.mark.parametrize(
    ("shape", "raw", "message"),
    [
        ([2**62, 4], None, r"'text': shape \[4611686018427387904, 4\] has more elements"),  # was INTERNAL
        ([1] * 65, b"", "'text': shape has 65 dimensions"),
        ([0, 2**63 - 1], b"", "has more elements than an array can hold"),
    ],
)
def test_grpc_impossible_shapes_are_a_400(shape: list[int], raw: bytes | None, message: str) -> None:
    datatype = "FP32" if raw is None else "BYTES"
    with pytest.raises(ProtocolError, match=message) as info:
        decode_infer_request(grpc_request(shape, datatype, raw))
    assert info.value.status == 400


def test_grpc_typed_contents_over_the_limit_are_refused_before_they_are_parsed() -> None:
    serialized = grpc_request([100_000], typed=[b""] * 100_000).SerializeToString()
    # parsed as ModelInferRequest, these 200 KB took ~1.6 MB (16 bytes an element); as the server
    # parses them, one copy of the contents' bytes
    assert peak_bytes(lambda: LazyModelInferRequest.FromString(serialized)) < 2 * len(serialized)
    request = LazyModelInferRequest.FromString(serialized)
    with pytest.raises(InputError, match="'text': request has 100000 elements"):
        decode_infer_request(request, LIMITS)
    assert peak_bytes(lambda: decode_infer_request(request, LIMITS)) < 100_000


def test_grpc_typed_contents_beyond_the_shape_are_counted_not_parsed() -> None:
    request = grpc_request([10], typed=[b""] * 100_000)
    with pytest.raises(ProtocolError, match=r"'text': shape \[10\] needs 10 elements, contents holds more"):
        decode_infer_request(request, LIMITS)
    # a copy of the contents' 200 KB (protobuf hands a bytes field out as a copy); a parse: ~2.4 MB
    assert peak_bytes(lambda: decode_infer_request(request, LIMITS)) < 400_000


def test_grpc_typed_contents_within_the_limits_decode() -> None:
    request = grpc_request([3], typed=[b"a", b"", b"xyz"])
    assert decode_infer_request(request, LIMITS)[0]["text"].tolist() == [b"a", b"", b"xyz"]
    numbers = service_pb2.ModelInferRequest()
    tensor = numbers.inputs.add()
    tensor.name, tensor.datatype = "x", "INT64"
    tensor.shape.append(3)
    tensor.contents.int64_contents.extend([1, -5, 2**40])
    lazy = LazyModelInferRequest.FromString(numbers.SerializeToString())
    assert decode_infer_request(lazy, LIMITS)[0]["x"].tolist() == [1, -5, 2**40]
    assert decode_infer_request(numbers, LIMITS)[0]["x"].tolist() == [1, -5, 2**40]  # parsed already
    assert count_values(lazy.inputs[0].contents, 10) == ({"int64_contents": 3}, True)
    assert count_values(lazy.inputs[0].contents, 2) == ({"int64_contents": 3}, False)


def test_grpc_raw_bytes_over_the_limits_are_refused_before_they_are_read() -> None:
    with pytest.raises(InputError, match="request has 100000 elements"):
        decode_infer_request(grpc_request([100_000], raw=struct.pack("<I", 0) * 100_000), LIMITS)
    payload = serialize_bytes(np.array([b"x" * 5000], dtype=object))
    with pytest.raises(InputError, match="request carries 5000 bytes"):
        decode_infer_request(grpc_request([1], raw=payload), LIMITS)


def test_the_grpc_message_cap_is_the_tensor_limits_not_four_times_them() -> None:
    limits = LimitsConfig()  # 16 MiB, 1M elements
    cap = max_message_bytes(limits)
    assert limits.max_request_bytes + 4 * limits.max_request_elements < cap < 2 * limits.max_request_bytes


# --- the JSON value counter ----------------------------------------------------------------------


def _counts(value: Any) -> tuple[int, int]:
    """(scalars, containers) of a JSON value, object keys counted as scalars."""
    if isinstance(value, list | dict):
        items = list(value.values()) if isinstance(value, dict) else value
        inner = [_counts(v) for v in items]
        return sum(s for s, _ in inner) + (len(value) if isinstance(value, dict) else 0), 1 + sum(
            c for _, c in inner
        )
    return 1, 0


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 4 and roll < 0.25:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if depth < 4 and roll < 0.35:
        return {_random_text(rng): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if roll < 0.65:
        return _random_text(rng)
    return rng.choice([1, -2.5e-3, True, False, None, 123456789, 0.0])


def _random_text(rng: random.Random) -> str:
    return "".join(rng.choice('ab"\\,[]{}: \n\u00e9') for _ in range(rng.randint(0, 6)))


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, jsonscan.BLOCK_BYTES])
def test_the_scan_counts_exactly_across_block_boundaries(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonscan, "BLOCK_BYTES", block)
    rng = random.Random(block)
    for _ in range(300):
        value = (
            [_random_value(rng, 1) for _ in range(rng.randint(0, 5))]
            if rng.random() < 0.8
            else _random_value(rng)
        )
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1])).encode()
        counts = jsonscan.scan(text)
        scalars, containers = _counts(value)
        items = len(value) if isinstance(value, list) else 0
        assert (counts.items, counts.scalars, counts.containers) == (items, scalars, containers), text
        assert jsonscan.upper_bound(text) >= counts.values


@pytest.mark.parametrize("block", [1, 7, 64, jsonscan.BLOCK_BYTES])
def test_byte_counts_are_exact_in_one_block_and_in_many(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # a text of at most a block is counted with bytes.count, a longer one in numpy blocks: same counts
    monkeypatch.setattr(jsonscan, "BLOCK_BYTES", block)
    rng = random.Random(block)
    for _ in range(100):
        text = json.dumps([_random_value(rng, 1) for _ in range(rng.randint(0, 8))]).encode()
        wanted = {c: text.count(c) for c in b',:[{"'}
        bound = 1 + sum(wanted[c] for c in b",:[{")
        for given in (text, bytearray(text), memoryview(bytearray(text)), memoryview(text)[: len(text)]):
            assert {c: jsonscan.count_byte(given, c) for c in wanted} == wanted, (block, text)
            assert jsonscan.upper_bound(given) == bound, (block, text)


def test_escaped_quotes_and_backslash_runs_are_told_apart() -> None:
    texts = ['\\"', "\\\\", '\\\\"', "\\\\\\", '"', "x\\"]
    text = json.dumps(texts).encode()
    assert jsonscan.scan(text) == jsonscan.Counts(items=6, scalars=6, containers=1)


# --- the body reader -----------------------------------------------------------------------------


def request_of(body: bytes, headers: dict[str, str], chunk: int = 65536) -> Request:
    chunks = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    raw_headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "headers": raw_headers}, receive)


async def test_a_gzip_bomb_stops_at_the_limit() -> None:
    bomb = gzip.compress(b" " * (64 << 20), compresslevel=9)  # 64 MB in ~64 KB
    request = request_of(bomb, {"content-encoding": "gzip", "content-length": str(len(bomb))})
    tracemalloc.start()
    try:
        with pytest.raises(HTTPError, match="decompressed request body is over the limit of 4000000") as info:
            await read_body(request, 4_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.status == 413
    # the buffer of the limit (tracemalloc counts it whole, written or not), a step or two and zlib's
    # own buffers: not the 64 MB the body inflates to
    assert peak < 2 * 4_000_000 + 2 * DECOMPRESS_STEP_BYTES


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "identity"])
async def test_bodies_over_several_steps_come_back_whole(encoding: str) -> None:
    data = bytes(random.Random(1).getrandbits(8) for _ in range(100_000)) * 40  # 4 MB
    sent = {"gzip": gzip.compress, "deflate": zlib.compress, "identity": bytes}[encoding](data)
    for headers in (
        {"content-encoding": encoding, "content-length": str(len(sent))},
        {"content-encoding": encoding},
    ):
        assert bytes(await read_body(request_of(sent, headers), 8_000_000)) == data


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize(("cut", "why"), [(-6, "ends before"), (0, "bytes follow its end")])
async def test_a_cut_or_padded_compressed_body_is_a_400(encoding: str, cut: int, why: str) -> None:
    sent = {"gzip": gzip.compress, "deflate": zlib.compress}[encoding](b'{"inputs": []}' * 100)
    sent = sent[:cut] if cut else sent + b"junk"
    with pytest.raises(HTTPError, match=f"not valid {encoding} data: .*{why}") as info:
        await read_body(request_of(sent, {"content-encoding": encoding}), 1_000_000)
    assert info.value.status == 400


async def test_a_body_over_the_limit_without_content_length_is_a_413() -> None:
    with pytest.raises(HTTPError, match="over the limit of 1000 bytes"):
        await read_body(request_of(b"x" * 5000, {}, chunk=100), 1000)


# --- malformed fields that were 500s -------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"key": "k", "offset": "abc", "byte_size": 8}, "'offset' must be a non-negative integer, got 'abc'"),
        (
            {"key": "k", "offset": 0, "byte_size": None},
            "'byte_size' must be a non-negative integer, got None",
        ),
        ({"key": 5, "byte_size": 8}, "'key' must be a string"),
        ({"key": "k", "offset": True, "byte_size": 8}, "'offset' must be a non-negative integer"),
    ],
)
def test_shared_memory_registration_fields_are_checked(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        register_spec("r", spec)
    assert info.value.status == 400


def test_openai_input_nested_too_deeply_is_an_openai_400() -> None:
    body = b'{"model": "m", "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for parse in (parse_embeddings_request, parse_rerank_request):
        with pytest.raises(OpenAIError, match="nested too deeply") as info:
            parse(body)
        assert info.value.status == 400


async def test_large_bodies_are_decoded_on_a_worker_thread() -> None:
    here = threading.get_ident()
    assert await decode_off_loop(DECODE_THREAD_BYTES, threading.get_ident) == here
    assert await decode_off_loop(DECODE_THREAD_BYTES + 1, threading.get_ident) != here
    with pytest.raises(ProtocolError, match="refused"):  # what the decoder raises, raised here
        await decode_off_loop(DECODE_THREAD_BYTES + 1, _refuse, "refused")


def _refuse(message: str) -> None:
    raise ProtocolError(message)
