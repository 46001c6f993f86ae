#!/usr/bin/env python3
"""Triton's perf_analyzer as the load generator, and its server-side breakdown against /metrics.

Runs ``perf_analyzer`` (``.cache/bin/perf_analyzer``, installed by ``make setup``), unmodified, against
a ``kubeinfer-runtime`` serving the bundled MiniLM (int8-dynamic, CPU) and Triton's ``simple`` (ONNX), over
REST and gRPC, at concurrency 1, 2, 4 and 8 (5 s windows, stable within 10 %: perf_analyzer's own
defaults). For each level it records what perf_analyzer measured (throughput, client average and P99
latency) and the server side it read from the statistics extension (queue, compute input, compute
infer, compute output, per request), and compares that with what the runtime's ``/metrics`` counted
over the same level: the mean of ``kubeinfer_queue_duration_seconds`` and of
``kubeinfer_request_duration_seconds``, from their ``_sum`` and ``_count`` before and after. The two
views come from the same calls in the runtime (``metrics.observe_queue`` feeds both), so the queue
time agrees within the windows' edges; the request duration of /metrics (receipt to response) is
the statistics' success time.

Usage::

    make bench-perf-analyzer            # -> bench/results/perf_analyzer.json
    .venv/bin/python bench/perf_analyzer_bench.py --models simple --protocols grpc --noisy

Runs under ``bench/quiet.py`` (the machine-wide lock, a 1-minute load under 0.5; ``--noisy`` on a busy
machine, and such a result is never committed).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# ROOT for hack.devtools, bench/ for quiet (appended: operator/ must not shadow the
# standard library's operator module)
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.append(str(_path))

import quiet  # noqa: E402

from hack.devtools.perf_analyzer import find_perf_analyzer  # noqa: E402
from hack.devtools.runtime_proc import RuntimeConfig, RuntimeProcess  # noqa: E402
from hack.devtools.runtime_tiny import simple_onnx  # noqa: E402

OUT = ROOT / "bench" / "results" / "perf_analyzer.json"
CONCURRENCY = (1, 2, 4, 8)
#: The /metrics histograms compared with perf_analyzer's server side: name -> what it is.
HISTOGRAMS = ("kubeinfer_queue_duration_seconds", "kubeinfer_request_duration_seconds")


def progress(message: str) -> None:
    print(f"[perf-analyzer-bench] {message}", flush=True)


def config(model: str, tmp: Path) -> RuntimeConfig:
    """The runtime of ``model``: MiniLM int8 as bundled, or ``simple`` as ONNX; batches of 8, 5 ms."""
    batching = {"max_batch_size": 8, "max_queue_delay_seconds": 0.005}
    if model == "minilm":
        return RuntimeConfig.model_validate(
            {"quantization": {"mode": "int8-dynamic"}, "device": "cpu", "batching": batching}
        )
    path = simple_onnx(tmp / "simple.onnx")
    return RuntimeConfig.model_validate(
        {
            "model": {"name": "simple", "source": str(path), "format": "onnx"},
            "device": "cpu",
            "batching": batching,
        }
    )


def histogram_sums(rt: RuntimeProcess, model: str) -> dict[str, tuple[float, float]]:
    """``{histogram: (sum seconds, count)}`` from the runtime's /metrics."""
    text = urllib.request.urlopen(f"http://{rt.address}/metrics", timeout=10).read().decode()
    out: dict[str, tuple[float, float]] = {}
    for name in HISTOGRAMS:
        values = []
        for suffix in ("_sum", "_count"):
            m = re.search(rf'^{name}{suffix}\{{model="{model}"\}} (\S+)$', text, re.MULTILINE)
            values.append(float(m.group(1)) if m else 0.0)
        out[name] = (values[0], values[1])
    return out


def run_level(binary: Path, model: str, address: str, protocol: str, level: int, tmp: Path) -> dict[str, Any]:
    """One perf_analyzer run at concurrency ``level``: its CSV row (microseconds, infer/s)."""
    report = tmp / f"{model}-{protocol}-{level}.csv"
    args = [
        str(binary), "-m", model, "-u", address, "-i", protocol,
        "--concurrency-range", str(level), "--verbose-csv", "-f", str(report),
    ]  # fmt: skip
    if model == "minilm":
        args += ["--string-length", "24"]  # short random texts, within the model's token limit
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
        )
    with report.open(newline="") as f:
        (row,) = list(csv.DictReader(f))
    return {k: float(v) for k, v in row.items()}


def measure(binary: Path, rt: RuntimeProcess, model: str, protocol: str, tmp: Path) -> list[dict[str, Any]]:
    """Every concurrency level: perf_analyzer's figures beside /metrics' means over the same run."""
    address = rt.address if protocol == "http" else rt.grpc_address
    rows = []
    for level in CONCURRENCY:
        before = histogram_sums(rt, model)
        row = run_level(binary, model, address, protocol, level, tmp)
        after = histogram_sums(rt, model)
        means = {}
        for name in HISTOGRAMS:
            (s0, c0), (s1, c1) = before[name], after[name]
            means[name] = round((s1 - s0) / (c1 - c0) * 1e6, 1) if c1 > c0 else None
        result = {
            "concurrency": level,
            "throughput_per_second": row["Inferences/Second"],
            "client_avg_us": row["Avg latency"],
            "client_p99_us": row.get("p99 latency"),
            "server_queue_us": row["Server Queue"],
            "server_compute_input_us": row["Server Compute Input"],
            "server_compute_infer_us": row["Server Compute Infer"],
            "server_compute_output_us": row["Server Compute Output"],
            "metrics_queue_mean_us": means["kubeinfer_queue_duration_seconds"],
            "metrics_request_mean_us": means["kubeinfer_request_duration_seconds"],
        }
        progress(f"{model} {protocol} {json.dumps(result)}")
        rows.append(result)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,simple", help="comma-separated: minilm, simple")
    parser.add_argument("--protocols", default="http,grpc", help="comma-separated: http, grpc")
    parser.add_argument("--out", default=str(OUT))
    quiet.add_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Measure every model and protocol; write ``--out``."""
    args = parse_args(argv)
    binary = find_perf_analyzer()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with quiet.quiet_run("perf_analyzer_bench", args, log=progress) as run:
        with tempfile.TemporaryDirectory(prefix="kubeinfer-pa-") as tmp_dir:
            tmp = Path(tmp_dir)
            for model in args.models.split(","):
                progress(f"starting a runtime serving {model}")
                with RuntimeProcess(config(model, tmp), ready_timeout=300) as rt:
                    time.sleep(1.0)  # past the batcher's first arrival window
                    results[model] = {
                        p: measure(binary, rt, model, p, tmp) for p in args.protocols.split(",")
                    }
        run.write(
            {
                "results": results,
                "perf_analyzer": "2.60.0 (hack/perf-analyzer.pins): 5 s windows, stable within 10 %",
                "command": ["bench/perf_analyzer_bench.py", *(sys.argv[1:] if argv is None else argv)],
            },
            args.out,
            log=progress,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
