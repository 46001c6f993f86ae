"""Every transport answers the same bad input the same way: one data plane under thin adapters.

One ``DataPlane`` with a fake model, reached four ways at once, each through a real client of its wire
format: REST in one process (``RestApp`` on the ``DataPlane``), REST in a front end (``RestApp`` on a
``RemotePlane``, over a real ZeroMQ connection to the model process's IPC endpoint,
``FrontEndPool.handle``), and gRPC (a real ``grpc.aio`` server on loopback, ``tritonclient.grpc.aio``).
For each bad input: the same status (gRPC: its code for that status), the same message, and exactly
one count of that status in ``kubeinfer_requests_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcclient
from google.protobuf import json_format
from kubeinfer.runtime import ipc
from kubeinfer.runtime.batching import BatchSettings
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.dataplane import DataPlane
from kubeinfer.runtime.errors import InputError
from kubeinfer.runtime.frontend import RemotePlane
from kubeinfer.runtime.frontend_pool import FrontEndPool
from kubeinfer.runtime.grpc_server import STATUS_CODES, create_grpc_server
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.openai_api import OpenAIRoutes
from kubeinfer.runtime.rest import RestApp
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from tests.unit.runtime.runtime_fakes import FakeModel

pytestmark = pytest.mark.timeout(60)


@dataclass
class Case:
    """One request: which model and version, the tensor ``x`` as sent, outputs named, priority."""

    model: str = "fake"
    version: str = ""
    x: np.ndarray = field(default_factory=lambda: np.ones((1, 2), np.float32))
    outputs: list[str] = field(default_factory=list)
    priority: int = 0


#: (what, the request, its status, a part of its message).
BAD: list[tuple[str, Case, int, str]] = [
    ("unknown model", Case(model="nope"), 404, "unknown model 'nope'"),
    ("unknown version", Case(version="7"), 404, "unknown version '7'"),
    ("wrong datatype", Case(x=np.ones((1, 2), np.int64)), 400, "expected datatype FP32"),
    ("wrong shape", Case(x=np.ones((1, 3), np.float32)), 400, "input tensor 'x': expected shape"),
    ("bad priority", Case(priority=5), 400, "priority"),
    ("rows over the warmed maximum", Case(x=np.ones((9, 2), np.float32)), 413, "over the largest batch"),
    ("unknown output", Case(outputs=["zz"]), 400, "unknown output 'zz'"),
    ("the model fails on it", Case(x=np.full((1, 2), -1, np.float32)), 500, "poisoned row"),
]


def rest_body(case: Case) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32" if case.x.dtype == np.float32 else "INT64",
                "shape": list(case.x.shape),
                "data": case.x.reshape(-1).tolist(),
            }
        ],
        "outputs": [{"name": o} for o in case.outputs],
    }
    if case.priority:
        doc["parameters"] = {"priority": case.priority}
    return doc


@dataclass
class Transports:
    plane: DataPlane
    model: FakeModel
    rest: httpx.AsyncClient
    frontend: httpx.AsyncClient
    grpc: grpcclient.InferenceServerClient

    def count(self, status: int) -> float:
        value = self.plane.metrics.registry.get_sample_value(
            "kubeinfer_requests_total", {"model": "fake", "code": str(status)}
        )
        return value or 0.0

    async def via_rest(self, client: httpx.AsyncClient, case: Case) -> tuple[int, str]:
        version = f"/versions/{case.version}" if case.version else ""
        r = await client.post(f"/v2/models/{case.model}{version}/infer", json=rest_body(case))
        return r.status_code, r.json()["error"] if r.status_code != 200 else ""

    async def via_grpc(self, case: Case) -> tuple[str, str]:
        inp = grpcclient.InferInput(
            "x", list(case.x.shape), "FP32" if case.x.dtype == np.float32 else "INT64"
        )
        inp.set_data_from_numpy(case.x)
        outputs = [grpcclient.InferRequestedOutput(o) for o in case.outputs] or None
        try:
            await self.grpc.infer(
                case.model, [inp], model_version=case.version, outputs=outputs, priority=case.priority
            )
        except InferenceServerException as exc:
            return str(exc.status()), str(exc.message())
        return "StatusCode.OK", ""


@contextlib.asynccontextmanager
async def open_transports(tmp_path: Path, cfg: RuntimeConfig) -> AsyncIterator[Transports]:
    """One ``DataPlane`` behind REST, a front end over real ZeroMQ and gRPC, as ``cfg`` configures
    them (OpenAI routes on both REST apps; authentication where ``server.bearer_token_env`` says)."""
    plane = DataPlane("fake", RuntimeMetrics("fake"), cache=cfg.cache)
    model = FakeModel(max_batch_size=8)
    address = f"ipc://{tmp_path}/model.sock"
    endpoint = ipc.ModelEndpoint(
        address, FrontEndPool(plane, cfg, workers=0).handle, closing=lambda: plane.closing
    )
    serving = asyncio.get_running_loop().create_task(endpoint.run())
    ipc_client = ipc.ModelClient(address)
    await ipc_client.start()
    one = RestApp(plane, cfg, OpenAIRoutes(plane, cfg).routes)
    grpc_server, port = create_grpc_server(plane, "127.0.0.1", 0, cfg.limits, one.auth)
    await grpc_server.start()
    rest = httpx.AsyncClient(transport=httpx.ASGITransport(app=one.app), base_url="http://one")
    remote = RemotePlane("fake", ipc_client)
    front = RestApp(remote, cfg, OpenAIRoutes(remote, cfg).routes)
    frontend = httpx.AsyncClient(transport=httpx.ASGITransport(app=front.app), base_url="http://front")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        yield Transports(plane, model, rest, frontend, grpc)
    finally:
        await grpc.close()
        await rest.aclose()
        await frontend.aclose()
        await grpc_server.stop(grace=0)
        await ipc_client.close()
        serving.cancel()
        endpoint.close()
        plane.close()


@pytest.fixture
async def transports(tmp_path: Path) -> AsyncIterator[Transports]:
    async with open_transports(tmp_path, RuntimeConfig.model_validate({"model": {"name": "fake"}})) as t:
        yield t


async def until(cond: Any) -> None:
    for _ in range(400):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def test_every_transport_gives_a_bad_input_the_same_outcome_counted_once(
    transports: Transports,
) -> None:
    t = transports
    t.plane.attach(t.model, BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.001))
    for what, case, status, message in BAD:
        before = t.count(status)
        one_status, one_message = await t.via_rest(t.rest, case)
        front_status, front_message = await t.via_rest(t.frontend, case)
        code, grpc_message = await t.via_grpc(case)
        assert (one_status, front_status) == (status, status), (what, one_message, front_message)
        assert code == str(STATUS_CODES[status]), (what, grpc_message)
        assert message in one_message, (what, one_message)
        assert front_message == one_message == grpc_message, what
        # each counted exactly once (a front end's own refusals arrive as a one-way message)
        await until(lambda status=status, before=before: t.count(status) >= before + 3)
        await asyncio.sleep(0.02)
        assert t.count(status) == before + 3, what
    good = Case(x=np.array([[1.0, 2.0]], np.float32), outputs=["y"])
    assert (await t.via_rest(t.rest, good))[0] == 200
    assert (await t.via_rest(t.frontend, good))[0] == 200
    assert (await t.via_grpc(good))[0] == "StatusCode.OK"
    assert t.plane.metrics.registry.get_sample_value("kubeinfer_inflight_requests", {"model": "fake"}) == 0


async def test_not_ready_and_draining_are_the_same_503_everywhere(transports: Transports) -> None:
    t = transports
    case = Case()
    loading = [await t.via_rest(t.rest, case), await t.via_rest(t.frontend, case)]
    assert loading == [(503, "model 'fake' is not ready")] * 2
    assert await t.via_grpc(case) == ("StatusCode.UNAVAILABLE", "model 'fake' is not ready")
    assert (await t.rest.get("/v2/health/ready")).json() == {
        "ready": False,
        "error": "model loading or warming up",
    }
    assert (await t.frontend.get("/v2/health/ready")).json() == {
        "ready": False,
        "error": "model loading or warming up",
    }
    assert not await t.grpc.is_server_ready()
    assert not await t.grpc.is_model_ready("fake")

    t.plane.attach(t.model, BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.001))
    assert await t.grpc.is_model_ready("fake")
    for client in (t.rest, t.frontend):
        assert (await client.get("/v2/models/fake/ready")).status_code == 200
        assert (await client.get("/v2/models/nope/ready")).status_code == 404
        meta = (await client.get("/v2/models/fake")).json()
        assert [o["name"] for o in meta["outputs"]] == ["y", "n"]
    grpc_meta = await t.grpc.get_model_metadata("fake", as_json=True)
    assert [o["name"] for o in grpc_meta["outputs"]] == ["y", "n"]
    assert (await t.rest.get("/v2")).json() == (await t.frontend.get("/v2")).json()

    assert await t.plane.drain(1.0)
    draining = [await t.via_rest(t.rest, case), await t.via_rest(t.frontend, case)]
    assert draining == [(503, "shutting down")] * 2
    assert await t.via_grpc(case) == ("StatusCode.UNAVAILABLE", "shutting down")
    assert (await t.frontend.get("/v2/health/ready")).json() == {"ready": False, "error": "shutting down"}


async def test_from_the_shutdown_on_every_rest_response_closes_its_connection(transports: Transports) -> None:
    """``Connection: close`` on every HTTP response once the shutdown was announced (and none before):
    the infer fast path, its errors, routed responses, on one process and through a front end (which
    learns it from the model process's replies)."""
    t = transports
    t.plane.attach(t.model, BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.001))
    good = rest_body(Case(x=np.array([[1.0, 2.0]], np.float32), outputs=["y"]))
    bad = rest_body(Case(x=np.ones((1, 3), np.float32)))

    async def connection_headers(client: httpx.AsyncClient) -> list[tuple[int, str | None]]:
        responses = [
            await client.post("/v2/models/fake/infer", json=good),
            await client.post("/v2/models/fake/infer", json=bad),
            await client.get("/v2/models/fake"),
            await client.get("/v2/health/ready"),
        ]
        return [(r.status_code, r.headers.get("connection")) for r in responses]

    for client in (t.rest, t.frontend):
        assert await connection_headers(client) == [(200, None), (400, None), (200, None), (200, None)]
    t.plane.announce_shutdown()  # the SIGTERM: not ready, still serving
    for client in (t.rest, t.frontend):
        assert await connection_headers(client) == [
            (200, "close"),
            (400, "close"),
            (200, "close"),
            (503, "close"),
        ]
    assert await t.plane.drain(1.0)
    for client in (t.rest, t.frontend):
        r = await client.post("/v2/models/fake/infer", json=good)
        assert (r.status_code, r.headers.get("connection")) == (503, "close")


