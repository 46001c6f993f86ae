"""Triton's own Python client examples, unmodified, against a real ``kubeinfer-runtime`` process.

The scripts in ``tests/vendor/triton_client_examples`` are copied byte for byte from
``triton-inference-server/client`` (see the README there). Each one talks to Triton's ``simple``
model, which this module builds as TorchScript (every tensor declared in the configuration), as
ONNX and as a ``torch.export`` program (``.pt2``; every tensor read from the model by the runtime):
INT32 inputs ``INPUT0`` and ``INPUT1`` of shape [-1, 16], outputs ``OUTPUT0 = INPUT0 + INPUT1`` and
``OUTPUT1 = INPUT0 - INPUT1``. A script is run as a subprocess with the venv's python and
``-u host:port`` (the REST port for the HTTP scripts, the gRPC port for the gRPC ones), once against
one process and once with ``server.http_workers`` 2 (the ``.pt2`` program against one process).

A script passes when it exits 0 and printed what it prints on success: its ``PASS`` line where it
has one, and the ``a + b = c`` / ``a - b = c`` lines of every result it validated (some scripts
exit 0 without validating anything when they cannot connect, so the status alone proves little).
Then the statistics extension must have counted what the script sent: ``inference_count`` grown by
its rows, ``success`` by its successful requests, and ``success.count`` equal to
``kubeinfer_requests_total{code="200"}`` of ``/metrics``. The model configuration (Triton's model
configuration extension, what perf_analyzer asks first) says what Triton's own ``config.pbtxt`` of
``simple`` says.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from torch import nn

from hack.devtools.runtime_proc import RuntimeConfig, RuntimeProcess
from hack.devtools.runtime_tiny import simple_onnx, simple_pt2
from tests.support.model_config import model_configs, tensors

pytestmark = pytest.mark.timeout(300)

EXAMPLES = Path(__file__).resolve().parents[2] / "vendor" / "triton_client_examples"
MODEL = "simple"

#: What the scripts print for each element they validate: "3 + 1 = 4", "3 - -1 = 4".
ARITH = re.compile(r"^(-?\d+) ([+-]) (-?\d+) = (-?\d+)$", re.MULTILINE)
#: Elements per tensor of the ``simple`` model; a validated result prints a sum and a difference each.
ELEMENTS = 16


class Simple(nn.Module):
    """Triton's ``simple`` model: the element-wise sum and difference of two INT32 tensors."""

    def forward(self, input0: torch.Tensor, input1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return input0 + input1, input0 - input1


def simple_config(path: Path, http_workers: int, fmt: str = "torchscript") -> RuntimeConfig:
    """A CPU runtime serving ``simple`` saved at ``path``: the scripted ``Simple`` with every tensor
    declared here, or (``fmt`` onnx, pt2) the ONNX model or the torch.export program, whose tensors the
    runtime reads from the model."""
    tensor = {"datatype": "INT32", "shape": [-1, ELEMENTS]}
    declared = {
        "inputs": [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}],
        "outputs": [{"name": "OUTPUT0", **tensor}, {"name": "OUTPUT1", **tensor}],
    }
    return RuntimeConfig.model_validate(
        {
            "model": {
                "name": MODEL,
                "source": str(path),
                "format": fmt,
                **(declared if fmt == "torchscript" else {}),
            },
            "device": "cpu",
            "batching": {"max_batch_size": 8, "max_queue_delay_seconds": 0.005},
            "server": {"http_workers": http_workers},
        }
    )


@pytest.fixture(
    scope="module",
    params=[(1, "torchscript"), (2, "torchscript"), (1, "onnx"), (2, "onnx"), (1, "pt2")],
    ids=["one-process", "http_workers=2", "onnx-one-process", "onnx-http_workers=2", "pt2-one-process"],
)
def runtime(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeProcess]:
    workers, fmt = request.param
    if fmt == "onnx":
        path = simple_onnx(tmp_path_factory.mktemp("simple") / "simple.onnx")
    elif fmt == "pt2":
        path = simple_pt2(tmp_path_factory.mktemp("simple") / "simple.pt2")
    else:
        path = tmp_path_factory.mktemp("simple") / "simple.pt"
        torch.jit.save(torch.jit.script(Simple().eval()), str(path))
    with RuntimeProcess(simple_config(path, workers, fmt), ready_timeout=120) as rt:
        assert rt.grpc_port, f"no gRPC port in the log:\n{rt.tail()}"
        yield rt


def test_the_simple_model_is_configured_as_tritons_own_configuration_says(runtime: RuntimeProcess) -> None:
    """Triton's ``simple`` model repository configures it with ``max_batch_size: 8`` and four
    ``TYPE_INT32`` tensors of ``dims: [16]``: the runtime's model configuration says the same, over
    HTTP and gRPC, for every format, in one process and behind two front ends."""
    _, cfg = model_configs(runtime.address, runtime.grpc_address, MODEL)
    onnx = "onnxruntime" if cfg.platform == "onnxruntime_onnx" else "pytorch"
    assert (cfg.name, cfg.backend, cfg.max_batch_size) == (MODEL, onnx, 8)
    assert tensors(cfg, "input") == [(n, "TYPE_INT32", [ELEMENTS]) for n in ("INPUT0", "INPUT1")]
    assert tensors(cfg, "output") == [(n, "TYPE_INT32", [ELEMENTS]) for n in ("OUTPUT0", "OUTPUT1")]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 5000


