"""``hack.devtools.prom.openmetrics_text``: the OpenMetrics text ``promtool tsdb create-blocks-from
openmetrics`` reads, for the backfill the autoscaler's tests write history with."""

from __future__ import annotations

import pytest

from hack.devtools.prom import Series, openmetrics_text


def test_openmetrics_text_groups_families_with_timestamps_and_ends_with_eof() -> None:
    text = openmetrics_text(
        [
            Series("reqs_total", {"pod": "b", "namespace": "ns"}, [(100.0, 1.0), (101.5, 3.0)]),
            Series("inflight", {}, [(100.0, 0.0)]),
            Series("reqs_total", {"pod": "c"}, [(100.0, 2.0)]),
        ]
    )
    assert text == (
        "# TYPE reqs_total unknown\n"
        'reqs_total{namespace="ns",pod="b"} 1.0 100.000\n'
        'reqs_total{namespace="ns",pod="b"} 3.0 101.500\n'
        'reqs_total{pod="c"} 2.0 100.000\n'
        "# TYPE inflight unknown\n"
        "inflight 0.0 100.000\n"
        "# EOF\n"
    )


def test_openmetrics_text_escapes_label_values() -> None:
    text = openmetrics_text([Series("m", {"a": 'say "hi"\\\n'}, [(1.0, 1)])])
    assert 'm{a="say \\"hi\\"\\\\\\n"} 1.0 1.000' in text


def test_openmetrics_text_refuses_timestamps_that_do_not_increase() -> None:
    with pytest.raises(ValueError, match=r"series m\{'pod': 'p'\}: timestamps must increase"):
        openmetrics_text([Series("m", {"pod": "p"}, [(2.0, 1.0), (2.0, 2.0)])])


def test_openmetrics_text_writes_special_values_and_millisecond_timestamps() -> None:
    text = openmetrics_text(
        [Series("m", {}, [(1.0004, float("nan")), (2.0, float("inf")), (3.0, -float("inf")), (4.0, 2)])]
    )
    assert text.splitlines()[1:5] == ["m NaN 1.000", "m +Inf 2.000", "m -Inf 3.000", "m 2.0 4.000"]


def test_openmetrics_text_refuses_what_promtool_would() -> None:
    with pytest.raises(ValueError, match="by at least a millisecond"):
        openmetrics_text([Series("m", {}, [(1.0001, 1.0), (1.0002, 2.0)])])  # both 1.000 s
    with pytest.raises(ValueError, match="a timestamp is not finite"):
        openmetrics_text([Series("m", {}, [(float("nan"), 1.0)])])
    with pytest.raises(ValueError, match=r"series m\{'a': 'b'\}: given twice"):
        openmetrics_text([Series("m", {"a": "b"}, [(1.0, 1.0)]), Series("m", {"a": "b"}, [(2.0, 1.0)])])
