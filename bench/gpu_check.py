"""GPU check of the runtime's model layer: fp32/fp16/bf16/int8-dynamic on CUDA, batch sweep, NVML.

Run on a machine with an NVIDIA GPU (one short, bounded run)::

    .venv/bin/python bench/gpu_check.py [--max-batch 256] [--budget 420] [--out bench/results/gpu_check.json]

For each quantization mode it loads the bundled all-MiniLM-L6-v2 on ``cuda:0`` through
``kubeinfer.runtime.models.load_model`` (pinned host memory, non-blocking copies, cudnn.benchmark),
records the loader's comparison with fp32 (mean cosine, retrieval agreement) and load seconds, warms
up, then measures the service time s(b) for b = 1, 2, 4, ..., max (median over repeats of the full
``preprocess`` + ``execute`` path, which ends in a device-to-host copy and is therefore synchronous),
fits s(b) = a + c*b by least squares and reports throughput b/s(b). While the largest batch runs in a
loop for ~2 s, a thread samples NVML utilization (``nvmlDeviceGetUtilizationRates``) and the
allocator's reserved bytes. Prints progress to stderr and the whole result as JSON to stdout.

Without CUDA it prints ``{"cuda": false, ...}`` and exits 0 (a dry run of the script itself).
The total run time is bounded by ``--budget`` seconds: modes left when the budget is spent are
reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODES = ("none", "fp16", "bf16", "int8-dynamic")


def progress(message: str) -> None:
    """One progress line on stderr (stdout carries the JSON)."""
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares a, c of y = a + c*x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    c = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - c * mx, c


def sweep(model: Any, sizes: list[int], repeats: int) -> list[dict[str, float]]:
    """Median service time of preprocess+execute per batch size (held-out sentences as rows)."""
    rows = []
    for b in sizes:
        request = model.example_inputs(b)
        model.execute(model.preprocess([request]))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.execute(model.preprocess([request]))
            times.append(time.perf_counter() - t0)
        s = statistics.median(times)
        rows.append({"batch_size": b, "service_seconds": s, "throughput_rps": b / s})
        progress(f"  b={b:4d} s={s * 1000:8.2f} ms  {b / s:9.1f} rows/s")
    return rows


def utilization(model: Any, batch: int, seconds: float) -> dict[str, float | None]:
    """Run the largest batch in a loop for ``seconds`` while sampling NVML every 50 ms."""
    import torch
    from kubeinfer.runtime.models.device import accelerator_memory_bytes, gpu_utilization_ratio

    device = torch.device(model.device)
    samples: list[float] = []
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            value = gpu_utilization_ratio(device)
            if value is not None:
                samples.append(value)
            time.sleep(0.05)

    prepared = model.preprocess([model.example_inputs(batch)])
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    end = time.perf_counter() + seconds
    runs = 0
    while time.perf_counter() < end:
        model.execute(prepared)
        runs += 1
    stop.set()
    thread.join()
    return {
        "nvml_utilization_mean_ratio": statistics.fmean(samples) if samples else None,
        "nvml_samples": float(len(samples)),
        "loop_throughput_rps": runs * batch / seconds,
        "accelerator_memory_bytes": float(accelerator_memory_bytes(device) or 0),
        "max_memory_allocated_bytes": float(torch.cuda.max_memory_allocated(device)),
    }


def check_mode(mode: str, sizes: list[int], repeats: int) -> dict[str, Any]:
    """Load, warm up, sweep and sample one quantization mode on cuda:0."""
    import torch
    from kubeinfer.runtime.config import RuntimeConfig
    from kubeinfer.runtime.models import load_model

    torch.cuda.reset_peak_memory_stats()
    cfg = RuntimeConfig.model_validate(
        {"device": "cuda", "quantization": {"mode": mode}, "batching": {"max_batch_size": max(sizes)}}
    )
    model = load_model(cfg)
    warmup_seconds = model.warmup(max(sizes), 1)
    report = model.report()
    progress(f"{mode}: loaded on {model.device}, report {report}, warmup {warmup_seconds:.1f} s")
    rows = sweep(model, sizes, repeats)
    a, c = fit_line([r["batch_size"] for r in rows], [r["service_seconds"] for r in rows])
    result: dict[str, Any] = {
        "mode": mode,
        "device": model.device,
        "report": report,
        "warmup_seconds": warmup_seconds,
        "sweep": rows,
        "a_seconds": a,
        "c_seconds": c,
        "limit_rps": max(sizes) / (a + c * max(sizes)),
    }
    result.update(utilization(model, max(sizes), 2.0))
    del model
    torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-batch", type=int, default=256, help="largest batch size (rows)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per batch size (median)")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for the whole check")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated quantization modes")
    parser.add_argument("--out", default=None, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    import torch

    result: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "modes": {},
        "skipped": [],
        "errors": {},
    }
    if not torch.cuda.is_available():
        result["message"] = "no CUDA device available: nothing measured (dry run)"
        progress(result["message"])
        print(json.dumps(result, indent=1))
        return 0
    result["gpu"] = torch.cuda.get_device_name(0)
    result["cuda_version"] = torch.version.cuda
    progress(f"GPU {result['gpu']}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    sizes = []
    b = 1
    while b < args.max_batch:
        sizes.append(b)
        b *= 2
    sizes.append(args.max_batch)
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        if time.perf_counter() - started > args.budget:
            result["skipped"].append(mode)
            progress(f"{mode}: skipped (budget of {args.budget:.0f} s spent)")
            continue
        try:
            result["modes"][mode] = check_mode(mode, sizes, args.repeats)
        except Exception as exc:  # report every mode, even when one fails
            result["errors"][mode] = f"{type(exc).__name__}: {exc}"
            progress(f"{mode}: FAILED {result['errors'][mode]}")
    result["elapsed_seconds"] = time.perf_counter() - started
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