@dataclass(frozen=True)
class Example:
    """One vendored script and what a successful run of it sends and prints."""

    script: str
    protocol: str  # "http" or "grpc": which port ``-u`` names
    results: int  # results it validates, each printing ELEMENTS sums and ELEMENTS differences
    requests: int  # successful one-row infer requests for ``simple`` it sends
    passed: str | None  # its success line, where it prints one
    args: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return self.script.removesuffix(".py") + ("-" + "-".join(self.args) if self.args else "")

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


EXAMPLES_RUN = [
    # two infers (with and without requested outputs), then one for "wrong_model_name" whose error
    # must start with "Request for unknown model"
    Example("simple_http_infer_client.py", "http", results=2, requests=2, passed=None),
    # two concurrent async_infer calls
    Example("simple_http_async_infer_client.py", "http", results=2, requests=2, passed=None),
    # two infers, the wrong model name (as above), then two in parallel
    Example(
        "simple_http_aio_infer_client.py",
        "http",
        results=4,
        requests=4,
        passed="PASS: infer",
    ),
    # three infers with the same input and output objects: shared memory, plain, shared memory again
    Example(
        "reuse_infer_objects_client.py",
        "http",
        results=3,
        requests=3,
        passed=None,
        args=("-i", "http"),
    ),
    Example(
        "reuse_infer_objects_client.py",
        "grpc",
        results=3,
        requests=3,
        passed=None,
        args=("-i", "grpc"),
    ),
    # two infers (with and without requested outputs)
    Example("simple_grpc_infer_client.py", "grpc", results=2, requests=2, passed="PASS: infer"),
    # one callback async_infer
    Example("simple_grpc_async_infer_client.py", "grpc", results=1, requests=1, passed="PASS: Async infer"),
    # one infer, then two in parallel
    Example("simple_grpc_aio_infer_client.py", "grpc", results=3, requests=3, passed="PASS: grpc aio infer"),
]


def statistics(rt: RuntimeProcess) -> dict[str, Any]:
    """``simple``'s one ``model_stats`` entry, read as a user reads it (tritonclient over REST)."""
    client = httpclient.InferenceServerClient(rt.address)
    try:
        stats = client.get_inference_statistics(MODEL)["model_stats"]
    finally:
        client.close()
    assert [(s["name"], s["version"]) for s in stats] == [(MODEL, "1")], stats
    return dict(stats[0])


def grpc_statistics(rt: RuntimeProcess) -> tuple[int, int]:
    """(``inference_count``, ``success.count``) of ``simple`` as gRPC ``ModelStatistics`` answers."""
    client = grpcclient.InferenceServerClient(rt.grpc_address)
    try:
        stats = client.get_inference_statistics(MODEL).model_stats
    finally:
        client.close()
    assert [(s.name, s.version) for s in stats] == [(MODEL, "1")], stats
    return stats[0].inference_count, stats[0].inference_stats.success.count


def requests_ok(rt: RuntimeProcess) -> int:
    """``kubeinfer_requests_total{model="simple", code="200"}`` from ``/metrics``."""
    for family in text_string_to_metric_families(rt.metrics_text()):
        for sample in family.samples:
            if sample.name == "kubeinfer_requests_total" and sample.labels == {"model": MODEL, "code": "200"}:
                return int(sample.value)
    return 0


def arithmetic(stdout: str) -> list[tuple[int, str, int, int]]:
    """Every ``a + b = c`` / ``a - b = c`` line the script printed, parsed."""
    return [(int(a), op, int(b), int(c)) for a, op, b, c in ARITH.findall(stdout)]


def run_example(example: Example, rt: RuntimeProcess, cwd: Path) -> subprocess.CompletedProcess[str]:
    address = rt.address if example.protocol == "http" else rt.grpc_address
    return subprocess.run(
        [sys.executable, str(EXAMPLES / example.script), "-u", address, *example.args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def settled_statistics(rt: RuntimeProcess, inference_count: int) -> dict[str, Any]:
    """The statistics once they count ``inference_count`` rows and agree with ``/metrics``, polled
    because the script's last response may reach it before the server has counted it; the last
    reading after 5 s otherwise, for the assertions to show."""
    deadline = time.monotonic() + 5
    while True:
        stats = statistics(rt)
        agreed = stats["inference_stats"]["success"]["count"] == requests_ok(rt)
        if (stats["inference_count"] == inference_count and agreed) or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


@pytest.mark.parametrize("example", [e.param() for e in EXAMPLES_RUN])
def test_triton_example_runs_unchanged(example: Example, runtime: RuntimeProcess, tmp_path: Path) -> None:
    before = statistics(runtime)
    proc = run_example(example, runtime, tmp_path)
    output = f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, output
    if example.passed is not None:
        assert example.passed in proc.stdout.splitlines(), output
    lines = arithmetic(proc.stdout)
    assert len(lines) == 2 * ELEMENTS * example.results, output
    assert all(c == (a + b if op == "+" else a - b) for a, op, b, c in lines), output

    after = settled_statistics(runtime, before["inference_count"] + example.requests)
    assert after["inference_count"] - before["inference_count"] == example.requests, (before, after)
    success = after["inference_stats"]["success"]["count"]
    assert success - before["inference_stats"]["success"]["count"] == example.requests, (before, after)
    assert success == requests_ok(runtime), (after, runtime.metrics_text())
    assert grpc_statistics(runtime) == (after["inference_count"], success), after
