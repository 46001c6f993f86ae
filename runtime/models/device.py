"""Device selection, torch threading, and accelerator figures (CUDA memory, NVML utilization).

The server's metrics use ``gpu_utilization_ratio`` and ``accelerator_memory_bytes``; on a CPU both
return ``None`` and the server reports its own CPU busy fraction instead.

torch is imported by the functions that use it, not by this module: an engine other than torch (ONNX
Runtime) picks its device with ``resolve_engine_device`` and its threads with ``default_threads``, and
its model process never imports torch (a pooled model's resident bytes are its budget).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kubeinfer.runtime.config import Device

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: Environment variable overriding the number of torch intra-op threads (an integer >= 1).
THREADS_ENV = "KUBEINFER_TORCH_THREADS"


def pick_device(requested: Device, cuda_available: Callable[[], bool]) -> str:
    """The device for ``requested``: ``cpu`` → ``"cpu"``; ``auto`` → ``"cuda:0"`` if ``cuda_available()``
    (not called for ``cpu``), else ``"cpu"``; ``cuda`` → ``"cuda:0"``, or raises.

    Raises:
        ValueError: ``cuda`` requested but ``cuda_available()`` is false.
    """
    if requested == "cpu":
        return "cpu"
    if cuda_available():
        return "cuda:0"
    if requested == "cuda":
        raise ValueError("device 'cuda' requested but no CUDA device is available; use 'auto' or 'cpu'")
    return "cpu"


def resolve_device(requested: Device) -> torch.device:
    """``pick_device`` for a torch model, CUDA as torch sees it (``torch.cuda.is_available()``).

    Raises:
        ValueError: ``cuda`` requested but ``torch.cuda.is_available()`` is false.
    """
    import torch

    return torch.device(pick_device(requested, torch.cuda.is_available))


def cuda_device_count() -> int:
    """The CUDA devices the driver shows this process (``cuDeviceGetCount`` of ``libcuda.so.1``, which
    honours ``CUDA_VISIBLE_DEVICES``); 0 without the driver's library or when it fails (no GPU)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def resolve_engine_device(requested: Device) -> str:
    """``pick_device`` for an engine other than torch (ONNX Runtime), CUDA as the driver sees it
    (``cuda_device_count``): ``"cpu"`` or ``"cuda:0"``, without importing torch.

    Raises:
        ValueError: ``cuda`` requested but the driver shows no CUDA device.
    """
    return pick_device(requested, lambda: cuda_device_count() > 0)


def available_cpus() -> int:
    """CPUs this process may use, >= 1: the least of the machine's CPUs, its affinity mask and its
    cgroup's CPU quota rounded up (``cpu.max``, v1's CFS quota: a pod's ``resources.limits.cpu``, which
    leaves the affinity at every CPU of the node), as ``joblib.cpu_count`` counts them (loky's count;
    ``$LOKY_MAX_CPU_COUNT`` lowers it).

    Raises:
        ValueError: ``$LOKY_MAX_CPU_COUNT`` is set and not an integer (named, with its value).
    """
    import joblib

    try:
        return max(1, int(joblib.cpu_count()))
    except ValueError as exc:
        raw = os.environ.get("LOKY_MAX_CPU_COUNT", "")
        raise ValueError(f"LOKY_MAX_CPU_COUNT must be an integer, got {raw!r}") from exc


def default_threads() -> int:
    """Intra-op threads for serving: the CPUs this process may use minus one (at least 1), so one
    core stays for the event loop, HTTP and tokenization. ``$KUBEINFER_TORCH_THREADS`` overrides it
    (``configure_torch``; on a pod through ``spec.runtime.env``).

    torch's own default (one thread per core) makes OpenMP workers compete with the server's
    event loop. Measured side by side in one run on the 2-core machine (shared with other work),
    MiniLM, ``bench/runtime_bench.py --threads 1,2`` (bench/results/runtime.json, ``by_threads``):
    in process, one batch at a time, 2 threads are faster at large batches (fp32 s(32) 112 vs
    167 ms, int8-dynamic 107 vs 136 ms); served through ``kubeinfer-runtime`` they collapse:
    at 10 requests/s P50 0.7 to 2.1 s (fp32) and 45 to 108 ms (int8) against 17 to 22 ms with 1
    thread, and no configuration with 2 threads held P99 <= 100 ms at any rate from 20/s, while 1
    thread held 65/s (fp32) and 127/s (int8) batched. Earlier (int8, one request at a time): median
    59 ms (P90 415 ms) with 2 threads, 3.8 ms with 1.
    """
    return max(1, available_cpus() - 1)


def configure_torch(device: torch.device, threads: int | None = None) -> int:
    """Set process-wide torch options for serving; return the intra-op thread count in force.

    ``threads`` (else ``$KUBEINFER_TORCH_THREADS``, else ``default_threads()``: CPUs - 1) sets
    ``torch.set_num_threads``. On CUDA, ``cudnn.benchmark`` is enabled (autotuned kernels per
    input shape; warmup covers the shape buckets).

    Raises:
        ValueError: ``$KUBEINFER_TORCH_THREADS`` is not a positive integer.
    """
    if threads is None and os.environ.get(THREADS_ENV):
        raw = os.environ[THREADS_ENV]
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{THREADS_ENV} must be a positive integer, got {raw!r}")
        threads = int(raw)
    import torch

    torch.set_num_threads(threads if threads is not None else default_threads())
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    return int(torch.get_num_threads())


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a CPU tensor to ``device``; on CUDA through pinned host memory, non-blocking."""
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def accelerator_memory_bytes(device: torch.device) -> int | None:
    """Bytes of accelerator memory held by torch's caching allocator on ``device``; None on CPU."""
    if device.type != "cuda":
        return None
    import torch

    return int(torch.cuda.memory_reserved(device))


_nvml_lock = threading.Lock()
_nvml: Any = None
_nvml_failed = False


def _nvml_module() -> Any:
    """pynvml (package nvidia-ml-py), initialised once; None if NVML is unavailable."""
    global _nvml, _nvml_failed
    with _nvml_lock:
        if _nvml is None and not _nvml_failed:
            try:
                import pynvml

                pynvml.nvmlInit()
                _nvml = pynvml
            except Exception as exc:  # NVML missing (no driver) raises library-specific errors
                log.info("NVML unavailable: %s", exc)
                _nvml_failed = True
        return _nvml


def gpu_utilization_ratio(device: torch.device) -> float | None:
    """NVML's GPU utilization of ``device`` (0..1: fraction of the last sample period in which a
    kernel ran, per ``nvmlDeviceGetUtilizationRates``); None on CPU or without NVML."""
    if device.type != "cuda":
        return None
    nvml = _nvml_module()
    if nvml is None:
        return None
    index = device.index if device.index is not None else 0
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
    except Exception as exc:
        log.warning("NVML utilization query failed: %s", exc)
        return None
