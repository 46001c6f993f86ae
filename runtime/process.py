"""What every process of the runtime sets up first, whatever it serves: the open-files limit
(``raise_open_files_limit``) and the event loop (``event_loop_factory``).

Standard library only (uvloop is imported when asked for): a model process of the model repository mode
imports no HTTP or gRPC stack (``kubeinfer.runtime.server``), and so these are not in ``wire`` or
``rest``.
"""

from __future__ import annotations

import asyncio
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
