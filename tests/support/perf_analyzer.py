"""Triton's ``perf_analyzer`` as the tests run it: the binary ``make setup`` installs, the command line of
every run (docs/clients.md shows it), and the checks of its ``-f`` CSV report.

The binary is ``hack.devtools.perf_analyzer``'s (what ``make setup`` installs); a test fails, naming
``make setup``, when it is missing.
"""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from hack.devtools.perf_analyzer import PerfAnalyzerMissing, find_perf_analyzer

#: What every run measures: concurrency 1 then 2, three 300 ms windows at each (see the docstring).
SWEEP = ("--concurrency-range", "1:2", "-p", "300", "-s", "1000", "-r", "10")

#: What the bundled MiniLM's runs add: short random strings (the tests' runtimes refuse texts over 64
#: tokens), and windows of at least 50 requests and 1 s (``count_windows``: perf_analyzer extends a
#: window second by second until it holds them). A model whose requests take milliseconds completes a
#: few in 300 ms on a busy machine, too few for perf_analyzer's stability check and for the server's
#: averages, which it reads at the windows' edges, to match the client's.
MINILM = ("--string-length", "24", "--measurement-mode", "count_windows", "--measurement-request-count", "50")


def perf_analyzer() -> Path:
    """The perf_analyzer to run (``hack.devtools.perf_analyzer.find_perf_analyzer``). Fails the test
    (not a skip), naming ``make setup``, when there is none."""
    try:
        return find_perf_analyzer()
    except PerfAnalyzerMissing as exc:
        pytest.fail(str(exc), pytrace=False)


def command(binary: Path, model: str, address: str, protocol: str, report: Path, *extra: str) -> list[str]:
    """The perf_analyzer command line of every run (docs/clients.md shows it)."""
    return [
        str(binary),
        "-m",
        model,
        "-u",
        address,
        "-i",
        protocol,
        *SWEEP,
        "--verbose-csv",
        "-f",
        str(report),
        *extra,
    ]


def run(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=cwd, check=False)
    shown = (
        f"{' '.join(args)}\nexit {proc.returncode}\n"
        f"stdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )
    return proc, shown


def check_report(report: Path, shown: str) -> list[dict[str, float]]:
    """The ``-f`` CSV's rows, asserted: concurrency 1 and 2, throughput > 0, and a server-side
    breakdown (from the statistics extension) that is there and fits in the client's latency (within
    10 %: see below). The
    queue may read 0: perf_analyzer shows whole microseconds, and a sequential client's request starts
    at once (the batcher's early dispatch)."""
    with report.open(newline="") as f:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    assert sorted(r["Concurrency"] for r in rows) == [1.0, 2.0], shown
    for r in rows:
        assert r["Inferences/Second"] > 0, (r, shown)
        assert r["Server Compute Infer"] > 0, (r, shown)
        assert min(r["Server Queue"], r["Server Compute Input"], r["Server Compute Output"]) >= 0, (r, shown)
        server = sum(r[k] for k in ("Server Queue", "Server Compute Input", "Server Compute Infer"))
        server += r["Server Compute Output"]
        # perf_analyzer reads the server's statistics at the window's edges: with few requests in a
        # window (a long batch window) the server's average can pass the client's by a few percent, as
        # perf_analyzer itself warns; a unit or accounting error would be a factor, not 10 %
        assert server <= 1.1 * r["Avg latency"], (r, shown)
        assert r["Network+Server Send/Recv"] >= 0, (r, shown)
    return rows
