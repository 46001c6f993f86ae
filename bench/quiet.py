"""What every benchmark does before it measures: one machine-wide lock, and a quiet machine.

Used by every script of bench/ that measures (``quiet_run``); none copies it.

- **The lock** (``bench_lock``): ``flock`` on one file, ``/tmp/kubeinfer-bench.lock``
  (``KUBEINFER_BENCH_LOCK`` moves it), so two benchmarks never measure at the same time. A
  benchmark that finds it held prints who holds it (pid, script, since when: the holders write
  themselves into the file) and waits, up to ``--lock-timeout`` seconds; then it exits with status
  3. The kernel drops the lock when its holder exits, killed or not: nothing stale is left to clean.
  Measuring benchmarks hold it exclusively. The autoscaler simulators hold it shared: their figures
  do not depend on the machine, so they may run beside each other, but each keeps both cores busy
  for minutes and must not run under a benchmark that measures time (nor one start under them).
- **The load check** (``check_load``): after the lock is taken, the 1-minute load average must be
  at most ``LOAD_LIMIT`` (0.5). Over it, the benchmark waits up to ``--settle-seconds`` for the
  load to fall (a benchmark that just released the lock leaves the average high for a minute or
  two), then exits with status 2 and one line naming the load, having measured nothing and written
  nothing. ``--noisy`` waives the check: the run proceeds and its JSON says ``"noisy": true``
  (whatever the load was), so a figure from a busy machine cannot pass for a quiet one.
- **The client's own pauses** (``collector_paused``): every load generator of bench/ runs each measured
  point with its own cyclic garbage collector off (one full collection before): a collection of the
  client's heap stops its event loop, and every request in flight reads that stop as the server's
  latency (a development measurement of the peers bench's client, sentence-transformers loaded,
  511,000 objects: 136 to 152 ms a full collection, one in most 6 s points at 900 to 1,200
  requests/s, P99 170 to 260 ms where the point without one read 28 ms).
- **The record** (``QuietRun.fields``): ``noisy`` and ``machine``: CPU model, core counts, the load
  averages (1, 5, 15 min) before and after, the limit, how the check went, the lock and how long it
  was waited for.

The simulators (``simulation=True``) take the lock shared and skip the load check; their JSON
still records the machine (with ``load_check`` saying it was not applied, and ``noisy`` false).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import gc
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: The machine-wide lock file; ``KUBEINFER_BENCH_LOCK`` moves it.
LOCK_PATH = Path(os.environ.get("KUBEINFER_BENCH_LOCK", "/tmp/kubeinfer-bench.lock"))
#: The highest 1-minute load average at which a benchmark measures without ``--noisy``.
LOAD_LIMIT = 0.5
#: Exit status of a benchmark that refused to measure on a busy machine.
EXIT_BUSY = 2
#: Exit status of a benchmark that gave up waiting for the lock.
EXIT_LOCK_TIMEOUT = 3
#: Default seconds to wait for the lock (a whole benchmark can take this long).
LOCK_TIMEOUT_SECONDS = 3600.0
#: Default seconds to wait for the load to fall under the limit before refusing.
SETTLE_SECONDS = 180.0
#: Seconds between two looks at the lock, and at the load while it settles.
POLL_SECONDS = 1.0
SETTLE_POLL_SECONDS = 5.0
#: Seconds between two "still waiting" lines.
REPORT_EVERY_SECONDS = 60.0

LoadReader = Callable[[], tuple[float, float, float]]


class LockTimeout(Exception):
    """The bench lock was still held by another benchmark when the wait ran out."""


class BusyMachine(Exception):
    """The 1-minute load average stayed over the limit (and ``--noisy`` was not given)."""


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The calling process's cyclic garbage collector off while the block runs (a measured point of a
    load generator), after one full collection; on again after it. Reference counting still frees
    every object that is in no cycle; the cycles the point makes (aiohttp's, asyncio's) wait for the
    next collection, after the point. See the module docstring for why a client needs it."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def add_arguments(parser: argparse.ArgumentParser, *, simulation: bool = False) -> None:
    """The options of ``quiet_run``: ``--lock-timeout``, and for a benchmark that measures,
    ``--noisy`` and ``--settle-seconds``."""
    group = parser.add_argument_group("quiet machine (bench/quiet.py)")
    group.add_argument(
        "--lock-timeout",
        type=float,
        default=LOCK_TIMEOUT_SECONDS,
        help=f"seconds to wait for another benchmark's lock ({LOCK_PATH}) before giving up "
        f"(status {EXIT_LOCK_TIMEOUT}); 0: do not wait",
    )
    if simulation:
        return
    group.add_argument(
        "--noisy",
        action="store_true",
        help=f"measure even when the 1-minute load average is over {LOAD_LIMIT}; the JSON then says "
        '"noisy": true (never a source of figures for the README)',
    )
    group.add_argument(
        "--settle-seconds",
        type=float,
        default=SETTLE_SECONDS,
        help=f"seconds to wait for the load to fall under {LOAD_LIMIT} before refusing (status {EXIT_BUSY})",
    )


# --- the machine --------------------------------------------------------------------------------


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name: the first ``model name`` of ``/proc/cpuinfo`` (or of the text
    ``cpuinfo``), else ``platform.processor()``, else ``"unknown"``."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or "unknown"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask), else ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine() -> dict[str, Any]:
    """The CPU model and core counts (``cpus``: the machine's, ``cpus_usable``: this process's)."""
    return {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "cpus_usable": usable_cpus()}


# --- the lock -----------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holders(path: Path = LOCK_PATH) -> list[dict[str, Any]]:
    """Who holds the lock at ``path`` as they wrote themselves into it (``pid``, ``name``, ``mode``,
    ``since``), those whose process is gone left out."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError, TypeError):
            entry = json.loads(line)
            if isinstance(entry, dict) and isinstance(entry.get("pid"), int) and _alive(entry["pid"]):
                found.append(entry)
    return found


