"""``kubectl get kisvc``: the P99 column is a duration a person reads (``23.4ms``), beside
MAX-QUEUE-DELAY (``15ms``), not raw seconds (``0.023353``)."""

from __future__ import annotations

import math

import pytest
from kubeinfer.operator import api, crdgen
from kubeinfer.operator.autoscale import loop
from kubeinfer.operator.autoscale.policy import Observation


def _columns() -> dict[str, dict[str, object]]:
    version = crdgen.inference_service_crd()["spec"]["versions"][0]
    return {c["name"]: c for c in version["additionalPrinterColumns"]}


def test_p99_column_is_a_duration_string_like_the_max_queue_delay() -> None:
    columns = _columns()
    assert columns["P99"]["type"] == "string" and columns["P99"]["jsonPath"] == ".status.observed.p99"
    assert columns["Max-Queue-Delay"]["type"] == "string"
    version = crdgen.inference_service_crd()["spec"]["versions"][0]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    observed = status["properties"]["observed"]["properties"]
    assert observed["p99"]["type"] == "string" and observed["p99Seconds"]["type"] == "number"


@pytest.mark.parametrize(
    "seconds, shown",
    [
        (0.023353, "23.4ms"),
        (0.015, "15ms"),
        (0.0999999, "100ms"),
        (1.23456, "1.23s"),
        (0.000456789, "457us"),
        (12.5, "12.5s"),
    ],
)
def test_observed_p99_is_written_as_a_rounded_duration(seconds: float, shown: str) -> None:
    out = loop.observed_status(Observation(seconds, 0.4, request_rate=10.0), "T")
    assert out["p99"] == shown
    assert out["p99Seconds"] == round(seconds, 6)  # the number stays, for machines
    assert api.parse_duration(shown) == pytest.approx(seconds, rel=5e-3)


def test_unknown_p99_leaves_the_column_empty() -> None:
    for unknown in (None, math.nan, math.inf):
        out = loop.observed_status(Observation(unknown, 0.4), "T")
        assert out["p99"] is None and out["p99Seconds"] is None


def test_format_duration_significant_digits() -> None:
    assert api.format_duration(0.023353) == "23.353ms"  # unchanged without significant
    assert api.format_duration(0.023353, significant=3) == "23.4ms"
    assert api.format_duration(0.0, significant=3) == "0s"
    assert api.format_duration(1234.5, significant=3) == "1230s"
