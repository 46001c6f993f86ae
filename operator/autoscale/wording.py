"""The words for the utilization signal, for the device a service runs on. Pure: no I/O.

``policy`` and ``signals`` word the utilization signal as a GPU's (``GPU 0.91 busy``, ``GPU utilization
missing``). A service without a GPU (``resources.gpus: 0``) has no DCGM series: its utilization is the
runtime's ``kubeinfer_device_utilization_ratio``, which on a CPU is the share of time the runtime's
executor is busy. :func:`for_device` rewrites those words for such a service, so that its decision
reasons, ``AutoscalingActive`` messages, Events and log lines speak of the executor's busy time and
not of a GPU it does not have.
"""

from __future__ import annotations

import re

__all__ = ["CPU_UTILIZATION", "for_device"]

#: What the utilization signal is on a service without a GPU.
CPU_UTILIZATION = "executor busy time"
#: ``GPU 0.91 busy`` / ``GPU 0.10 not busy``: the policy's reading of the utilization against the band.
_GPU_LEVEL = re.compile(r"\bGPU (\d+(?:\.\d+)?) (busy|not busy)\b")
#: The signal's name in the policy's and the reader's messages (missing, NaN, a failed query).
_GPU_UTILIZATION = re.compile(r"\bGPU utilization\b")


def for_device(text: str, *, gpus: int) -> str:
    """``text`` (a reason or message of the policy or the signal reader) in the words of a service with
    ``gpus`` GPUs per replica: unchanged with a GPU; without one ``GPU 0.10 not busy`` becomes
    ``executor busy time 0.10 (not busy)`` and ``GPU utilization`` becomes ``executor busy time``."""
    if gpus > 0:
        return text
    text = _GPU_LEVEL.sub(rf"{CPU_UTILIZATION} \1 (\2)", text)
    return _GPU_UTILIZATION.sub(CPU_UTILIZATION, text)