def describe_holders(path: Path = LOCK_PATH) -> str:
    """``pid 123 (runtime_bench, exclusive, since 12:00:01)``, for each holder; or that the holder did
    not say (a holder between taking the lock and writing itself in)."""
    entries = holders(path)
    if not entries:
        return "a process that has not written its name yet"
    return ", ".join(
        f"pid {e['pid']} ({e.get('name', '?')}, {e.get('mode', '?')}, since "
        f"{time.strftime('%H:%M:%S', time.localtime(float(e.get('since', 0))))})"
        for e in entries
    )


def _open_lock_file(path: Path) -> int:
    # Open an existing file without O_CREAT first: in a sticky world-writable folder (/tmp) the
    # kernel refuses O_CREAT on another user's file (fs.protected_regular), even one left 0666.
    try:
        return os.open(path, os.O_RDWR | os.O_APPEND)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    with contextlib.suppress(OSError):  # another user's benchmark must be able to take it too
        os.fchmod(fd, 0o666)
    return fd


def _try_lock(fd: int, shared: bool) -> bool:
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


@contextlib.contextmanager
def bench_lock(
    name: str,
    *,
    path: Path = LOCK_PATH,
    timeout: float = LOCK_TIMEOUT_SECONDS,
    shared: bool = False,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll: float = POLL_SECONDS,
) -> Iterator[float]:
    """Hold the machine-wide bench lock for the block; yields the seconds waited for it.

    ``shared``: a shared hold (the simulators), compatible with other shared holds and not with an
    exclusive one. While another benchmark holds it, a line every ``REPORT_EVERY_SECONDS`` says who;
    after ``timeout`` seconds (0: at once) raises ``LockTimeout`` naming the holder.

    The holder writes one JSON line into the file (an exclusive holder empties it first and again
    on release; a shared holder's line stays until the next exclusive holder, and is ignored once its
    process is gone)."""
    fd = _open_lock_file(path)
    try:
        started = clock()
        reported = None
        while not _try_lock(fd, shared):
            waited = clock() - started
            if waited >= timeout:
                raise LockTimeout(
                    f"{name}: the bench lock {path} is still held by {describe_holders(path)} after "
                    f"{waited:.0f} s (--lock-timeout {timeout:g})"
                )
            if reported is None or waited - reported >= REPORT_EVERY_SECONDS:
                log(
                    f"{name}: waiting for the bench lock {path}, held by {describe_holders(path)} "
                    f"(waited {waited:.0f} s of {timeout:g})"
                )
                reported = waited
            sleep(min(poll, max(0.0, timeout - waited)))
        waited = clock() - started
        mode = "shared" if shared else "exclusive"
        if not shared:
            os.ftruncate(fd, 0)
        entry = {"pid": os.getpid(), "name": name, "mode": mode, "since": time.time()}
        os.write(fd, (json.dumps(entry) + "\n").encode())
        if reported is not None:
            log(f"{name}: took the bench lock after {waited:.0f} s")
        try:
            yield waited
        finally:
            if not shared:
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# --- the load -----------------------------------------------------------------------------------


def check_load(
    name: str,
    *,
    noisy: bool,
    settle: float = SETTLE_SECONDS,
    limit: float = LOAD_LIMIT,
    loadavg: LoadReader | None = None,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll: float = SETTLE_POLL_SECONDS,
) -> tuple[tuple[float, float, float], float, str]:
    """The load at the start of a measurement: ``(load averages, seconds waited, verdict)``.

    Verdict ``"passed"`` (1-minute average at most ``limit``, waiting up to ``settle`` seconds for it
    to fall there) or ``"waived (--noisy)"`` (``noisy``: read once, never waited for, never refused).
    Raises ``BusyMachine`` with a one-line message naming the load when it stays over ``limit``.
    ``loadavg`` reads the load (default ``os.getloadavg``)."""
    loadavg = loadavg or os.getloadavg
    load = tuple(loadavg())
    if noisy:
        return (load[0], load[1], load[2]), 0.0, "waived (--noisy)"
    started, waited = clock(), 0.0
    if load[0] > limit and settle > 0:
        log(f"{name}: 1-minute load average {load[0]:.2f} > {limit}: waiting up to {settle:.0f} s to fall")
    while load[0] > limit and waited < settle:
        sleep(min(poll, settle - waited))
        load = tuple(loadavg())
        waited = clock() - started
    if load[0] > limit:
        raise BusyMachine(
            f"{name}: 1-minute load average {load[0]:.2f} (5 min {load[1]:.2f}, 15 min {load[2]:.2f}) "
            f"is over {limit} on {os.cpu_count()} CPUs after {waited:.0f} s: not measuring on a busy "
            'machine; --noisy runs anyway (the result then says "noisy": true)'
        )
    return (load[0], load[1], load[2]), waited, "passed"


