"""Clients that leave before their answer: counted 499 (``errors.CLIENT_CLOSED``), never a 5xx, and
their queued work dropped, in the data plane, the REST transport (one process and a front end over
real ZeroMQ) and the IPC's ``cancel``. The fake model records every batch it runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import zmq
from kubeinfer.runtime import ipc
from kubeinfer.runtime.batching import BatchSettings
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.dataplane import DataPlane, InferCall
from kubeinfer.runtime.errors import CLIENT_CLOSED, ClientGone
from kubeinfer.runtime.frontend import RemotePlane
from kubeinfer.runtime.frontend_pool import FrontEndPool
from kubeinfer.runtime.grpc_server import STATUS_CODES
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.rest import RestApp

from tests.unit.runtime.runtime_fakes import FakeModel

pytestmark = pytest.mark.timeout(60)

#: A batch delay no test waits out: a request stays queued until it is dropped.
LONG = BatchSettings(max_batch_size=8, max_queue_delay_seconds=30.0)


def count(plane: DataPlane, status: int) -> float:
    value = plane.metrics.registry.get_sample_value(
        "kubeinfer_requests_total", {"model": "fake", "code": str(status)}
    )
    return value or 0.0


def codes(plane: DataPlane) -> dict[int, float]:
    return {s: count(plane, s) for s in (200, 499, 500) if count(plane, s)}


async def until(cond: Callable[[], bool], seconds: float = 2.0) -> None:
    for _ in range(int(seconds / 0.005)):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def call(x: float) -> Callable[[], Awaitable[InferCall]]:
    async def decode() -> InferCall:
        return InferCall({"x": np.full((1, 2), x, np.float32)})

    return decode


async def test_a_cancelled_queued_request_leaves_the_queue_uncomputed_and_is_counted_499(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plane = DataPlane("fake", RuntimeMetrics("fake"))
    model = FakeModel()
    plane.attach(model, LONG)
    assert plane.batcher is not None
    try:
        task = asyncio.create_task(plane.infer(0.0, "fake", None, call(1.0)))
        await until(lambda: plane.batcher is not None and plane.batcher.queued == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert plane.batcher.queued == 0
        assert codes(plane) == {499: 1.0}  # not a 500
        await plane.drain(5)  # a drain makes everything queued due: nothing is left to run
        assert model.batches == []
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        plane.close()


async def test_a_request_cancelled_in_a_running_batch_is_counted_499_and_the_batch_finishes() -> None:
    plane = DataPlane("fake", RuntimeMetrics("fake"))
    model = FakeModel()
    model.gate = threading.Event()
    plane.attach(model, BatchSettings(max_batch_size=2, max_queue_delay_seconds=30.0))
    try:
        leaving = asyncio.create_task(plane.infer(0.0, "fake", None, call(1.0)))
        staying = asyncio.create_task(plane.infer(0.0, "fake", None, call(2.0)))
        await asyncio.to_thread(model.started.wait, 5)  # the full batch of 2 runs
        leaving.cancel()
        model.gate.set()
        outputs = await staying
        assert outputs["y"].tolist() == [[4.0, 4.0]]
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert model.batches == [2]
        assert codes(plane) == {200: 1.0, 499: 1.0}
    finally:
        model.gate.set()
        plane.close()


def test_a_cancelled_grpc_call_maps_to_cancelled() -> None:
    assert STATUS_CODES[CLIENT_CLOSED] == grpc.StatusCode.CANCELLED
    assert ClientGone("gone").status == CLIENT_CLOSED == 499


# --- the REST transport: ASGI calls whose client leaves, in one process and in a front end --------


@dataclass
class Apps:
    plane: DataPlane
    model: FakeModel
    one: RestApp  # on the DataPlane
    front: RestApp  # on a RemotePlane, over ZeroMQ to the DataPlane


@pytest.fixture
async def apps(tmp_path: Path) -> AsyncIterator[Apps]:
    cfg = RuntimeConfig.model_validate({"model": {"name": "fake"}})
    plane = DataPlane("fake", RuntimeMetrics("fake"))
    model = FakeModel()
    address = f"ipc://{tmp_path}/model.sock"
    endpoint = ipc.ModelEndpoint(address, FrontEndPool(plane, cfg, workers=0).handle)
    serving = asyncio.create_task(endpoint.run())
    client = ipc.ModelClient(address)
    await client.start()
    try:
        yield Apps(plane, model, RestApp(plane, cfg), RestApp(RemotePlane("fake", client), cfg))
    finally:
        await client.close()
        serving.cancel()
        endpoint.close()
        plane.close()


BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}).encode()


#: One entry per ``receive`` call of the last ``asgi_call``.
received: list[int] = []


async def asgi_call(app: RestApp, chunks: list[bytes], leave: asyncio.Event) -> list[dict[str, Any]]:
    """POST ``BODY`` (declared whole) sent as ``chunks``; after them ``receive`` waits for ``leave``
    and then says ``http.disconnect``, as uvicorn does when the connection is lost. Returns what the
    app sent."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v2/models/fake/infer",
        "raw_path": b"/v2/models/fake/infer",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8080),
    }
    pending = list(chunks)
    sent: list[dict[str, Any]] = []
    received.clear()

    async def receive() -> dict[str, Any]:
        received.append(len(received))
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending) or chunk != BODY}
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app.app(scope, receive, send)
    return sent


