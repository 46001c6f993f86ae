"""Where a runtime process's start goes: its cold-start stages, each a moment in seconds since the process
started, observed once per process into ``kubeinfer_cold_start_stage_seconds`` (``RuntimeMetrics``).

The stages, in the order they happen:

- ``fetched``: the model is in place and located (the fetch init container's report read, or the model's
  path found). A fetch in an init container happens before this process starts: its own duration is the
  ``kubeinfer_model_fetch_seconds`` gauge; this stage is the interpreter's start and the runtime's imports.
- ``loaded``: the model loaded, quantized and its engine ready (``kubeinfer_model_load_seconds`` is that
  step's duration).
- ``warmed``: the warmup a first request needs done, the model attached: the runtime answers ready
  (``kubeinfer_warmup_seconds`` is that warmup's duration).
- ``first_answer``: the first inference answered (status 200).

Seconds since the process started, not stage durations: the stages of one start then read as a
timeline (``loaded`` 3.1 s means ready to warm up 3.1 s after exec), and ``histogram_quantile`` over
``warmed`` is directly the time to ready of the replicas that started. The process's start is the
kernel's (``/proc/self/stat``), so the interpreter's start and the imports before any of this module's
code count too; off Linux, the moment ``StartupClock`` was made.

Every stage of a process carries the same ``graph_cache`` label: ``hit`` (the engine's compiled graphs
came from the graph cache: ``spec.server.graphCache``), ``miss`` (made now, and written to the cache),
``none`` (the engine keeps no graph: torch, an ONNX file served as it is). It is known once the model is
loaded, so the ``fetched`` stage is observed then, with it.

Pure apart from reading ``/proc``: the standard library only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

STAGE_FETCHED = "fetched"
STAGE_LOADED = "loaded"
STAGE_WARMED = "warmed"
STAGE_FIRST_ANSWER = "first_answer"
#: The stages in the order they happen.
STAGES = (STAGE_FETCHED, STAGE_LOADED, STAGE_WARMED, STAGE_FIRST_ANSWER)

#: ``graph_cache`` label values (``ServableModel.graph_cache``).
GRAPH_CACHE_HIT = "hit"
GRAPH_CACHE_MISS = "miss"
GRAPH_CACHE_NONE = "none"

#: Histogram buckets, seconds: 0.1 s to 120 s, about 1.5x apart (a replica's start spans that range:
#: a cached graph on a fast node to a large model fetched and compiled).
COLD_START_BUCKETS: tuple[float, ...] = (
    0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
)  # fmt: skip


def process_age_seconds(
    stat: str | None = None, uptime: str | None = None, ticks_per_second: int | None = None
) -> float | None:
    """Seconds since this process started, from the kernel: ``/proc/uptime`` less the process's
    ``starttime`` (field 22 of ``/proc/self/stat``, clock ticks after boot); 10 ms resolution. The texts
    may be given (tests). ``None`` where ``/proc`` is not there or does not parse."""
    try:
        if stat is None:
            stat = Path("/proc/self/stat").read_text(encoding="ascii")
        if uptime is None:
            uptime = Path("/proc/uptime").read_text(encoding="ascii")
        ticks = ticks_per_second or os.sysconf("SC_CLK_TCK")
        # the command name (field 2) is in parentheses and may hold spaces: count from its end
        fields = stat[stat.rindex(")") + 2 :].split()
        started = int(fields[19]) / ticks  # field 22 of the whole line
        return max(0.0, float(uptime.split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return None


class StartupClock:
    """Seconds since the process started (``process_age_seconds`` when this clock is made, then the
    monotonic clock, which a change of the wall clock cannot move); without ``/proc``, since this clock
    was made."""

    def __init__(
        self,
        age: Callable[[], float | None] = process_age_seconds,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._monotonic = monotonic
        self._origin = monotonic() - (age() or 0.0)

    def __call__(self) -> float:
        """Seconds since the process started, >= 0."""
        return max(0.0, self._monotonic() - self._origin)


class ColdStart:
    """The cold-start stages of one process: each marked once, at the clock's reading; observed
    (``observe(stage, graph_cache, seconds)``) once the graph cache's state is known (``graph_cache``, at
    load), the stages marked before it then. Thread-safe: the load marks from its thread, ``first_answer``
    comes from the event loop."""

    def __init__(
        self, observe: Callable[[str, str, float], None], clock: Callable[[], float] | None = None
    ) -> None:
        self._observe = observe
        self._clock = clock if clock is not None else StartupClock()
        self._lock = threading.Lock()
        self._marks: dict[str, float] = {}
        self._cache: str | None = None
        #: True until ``first_answer`` is marked: what the request path checks, without the lock.
        self.awaiting_first_answer = True

    @property
    def marks(self) -> dict[str, float]:
        """The stages marked so far: name -> seconds since the process started."""
        with self._lock:
            return dict(self._marks)

    def mark(self, stage: str) -> float:
        """Mark ``stage`` now (a stage already marked keeps its first moment); returns its seconds.

        Raises ``ValueError`` for a name not in ``STAGES``."""
        if stage not in STAGES:
            raise ValueError(f"unknown cold-start stage {stage!r}; one of {', '.join(STAGES)}")
        with self._lock:
            if stage in self._marks:
                return self._marks[stage]
            seconds = self._marks[stage] = self._clock()
            if stage == STAGE_FIRST_ANSWER:
                self.awaiting_first_answer = False
            cache = self._cache
        if cache is not None:
            self._observe(stage, cache, seconds)
        return seconds

    def graph_cache(self, value: str) -> None:
        """The graph cache's state for this process (``GRAPH_CACHE_*``): observe the stages marked so far;
        later stages are observed as they are marked. Only the first call counts."""
        with self._lock:
            if self._cache is not None:
                return
            self._cache = value
            pending = sorted(self._marks.items(), key=lambda kv: STAGES.index(kv[0]))
        for stage, seconds in pending:
            self._observe(stage, value, seconds)

    def first_answer(self) -> None:
        """Mark ``first_answer`` unless marked already (the request path calls it on every 200 until then)."""
        if self.awaiting_first_answer:
            self.mark(STAGE_FIRST_ANSWER)

    def summary(self) -> str:
        """``fetched 0.9 s, loaded 3.1 s, warmed 3.2 s (graph cache hit)``: the stages marked so far."""
        marks = self.marks
        text = ", ".join(f"{s} {marks[s]:.1f} s" for s in STAGES if s in marks) or "no stage yet"
        return text + (f" (graph cache {self._cache})" if self._cache else "")


#: The background warmup starts a pass only once no infer request has been in flight for this long,
#: seconds: a pass started in the gap between two requests of a stream would share the CPU with the next.
WARMUP_QUIET_SECONDS = 0.25
#: How often the background warmup looks at the requests in flight while it waits, seconds.
WARMUP_POLL_SECONDS = 0.02


class WarmupStopped(Exception):
    """The runtime began to shut down while the background warmup waited: it stops there."""


def wait_quiet(
    busy: Callable[[], bool],
    stopping: Callable[[], bool],
    quiet: float = WARMUP_QUIET_SECONDS,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll: float = WARMUP_POLL_SECONDS,
) -> None:
    """Block until ``busy()`` (requests in flight) has read False for ``quiet`` seconds in a row; the
    background warmup's gate before each pass, on its thread.

    Raises:
        WarmupStopped: ``stopping()`` read True (the drain began).
    """
    since: float | None = None
    while True:
        if stopping():
            raise WarmupStopped("the runtime is shutting down")
        now = clock()
        if busy():
            since = None
        elif since is None:
            since = now
        if since is not None and now - since >= quiet:
            return
        sleep(poll)
