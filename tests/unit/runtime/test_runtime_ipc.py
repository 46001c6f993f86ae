"""The front-end <-> model-process IPC (``kubeinfer.runtime.ipc``): tensor framing, headers, errors,
the deadline that travels with a request, and a real ROUTER/DEALER round trip on an ipc:// socket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import ml_dtypes
import msgspec
import numpy as np
import pytest
import zmq
from kubeinfer.runtime import ipc
from kubeinfer.runtime.errors import HTTPError, InputError, ProtocolError, ServingError
from kubeinfer.runtime.ipc import Header


def _roundtrip(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    specs, frames = ipc.encode_tensors(tensors)
    # what travels: the header as JSON, each frame as bytes
    header = ipc.decode_header(ipc.encode_header(Header(op="infer", tensors=specs)))
    return ipc.decode_tensors(header.tensors, [bytes(memoryview(f)) for f in frames])


@pytest.mark.parametrize(
    "array",
    [
        np.array([[1.5, -2.0], [3.0, 4.25]], dtype=np.float32),
        np.arange(6, dtype=np.int64).reshape(3, 2),
        np.array([True, False, True]),
        np.array([1, 255], dtype=np.uint8),
        np.array([0.5, -1.0], dtype=np.float16),
        np.array([1.0, 2.5], dtype=ml_dtypes.bfloat16),
        np.array([1e300, -0.0], dtype=np.float64),
        np.zeros((0, 4), dtype=np.float32),
        np.array([b"hello", b"", "caf\u00e9".encode()], dtype=object),
        np.array([[b"a", b"bc"], [b"d", b"ef"]], dtype=object),
    ],
    ids=["fp32", "int64-2d", "bool", "uint8", "fp16", "bf16", "fp64", "empty", "bytes", "bytes-2d"],
)
def test_tensors_round_trip_with_datatype_and_shape(array: np.ndarray) -> None:
    out = _roundtrip({"t": array})["t"]
    assert out.dtype == array.dtype and out.shape == array.shape
    if array.dtype == object:
        assert out.tolist() == array.tolist()
    else:
        np.testing.assert_array_equal(out, array)


def test_several_tensors_keep_their_names_and_order() -> None:
    tensors = {"b": np.ones((2, 3), np.float32), "a": np.array([b"x", b"y"], dtype=object)}
    specs, frames = ipc.encode_tensors(tensors)
    assert [s[:2] for s in specs] == [("b", "FP32"), ("a", "BYTES")] and len(frames) == 2
    out = _roundtrip(tensors)
    assert list(out) == ["b", "a"] and out["a"].tolist() == [b"x", b"y"]


def test_numeric_frames_are_read_in_place_and_non_contiguous_input_is_made_contiguous() -> None:
    big = np.arange(40_000, dtype=np.float32).reshape(200, 200)
    specs, frames = ipc.encode_tensors({"x": big[:, ::2]})  # a strided view: sent as a contiguous copy
    assert frames[0].flags.c_contiguous and specs[0][2] == [200, 100]
    assert np.shares_memory(ipc.encode_tensors({"x": big})[1][0], big)  # contiguous: sent without a copy
    buf = bytearray(memoryview(frames[0]))
    out = ipc.decode_tensors(specs, [buf])["x"]
    np.testing.assert_array_equal(out, big[:, ::2])
    buf[0:4] = np.float32(7.0).tobytes()  # the array is a view of the frame, not a copy
    assert out[0, 0] == 7.0 and out.flags.writeable


def test_big_endian_input_goes_little_endian() -> None:
    arr = np.array([1, 2, 3], dtype=">i4")
    _, frames = ipc.encode_tensors({"x": arr.astype(np.int32)})
    assert bytes(memoryview(frames[0])) == np.array([1, 2, 3], "<i4").tobytes()


@pytest.mark.parametrize(
    ("specs", "frames", "message"),
    [
        ([("x", "FP32", [2])], [b"\0" * 4], "needs 8 bytes, frame has 4"),
        ([("x", "FP32", [1])], [], "1 tensors declared, 0 frames"),
        ([("x", "COMPLEX", [1])], [b"\0" * 8], "unknown datatype"),
        ([("x", "BYTES", [2])], [b"\x01\0\0\0a"], "'x'"),
    ],
)
def test_frames_that_do_not_match_their_specs_are_protocol_errors(
    specs: list[ipc.TensorSpec], frames: list[bytes], message: str
) -> None:
    with pytest.raises(ProtocolError, match=message):
        ipc.decode_tensors(specs, frames)


def test_header_omits_defaults_and_rejects_garbage() -> None:
    raw = ipc.encode_header(Header(op="status", id=3))
    assert msgspec.json.decode(raw) == {"op": "status", "id": 3}
    h = ipc.decode_header(
        ipc.encode_header(Header(op="infer", priority="high", timeout_us=1.5, received=2.0))
    )
    assert (h.priority, h.timeout_us, h.received) == ("high", 1.5, 2.0)  # passed as sent: the batcher judges
    with pytest.raises(ValueError):
        ipc.decode_header(b"{not json")


@pytest.mark.parametrize(
    "exc",
    [
        ServingError("queue full", 429, {"Retry-After": "1"}),
        InputError("too many tokens", 413),
        ProtocolError("bad json"),
        HTTPError("unknown model", 404),
        ServingError("timed out", 504),
    ],
)
def test_errors_cross_with_class_status_message_and_headers(exc: ServingError) -> None:
    info = ipc.decode_header(ipc.encode_header(Header(error=ipc.error_info(exc)))).error
    assert info is not None
    with pytest.raises(type(exc)) as raised:
        ipc.raise_error(info)
    assert (raised.value.status, raised.value.message, raised.value.headers) == (
        exc.status,
        exc.message,
        exc.headers,
    )


def test_the_deadline_travels_with_the_request() -> None:
    assert ipc.remaining_timeout_us(10_000, received=100.0, now=100.004) == 6_000
    assert ipc.remaining_timeout_us(None, received=100.0, now=200.0) is None
    assert ipc.remaining_timeout_us(0, received=100.0, now=200.0) == 0  # 0 = no timeout (Triton)
    assert ipc.remaining_timeout_us("soon", received=100.0, now=200.0) == "soon"  # the batcher says 400
    assert ipc.remaining_timeout_us(True, received=100.0, now=200.0) is True
    with pytest.raises(ServingError) as info:
        ipc.remaining_timeout_us(1_000, received=100.0, now=100.002)
    assert info.value.status == 504 and "timed out" in info.value.message


async def test_router_dealer_round_trip_with_concurrent_calls_errors_and_one_way(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/model.sock"
    seen: list[Header] = []

    async def handler(header: Header, frames: list[zmq.Frame]) -> tuple[Header, list[object]] | None:
        seen.append(header)
        if header.op == "count":
            return None
        if header.op == "boom":
            raise RuntimeError("kaput")
        inputs = ipc.decode_tensors(header.tensors, frames)
        if inputs["x"][0, 0] < 0:
            raise ServingError("queue full", 429, {"Retry-After": "1"})
        await asyncio.sleep(0.01 * float(inputs["x"][0, 0]))  # replies come back out of order
        specs, out = ipc.encode_tensors({"y": inputs["x"] * 2})
        return Header(op="reply", tensors=specs), out

    endpoint = ipc.ModelEndpoint(address, handler)
    serving = asyncio.create_task(endpoint.run())
    client = ipc.ModelClient(address)
    await client.start()
    try:

        async def one(v: float) -> np.ndarray:
            specs, frames = ipc.encode_tensors({"x": np.full((1, 3), v, np.float32)})
            reply, out = await client.call(Header(op="infer", tensors=specs), frames)
            if reply.error is not None:
                ipc.raise_error(reply.error)
            return ipc.decode_tensors(reply.tensors, out)["y"]

        results = await asyncio.gather(*(one(float(v)) for v in (5, 1, 3, 0, 2)))
        assert [float(r[0, 0]) for r in results] == [10.0, 2.0, 6.0, 0.0, 4.0]
        with pytest.raises(ServingError) as info:
            await one(-1.0)
        assert info.value.status == 429 and info.value.headers == {"Retry-After": "1"}
        reply, _ = await client.call(Header(op="boom"))
        assert reply.error is not None and reply.error.status == 500 and "kaput" in reply.error.message
        await client.send(Header(op="count", code=400, seconds=0.001))
        for _ in range(100):
            if any(h.op == "count" for h in seen):
                break
            await asyncio.sleep(0.01)
        assert [h.code for h in seen if h.op == "count"] == [400]
    finally:
        await client.close()
        serving.cancel()
        endpoint.close()


async def test_close_fails_pending_calls_with_503(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/none.sock"  # nobody answers
    client = ipc.ModelClient(address)
    await client.start()
    call = asyncio.create_task(client.call(Header(op="status")))
    await asyncio.sleep(0.05)
    await client.close()
    with pytest.raises(ServingError) as info:
        await call
    assert info.value.status == 503


async def test_thousands_of_concurrent_calls_from_two_clients_are_all_answered(tmp_path: Path) -> None:
    """The pump reads an edge-triggered descriptor: a missed wake-up would leave calls unanswered."""
    address = f"ipc://{tmp_path}/many.sock"

    async def echo(header: Header, frames: list[zmq.Frame]) -> tuple[Header, list[zmq.Frame]]:
        if header.id % 7 == 0:
            await asyncio.sleep(0)  # some replies leave in a later loop iteration
        return Header(op="reply", tensors=header.tensors), frames

    endpoint = ipc.ModelEndpoint(address, echo)
    serving = asyncio.create_task(endpoint.run())
    clients = [ipc.ModelClient(address), ipc.ModelClient(address)]
    for c in clients:
        await c.start()
    try:

        async def one(c: ipc.ModelClient, v: int) -> int:
            specs, frames = ipc.encode_tensors({"x": np.array([v], np.int64)})
            reply, out = await c.call(Header(op="infer", tensors=specs), frames)
            return int(ipc.decode_tensors(reply.tensors, out)["x"][0])

        calls = [one(clients[v % 2], v) for v in range(3000)]
        assert await asyncio.wait_for(asyncio.gather(*calls), 30) == list(range(3000))
    finally:
        for c in clients:
            await c.close()
        serving.cancel()
        endpoint.close()
