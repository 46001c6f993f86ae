"""The lock by which ``make test``'s e2e tier knows that the tier it runs beside has ended
(``hack/test.sh``: that tier's pytest holds the lock exclusively for as long as it runs; the e2e files
that time the node's CPU take it shared first)."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path
from typing import IO, Any


def wait_for_quiet_node(lock: Path, *, timeout: float, say: Any = print) -> IO[str]:
    """Block until ``lock`` (a file another tier holds with ``flock`` while it runs) can be locked
    shared; returns the open file, which keeps it locked until closed. Says once that it waits (``say``).

    Raises TimeoutError naming the lock after ``timeout`` seconds.
    """
    lock.parent.mkdir(parents=True, exist_ok=True)
    f = lock.open("a")
    deadline = time.monotonic() + timeout
    waited = False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if not waited:
                say(f"waiting for the tier beside this one to end (it holds {lock}): this file times the CPU")
                waited = True
            if time.monotonic() > deadline:
                f.close()
                raise TimeoutError(f"{lock} still held after {timeout:.0f} s") from None
            time.sleep(1.0)
