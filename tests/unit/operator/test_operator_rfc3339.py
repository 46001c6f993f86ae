"""operator/rfc3339.py: the one formatter/parser of Kubernetes timestamps."""

from __future__ import annotations

import datetime as dt

from kubeinfer.operator import rfc3339


def test_format_is_utc_whole_seconds_with_z() -> None:
    t = dt.datetime(2026, 1, 31, 13, 0, 5, 987654, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert rfc3339.format_time(t) == "2026-01-31T12:00:05Z"


def test_parse_round_trips_and_unknown_is_none() -> None:
    t = dt.datetime(2026, 1, 31, 12, 0, 5, tzinfo=dt.UTC)
    assert rfc3339.parse_time(rfc3339.format_time(t)) == t
    for bad in (None, "", "yesterday", "2026-01-31T12:00:05+01:00", "2026-01-31 12:00:05Z"):
        assert rfc3339.parse_time(bad) is None


def test_now_is_current_and_parsable() -> None:
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    parsed = rfc3339.parse_time(rfc3339.now())
    assert parsed is not None and before <= parsed <= dt.datetime.now(dt.UTC)
