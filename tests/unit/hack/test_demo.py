"""hack/demo.py's wait for the capacity probe to leave the autoscaler's window, on a fake clock.

Without that wait the warm phase's 5 requests/s started while the probe's P99 was still in the
autoscaler's 10 s window, and the autoscaler scaled out before the burst began."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest

from hack import demo
from hack.devtools.prom import PrometheusServer


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def readings(*values: float | Exception | None) -> Callable[[], float | None]:
    it: Iterator[float | Exception | None] = iter(values)

    def request_rate() -> float | None:
        value = next(it)
        if isinstance(value, Exception):
            raise value
        return value

    return request_rate


def test_waits_until_the_request_rate_over_the_window_is_zero() -> None:
    clock = FakeClock()
    waited = demo.wait_window_clear(readings(21.0, 8.5, 0.4, 0.0), 30.0, clock=clock, sleep=clock.sleep)
    assert waited == 3.0
    assert clock.sleeps == [1.0, 1.0, 1.0]


def test_no_series_is_clear_but_nan_or_an_error_is_not_known_to_be() -> None:
    clock = FakeClock()
    rate = readings(math.nan, RuntimeError("prometheus down"), None)
    assert demo.wait_window_clear(rate, 30.0, clock=clock, sleep=clock.sleep) == 2.0


def test_gives_up_after_the_timeout() -> None:
    clock = FakeClock()
    assert demo.wait_window_clear(lambda: 5.0, 3.0, clock=clock, sleep=clock.sleep) is None
    assert clock.sleeps == [1.0, 1.0, 1.0]


def test_the_wait_reads_the_autoscalers_request_rate_over_its_window() -> None:
    window = demo.DEMO_AUTOSCALING["window"]
    expected = f'sum(rate(kubeinfer_requests_total{{namespace="demo",inferenceservice="minilm"}}[{window}]))'
    assert expected == demo.REQUEST_RATE_QUERY
    assert f"[{window}]" in demo.P99_QUERY


def run_burst(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, burst_rate: float | None) -> list[str]:
    """``Demo.burst`` with the cluster, Prometheus and load stubbed: the order of what it does."""
    args = argparse.Namespace(base_rate=5.0, burst_rate=burst_rate, burst_seconds=75.0, cool_seconds=45.0,
                              print_every=3.0)  # fmt: skip
    d = demo.Demo(tmp_path, args)
    d.prom = cast(PrometheusServer, object())
    calls: list[str] = []
    monkeypatch.setattr(d, "capacity", lambda: calls.append("probe") or 21.0)
    monkeypatch.setattr(d, "_let_probe_leave_window", lambda: calls.append("wait for the window"))
    monkeypatch.setattr(d, "runtime_pods", lambda: [])
    monkeypatch.setattr(
        d, "_offer", lambda _pool, _load, _ticks, _q, name, rate, _s: calls.append(f"{name} {rate:g}/s")
    )
    d.burst()
    return calls


def test_the_warm_phase_starts_after_the_probe_has_left_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_burst(tmp_path, monkeypatch, None) == [
        "probe", "wait for the window", "warm 5/s", "burst 21/s", "cool 5/s"
    ]  # fmt: skip


def test_no_probe_no_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_burst(tmp_path, monkeypatch, 30.0) == ["warm 5/s", "burst 30/s", "cool 5/s"]
