"""``service_time``: the s(b) = a + c*b fit the runtime exports for the autoscaler's capacity rule."""

from __future__ import annotations

import math
import time

import pytest
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.service_time import ServiceTimeFit, calibrate, calibrate_model


def test_fit_recovers_a_line() -> None:
    fit = ServiceTimeFit()
    for b in (1, 4, 8, 16, 32) * 5:
        fit.observe(b, 0.004 + 0.00075 * b)
    a, c = fit.estimate() or (0.0, 0.0)
    assert a == pytest.approx(0.004) and c == pytest.approx(0.00075)


def test_fit_needs_two_batch_sizes_and_ignores_nonsense() -> None:
    fit = ServiceTimeFit()
    assert fit.estimate() is None and math.isnan(fit.intercept()) and math.isnan(fit.slope())
    for _ in range(10):
        fit.observe(8, 0.01)
    assert fit.estimate() is None  # one size: no slope
    for rows, seconds in ((0, 0.01), (4, 0.0), (4, -1.0), (4, math.inf), (4, math.nan)):
        fit.observe(rows, seconds)
    assert fit.estimate() is None
    fit.observe(16, 0.018)
    assert fit.estimate() == pytest.approx((0.002, 0.001))


def test_negative_intercept_is_refitted_through_the_origin() -> None:
    fit = ServiceTimeFit()
    fit.observe(1, 0.0005)  # noise at a small batch would give a < 0
    fit.observe(10, 0.011)
    a, c = fit.estimate() or (1.0, 0.0)
    # least squares through the origin, sum(b*s) / sum(b*b) (the older sample weighs a little less)
    assert a == 0.0 and c == pytest.approx((0.0005 + 10 * 0.011) / (1 + 100), rel=1e-3)


def test_fit_follows_a_change_within_its_half_life() -> None:
    fit = ServiceTimeFit(half_life=10)
    for b in (1, 32) * 50:
        fit.observe(b, 0.004 + 0.001 * b)
    for b in (1, 32) * 50:  # the device got twice as slow per row
        fit.observe(b, 0.004 + 0.002 * b)
    assert fit.slope() == pytest.approx(0.002, rel=0.01)
    with pytest.raises(ValueError, match="half_life"):
        ServiceTimeFit(half_life=0)


def test_calibrate_times_one_two_and_max_rows() -> None:
    seen: list[int] = []

    def run(rows: int) -> None:
        seen.append(rows)
        time.sleep(0.001 + 0.0002 * rows)

    fit = ServiceTimeFit()
    medians = calibrate(run, 32, fit, repeats=2)
    assert sorted(medians) == [1, 16, 32] and seen == [1, 1, 16, 16, 32, 32]
    a, c = fit.estimate() or (0.0, 0.0)
    assert c > 0 and a >= 0
    assert calibrate(lambda rows: None, 1, ServiceTimeFit(), repeats=1).keys() == {1}


class _NoExamples:
    name = "m"

    def example_inputs(self, rows: int) -> dict[str, object]:
        raise NotImplementedError

    def preprocess(self, batch: object) -> object:
        return batch

    def execute(self, prepared: object) -> dict[str, object]:
        return {}


def test_calibrate_model_never_raises() -> None:
    fit = ServiceTimeFit()
    calibrate_model(_NoExamples(), 8, fit)  # type: ignore[arg-type]
    assert fit.estimate() is None


def test_metrics_export_the_fit() -> None:
    metrics = RuntimeMetrics("m")

    def value(name: str) -> float:
        for family in metrics.registry.collect():
            for sample in family.samples:
                if sample.name == name:
                    return float(sample.value)
        raise AssertionError(f"{name} not exported")

    assert math.isnan(value("kubeinfer_service_time_slope_seconds"))  # unknown is NaN, never 0
    metrics.service_time.observe(1, 0.005)
    metrics.service_time.observe(9, 0.013)
    assert value("kubeinfer_service_time_intercept_seconds") == pytest.approx(0.004)
    assert value("kubeinfer_service_time_slope_seconds") == pytest.approx(0.001)