def sample(t: Transports, name: str, **labels: str) -> float:
    return t.plane.metrics.registry.get_sample_value(name, {"model": "fake", **labels}) or 0.0


async def test_statistics_are_the_same_on_every_transport_and_agree_with_the_metrics(
    transports: Transports,
) -> None:
    t = transports
    t.plane.attach(t.model, BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.001))
    good = [Case(x=np.full((rows, 2), 1.0, np.float32)) for rows in (1, 2, 3)]
    for case in good:
        assert (await t.via_rest(t.rest, case))[0] == 200
        assert (await t.via_rest(t.frontend, case))[0] == 200
        assert (await t.via_grpc(case))[0] == "StatusCode.OK"
    for _, case, _, _ in BAD[:3]:
        await t.via_rest(t.frontend, case)
    await until(lambda: sample(t, "kubeinfer_requests_total", code="404") == 2)
    one = (await t.rest.get("/v2/models/stats")).json()
    assert (await t.frontend.get("/v2/models/fake/stats")).json() == one
    assert (await t.rest.get("/v2/models/fake/versions/1/stats")).json() == one
    (stat,) = one["model_stats"]
    grpc_stats = await t.grpc.get_inference_statistics("fake")
    (message,) = grpc_stats.model_stats
    assert (message.name, message.version) == (stat["name"], stat["version"]) == ("fake", "1")
    assert (
        message.inference_count == stat["inference_count"]
        and message.execution_count == stat["execution_count"]
    )
    for key, value in stat["inference_stats"].items():
        got = getattr(message.inference_stats, key)
        assert (got.count, got.ns) == (value["count"], value["ns"]), key
    assert [b.batch_size for b in message.batch_stats] == [b["batch_size"] for b in stat["batch_stats"]]

    # Triton's meaning: rows are inferences, batches are executions, each request counted once
    inference = stat["inference_stats"]
    assert inference["success"]["count"] == 9 and inference["fail"]["count"] == 3
    assert stat["inference_count"] == 3 * (1 + 2 + 3)
    assert 1 <= stat["execution_count"] <= 9
    assert inference["queue"]["count"] == inference["compute_infer"]["count"] == 9
    assert sum(b["compute_infer"]["count"] for b in stat["batch_stats"]) == stat["execution_count"]
    assert stat["last_inference"] > 1_700_000_000_000  # milliseconds since the epoch
    # ... and the same calls fed /metrics
    assert inference["success"]["count"] == sample(t, "kubeinfer_requests_total", code="200")
    failed = sum(sample(t, "kubeinfer_requests_total", code=c) for c in ("400", "404", "413", "500"))
    assert inference["fail"]["count"] == failed
    assert inference["queue"]["count"] == sample(t, "kubeinfer_queue_duration_seconds_count")
    assert inference["queue"]["ns"] == pytest.approx(
        sample(t, "kubeinfer_queue_duration_seconds_sum") * 1e9, abs=100
    )
    assert stat["execution_count"] == sample(t, "kubeinfer_batch_size_count")
    assert stat["inference_count"] == sample(t, "kubeinfer_batch_size_sum")
    compute_ns = sum(b["compute_input"]["ns"] + b["compute_infer"]["ns"] for b in stat["batch_stats"])
    assert compute_ns == pytest.approx(sample(t, "kubeinfer_compute_duration_seconds_sum") * 1e9, abs=100)
    total_ns = inference["success"]["ns"] + inference["fail"]["ns"]
    assert total_ns == pytest.approx(sample(t, "kubeinfer_request_duration_seconds_sum") * 1e9, abs=100)

    for client in (t.rest, t.frontend):
        for path in ("/v2/models/nope/stats", "/v2/models/fake/versions/3/stats"):
            r = await client.get(path)
            assert r.status_code == 404 and "unknown" in r.json()["error"], path
    meta = (await t.rest.get("/v2")).json()
    assert "statistics" in meta["extensions"]


