"""The gRPC front end (``inference.GRPCInferenceService``) of a real ``kubeinfer-runtime`` process,
driven by ``tritonclient.grpc`` (sync, callback-async and asyncio clients) on the tiny BERT: the same
correctness and bad-input checks as the REST tests, with gRPC status codes, and the batcher shared
with REST (one queue, one set of metrics)."""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from hack.devtools.runtime_proc import RuntimeConfig, RuntimeProcess
from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir
from tests.support.model_config import assert_unknown_model_is_not_found, model_configs, tensors

pytestmark = pytest.mark.timeout(300)

SENTENCES = [
    "A man is playing a guitar on stage.",
    "The new movie is awesome.",
    "A cat sits on the windowsill in the sun.",
    "The stock market fell sharply on Monday.",
    "She is cooking pasta for dinner.",
    "Children are playing football in the park.",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_dir(tmp_path_factory.mktemp("tiny"))


def config(tiny_dir: Path, **batching: object) -> RuntimeConfig:
    return tiny_hf_config(
        tiny_dir,
        batching={"max_batch_size": 8, "max_queue_delay_seconds": 0.02, **batching},
        limits={"max_text_tokens": 32},
    )


@pytest.fixture(scope="module")
def runtime(tiny_dir: Path) -> Iterator[RuntimeProcess]:
    with RuntimeProcess(config(tiny_dir), ready_timeout=60) as rt:
        yield rt


def text_input(texts: list[str], datatype: str = "BYTES") -> grpcclient.InferInput:
    inp = grpcclient.InferInput("text", [len(texts)], datatype)
    inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    return inp


def grpc_error(fn: object, *args: object, **kwargs: object) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        fn(*args, **kwargs)  # type: ignore[operator]
    return info.value


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def test_health_and_metadata(runtime: RuntimeProcess) -> None:
    client = grpcclient.InferenceServerClient(runtime.grpc_address)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny") and client.is_model_ready("tiny", "1")
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "kubeinfer" and "binary_tensor_data" in server["extensions"]
    meta = client.get_model_metadata("tiny", as_json=True)
    assert meta["name"] == "tiny" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1", "1"]}]
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": ["-1", "32"]}]
    assert grpc_error(client.get_model_metadata, "nope").status() == "StatusCode.NOT_FOUND"
    assert grpc_error(client.is_model_ready, "tiny", "2").status() == "StatusCode.NOT_FOUND"


def test_model_configuration_in_tritons_schema(runtime: RuntimeProcess) -> None:
    """What perf_analyzer asks first, over HTTP and gRPC in one process: the batch and the tensors."""
    doc, cfg = model_configs(runtime.address, runtime.grpc_address, "tiny")
    assert (cfg.name, cfg.platform, cfg.backend, cfg.max_batch_size) == ("tiny", "pytorch", "pytorch", 8)
    assert tensors(cfg, "input") == [("text", "TYPE_STRING", [1])]
    assert tensors(cfg, "output") == [("embedding", "TYPE_FP32", [32])]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 20000
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 20000  # a JSON number, as Triton's
    assert_unknown_model_is_not_found(runtime.address, runtime.grpc_address)
    server = grpcclient.InferenceServerClient(runtime.grpc_address).get_server_metadata(as_json=True)
    assert "model_configuration" in server["extensions"]


def test_infer_matches_rest_sync_async_and_asyncio(runtime: RuntimeProcess) -> None:
    rest = httpclient.InferenceServerClient(runtime.address)
    inp = httpclient.InferInput("text", [len(SENTENCES)], "BYTES")
    inp.set_data_from_numpy(np.array([s.encode() for s in SENTENCES], dtype=object))
    expected = rest.infer("tiny", [inp]).as_numpy("embedding")
    assert expected is not None and expected.shape == (6, 32)

    client = grpcclient.InferenceServerClient(runtime.grpc_address)
    result = client.infer(
        "tiny",
        [text_input(SENTENCES)],
        outputs=[grpcclient.InferRequestedOutput("embedding")],
        request_id="r1",
    )
    out = result.as_numpy("embedding")
    assert out is not None and out.dtype == np.float32
    np.testing.assert_allclose(out, expected, atol=1e-5)
    assert result.get_response().id == "r1" and result.get_response().model_name == "tiny"

    # callback-async: each of several concurrent requests gets its own row
    done: queue.Queue[tuple[object, object]] = queue.Queue()
    for s in SENTENCES:
        client.async_infer(
            "tiny", [text_input([s])], callback=lambda result, error: done.put((result, error)), priority=1
        )
    rows = []
    for _ in SENTENCES:
        r, e = done.get(timeout=30)
        assert e is None, e
        rows.append(r.as_numpy("embedding")[0])  # type: ignore[attr-defined]
    for row in rows:  # any order: match each to its sentence's row
        assert np.abs(expected - row).max(axis=1).min() < 1e-4

    async def aio() -> np.ndarray:
        async with grpcaio.InferenceServerClient(runtime.grpc_address) as c:
            assert await c.is_server_ready()
            outs = await asyncio.gather(*(c.infer("tiny", [text_input([s])]) for s in SENTENCES))
            return np.concatenate([o.as_numpy("embedding") for o in outs])

    np.testing.assert_allclose(asyncio.run(aio()), expected, atol=1e-4)


def test_bad_requests_get_status_codes_and_fail_alone(runtime: RuntimeProcess) -> None:
    client = grpcclient.InferenceServerClient(runtime.grpc_address)
    invalid = "StatusCode.INVALID_ARGUMENT"
    fp = grpcclient.InferInput("text", [1], "FP32")
    fp.set_data_from_numpy(np.zeros(1, np.float32))
    err = grpc_error(client.infer, "tiny", [fp])
    assert err.status() == invalid and "expected datatype BYTES" in err.message()
    err = grpc_error(client.infer, "tiny", [text_input(["word " * 100])])
    assert err.status() == invalid and "tokens" in err.message()
    err = grpc_error(client.infer, "tiny", [text_input(["x"] * 9)])  # over the warmed maximum (8)
    assert err.status() == invalid and "rows" in err.message()
    err = grpc_error(client.infer, "nope", [text_input(["x"])])
    assert err.status() == "StatusCode.NOT_FOUND"
    err = grpc_error(
        client.infer, "tiny", [text_input(["x"])], outputs=[grpcclient.InferRequestedOutput("logits")]
    )
    assert err.status() == invalid and "unknown output 'logits'" in err.message()
    err = grpc_error(client.infer, "tiny", [text_input(["x"])], priority=7)
    assert err.status() == invalid and "priority" in err.message()

    # raw messages a tritonclient would never send: sizes that do not add up, no inputs
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(runtime.grpc_address))
    req = service_pb2.ModelInferRequest(model_name="tiny")
    tensor = req.inputs.add(name="text", datatype="BYTES")
    tensor.shape.append(2)
    req.raw_input_contents.append(b"\x05\x00\x00\x00hello")  # one element of the two declared
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'text'" in str(info.value.details())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(service_pb2.ModelInferRequest(model_name="tiny"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    typed = service_pb2.ModelInferRequest(model_name="tiny")  # typed contents instead of raw: served
    tensor = typed.inputs.add(name="text", datatype="BYTES")
    tensor.shape.append(1)
    tensor.contents.bytes_contents.append(SENTENCES[0].encode())
    assert len(stub.ModelInfer(typed).raw_output_contents[0]) == 32 * 4

    # bad requests mixed into a batch of good ones: only they fail
    done: queue.Queue[tuple[str, object, object]] = queue.Queue()
    for i in range(6):
        client.async_infer(
            "tiny",
            [text_input([f"good {i}"])],
            callback=lambda result, error: done.put(("good", result, error)),
        )
        client.async_infer(
            "tiny",
            [text_input(["word " * 100])],
            callback=lambda result, error: done.put(("bad", result, error)),
        )
    outcomes = [done.get(timeout=30) for _ in range(12)]
    assert all(e is None for kind, _, e in outcomes if kind == "good")
    assert all(e is not None and e.status() == invalid for kind, _, e in outcomes if kind == "bad")  # type: ignore[attr-defined]
    assert client.is_server_live()


