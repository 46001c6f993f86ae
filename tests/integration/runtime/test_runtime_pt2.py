"""Triton's ``simple`` add/sub model as a ``.pt2`` file served by a real ``kubeinfer-runtime serve``
process, with no tensor declared in the configuration: as a ``torch.export`` program and as an
AOTInductor package (compiled here for the CPU, with its program). ``tritonclient.http`` and
``tritonclient.grpc`` read the tensors the runtime took from the program (v2 metadata), get the sum and
the difference, concurrent requests of different row counts batch together with the same answers, and
a wrong name, datatype or non-batch dimension is refused with a 400 naming the tensor. A ``.pt2``
fetched by ``kubeinfer-runtime fetch`` over HTTP stays one file (a zip file, not unpacked as an
archive) and is served from the fetch's directory. In process: an AOTInductor package runs compiled
with its program's tensors, and one without its program needs declared tensors that fit its call
spec."""

from __future__ import annotations

import concurrent.futures
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.runtime.models import load_model
from kubeinfer.runtime.models.pt2 import archive_contents
from tritonclient.utils import InferenceServerException

from hack.devtools.runtime_proc import RuntimeConfig, RuntimeProcess
from hack.devtools.runtime_tiny import simple_aoti_packages, simple_pt2
from tests.integration.runtime.conftest import FetchCli
from tests.support.model_config import model_configs, tensors
from tests.support.storage import FileServer

pytestmark = pytest.mark.timeout(300)

MODEL = "simple"
ELEMENTS = 16
CLIENTS = ((httpclient, "http"), (grpcclient, "grpc"))