async def test_the_model_configuration_is_the_same_on_every_transport_with_the_settings_in_force(
    transports: Transports,
) -> None:
    t = transports
    for client in (t.rest, t.frontend):
        r = await client.get("/v2/models/fake/config")
        assert r.status_code == 503 and "loading" in r.json()["error"]
    t.plane.attach(t.model, BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.004))

    async def configs() -> list[dict[str, Any]]:
        docs = [
            (await c.get(p)).json()
            for c in (t.rest, t.frontend)
            for p in ("/v2/models/fake/config", "/v2/models/fake/versions/1/config")
        ]
        grpc_doc = await t.grpc.get_model_config("fake", as_json=True)
        return [*docs, grpc_doc["config"]]

    docs = await configs()
    rest_doc = docs[0]
    assert all(d == rest_doc for d in docs[1:4])
    assert (
        rest_doc["max_batch_size"] == 8
        and rest_doc["dynamic_batching"]["max_queue_delay_microseconds"] == 4000
    )
    assert rest_doc["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}]
    # gRPC's JSON is protobuf's: int64 as strings, defaults left out; the same message either way
    config = json_format.ParseDict(docs[4], model_config_pb2.ModelConfig())
    assert config == json_format.ParseDict(rest_doc, model_config_pb2.ModelConfig())

    # a reload's new settings are in the next answer, through the front end too (never cached there)
    assert t.plane.batcher is not None
    t.plane.batcher.update_settings(BatchSettings(max_batch_size=4, max_queue_delay_seconds=0.0125))
    for doc in (await configs())[::2]:
        assert int(doc["max_batch_size"]) == 4
        assert int(doc["dynamic_batching"]["max_queue_delay_microseconds"]) == 12500

    for client in (t.rest, t.frontend):
        for path in ("/v2/models/nope/config", "/v2/models/fake/versions/3/config"):
            r = await client.get(path)
            assert r.status_code == 404 and "unknown" in r.json()["error"], path
    for name, version in (("nope", ""), ("fake", "3")):
        with pytest.raises(InferenceServerException) as info:
            await t.grpc.get_model_config(name, version)
        assert info.value.status() == "StatusCode.NOT_FOUND"
    meta = (await t.rest.get("/v2")).json()
    assert {"model_configuration", "statistics", "system_shared_memory", "binary_tensor_data"} <= set(
        meta["extensions"]
    )


async def test_unknown_routes_and_methods_answer_the_protocol_error_shape(transports: Transports) -> None:
    t = transports
    for client in (t.rest, t.frontend):
        r = await client.get("/v2/no/such/route")
        assert r.status_code == 404 and r.json()["error"] == "no route GET /v2/no/such/route on this server"
        r = await client.get("/v2/models/fake/infer")
        assert r.status_code == 405 and "POST" in r.json()["error"] and "POST" in r.headers["allow"]
        r = await client.delete("/v2/health/live")
        assert r.status_code == 405 and r.headers["content-type"] == "application/json"


async def test_grpc_methods_not_served_answer_unimplemented_without_an_error_log(
    transports: Transports, caplog: pytest.LogCaptureFixture
) -> None:
    t = transports
    caplog.set_level("DEBUG")
    for call in (
        t.grpc.get_model_repository_index,
        t.grpc.get_trace_settings,
        t.grpc.get_log_settings,
    ):
        with pytest.raises(InferenceServerException) as info:
            await call()
        assert info.value.status() == "StatusCode.UNIMPLEMENTED"
        assert "not implemented by this server" in str(info.value.message())
    errors = [r for r in caplog.records if r.levelno >= 40]
    assert not errors, [r.getMessage() for r in errors]


async def test_a_shared_memory_region_not_registered_is_the_same_400_everywhere(
    transports: Transports,
) -> None:
    t = transports
    t.plane.attach(t.model, BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.001))
    body = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [1, 2],
                "parameters": {"shared_memory_region": "nope", "shared_memory_byte_size": 8},
            }
        ]
    }
    answers = [await c.post("/v2/models/fake/infer", json=body) for c in (t.rest, t.frontend)]
    assert [r.status_code for r in answers] == [400, 400]
    message = "tensor 'x': shared memory region 'nope' is not registered"
    assert answers[0].json() == answers[1].json() == {"error": message}
    inp = grpcclient.InferInput("x", [1, 2], "FP32")
    inp.set_shared_memory("nope", 8)
    with pytest.raises(InferenceServerException) as info:
        await t.grpc.infer("fake", [inp])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and info.value.message() == message
    for client in (t.rest, t.frontend):
        assert (await client.get("/v2/systemsharedmemory/status")).json() == []
        r = await client.get("/v2/systemsharedmemory/region/nope/status")
        assert r.status_code == 400 and "unable to find" in r.json()["error"]
        assert (await client.post("/v2/cudasharedmemory/unregister")).status_code == 200
        r = await client.post("/v2/cudasharedmemory/region/gpu0/register", json={"byte_size": 8})
        assert r.status_code == 400 and "CUDA shared memory is not supported" in r.json()["error"]


