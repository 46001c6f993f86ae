"""Triton's ``perf_analyzer``, unmodified, against a real ``kubeinfer-runtime`` process.

``perf_analyzer`` (the ``perf-analyzer`` wheel's binary) is what ``make setup`` installs as
``.cache/bin/perf_analyzer`` (hack/setup.sh step 10, ``hack/perf-analyzer.pins``): a wrapper that runs it
through a Debian trixie glibc sysroot, since it needs a newer glibc than the machine's. The test fails,
naming ``make setup``, when it is missing; ``$KUBEINFER_PERF_ANALYZER`` names another one.

It asks the runtime what Triton's own server answers: the model metadata, the model configuration
(``max_batch_size``, the scheduler) and, before and after every measurement window, the statistics
extension, from which it derives the server-side breakdown of a request (queue, compute input,
compute infer, compute output). Each run sweeps concurrency 1 and 2 with short windows (``-p 300``; a
lenient ``-s 1000`` with ``-r 3``: three windows at each level, whatever the load of the machine) over
HTTP and over gRPC, against:

- Triton's ``simple`` model as ONNX (INT32 ``INPUT0``, ``INPUT1`` [-1, 16]), fed perf_analyzer's own
  random data;
- Triton's ``simple_string`` model as ONNX (the same as decimal strings, BYTES), fed ``--input-data``
  JSON whose ``validation_data`` perf_analyzer checks every response against (so a wrong sum or
  difference fails the run).

A run passes when perf_analyzer exits 0, reports a throughput above 0 at both concurrencies in its
``-f`` CSV, and the server side it read from the statistics is there and consistent: queue and compute
infer above 0, and queue plus compute no more than the client's average latency (the statistics are in
nanoseconds and per request; a unit or a count off would break that).

The bundled MiniLM (a BYTES ``text`` input, listed [-1, 1] in the metadata) is swept by
``tests/integration/runtime/test_runtime_serve.py``, whose module already serves it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.devtools.runtime_proc import RuntimeConfig, RuntimeProcess
from hack.devtools.runtime_tiny import simple_onnx, simple_string_onnx
from tests.support.perf_analyzer import check_report, command, perf_analyzer, run

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]
ELEMENTS = 16


def simple_string_data() -> dict[str, object]:
    """``--input-data`` for ``simple_string``: two requests, and the outputs each must get."""
    pairs = [
        ([i for i in range(ELEMENTS)], [1] * ELEMENTS),
        ([-i for i in range(ELEMENTS)], [2 * i + 7 for i in range(ELEMENTS)]),
    ]
    return {
        "data": [{"INPUT0": [str(v) for v in a], "INPUT1": [str(v) for v in b]} for a, b in pairs],
        "validation_data": [
            {
                "OUTPUT0": [str(x + y) for x, y in zip(a, b, strict=True)],
                "OUTPUT1": [str(x - y) for x, y in zip(a, b, strict=True)],
            }
            for a, b in pairs
        ],
    }


def model_config(name: str, path: Path, **sections: object) -> RuntimeConfig:
    """A CPU runtime serving the ONNX model at ``path`` as ``name``: batches of up to 8 rows, 5 ms delay."""
    return RuntimeConfig.model_validate(
        {
            "model": {"name": name, "source": str(path), "format": "onnx"},
            "device": "cpu",
            "batching": {"max_batch_size": 8, "max_queue_delay_seconds": 0.005},
            **sections,
        }
    )


@pytest.fixture(scope="module", params=["simple", "simple_string"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, RuntimeProcess]]:
    """The model's name and a runtime serving it, ``simple`` or ``simple_string``. ``simple_string``
    has no warmup: the warmup's random strings are not decimal integers, which its Cast refuses."""
    name: str = request.param
    tmp = tmp_path_factory.mktemp(name)
    if name == "simple":
        cfg = model_config(name, simple_onnx(tmp / "simple.onnx"))
    else:
        cfg = model_config(name, simple_string_onnx(tmp / "simple_string.onnx"), warmup={"enabled": False})
    with RuntimeProcess(cfg, ready_timeout=120) as rt:
        assert rt.grpc_port, f"no gRPC port in the log:\n{rt.tail()}"
        yield name, rt


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_measures_the_runtime(
    served: tuple[str, RuntimeProcess], protocol: str, tmp_path: Path
) -> None:
    binary = perf_analyzer()
    model, rt = served
    address = rt.address if protocol == "http" else rt.grpc_address
    extra: list[str] = []
    if model == "simple_string":
        data = tmp_path / "simple_string.json"
        data.write_text(json.dumps(simple_string_data()))
        extra = ["--input-data", str(data)]
    report = tmp_path / "report.csv"
    proc, shown = run(command(binary, model, address, protocol, report, *extra), tmp_path)
    assert proc.returncode == 0, shown
    for level in (1, 2):
        assert f"Request concurrency: {level}" in proc.stdout, shown
    assert proc.stdout.count("  Server: ") == 2, shown
    rows = check_report(report, shown)
    # What it measured (pytest -s or -rP shows it).
    print(f"\n{model} over {protocol}:")
    print(proc.stdout[proc.stdout.index("Inferences/Second vs.") :].rstrip())
    for r in sorted(rows, key=lambda r: r["Concurrency"]):
        print(
            f"  concurrency {int(r['Concurrency'])}: server queue {int(r['Server Queue'])} us, "
            f"compute input {int(r['Server Compute Input'])} us, "
            f"infer {int(r['Server Compute Infer'])} us, output {int(r['Server Compute Output'])} us; "
            f"client avg {int(r['Avg latency'])} us"
        )