@pytest.fixture(scope="module")
def aoti_packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The simple model compiled by AOTInductor for the CPU (once: tens of seconds), packaged with and
    without its program."""
    return simple_aoti_packages(tmp_path_factory.mktemp("aoti"), ELEMENTS)


@pytest.fixture(scope="module", params=[None, "with-program"], ids=["exported-program", "aoti-package"])
def runtime(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeProcess]:
    directory = tmp_path_factory.mktemp("simple")
    if request.param is None:
        simple_pt2(directory / "model.pt2", ELEMENTS)
    else:  # the module's compiled package, copied (not compiled a second time)
        shutil.copyfile(request.getfixturevalue("aoti_packages")[request.param], directory / "model.pt2")
    cfg = RuntimeConfig.model_validate(
        {
            "model": {"name": MODEL, "source": str(directory), "format": "pt2"},
            "device": "cpu",
            "batching": {"max_batch_size": 16, "max_queue_delay_seconds": 0.2},
        }
    )
    with RuntimeProcess(cfg, ready_timeout=180) as rt:
        assert rt.grpc_port, f"no gRPC port in the log:\n{rt.tail()}"
        engine = "AOTInductor" if request.param else "ExportedProgram"
        assert f"loaded pt2 {MODEL} from {directory / 'model.pt2'} ({engine}) on cpu" in rt.log_text()
        yield rt


def client_of(module: Any, rt: RuntimeProcess) -> Any:
    return module.InferenceServerClient(rt.address if module is httpclient else rt.grpc_address)


def tensor(module: Any, name: str, array: np.ndarray, datatype: str = "INT32") -> Any:
    inp = module.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def test_the_tensors_are_read_from_the_program(runtime: RuntimeProcess) -> None:
    expected = [
        {"name": name, "datatype": "INT32", "shape": [-1, ELEMENTS]}
        for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
    ]
    http = client_of(httpclient, runtime).get_model_metadata(MODEL)
    assert [*http["inputs"], *http["outputs"]] == expected and http["platform"] == "pytorch"
    grpc = client_of(grpcclient, runtime).get_model_metadata(MODEL)
    assert [
        {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        for t in (*grpc.inputs, *grpc.outputs)
    ] == expected


def test_the_model_configuration_follows_the_program(runtime: RuntimeProcess) -> None:
    """perf_analyzer's first question: Triton's simple model as Triton would describe it."""
    _, cfg = model_configs(runtime.address, runtime.grpc_address, MODEL)
    assert (cfg.platform, cfg.backend, cfg.max_batch_size) == ("pytorch", "pytorch", 16)
    assert tensors(cfg, "input") == [(n, "TYPE_INT32", [ELEMENTS]) for n in ("INPUT0", "INPUT1")]
    assert tensors(cfg, "output") == [(n, "TYPE_INT32", [ELEMENTS]) for n in ("OUTPUT0", "OUTPUT1")]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 200000


@pytest.mark.parametrize(("module", "protocol"), CLIENTS, ids=[p for _, p in CLIENTS])
def test_sum_and_difference_over_tritonclient(runtime: RuntimeProcess, module: Any, protocol: str) -> None:
    client = client_of(module, runtime)
    a = np.arange(3 * ELEMENTS, dtype=np.int32).reshape(3, ELEMENTS)
    b = np.full((3, ELEMENTS), -7, np.int32)
    result = client.infer(MODEL, [tensor(module, "INPUT0", a), tensor(module, "INPUT1", b)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0").dtype == np.int32
    only = client.infer(
        MODEL,
        [tensor(module, "INPUT0", a[:1]), tensor(module, "INPUT1", b[:1])],
        outputs=[module.InferRequestedOutput("OUTPUT1")],
    )
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), a[:1] - b[:1])
    assert only.as_numpy("OUTPUT0") is None


def _executions(rt: RuntimeProcess) -> tuple[int, int]:
    stats = client_of(httpclient, rt).get_inference_statistics(MODEL)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_concurrent_requests_batch_together_with_the_same_answers(runtime: RuntimeProcess) -> None:
    rows = [1, 3, 2, 4, 1, 2, 3, 1]
    start = threading.Barrier(len(rows))
    inferences, executions = _executions(runtime)

    def one(i: int) -> None:
        module = CLIENTS[i % 2][0]
        client = client_of(module, runtime)
        a = np.full((rows[i], ELEMENTS), i, np.int32)
        b = np.arange(rows[i] * ELEMENTS, dtype=np.int32).reshape(rows[i], ELEMENTS)
        start.wait()
        result = client.infer(MODEL, [tensor(module, "INPUT0", a), tensor(module, "INPUT1", b)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)

    with concurrent.futures.ThreadPoolExecutor(len(rows)) as pool:
        list(pool.map(one, range(len(rows))))
    inferences_after, executions_after = _executions(runtime)
    assert inferences_after - inferences == sum(rows)
    # 8 requests released together within the 0.2 s max queue delay: fewer batches than requests
    assert 1 <= executions_after - executions < len(rows)


@pytest.mark.parametrize(("module", "protocol"), CLIENTS, ids=[p for _, p in CLIENTS])
def test_a_request_that_does_not_fit_the_program_is_refused_naming_the_tensor(
    runtime: RuntimeProcess, module: Any, protocol: str
) -> None:
    client = client_of(module, runtime)
    good = np.ones((1, ELEMENTS), np.int32)
    cases = [
        (
            [tensor(module, "INPUT0", good), tensor(module, "INPUT1", good.astype(np.float32), "FP32")],
            "input tensor 'INPUT1': expected datatype INT32, got FP32",
        ),
        (
            [tensor(module, "INPUT0", good), tensor(module, "INPUT1", np.ones((1, 15), np.int32))],
            r"input tensor 'INPUT1': expected shape \[-1, 16\]",
        ),
        (
            [tensor(module, "INPUT0", good), tensor(module, "X", good)],
            "input tensor 'INPUT1' is missing",
        ),
        (
            [tensor(module, "INPUT0", good), tensor(module, "INPUT1", good), tensor(module, "X", good)],
            "unexpected input tensor 'X'",
        ),
    ]
    for inputs, message in cases:
        with pytest.raises(InferenceServerException, match=message) as info:
            client.infer(MODEL, inputs)
        status = info.value.status()
        assert status in ("400", "StatusCode.INVALID_ARGUMENT"), (message, status)


def test_a_fetched_pt2_file_stays_whole_and_is_served(
    file_server: FileServer, fetch_cli: FetchCli, tmp_path: Path
) -> None:
    model = simple_pt2(file_server.root / "simple.pt2", ELEMENTS)
    dest = tmp_path / "mnt" / "models"
    run = fetch_cli("--source", file_server.url("simple.pt2"), "--dest", str(dest), "--allow-http")
    assert run.returncode == 0, run.stderr + run.termination
    assert sorted(p.name for p in dest.iterdir() if not p.name.startswith(".")) == ["simple.pt2"]
    assert (dest / "simple.pt2").read_bytes() == model.read_bytes()
    cfg = RuntimeConfig.model_validate(
        {"model": {"name": MODEL, "source": str(dest), "format": "pt2"}, "device": "cpu"}
    )
    with RuntimeProcess(cfg, ready_timeout=120) as rt:
        a = np.arange(2 * ELEMENTS, dtype=np.int32).reshape(2, ELEMENTS)
        result = client_of(httpclient, rt).infer(
            MODEL, [tensor(httpclient, "INPUT0", a), tensor(httpclient, "INPUT1", a * 2)]
        )
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 3)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), -a)
        assert "startup: fetch " in rt.log_text()


def cfg(source: Path, model: dict[str, object]) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {"model": {"name": MODEL, "source": str(source), "format": "pt2", **model}, "device": "cpu"}
    )


def _declared() -> dict[str, object]:
    tensor = {"datatype": "INT32", "shape": [-1, 16]}
    return {
        "inputs": [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}],
        "outputs": [{"name": "OUTPUT0", **tensor}, {"name": "OUTPUT1", **tensor}],
    }


def test_an_aoti_package_runs_compiled_with_tensors_read_from_its_program(
    aoti_packages: dict[str, Path],
) -> None:
    path = aoti_packages["with-program"]
    assert archive_contents(path).aoti and archive_contents(path).program
    model = load_model(cfg(path, {}))
    assert type(model.module).__name__ == "AOTICompiledModel"  # type: ignore[attr-defined]
    assert [t.name for t in model.inputs] == ["INPUT0", "INPUT1"]
    assert [t.name for t in model.outputs] == ["OUTPUT0", "OUTPUT1"]
    a = np.arange(48, dtype=np.int32).reshape(3, 16)
    out = model.execute(model.preprocess([{"INPUT0": a, "INPUT1": a[::-1]}]))
    np.testing.assert_array_equal(out["OUTPUT0"], a + a[::-1])
    np.testing.assert_array_equal(out["OUTPUT1"], a - a[::-1])
    assert model.warmup(8, 1) >= 0


def test_an_aoti_package_alone_needs_declared_tensors_that_fit_its_call_spec(
    aoti_packages: dict[str, Path],
) -> None:
    path = aoti_packages["alone"]
    assert archive_contents(path).aoti and not archive_contents(path).program
    with pytest.raises(ValueError, match="without its ExportedProgram, which carries no datatypes"):
        load_model(cfg(path, {}))
    declared = _declared()
    model = load_model(cfg(path, declared))
    a = np.ones((2, 16), np.int32)
    np.testing.assert_array_equal(model.execute(model.preprocess([{"INPUT0": a, "INPUT1": a}]))["OUTPUT1"], 0)
    renamed = {**declared, "outputs": [{**o, "name": f"Y{i}"} for i, o in enumerate(declared["outputs"])]}  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"model\.outputs names \['Y0', 'Y1'\], the AOTInductor package has"):
        load_model(cfg(path, renamed))
    one_input = {**declared, "inputs": declared["inputs"][:1]}  # type: ignore[index]
    with pytest.raises(ValueError, match=r"model\.inputs: 1 declared, the AOTInductor package takes 2"):
        load_model(cfg(path, one_input))