TOKEN = "s3cr3t-t0ken-value"


async def test_bearer_token_guards_every_route_but_health_and_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBEINFER_TEST_TOKEN", TOKEN)
    cfg = RuntimeConfig.model_validate(
        {"model": {"name": "fake"}, "server": {"bearer_token_env": "KUBEINFER_TEST_TOKEN"}}
    )
    async with open_transports(tmp_path, cfg) as t:
        t.plane.attach(t.model, BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.001))
        body = rest_body(Case())
        wrong = {"Authorization": "Bearer not-the-token"}
        good = {"Authorization": f"Bearer {TOKEN}"}
        for client in (t.rest, t.frontend):
            for headers in ({}, wrong, {"Authorization": f"Basic {TOKEN}"}):
                for method, path, payload in (
                    ("POST", "/v2/models/fake/infer", body),
                    ("GET", "/v2/models/fake", None),
                    ("GET", "/v2/models/fake/config", None),
                    ("GET", "/v2", None),
                    ("GET", "/v2/models/stats", None),
                    ("GET", "/v2/systemsharedmemory/status", None),
                ):
                    r = await client.request(method, path, json=payload, headers=headers)
                    assert r.status_code == 401, (path, headers, r.text)
                    assert r.headers["www-authenticate"].startswith("Bearer")
                    assert "not-the-token" not in r.text and TOKEN not in r.text
                r = await client.post("/v1/embeddings", json={"model": "fake", "input": "x"}, headers=headers)
                assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"
            for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
                assert (await client.get(path)).status_code == 200, path
            r = await client.post("/v2/models/fake/infer", json=body, headers=good)
            assert r.status_code == 200, r.text
            assert (await client.get("/v2/models/fake", headers=good)).status_code == 200
        inp = grpcclient.InferInput("x", [1, 2], "FP32")
        inp.set_data_from_numpy(np.ones((1, 2), np.float32))
        assert await t.grpc.is_server_live() and await t.grpc.is_server_ready()
        for headers in ({}, {"authorization": "Bearer not-the-token"}):
            for call in (
                t.grpc.infer("fake", [inp], headers=headers),
                t.grpc.get_model_metadata("fake", headers=headers),
                t.grpc.get_model_config("fake", headers=headers),
                t.grpc.get_inference_statistics("fake", headers=headers),
            ):
                with pytest.raises(InferenceServerException) as info:
                    await call
                assert info.value.status() == "StatusCode.UNAUTHENTICATED"
                assert "not-the-token" not in str(info.value.message())
        result = await t.grpc.infer("fake", [inp], headers={"authorization": f"Bearer {TOKEN}"})
        assert result.as_numpy("y") is not None
        # every refused infer counted once, as 401, in one process and through the front end
        assert sample(t, "kubeinfer_requests_total", code="401") >= 8