def test_deadlines_queue_full_and_metrics(runtime: RuntimeProcess, tiny_dir: Path) -> None:
    client = grpcclient.InferenceServerClient(runtime.grpc_address)
    before = metric(runtime.metrics_text(), 'kubeinfer_requests_total{code="429",model="tiny"}')
    runtime.write_config(config(tiny_dir, max_queue_delay_seconds=0.5, max_queue_size=4))
    deadline = time.monotonic() + 10
    while metric(runtime.metrics_text(), 'kubeinfer_max_queue_delay_seconds{model="tiny"}') != 0.5:
        assert time.monotonic() < deadline, "hot reload not applied"
        time.sleep(0.2)
    done: queue.Queue[object] = queue.Queue()

    def fillers(n: int) -> None:  # a burst: the batch they start waits out its 0.5 s delay
        for i in range(n):
            client.async_infer(
                "tiny", [text_input([f"filler {i}"])], callback=lambda result, error: done.put(error)
            )

    try:
        # a queue timeout (the 'timeout' parameter, microseconds) shorter than the max queue delay
        fillers(3)
        err = grpc_error(client.infer, "tiny", [text_input(["late"])], timeout=1000)
        assert err.status() == "StatusCode.DEADLINE_EXCEEDED" and "timed out" in err.message()
        assert [done.get(timeout=30) for _ in range(3)] == [None] * 3
        # the client's own gRPC deadline bounds the time in the queue too
        fillers(3)
        err = grpc_error(client.infer, "tiny", [text_input(["late"])], client_timeout=0.1)
        assert err.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert [done.get(timeout=30) for _ in range(3)] == [None] * 3
        # 4 queued requests fill the queue: the others get RESOURCE_EXHAUSTED, the queued ones succeed
        # (the first of the burst may start at once if the executor is idle and no arrival was expected)
        fillers(10)
        errors = [done.get(timeout=30) for _ in range(10)]
        codes = ["ok" if e is None else e.status() for e in errors]  # type: ignore[attr-defined]
        exhausted = codes.count("StatusCode.RESOURCE_EXHAUSTED")
        assert codes.count("ok") in (4, 5) and exhausted == 10 - codes.count("ok"), codes
        after = metric(runtime.metrics_text(), 'kubeinfer_requests_total{code="429",model="tiny"}')
        assert after - before == exhausted  # gRPC requests are counted with their REST status code
    finally:
        runtime.write_config(config(tiny_dir))
        deadline = time.monotonic() + 10
        while metric(runtime.metrics_text(), 'kubeinfer_max_queue_delay_seconds{model="tiny"}') != 0.02:
            assert time.monotonic() < deadline
            time.sleep(0.2)


