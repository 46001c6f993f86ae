"""Retries with exponential backoff, for transient failures only.

Transient (``FetchError.transient``): connection errors, timeouts and stalls, HTTP 5xx and 429.
Everything else (a 4xx, a missing object, a checksum mismatch, an unsafe archive, a size over the
limit) fails at once: another attempt would meet the same answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from kubeinfer.runtime.fetch.errors import FetchError

T = TypeVar("T")

#: The first backoff, seconds; each next one doubles (1 s, 2 s, 4 s, ...) up to ``MAX_BACKOFF_SECONDS``.
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0


def backoff_seconds(retry: int) -> float:
    """Seconds to wait before retry number ``retry`` (0 for the first): 1, 2, 4, ... at most 30."""
    return min(FIRST_BACKOFF_SECONDS * 2.0**retry, MAX_BACKOFF_SECONDS)


def transient_status(status: int) -> bool:
    """Whether an HTTP status may pass on another attempt: 429 and every 5xx."""
    return status == 429 or 500 <= status <= 599


def retrying(
    attempt: Callable[[], T],
    *,
    retries: int,
    log: Callable[[str], None],
    label: str,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``attempt()``, called again after a transient ``FetchError`` at most ``retries`` times.

    Each retry is logged (``log``, one line naming ``label``, the cause and the wait) and preceded
    by ``backoff_seconds`` of sleep.

    Raises:
        FetchError: a permanent failure at once; a transient one when no retry is left (its cause
            says how many attempts were made when more than one).
    """
    for retry in range(retries + 1):
        try:
            return attempt()
        except FetchError as exc:
            if not exc.transient:
                raise
            if retry == retries:
                if retries:
                    raise FetchError(f"{exc.cause} (after {retries + 1} attempts)", transient=True) from exc
                raise
            wait = backoff_seconds(retry)
            log(f"fetch: {label}: {exc.cause}; retrying in {wait:g} s (attempt {retry + 2} of {retries + 1})")
            sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover
