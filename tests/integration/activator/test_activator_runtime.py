"""The activator (a ``kubeinfer-activator`` process) in front of real ``kubeinfer-runtime`` processes.

The activator reads its targets from a JSON file (``hack/devtools/activator_proc.ActivatorProcess``):
a target without an endpoint has no ready replica; writing its endpoint is "the replica is Ready". The
model is Triton's ``simple`` as ONNX (INT32 ``INPUT0``, ``INPUT1`` [-1, 16]; ``OUTPUT0`` their sum,
``OUTPUT1`` their difference), the cheapest the runtime serves. Clients are Triton's own,
``tritonclient.http.aio`` (with ``Host`` set to a Service DNS name) and ``tritonclient.grpc.aio`` (on the
target's own gRPC port). One runtime serves the module's tests and starts inside the first one (while
its requests are held); the bearer-token test starts its own. Waits are on the activator's
``/activator/status``, never on sleeps.

The processes are spawned without a ``preexec_fn`` (``die_with_parent=False``): the test process runs
gRPC threads, and a child forked under them crashes before exec.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from hack.devtools.activator_proc import ActivatorProcess
from hack.devtools.runtime_proc import RuntimeConfig, RuntimeProcess
from hack.devtools.runtime_tiny import simple_onnx

pytestmark = pytest.mark.timeout(180)

TARGET = "ml/simple"
#: The Service's DNS name as a client in another namespace writes it, with the Service's port.
HOST = "simple.ml.svc.cluster.local:8080"
STAGE = "loading model"


def simple_config(path: Path, server: dict[str, Any] | None = None) -> RuntimeConfig:
    """A CPU runtime serving ``simple`` (ONNX at ``path``)."""
    return RuntimeConfig.model_validate(
        {
            "model": {"name": "simple", "source": str(path), "format": "onnx"},
            "device": "cpu",
            "batching": {"max_batch_size": 8, "max_queue_delay_seconds": 0.005},
            **({"server": server} if server else {}),
        }
    )


class LazyRuntime:
    """The module's runtime, started by the first test that needs it (the first test starts it while
    its requests are held)."""

    def __init__(self, path: Path) -> None:
        self.process = RuntimeProcess(simple_config(path), ready_timeout=120, die_with_parent=False)
        self.started = False

    def get(self) -> RuntimeProcess:
        if not self.started:
            self.process.start()
            self.started = True
        return self.process


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return simple_onnx(tmp_path_factory.mktemp("simple") / "simple.onnx")


@pytest.fixture(scope="module")
def runtime(model_path: Path) -> Iterator[LazyRuntime]:
    lazy = LazyRuntime(model_path)
    try:
        yield lazy
    finally:
        lazy.process.close()


def target(endpoint: RuntimeProcess | None = None, stage: str = STAGE) -> dict[str, Any]:
    """The targets-file entry of ``ml/simple``: with its own gRPC listener, ready when ``endpoint``."""
    doc: dict[str, Any] = {"name": "simple", "namespace": "ml", "grpc_port": 0, "stage": stage}
    if endpoint is not None:
        doc["endpoint"] = {"host": "127.0.0.1", "http_port": endpoint.port, "grpc_port": endpoint.grpc_port}
    return doc


def activator(*args: str, targets: list[dict[str, Any]] | None = None) -> ActivatorProcess:
    return ActivatorProcess(args=list(args), targets=targets or [target()], die_with_parent=False)


def inputs(module: Any, seed: int) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """``simple``'s inputs for ``module`` (tritonclient.http or .grpc) and the expected outputs."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16) + seed
    b = np.full((1, 16), seed, dtype=np.int32)
    tensors = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        t = module.InferInput(name, [1, 16], "INT32")
        t.set_data_from_numpy(value)
        tensors.append(t)
    return tensors, a + b, a - b


async def rest_infer(client: httpaio.InferenceServerClient, seed: int, **kwargs: Any) -> bool:
    """One REST inference through the activator; True when both outputs are right."""
    tensors, total, diff = inputs(httpclient, seed)
    headers = {"Host": HOST, **kwargs.pop("headers", {})}
    result = await client.infer("simple", tensors, headers=headers, **kwargs)
    return bool((result.as_numpy("OUTPUT0") == total).all() and (result.as_numpy("OUTPUT1") == diff).all())


