"""The model repository mode (runtime/repository.py) on real processes: a repository of three copies of
Triton's ``simple`` as ONNX and one broken model, with a memory budget that fits two of the three (the
budget is 2.5 times the resident size of one model's process, measured first as the runtime measures
it, with that model pinned). One runtime for the module; each test leaves it usable by the next.

- requests cycling over the three all succeed, and the least recently used model is evicted each time a
  third one loads (evictions counted, never more than two loaded);
- concurrent first requests for a model share one load;
- a model whose file is broken fails its requests with its name and the cause, alone;
- ``tritonclient``'s repository calls (index, load, unload) over REST and gRPC;
- an ONNX model's process imports only what serves it: ONNX Runtime, neither torch nor transformers, nor
  the HTTP and gRPC stacks that its parent serves (a pooled model's resident bytes are its budget).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.errors import HTTPError
from kubeinfer.runtime.repository import ModelRepository
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from hack.devtools.runtime_proc import RuntimeProcess
from hack.devtools.runtime_tiny import simple_onnx

pytestmark = pytest.mark.timeout(240)

MODELS = ("a", "b", "c")
MODEL_YAML = """\
model:
  source: model.onnx
  format: onnx
device: cpu
batching:
  max_batch_size: 8
  max_queue_delay_seconds: 0.001