def test_sigterm_answers_queued_grpc_requests_and_refuses_new_ones(tiny_dir: Path) -> None:
    # A 2 s max queue delay: the four requests are still queued when the SIGTERM comes 0.2 s later, with
    # a wide margin on a loaded machine (the drain dispatches them at once, so the test does not wait it).
    cfg = config(tiny_dir, max_queue_delay_seconds=2.0)
    with RuntimeProcess(cfg, ready_timeout=60) as rt:

        async def run() -> tuple[list[object], object]:
            async with grpcaio.InferenceServerClient(rt.grpc_address) as c:
                await c.is_server_live()

                async def one(text: str) -> object:
                    try:
                        return (await c.infer("tiny", [text_input([text])])).as_numpy("embedding").shape
                    except InferenceServerException as exc:
                        return exc.status()

                async def handled_sigterm() -> bool:
                    try:
                        return not await c.is_server_ready()
                    except InferenceServerException:
                        return True

                queued = [asyncio.create_task(one(f"queued {i}")) for i in range(4)]
                await asyncio.sleep(0.2)
                assert not any(t.done() for t in queued)
                os.kill(rt.pid, signal.SIGTERM)
                # the late request goes once the server says it is not ready (it has handled the
                # SIGTERM: with no shutdown delay it drains at once), not after a guessed time
                for _ in range(500):
                    if await handled_sigterm():
                        break
                    await asyncio.sleep(0.01)
                late = await one("after SIGTERM")
                return list(await asyncio.gather(*queued)), late

        shapes, late = asyncio.run(run())
        assert shapes == [(1, 32)] * 4
        assert late == "StatusCode.UNAVAILABLE"
        assert rt.proc is not None and rt.proc.wait(30) == 0
