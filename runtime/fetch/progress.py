"""Progress lines on stderr: at most one every ``interval`` seconds, and one at the end.

::

    fetch: s3://b/p: 123.4 MB of 400.0 MB (31 %), 40.1 MB/s
    fetch: https://host/m.onnx: 12.0 MB, 6.0 MB/s          (the total unknown)
    fetch: done: 3 files, 400.0 MB in 9.8 s

MB are 10^6 bytes; the rate is that of the bytes since the previous line.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

#: Seconds between two progress lines at most often.
INTERVAL_SECONDS = 5.0
_MB = 1e6


def megabytes(n: float) -> str:
    """``n`` bytes as ``123.4 MB`` (10^6 bytes)."""
    return f"{n / _MB:.1f} MB"


def progress_line(label: str, done: int, total: int | None, rate: float) -> str:
    """One progress line: bytes so far, of the total when known (and the percentage), the rate
    (bytes per second)."""
    if total:
        pct = min(100, int(done * 100 / total))
        return f"fetch: {label}: {megabytes(done)} of {megabytes(total)} ({pct} %), {megabytes(rate)}/s"
    return f"fetch: {label}: {megabytes(done)}, {megabytes(rate)}/s"


def done_line(files: int, nbytes: int, seconds: float) -> str:
    """The final line: files written, bytes fetched, seconds taken."""
    noun = "file" if files == 1 else "files"
    return f"fetch: done: {files} {noun}, {megabytes(nbytes)} in {seconds:.1f} s"


class Progress:
    """Counts the bytes fetched and prints ``progress_line`` at most every ``interval`` seconds.

    Thread-safe: backends that download in threads (s3 objects, the Hub's workers) or poll the
    destination from a thread call ``add`` or ``set`` concurrently.
    """

    def __init__(
        self,
        label: str,
        *,
        total: int | None = None,
        stream: TextIO | None = None,
        interval: float = INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self._stream = stream
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._last_time = self._started
        self._last_done = 0
        self._printed = False

    def set_total(self, total: int | None) -> None:
        """The total bytes expected (None: unknown)."""
        with self._lock:
            self.total = total

    def add(self, n: int) -> None:
        """``n`` more bytes fetched (negative: bytes discarded by a failed attempt)."""
        with self._lock:
            self.done += n
            self._maybe_print()

    def set(self, done: int) -> None:
        """The bytes fetched so far, counted by the caller."""
        with self._lock:
            self.done = done
            self._maybe_print()

    @property
    def seconds(self) -> float:
        """Seconds since the start."""
        return self._clock() - self._started

    def finish(self, files: int, nbytes: int | None = None) -> str:
        """Print the last progress line (if any bytes were counted) and ``done_line``; return the
        latter. ``nbytes`` defaults to the bytes counted."""
        with self._lock:
            seconds = self._clock() - self._started
            count = self.done if nbytes is None else nbytes
            if count:
                rate = count / seconds if seconds > 0 else 0.0
                self._write(progress_line(self.label, count, self.total or count, rate))
            line = done_line(files, count, seconds)
            self._write(line)
            return line

    def _maybe_print(self) -> None:
        now = self._clock()
        if now - self._last_time < self._interval:
            return
        elapsed = now - self._last_time
        rate = (self.done - self._last_done) / elapsed if elapsed > 0 else 0.0
        self._write(progress_line(self.label, self.done, self.total, max(rate, 0.0)))
        self._last_time = now
        self._last_done = self.done

    def _write(self, line: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        print(line, file=stream, flush=True)
