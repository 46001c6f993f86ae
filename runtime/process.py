"""What every process of the runtime sets up, whatever it serves: the open-files limit
(``raise_open_files_limit``), the event loop (``event_loop_factory``), and, once started, its heap
frozen out of garbage collection (``freeze_heap``).

Standard library only (uvloop is imported when asked for): a model process of the model repository mode
imports no HTTP or gRPC stack (``kubeinfer.runtime.server``), and so these are not in ``wire`` or
``rest``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import resource
from collections.abc import Callable

log = logging.getLogger(__name__)


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; returns (soft, hard) in force
    after it. A failure (a platform that refuses) is logged and leaves the limit as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            log.info("open files limit raised from %d to %d", soft, hard)
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, hard, exc)
    return soft, hard


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (a dependency; libuv's loop costs the serving path
    less CPU per request than asyncio's, and the event loop shares the cores with torch), else
    ``None`` (asyncio's default loop)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def freeze_heap() -> int:
    """One full garbage collection, then every object alive moved to the collector's permanent
    generation (``gc.freeze``); returns how many. A model process calls it once the model is loaded
    and warmed up, before it answers ready (``RuntimeServer``'s ``freeze_after_load``), a front end
    and the model repository's serving process once their servers are started.

    What a load leaves (the engine's and the tokenizer's libraries, the model's Python objects: about
    268,000 objects for MiniLM on ONNX Runtime int8) lives as long as the process, yet every full
    collection would walk it again: 64 to 69 ms under load with the event loop and the executors'
    Python stopped, about every 15 s at 1,000 requests/s, each a step in P99 (a development
    measurement; docs/runtime.md, Cold start, says how). Frozen, one takes 0.2 ms. Nothing frozen is
    freed by the collector (reference counting still frees what is in no cycle); a model process
    serves one model for its life, so nothing of an unloaded model is held by this."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
