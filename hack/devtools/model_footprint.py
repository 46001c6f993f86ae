"""Measure a model repository's model process per format (runtime team): its resident bytes after load
and warmup, its start-to-ready seconds and the heavy packages it imported.

Usage::

    python -m hack.devtools.model_footprint [--repeat N] [--baseline PYTHON] [FORMAT ...]

Each FORMAT (default: all of ``FORMATS``) is a tiny model of ``hack.devtools.runtime_tiny`` written to a
temporary directory; its process is started as ``kubeinfer.runtime.repository`` starts one (``python -m
kubeinfer.runtime.cli model-process`` with the configuration on stdin), timed from the start to its first
ready answer over IPC, its RSS read from ``/proc`` (as ``repository.resident_bytes`` does), and its
imports listed by ``-X importtime``. Prints one line per format: the median of ``--repeat`` runs.
``--baseline``: another checkout's interpreter (its virtual environment's ``python``), whose model
process is measured too, each run beside this one's (a busy machine's load hits both alike).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubeinfer.runtime import ipc
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.frontend import RemotePlane
from kubeinfer.runtime.repository import resident_bytes

#: Top-level packages a lean model process leaves alone unless its format needs them.
HEAVY = ("torch", "transformers", "onnxruntime", "grpc", "uvicorn", "starlette", "tokenizers", "safetensors")


def _onnx(path: Path, write: Callable[[Path], Path]) -> dict[str, Any]:
    return {"model": {"source": str(write(path / "model.onnx")), "format": "onnx"}}


def _models() -> dict[str, Callable[[Path], dict[str, Any]]]:
    from hack.devtools import runtime_tiny as tiny

    return {
        "simple_onnx": lambda p: _onnx(p, tiny.simple_onnx),
        "tiny_onnx_mlp": lambda p: _onnx(p, tiny.tiny_onnx_mlp),
        "simple_pt2": lambda p: {"model": {"source": str(tiny.simple_pt2(p / "m.pt2")), "format": "pt2"}},
        "tiny_torchscript": lambda p: {
            "model": {
                "source": str(tiny.tiny_torchscript(p / "m.pt")),
                "format": "torchscript",
                **tiny.TORCHSCRIPT_IO,
            }
        },
        "tiny_hf_classifier": lambda p: {"model": {"source": str(tiny.tiny_hf_classifier(p / "hf"))}},
    }


FORMATS = ("simple_onnx", "tiny_onnx_mlp", "simple_pt2", "tiny_torchscript", "tiny_hf_classifier")


async def _ready(plane: RemotePlane, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"model process exited with code {proc.returncode}")
        try:
            if await asyncio.wait_for(plane.readiness(), 1.0) is None:
                return
        except TimeoutError:
            pass
        await asyncio.sleep(0.02)
    raise RuntimeError("model process not ready in time")


async def measure(cfg: RuntimeConfig, log: Path, python: str) -> tuple[int, float, list[str]]:
    """Start one model process for ``cfg`` with the interpreter ``python``; returns (RSS bytes once
    ready, seconds to ready, the ``HEAVY`` packages it imported)."""
    address = f"ipc://@footprint-{os.getpid()}-{secrets.token_hex(4)}"
    cmd = [python, "-X", "importtime", "-m", "kubeinfer.runtime.cli", "model-process", "--ipc", address]
    cmd += ["--parent-pid", str(os.getpid())]
    with log.open("wb") as err:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=err)
        assert proc.stdin is not None
        proc.stdin.write(cfg.model_dump_json().encode())
        proc.stdin.close()
        client = ipc.ModelClient(address)
        await client.start()
        try:
            await _ready(RemotePlane(cfg.model.name, client), proc, start + 300)
            seconds = time.monotonic() - start
            rss = resident_bytes(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
            await client.close()
    imported = set()
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line:
            imported.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return rss, seconds, [name for name in HEAVY if name in imported]


def _line(label: str, runs: list[tuple[int, float, list[str]]]) -> str:
    rss = statistics.median(r[0] for r in runs) / 1e6
    seconds = statistics.median(r[1] for r in runs)
    return f"{label:30} {rss:6.0f} MB {seconds:6.2f} s  imports: {' '.join(runs[-1][2]) or '-'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("formats", nargs="*", default=list(FORMATS), help=f"of {', '.join(FORMATS)}")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", help="another interpreter (checkout) to measure, alternating")
    args = parser.parse_args()
    unknown = set(args.formats) - set(FORMATS)
    if unknown:
        parser.error(f"unknown formats: {', '.join(sorted(unknown))}")
    pythons = (
        {"": sys.executable} if args.baseline is None else {" (baseline)": args.baseline, "": sys.executable}
    )
    models = _models()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.formats:
            directory = Path(tmp) / name
            directory.mkdir()
            cfg = RuntimeConfig.model_validate({**models[name](directory), "device": "cpu"})
            runs: dict[str, list[tuple[int, float, list[str]]]] = {label: [] for label in pythons}
            for _ in range(args.repeat):
                for label, python in pythons.items():
                    runs[label].append(asyncio.run(measure(cfg, directory / "stderr.log", python)))
            for label, measured in runs.items():
                print(_line(name + label, measured), flush=True)


if __name__ == "__main__":
    main()
