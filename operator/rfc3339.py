"""RFC 3339 timestamps as the Kubernetes API writes them: UTC, whole seconds, ``Z`` suffix.

The one place the operator formats and parses them (``metav1.Time``: condition
``lastTransitionTime``, Event times, the autoscaler's decision time in status), as
``2026-01-31T12:00:00Z``.
"""

from __future__ import annotations

import datetime as dt

__all__ = ["FORMAT", "format_time", "now", "parse_time"]

#: ``strftime``/``strptime`` format of a ``metav1.Time`` (seconds precision, UTC).
FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(t: dt.datetime) -> str:
    """``t`` as an RFC 3339 UTC string, fractions of a second dropped.

    ``t`` must be timezone-aware (a naive datetime is taken as local time by ``astimezone``).
    """
    return t.astimezone(dt.UTC).strftime(FORMAT)


def now() -> str:
    """The current time (wall clock) as an RFC 3339 UTC string."""
    return format_time(dt.datetime.now(dt.UTC))


def parse_time(text: str | None) -> dt.datetime | None:
    """An RFC 3339 UTC string (``...Z``, whole seconds) as an aware datetime; None when ``text`` is
    empty, None or not in that form (an unknown time, never an exception)."""
    if not text:
        return None
    try:
        return dt.datetime.strptime(text, FORMAT).replace(tzinfo=dt.UTC)
    except ValueError:
        return None