class QuietRun:
    """One benchmark's run under the lock: what ``fields`` records in its JSON."""

    def __init__(
        self,
        *,
        noisy: bool,
        load_before: tuple[float, float, float],
        load_check: str,
        settled_seconds: float,
        lock: dict[str, Any],
        loadavg: LoadReader | None = None,
    ) -> None:
        self.noisy = noisy
        self.load_before = load_before
        self.load_check = load_check
        self.settled_seconds = settled_seconds
        self.lock = lock
        self._loadavg = loadavg or os.getloadavg

    def fields(self) -> dict[str, Any]:
        """``{"noisy": bool, "machine": {...}}``, the load after read now: merge into the result."""
        return {
            "noisy": self.noisy,
            "machine": {
                **machine(),
                "loadavg_before": list(self.load_before),
                "loadavg_after": list(self._loadavg()),
                "load_limit_1m": LOAD_LIMIT,
                "load_check": self.load_check,
                "load_settle_seconds": round(self.settled_seconds, 1),
                "lock": self.lock,
            },
        }

    def stamp(self, result: dict[str, Any]) -> dict[str, Any]:
        """``result`` with ``fields`` merged in (they replace a ``noisy`` or ``machine`` it had)."""
        return {**result, **self.fields()}

    def write(self, result: dict[str, Any], out: str | Path, log: Callable[[str], None] = print) -> Path:
        """Write ``result``, stamped (``stamp``), as JSON to ``out`` (its folder made), and log where,
        saying when the run was noisy. Returns the path."""
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.stamp(result), indent=1) + "\n", encoding="utf-8")
        log(f"wrote {path}{' (noisy: not a source of figures)' if self.noisy else ''}")
        return path


@contextlib.contextmanager
def quiet_run(
    name: str,
    args: argparse.Namespace,
    *,
    simulation: bool = False,
    log: Callable[[str], None] = print,
    lock_path: Path | None = None,
    loadavg: LoadReader | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[QuietRun]:
    """The block a benchmark measures in: the lock taken (``bench_lock``, shared for a
    ``simulation``), the load checked (``check_load``; not for a ``simulation``); yields the
    ``QuietRun`` whose ``stamp`` goes on the result. ``args`` carries ``add_arguments``' options.

    A busy machine or a lock wait that ran out is one line on stderr and ``SystemExit`` with
    ``EXIT_BUSY`` or ``EXIT_LOCK_TIMEOUT``, before anything is measured. ``lock_path`` (default
    ``LOCK_PATH``), ``loadavg`` (default ``os.getloadavg``), ``clock`` and ``sleep``: for tests."""
    path = lock_path or LOCK_PATH
    read = loadavg or os.getloadavg
    mode = "shared" if simulation else "exclusive"
    try:
        with bench_lock(
            name, path=path, timeout=args.lock_timeout, shared=simulation, log=log, clock=clock, sleep=sleep
        ) as waited:
            if simulation:
                load = read()
                before, settled = (load[0], load[1], load[2]), 0.0
                verdict = "not applied (a simulation: its figures do not depend on the load)"
            else:
                before, settled, verdict = check_load(
                    name,
                    noisy=args.noisy,
                    settle=args.settle_seconds,
                    loadavg=read,
                    log=log,
                    clock=clock,
                    sleep=sleep,
                )
            run = QuietRun(
                noisy=not simulation and bool(args.noisy),
                load_before=before,
                load_check=verdict,
                settled_seconds=settled,
                lock={"path": str(path), "mode": mode, "waited_seconds": round(waited, 1)},
                loadavg=read,
            )
            log(
                f"{name}: bench lock held ({mode}); load average {before[0]:.2f} {before[1]:.2f} "
                f"{before[2]:.2f}; load check {verdict}{'; a noisy run' if run.noisy else ''}"
            )
            yield run
    except LockTimeout as exc:
        print(exc, file=sys.stderr, flush=True)
        raise SystemExit(EXIT_LOCK_TIMEOUT) from None
    except BusyMachine as exc:
        print(exc, file=sys.stderr, flush=True)
        raise SystemExit(EXIT_BUSY) from None
