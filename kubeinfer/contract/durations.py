"""Durations as the API writes them: Go's ``time.ParseDuration`` syntax without sign (``10ms``, ``1.5s``,
``1m30s``), the syntax CEL's ``duration()`` reads. The operator's schema and checks and the activator's
reading of a spec share this one grammar and parser.

Pure: standard library only.
"""

from __future__ import annotations

import re

__all__ = ["DURATION_PATTERN", "parse_duration"]

#: A Go duration (``time.ParseDuration``) without sign: one or more ``<number><unit>`` groups.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"
_DURATION_RE = re.compile(DURATION_PATTERN)
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Convert a Go duration string to float seconds.

    ``"10ms"`` → 0.01, ``"1.5s"`` → 1.5, ``"1h30m"`` → 5400.0. Units: ns, us, ms, s, m, h (the
    units of Go's ``time.ParseDuration``, which CEL's ``duration()`` also uses; ``µs`` excepted).

    Raises:
        ValueError: ``text`` is not a duration (the message quotes it).
    """
    if not isinstance(text, str) or not _DURATION_RE.fullmatch(text):
        raise ValueError(
            f"invalid duration {text!r}: expected e.g. '10ms', '1.5s', '5m' (units ns|us|ms|s|m|h)"
        )
    return sum(float(num) * _UNIT_SECONDS[unit] for num, unit in _DURATION_PART_RE.findall(text))