async def grpc_infer(client: grpcaio.InferenceServerClient, seed: int, **kwargs: Any) -> bool:
    """One gRPC inference through the activator; True when both outputs are right."""
    tensors, total, diff = inputs(grpcclient, seed)
    result = await client.infer("simple", tensors, **kwargs)
    return bool((result.as_numpy("OUTPUT0") == total).all() and (result.as_numpy("OUTPUT1") == diff).all())


def held(act: ActivatorProcess, n: int) -> Any:
    """A predicate of the activator's status: ``n`` requests held for the target."""
    return lambda s: s["targets"][TARGET]["held"] == n


async def test_requests_held_at_zero_are_all_answered_once_the_replica_is_ready(runtime: LazyRuntime) -> None:
    with activator() as act:
        act.wait_for(lambda s: s["targets"][TARGET]["grpc_port"])
        rest = httpaio.InferenceServerClient(act.address)
        grpc_ = grpcaio.InferenceServerClient(act.target_grpc_address(TARGET))
        try:
            calls = [
                asyncio.create_task(rest_infer(rest, i) if i % 2 else grpc_infer(grpc_, i)) for i in range(10)
            ]
            status = await asyncio.to_thread(act.wait_for, held(act, 10))
            assert status["targets"][TARGET]["demands"] == 1  # the first held request asked for a replica
            assert not any(c.done() for c in calls)
            rt = await asyncio.to_thread(runtime.get)  # the replica starts only now
            act.write_targets([target(rt)])
            assert await asyncio.wait_for(asyncio.gather(*calls), timeout=60) == [True] * 10
            # a ready target: forwarded at once, held never
            assert await rest_infer(rest, 42) and await grpc_infer(grpc_, 43)
            assert act.status()["targets"][TARGET]["held"] == 0
        finally:
            await rest.close()
            await grpc_.close()


async def test_over_the_count_bound_exactly_the_excess_is_refused(runtime: LazyRuntime) -> None:
    rt = await asyncio.to_thread(runtime.get)
    with activator("--max-held-requests", "4", "--retry-after", "3") as act:
        act.wait_for(lambda s: s["targets"][TARGET]["grpc_port"])
        rest = httpaio.InferenceServerClient(act.address)
        grpc_ = grpcaio.InferenceServerClient(act.target_grpc_address(TARGET))
        try:
            calls = [
                asyncio.create_task(rest_infer(rest, i) if i % 2 else grpc_infer(grpc_, i)) for i in range(4)
            ]
            await asyncio.to_thread(act.wait_for, held(act, 4))
            # the excess: one REST (raw, to see Retry-After), one through tritonclient, one gRPC
            async with httpx.AsyncClient() as raw:
                tensor = {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16}
                url = f"http://{act.address}/v2/models/simple/infer"
                resp = await raw.post(url, json={"inputs": [tensor]}, headers={"Host": HOST})
            assert resp.status_code == 503 and resp.headers["retry-after"] == "3"
            assert "4 requests already held" in resp.json()["error"]
            with pytest.raises(InferenceServerException) as rest_refused:
                await rest_infer(rest, 100)
            assert rest_refused.value.status() == "503"
            with pytest.raises(InferenceServerException) as grpc_refused:
                await grpc_infer(grpc_, 101)
            assert grpc_refused.value.status() == "StatusCode.UNAVAILABLE"
            assert act.status()["targets"][TARGET]["held"] == 4 and not any(c.done() for c in calls)
            act.write_targets([target(rt)])
            assert await asyncio.wait_for(asyncio.gather(*calls), timeout=60) == [True] * 4
            refusals = [line for line in act.log_text().splitlines() if "already held" in line]
            assert len(refusals) == 3 and "Traceback" not in act.log_text()  # one line per refusal
        finally:
            await rest.close()
            await grpc_.close()


async def test_held_past_the_cold_start_budget_is_504_naming_the_stage() -> None:
    stage = "Unschedulable: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu"
    with activator("--cold-start-timeout", "0.5", targets=[target(stage=stage)]) as act:
        act.wait_for(lambda s: s["targets"][TARGET]["grpc_port"])
        rest = httpaio.InferenceServerClient(act.address)
        grpc_ = grpcaio.InferenceServerClient(act.target_grpc_address(TARGET))
        try:
            with pytest.raises(InferenceServerException) as rest_late:
                await rest_infer(rest, 1)
            assert rest_late.value.status() == "504" and stage in rest_late.value.message()
            with pytest.raises(InferenceServerException) as grpc_late:
                await grpc_infer(grpc_, 2)
            assert grpc_late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            assert stage in grpc_late.value.message()
        finally:
            await rest.close()
            await grpc_.close()