"""


def _repository(root: Path) -> Path:
    for name in (*MODELS, "broken"):
        directory = root / name
        directory.mkdir(parents=True)
        if name == "broken":
            (directory / "model.onnx").write_bytes(b"this is not an ONNX model")
        else:
            simple_onnx(directory / "model.onnx")
        (directory / "runtime.yaml").write_text(MODEL_YAML, encoding="utf-8")
    return root


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of metric ``name``, by their sorted labels."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def _config(root: Path, budget: int, pinned: tuple[str, ...] = ()) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {
            "repository": {
                "path": str(root),
                "memory_budget_bytes": budget,
                "pinned": list(pinned),
                "load_timeout_seconds": 60,
            }
        }
    )


async def _one_model_bytes(root: Path) -> int:
    """The resident bytes of model ``a``'s process, as the repository measures them; on the way, ``a``
    pinned: loaded at start, the repository ready only then, an unload of it refused."""
    repository = ModelRepository(_config(root, 1 << 40, pinned=("a",)))
    await repository.start()
    try:
        assert (await repository.readiness() or "").startswith("pinned models not loaded: a (")
        for _ in range(600):
            if await repository.readiness() is None:
                break
            await asyncio.sleep(0.1)
        assert await repository.readiness() is None
        with pytest.raises(HTTPError, match="pinned"):
            await repository.repository_unload("a")
        text = (await repository.metrics_text()).decode()
    finally:
        await repository.close()
    return int(_samples(text, "kubeinfer_model_resident_bytes")[(("model", "a"),)])


#: What an ONNX model's process must not import: another engine, and the transports its parent serves.
NOT_FOR_ONNX = ("torch", "transformers", "grpc", "uvicorn", "starlette")


async def test_an_onnx_model_process_imports_only_onnx_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # the model process inherits the environment and this process's stderr: -X importtime's lines
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    root = tmp_path / "models"
    (root / "a").mkdir(parents=True)
    simple_onnx(root / "a" / "model.onnx")
    (root / "a" / "runtime.yaml").write_text(MODEL_YAML, encoding="utf-8")
    repository = ModelRepository(_config(root, 1 << 40))
    await repository.start()
    try:
        await repository.repository_load("a")
    finally:
        await repository.close()
    imported = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in capfd.readouterr().err.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "onnxruntime" in imported  # the model process's imports were seen
    assert not imported & set(NOT_FOR_ONNX), sorted(imported & set(NOT_FOR_ONNX))


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    root = _repository(tmp_path_factory.mktemp("repository") / "models")
    one = asyncio.run(_one_model_bytes(root))
    assert one > 0
    with RuntimeProcess(_config(root, int(2.5 * one)), ready_timeout=60) as rt:
        yield rt


def _body(value: int) -> dict[str, object]:
    row = list(range(16))
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": row},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [value] * 16},
        ]
    }


def _infer(rt: RuntimeProcess, model: str, value: int = 1) -> httpx.Response:
    return httpx.post(f"{rt.url}/v2/models/{model}/infer", json=_body(value), timeout=60)


def _index(rt: RuntimeProcess) -> dict[str, dict[str, str]]:
    response = httpx.post(f"{rt.url}/v2/repository/index", timeout=30)
    assert response.status_code == 200, response.text
    return {entry["name"]: entry for entry in response.json()}


def _metric(rt: RuntimeProcess, name: str, **labels: str) -> float:
    text = httpx.get(f"{rt.url}/metrics", timeout=30).text
    return sum(v for k, v in _samples(text, name).items() if set(labels.items()) <= set(k))


def test_requests_cycling_over_three_models_all_succeed_and_evict_the_least_recently_used(
    runtime: RuntimeProcess,
) -> None:
    evicted = _metric(runtime, "kubeinfer_model_evictions_total")
    for step, model in enumerate([*MODELS, *MODELS]):
        response = _infer(runtime, model, step)
        assert response.status_code == 200, response.text
        assert response.json()["model_name"] == model
        outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
        assert outputs["OUTPUT0"] == [i + step for i in range(16)]
        ready = [name for name, entry in _index(runtime).items() if entry["state"] == "READY"]
        assert len(ready) <= 2, ready
        assert model in ready
    # from the third load on, each load evicts the least recently used: c evicts a, a evicts b, ...
    assert _metric(runtime, "kubeinfer_model_evictions_total") - evicted >= 4
    index = _index(runtime)
    assert index["a"]["state"] == "UNAVAILABLE" and index["a"]["reason"] == "evicted: memory budget"
    assert (index["b"]["state"], index["c"]["state"]) == ("READY", "READY")
    budget = _metric(runtime, "kubeinfer_repository_memory_budget_bytes")
    assert 0 < _metric(runtime, "kubeinfer_repository_resident_bytes") <= budget


def test_concurrent_first_requests_share_one_load(runtime: RuntimeProcess) -> None:
    assert httpx.post(f"{runtime.url}/v2/repository/models/a/unload", timeout=60).status_code == 200
    assert _index(runtime)["a"]["state"] == "UNAVAILABLE"
    loads = _metric(runtime, "kubeinfer_model_loads_total", model="a", outcome="success")
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: _infer(runtime, "a", i), range(8)))
    assert [r.status_code for r in responses] == [200] * 8, [r.text for r in responses]
    assert _metric(runtime, "kubeinfer_model_loads_total", model="a", outcome="success") == loads + 1
    assert _metric(runtime, "nv_model_load_duration_secs", model="a", version="1") > 0
    # the model process's request metrics are on the pod's /metrics (a pool's autoscaler reads them)
    assert _metric(runtime, "kubeinfer_requests_total", model="a", code="200") >= 8
    assert _metric(runtime, "kubeinfer_request_duration_seconds_count", model="a") >= 8
    # the serving process froze its start's objects out of garbage collection, each model process its load's
    log = runtime.log_text()
    assert "objects of the started server frozen out of garbage collection" in log, log[-3000:]
    assert "objects of the load frozen out of garbage collection" in log, log[-3000:]


def test_a_broken_model_fails_alone_with_its_name_and_cause(runtime: RuntimeProcess) -> None:
    response = _infer(runtime, "broken")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error.startswith("model 'broken' failed to load: ") and "Protobuf parsing failed" in error
    # within the backoff: the same answer at once, no second load
    again = _infer(runtime, "broken")
    assert (again.status_code, again.json()["error"]) == (503, error)
    assert "retry-after" in again.headers
    assert _metric(runtime, "kubeinfer_model_loads_total", model="broken", outcome="failure") == 1
    entry = _index(runtime)["broken"]
    assert entry["state"] == "UNAVAILABLE" and "Protobuf parsing failed" in entry["reason"]
    for model in MODELS:  # the others are unaffected
        assert _infer(runtime, model).status_code == 200
    assert _infer(runtime, "missing").status_code == 404


def test_tritonclient_repository_calls_over_rest_and_grpc(runtime: RuntimeProcess) -> None:
    http = httpclient.InferenceServerClient(runtime.address)
    assert "model_repository" in http.get_server_metadata()["extensions"]
    names = {m["name"] for m in http.get_model_repository_index()}
    assert names == {*MODELS, "broken"}
    http.unload_model("b")
    assert not http.is_model_ready("b")
    http.load_model("b")
    assert http.is_model_ready("b")
    with pytest.raises(InferenceServerException, match="failed to load"):
        http.load_model("broken")

    grpc = grpcclient.InferenceServerClient(runtime.grpc_address)
    try:
        assert "model_repository" in grpc.get_server_metadata(as_json=True)["extensions"]
        index = grpc.get_model_repository_index(as_json=True)["models"]
        assert {m["name"] for m in index} == {*MODELS, "broken"}
        assert all(m["version"] == "1" and m["state"] for m in index)
        # loaded first: the refused load of "broken" above made room for it at the largest size measured
        # (a model never loaded is expected at that size), which may have evicted "c"
        grpc.load_model("c")
        grpc.unload_model("c")
        assert not grpc.is_model_ready("c")
        states = {m["name"]: m.get("state") for m in grpc.get_model_repository_index(as_json=True)["models"]}
        assert states["c"] == "UNAVAILABLE"
        grpc.load_model("c")
        assert grpc.is_model_ready("c")
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        result = grpc.infer("c", inputs)
        assert result.as_numpy("OUTPUT0").tolist() == [[2] * 16]
        with pytest.raises(InferenceServerException, match="failed to load"):
            grpc.load_model("broken")
        with pytest.raises(InferenceServerException):
            grpc.load_model("missing")
    finally:
        grpc.close()
    assert _metric(runtime, "kubeinfer_model_unloads_total", model="c", reason="request") >= 1


def _tree_rss(pid: int) -> int:
    """Resident bytes of process ``pid`` and its descendants (``/proc``: VmRSS), as a pod counts them."""
    total = 0
    pids = [pid]
    while pids:
        current = pids.pop()
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            status = Path(f"/proc/{current}/status").read_text()
            total += 1024 * int(
                next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
            )
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
            pids.extend(int(c) for c in children)
    return total


def _children(pid: int) -> set[str]:
    return set(Path(f"/proc/{pid}/task/{pid}/children").read_text().split())


@pytest.mark.timeout(600)
def test_a_hundred_load_and_unload_cycles_leave_the_replica_at_its_first_cycles_memory(
    runtime: RuntimeProcess,
) -> None:
    """Unloading frees what loading took: the model's process goes with it, and the runtime itself holds
    nothing per cycle (its resident size after the 100th unload, and the whole tree's with the model
    loaded, within 10 % of the first cycle's)."""
    http = httpclient.InferenceServerClient(runtime.address, network_timeout=60)
    for model in ("b", "c"):  # only "a" in this runtime's processes while it cycles
        http.unload_model(model)
    base = _children(runtime.pid)  # front ends, if any
    loaded: list[int] = []
    unloaded: list[int] = []
    for cycle in range(100):
        http.load_model("a")
        assert _infer(runtime, "a", cycle).status_code == 200
        loaded.append(_tree_rss(runtime.pid))
        http.unload_model("a")
        unloaded.append(_tree_rss(runtime.pid))
        assert _children(runtime.pid) == base, f"cycle {cycle}: a model process left after the unload"
    mib = [v >> 20 for v in (loaded[0], loaded[-1], unloaded[0], unloaded[-1])]
    print("tree RSS loaded {} -> {} MiB, unloaded {} -> {} MiB".format(*mib))
    assert unloaded[-1] <= 1.10 * unloaded[0], (unloaded[0], unloaded[-1])
    assert loaded[-1] <= 1.10 * loaded[0], (loaded[0], loaded[-1])