@pytest.mark.parametrize("which", ["one", "front"])
async def test_a_body_cut_by_a_disconnect_is_499_without_a_response_or_a_traceback(
    apps: Apps, which: str, caplog: pytest.LogCaptureFixture
) -> None:
    apps.plane.attach(apps.model, LONG)
    app = apps.one if which == "one" else apps.front
    gone = asyncio.Event()
    gone.set()
    sent = await asyncio.wait_for(asgi_call(app, [BODY[:10]], gone), 5)
    assert sent == []
    await until(lambda: count(apps.plane, 499) == 1)  # a front end counts it with a one-way message
    assert codes(apps.plane) == {499: 1.0}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


@pytest.mark.parametrize("which", ["one", "front"])
async def test_a_client_that_leaves_while_queued_is_dropped_and_counted_499(
    apps: Apps, which: str, caplog: pytest.LogCaptureFixture
) -> None:
    apps.plane.attach(apps.model, LONG)
    batcher = apps.plane.batcher
    assert batcher is not None
    app = apps.one if which == "one" else apps.front
    leave = asyncio.Event()
    served = asyncio.create_task(asgi_call(app, [BODY], leave))
    await until(lambda: batcher.queued == 1)
    leave.set()
    sent = await asyncio.wait_for(served, 5)  # before: it waited for its batch (30 s)
    assert sent == []
    await until(lambda: batcher.queued == 0 and count(apps.plane, 499) == 1)
    assert codes(apps.plane) == {499: 1.0}
    await apps.plane.drain(5)
    assert apps.model.batches == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


@pytest.mark.parametrize("which", ["one", "front"])
async def test_a_client_that_stays_is_answered_and_never_cancelled(apps: Apps, which: str) -> None:
    apps.plane.attach(apps.model, BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.15))
    app = apps.one if which == "one" else apps.front
    leave = asyncio.Event()  # never set: the watch waits on receive() until it is stopped
    sent = await asyncio.wait_for(asgi_call(app, [BODY], leave), 5)  # answered after the watch began
    assert sent[0]["status"] == 200 and json.loads(sent[1]["body"])["outputs"]
    assert len(received) == 2  # the body, then the watch's receive() (stopped before the answer)
    assert codes(apps.plane) == {200: 1.0}


@pytest.mark.parametrize("which", ["one", "front"])
async def test_a_request_answered_at_once_costs_no_watching_task(apps: Apps, which: str) -> None:
    apps.plane.attach(apps.model, BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.0))
    app = apps.one if which == "one" else apps.front
    sent = await asyncio.wait_for(asgi_call(app, [BODY], asyncio.Event()), 5)
    assert sent[0]["status"] == 200
    assert len(received) == 1  # the body only: answered within DISCONNECT_WATCH_AFTER_SECONDS


# --- the IPC: a front end's cancelled call cancels its handler in the model process -----------------


async def test_a_cancelled_call_cancels_its_handler_and_the_connection_serves_on(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/model.sock"
    started = asyncio.Event()
    outcomes: list[str] = []

    async def handler(header: ipc.Header, frames: list[zmq.Frame]) -> tuple[ipc.Header, list[Any]] | None:
        if header.op == "slow":
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                outcomes.append("cancelled")
                raise
        return ipc.Header(op="reply", info={"op": header.op}), []

    endpoint = ipc.ModelEndpoint(address, handler)
    serving = asyncio.create_task(endpoint.run())
    client = ipc.ModelClient(address)
    await client.start()
    try:
        slow = asyncio.create_task(client.call(ipc.Header(op="slow")))
        await asyncio.wait_for(started.wait(), 5)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        await until(lambda: outcomes == ["cancelled"])
        await client.send(ipc.Header(op="cancel", id=12345))  # no such call: ignored
        reply, _ = await asyncio.wait_for(client.call(ipc.Header(op="status")), 5)
        assert reply.info == {"op": "status"}
    finally:
        await client.close()
        serving.cancel()
        with contextlib.suppress(Exception):
            endpoint.close()