def test_a_token_variable_that_is_not_set_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBEINFER_TEST_TOKEN", raising=False)
    cfg = RuntimeConfig.model_validate({"server": {"bearer_token_env": "KUBEINFER_TEST_TOKEN"}})
    with pytest.raises(ValueError, match="KUBEINFER_TEST_TOKEN, which is not set"):
        RestApp(DataPlane("fake", RuntimeMetrics("fake")), cfg)
    assert "bearer_token_env" not in RuntimeConfig().to_yaml()  # off: the file reads as before


async def test_the_response_cache_answers_repeats_byte_identical_on_every_transport(tmp_path: Path) -> None:
    cfg = RuntimeConfig.model_validate(
        {"model": {"name": "fake"}, "cache": {"enabled": True, "max_bytes": 4096}}
    )
    async with open_transports(tmp_path, cfg) as t:
        t.plane.attach(t.model, BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.001))
        body = rest_body(Case(x=np.array([[1.0, 2.0]], np.float32)))
        first = await t.rest.post("/v2/models/fake/infer", json=body)
        executed = len(t.model.batches)
        repeats = [await c.post("/v2/models/fake/infer", json=body) for c in (t.rest, t.frontend, t.rest)]
        assert [r.status_code for r in repeats] == [200, 200, 200]
        assert all(r.content == first.content for r in repeats)  # byte-identical answers
        assert len(t.model.batches) == executed  # the model did not run again
        code, _ = await t.via_grpc(Case(x=np.array([[1.0, 2.0]], np.float32)))
        assert code == "StatusCode.OK" and len(t.model.batches) == executed  # gRPC hits the same entry
        # other values, or the cache parameter false, run the model
        other = await t.rest.post(
            "/v2/models/fake/infer", json=rest_body(Case(x=np.array([[3.0, 2.0]], np.float32)))
        )
        assert other.status_code == 200 and len(t.model.batches) == executed + 1
        opted_out = await t.frontend.post(
            "/v2/models/fake/infer", json={**body, "parameters": {"cache": False}}
        )
        assert opted_out.status_code == 200 and len(t.model.batches) == executed + 2
        # what a miss would refuse, a hit refuses too
        bad = await t.rest.post("/v2/models/fake/infer", json={**body, "parameters": {"priority": 9}})
        assert bad.status_code == 400 and "priority" in bad.json()["error"]
        for client in (t.rest, t.frontend):
            r = await client.post("/v2/models/fake/infer", json={**body, "parameters": {"cache": "no"}})
            assert r.status_code == 400 and "parameter 'cache'" in r.json()["error"]
        assert sample(t, "kubeinfer_cache_hits_total") == 4
        assert sample(t, "kubeinfer_cache_misses_total") == 2  # the first request and the other values
        assert sample(t, "kubeinfer_cache_entries") == 2 and sample(t, "kubeinfer_cache_bytes") > 0
        (stat,) = (await t.rest.get("/v2/models/fake/stats")).json()["model_stats"]
        assert stat["inference_stats"]["cache_hit"]["count"] == 4
        assert stat["inference_stats"]["cache_miss"]["count"] == 2
        assert stat["inference_count"] == 3  # hits are no inferences (Triton's meaning)
        assert stat["inference_stats"]["success"]["count"] == 7  # hits included


