"""The ASGI app with a fake model, through tritonclient's own request encoder and response decoder."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections.abc import AsyncIterator, Callable

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from kubeinfer.runtime.batching import BatchSettings
from kubeinfer.runtime.config import LimitsConfig, RuntimeConfig
from kubeinfer.runtime.server import RuntimeServer
from tritonclient.http._utils import _get_inference_request

from tests.unit.runtime.runtime_fakes import FakeModel

pytestmark = pytest.mark.timeout(30)


def cfg() -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {"model": {"name": "fake"}, "batching": {"max_batch_size": 8, "max_queue_delay_seconds": 0.002}}
    )


@pytest.fixture
async def served() -> AsyncIterator[tuple[RuntimeServer, FakeModel, httpx.AsyncClient]]:
    server = RuntimeServer(cfg())
    model = FakeModel(max_batch_size=8)
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield server, model, client
    server.close()


def triton_body(
    x: np.ndarray, binary: bool = True, outputs: list[str] | None = None, **kw: object
) -> tuple[bytes, dict[str, str]]:
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    outs = [httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs] if outputs else None
    body, header = _get_inference_request(
        [inp], "", outs, 0, False, False, kw.get("priority", 0), kw.get("timeout"), None
    )
    data = body if isinstance(body, bytes) else body.encode()
    headers = {} if header is None else {"Inference-Header-Content-Length": str(header)}
    return data, headers


async def wait_for(cond: Callable[[], bool]) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def parse(resp: httpx.Response) -> httpclient.InferResult:
    header = resp.headers.get("inference-header-content-length")
    return httpclient.InferResult.from_response_body(
        resp.content, header_length=None if header is None else int(header)
    )


async def test_not_ready_until_attached_then_infers_binary_and_json(served) -> None:  # type: ignore[no-untyped-def]
    server, model, client = served
    assert (await client.get("/v2/health/live")).status_code == 200
    assert (await client.get("/v2/health/ready")).status_code == 503
    # the bodies of KServe's model server (its SDK's is_server_live/ready parse them)
    assert (await client.get("/v2/health/live")).json() == {"live": True}
    not_ready = (await client.get("/v2/health/ready")).json()
    assert not_ready["ready"] is False and "loading" in not_ready["error"]
    body, headers = triton_body(np.ones((1, 2), np.float32))
    r = await client.post("/v2/models/fake/infer", content=body, headers=headers)
    assert r.status_code == 503 and "not ready" in r.json()["error"]
    server.attach(model)
    assert (await client.get("/v2/health/ready")).status_code == 200
    assert (await client.get("/v2/models/fake/ready")).status_code == 200
    assert (await client.get("/v2/health/ready")).json() == {"ready": True}
    assert (await client.get("/v2/models/fake/ready")).json() == {"name": "fake", "ready": True}
    meta = (await client.get("/v2/models/fake")).json()
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    for binary in (True, False):
        body, headers = triton_body(x, binary=binary, outputs=None if binary else ["y"])
        r = await client.post("/v2/models/fake/versions/1/infer", content=body, headers=headers)
        assert r.status_code == 200, r.text
        assert ("inference-header-content-length" in r.headers) == binary
        np.testing.assert_array_equal(parse(r).as_numpy("y"), 2 * x)
    server.announce_shutdown()  # SIGTERM with a shutdown delay: not ready, still serving
    assert (await client.get("/v2/health/ready")).status_code == 503
    assert (await client.get("/v2/health/ready")).json() == {"ready": False, "error": "shutting down"}
    body, headers = triton_body(x)
    assert (await client.post("/v2/models/fake/infer", content=body, headers=headers)).status_code == 200
    gz = gzip.compress(triton_body(x, binary=False, outputs=["y"])[0])
    r = await client.post("/v2/models/fake/infer", content=gz, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]


async def test_error_statuses(served) -> None:  # type: ignore[no-untyped-def]
    server, model, client = served
    server.cfg.limits = LimitsConfig(max_request_bytes=4096)
    server.attach(model)
    body, headers = triton_body(np.ones((1, 2), np.float32))
    cases = [
        ("/v2/models/nope/infer", body, headers, 404, "unknown model 'nope'"),
        ("/v2/models/fake/versions/7/infer", body, headers, 404, "unknown version '7'"),
        ("/v2/models/fake/infer", b"{", {}, 400, "not valid JSON"),
        (
            "/v2/models/fake/infer",
            triton_body(np.ones((1, 3), np.float32), binary=False)[0],
            {},
            400,
            "input tensor 'x': expected shape",
        ),
        (
            "/v2/models/fake/infer",
            json.dumps(
                {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}]}
            ).encode(),
            {},
            400,
            "expected datatype FP32",
        ),
        (
            "/v2/models/fake/infer",
            triton_body(np.ones((1, 2), np.float32), binary=False, priority=5)[0],
            {},
            400,
            "priority",
        ),
        ("/v2/models/fake/infer", b"x" * 20000, {}, 413, "over the limit"),
        (
            "/v2/models/fake/infer",
            triton_body(np.ones((9, 2), np.float32), binary=False)[0],
            {},
            413,
            "over the largest batch",
        ),
        (
            "/v2/models/fake/infer",
            triton_body(np.ones((1, 2), np.float32), binary=False, outputs=["zz"])[0],
            {},
            400,
            "unknown output 'zz'",
        ),
    ]
    for path, data, hdrs, status, message in cases:
        r = await client.post(path, content=data, headers=hdrs)
        assert r.status_code == status, (path, r.text)
        assert message in r.json()["error"], (message, r.text)
    poisoned = triton_body(np.full((1, 2), -1, np.float32), binary=False)[0]
    r = await client.post("/v2/models/fake/infer", content=poisoned)
    assert r.status_code == 500 and "poisoned row" in r.json()["error"]
    text = (await client.get("/metrics")).text
    for code in ("404", "400", "413", "500", "200"):
        assert f'kubeinfer_requests_total{{code="{code}",model="fake"}}' in text or code == "200"


async def test_429_504_and_drain_503(served) -> None:  # type: ignore[no-untyped-def]
    server, model, client = served
    model.gate = threading.Event()
    server.attach(model, BatchSettings(max_batch_size=1, max_queue_delay_seconds=0.0, max_queue_size=1))
    body, headers = triton_body(np.ones((1, 2), np.float32))
    first = asyncio.ensure_future(client.post("/v2/models/fake/infer", content=body, headers=headers))
    await asyncio.to_thread(model.started.wait, 5)
    timed, th = triton_body(np.ones((1, 2), np.float32), timeout=30_000)
    r = await client.post("/v2/models/fake/infer", content=timed, headers=th)
    assert r.status_code == 504 and "timed out" in r.json()["error"]
    second = asyncio.ensure_future(client.post("/v2/models/fake/infer", content=body, headers=headers))
    # (the expired request's batch still holds the one look-ahead slot, so this one stays queued)
    await wait_for(lambda: server.batcher is not None and server.batcher.queued == 1)
    r = await client.post("/v2/models/fake/infer", content=body, headers=headers)
    assert r.status_code == 429 and r.headers["retry-after"].isdigit()
    drain = asyncio.ensure_future(server.drain(5.0))
    await asyncio.sleep(0.01)
    assert (await client.get("/v2/health/ready")).status_code == 503
    r = await client.post("/v2/models/fake/infer", content=body, headers=headers)
    assert r.status_code == 503
    model.gate.set()
    assert await drain
    assert [(await f).status_code for f in (first, second)] == [200, 200]
    text = (await client.get("/metrics")).text
    assert 'kubeinfer_requests_total{code="429",model="fake"} 1.0' in text
    assert 'kubeinfer_requests_total{code="504",model="fake"} 1.0' in text
    assert 'kubeinfer_inflight_requests{model="fake"}' in text