async def test_a_requests_own_timeout_shorter_than_the_budget_wins() -> None:
    with activator("--cold-start-timeout", "60", targets=[target(stage="pulling image")]) as act:
        rest = httpaio.InferenceServerClient(act.address)
        try:
            started = time.monotonic()
            with pytest.raises(InferenceServerException) as own:
                await rest_infer(rest, 3, timeout=50_000)  # the OIP timeout parameter: 50 ms
            assert own.value.status() == "504" and "pulling image" in own.value.message()
            assert time.monotonic() - started < 30  # the 60 s budget did not end it
        finally:
            await rest.close()


async def test_a_client_that_leaves_while_held_leaves_the_queue_and_unknown_hosts_are_404() -> None:
    with activator() as act:
        async with httpx.AsyncClient() as raw:
            url = f"http://{act.address}/v2/models/simple"
            with pytest.raises(httpx.ReadTimeout):
                await raw.get(url, headers={"Host": "simple.ml"}, timeout=0.3)
            act.wait_for(lambda s: s["targets"][TARGET]["demands"] == 1 and s["targets"][TARGET]["held"] == 0)
            unknown = await raw.get(f"http://{act.address}/v2/health/ready", headers={"Host": "other.ml.svc"})
            assert unknown.status_code == 404 and "other.ml.svc" in unknown.json()["error"]
            own = await raw.get(f"http://{act.address}/activator/healthz", headers={"Host": "other.ml.svc"})
            assert own.status_code == 200
        # gRPC, on the shared port (the target named by the model): a cancelled call leaves the queue too
        async with grpc.aio.insecure_channel(act.grpc_address) as channel:
            ready = channel.unary_unary("/inference.GRPCInferenceService/ModelReady")
            call = ready(service_pb2.ModelReadyRequest(name="simple").SerializeToString())
            await asyncio.to_thread(act.wait_for, lambda s: s["targets"][TARGET]["held"] == 1)
            call.cancel()
            act.wait_for(lambda s: s["targets"][TARGET]["demands"] == 2 and s["targets"][TARGET]["held"] == 0)
        grpc_ = grpcaio.InferenceServerClient(act.grpc_address)
        try:
            with pytest.raises(InferenceServerException) as missing:
                await grpc_.get_model_metadata("nope")
            assert missing.value.status() == "StatusCode.NOT_FOUND"
        finally:
            await grpc_.close()


async def test_the_runtimes_bearer_token_check_is_not_weakened(model_path: Path) -> None:
    token = "s3cret-token-for-the-test"
    cfg = simple_config(model_path, server={"bearer_token_env": "KUBEINFER_TEST_TOKEN"})
    rt = RuntimeProcess(cfg, env={"KUBEINFER_TEST_TOKEN": token}, ready_timeout=120, die_with_parent=False)
    with activator() as act:
        act.wait_for(lambda s: s["targets"][TARGET]["grpc_port"])
        rest = httpaio.InferenceServerClient(act.address)
        grpc_ = grpcaio.InferenceServerClient(act.target_grpc_address(TARGET))
        bearer = {"Authorization": f"Bearer {token}"}
        try:
            # held first, then released to the runtime, which checks the token
            calls = [
                asyncio.create_task(rest_infer(rest, 1)),
                asyncio.create_task(rest_infer(rest, 2, headers=bearer)),
                asyncio.create_task(grpc_infer(grpc_, 3)),
                asyncio.create_task(grpc_infer(grpc_, 4, headers={"authorization": f"Bearer {token}"})),
            ]
            await asyncio.to_thread(act.wait_for, held(act, 4))
            with rt:
                act.write_targets([target(rt)])
                results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout=60)
                assert results[1] is True and results[3] is True
                assert isinstance(results[0], InferenceServerException) and results[0].status() == "401"
                assert isinstance(results[2], InferenceServerException)
                assert results[2].status() == "StatusCode.UNAUTHENTICATED"
                async with httpx.AsyncClient() as raw:  # the runtime's own 401, challenge included
                    url = f"http://{act.address}/v2/models/simple"
                    resp = await raw.get(url, headers={"Host": HOST})
                    assert resp.status_code == 401 and resp.headers["www-authenticate"].startswith("Bearer")
                    resp = await raw.get(url, headers={"Host": HOST, **bearer})
                    assert resp.status_code == 200
        finally:
            await rest.close()
            await grpc_.close()