class PolicyFake(FakeModel):
    """A ``FakeModel`` whose service chunks: a request may narrow that to truncate or refuse
    (``narrow_overflow``); it records the policy each request was validated with."""

    def __init__(self) -> None:
        super().__init__(max_batch_size=8)
        self.policies: list[str | None] = []

    def narrow_overflow(self, requested: Any) -> str | None:
        if requested in (None, "chunk"):
            return None
        if requested in ("truncate", "refuse"):
            return str(requested)
        raise InputError(f"parameter 'overflow' may only narrow chunk, got {requested!r}")

    def validate(self, inputs: Mapping[str, np.ndarray], overflow: str | None = None) -> int:
        self.policies.append(overflow)
        return super().validate(inputs, overflow)


async def test_the_overflow_parameter_reaches_the_model_on_every_transport(tmp_path: Path) -> None:
    cfg = RuntimeConfig.model_validate(
        {"model": {"name": "fake"}, "cache": {"enabled": True, "max_bytes": 4096}}
    )
    async with open_transports(tmp_path, cfg) as t:
        model = PolicyFake()
        t.plane.attach(model, BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.001))
        body = rest_body(Case(x=np.array([[1.0, 2.0]], np.float32)))
        for client, policy in ((t.rest, "truncate"), (t.frontend, "refuse"), (t.rest, None)):
            params = {} if policy is None else {"parameters": {"overflow": policy}}
            r = await client.post("/v2/models/fake/infer", json={**body, **params})
            assert r.status_code == 200, r.text
        # one cache entry per policy: the same inputs under another policy ran the model again
        assert model.policies == ["truncate", "refuse", None]
        inp = grpcclient.InferInput("x", [1, 2], "FP32")
        inp.set_data_from_numpy(np.array([[5.0, 2.0]], np.float32))
        await t.grpc.infer("fake", [inp], parameters={"overflow": "truncate"})
        assert model.policies[-1] == "truncate"
        for client in (t.rest, t.frontend):  # widening (here: an unknown policy) is a 400 naming it
            r = await client.post("/v2/models/fake/infer", json={**body, "parameters": {"overflow": "wide"}})
            assert r.status_code == 400 and "parameter 'overflow'" in r.json()["error"]
