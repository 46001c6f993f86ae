"""A runtime's start: its cold-start stages (``kubeinfer.runtime.startup``, the histogram of
``RuntimeMetrics``) and its warmup split at readiness (what a first request needs before, the rest
after, while no request is in flight)."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubeinfer.runtime import server as server_module
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models.base import WarmupPass, batch_buckets, first_request_passes, run_warmup
from kubeinfer.runtime.server import RuntimeServer
from kubeinfer.runtime.startup import (
    STAGES,
    ColdStart,
    StartupClock,
    WarmupStopped,
    process_age_seconds,
    wait_quiet,
)

from tests.unit.runtime.runtime_fakes import FakeModel

pytestmark = pytest.mark.timeout(30)

# /proc/self/stat of a process whose command name holds a space and a parenthesis; starttime (field
# 22) is 250000 ticks: 2500 s after boot at 100 ticks per second
STAT = "4242 (kubeinfer (rt) x) S 1 4242 4242 0 -1 4194560 " + " ".join(["0"] * 12) + " 250000 0 0\n"


def test_the_process_age_is_the_uptime_less_the_process_start() -> None:
    assert process_age_seconds(STAT, "2503.25 100.00\n", 100) == pytest.approx(3.25)
    assert process_age_seconds("garbage", "1.0 1.0", 100) is None
    assert process_age_seconds(STAT, "", 100) is None
    age = process_age_seconds()  # this very process, on Linux
    assert age is not None and 0.0 < age < 24 * 3600


def test_the_startup_clock_counts_from_the_process_start_on_the_monotonic_clock() -> None:
    now = [100.0]
    clock = StartupClock(age=lambda: 2.5, monotonic=lambda: now[0])
    assert clock() == 2.5
    now[0] = 101.0
    assert clock() == 3.5
    assert StartupClock(age=lambda: None, monotonic=lambda: now[0])() == 0.0  # no /proc: from now


def test_stages_marked_before_the_graph_cache_is_known_are_observed_with_it_in_order() -> None:
    seen: list[tuple[str, str, float]] = []
    now = [0.7]
    cold = ColdStart(lambda stage, cache, s: seen.append((stage, cache, s)), clock=lambda: now[0])
    assert cold.mark("fetched") == 0.7
    now[0] = 3.0
    cold.mark("loaded")
    assert seen == []  # the label is not known yet
    cold.graph_cache("hit")
    assert seen == [("fetched", "hit", 0.7), ("loaded", "hit", 3.0)]
    now[0] = 3.5
    cold.mark("warmed")
    cold.graph_cache("miss")  # only the first call counts
    now[0] = 4.0
    cold.first_answer()
    now[0] = 9.0
    cold.first_answer()  # once per process
    assert cold.mark("loaded") == 3.0  # a stage keeps its first moment, observed once
    assert seen[2:] == [("warmed", "hit", 3.5), ("first_answer", "hit", 4.0)]
    assert cold.summary() == (
        "fetched 0.7 s, loaded 3.0 s, warmed 3.5 s, first_answer 4.0 s (graph cache hit)"
    )
    with pytest.raises(ValueError, match="unknown cold-start stage 'ready'"):
        cold.mark("ready")


def test_the_histogram_has_every_stage_once_and_the_first_answer_is_the_first_200() -> None:
    metrics = RuntimeMetrics("m")
    for stage in STAGES[:3]:
        metrics.cold_start.mark(stage)
    metrics.count_request(503, 0.01)  # not an answer
    text = metrics.exposition().decode()
    assert "kubeinfer_cold_start_stage_seconds_count" not in text  # nothing before the label is known
    metrics.cold_start.graph_cache("none")
    metrics.count_request(200, 0.01)
    metrics.count_request(200, 0.01)
    text = metrics.exposition().decode()
    for stage in STAGES:
        series = f'kubeinfer_cold_start_stage_seconds_count{{graph_cache="none",model="m",stage="{stage}"}}'
        count = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
        assert count is not None and float(count.group(1)) == 1.0, stage
    assert 'kubeinfer_cold_start_stage_seconds_bucket{graph_cache="none",le="0.1",model="m"' in text
    assert 'le="120.0",model="m"' in text


def test_wait_quiet_returns_after_the_quiet_time_without_requests_and_stops_at_the_drain() -> None:
    now = [0.0]
    busy_until = [0.5]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    wait_quiet(
        lambda: now[0] < busy_until[0], lambda: False, 0.25, clock=lambda: now[0], sleep=sleep, poll=0.125
    )
    assert now[0] == pytest.approx(0.75)  # busy until 0.5, then quiet for 0.25
    now[0], busy_until[0] = 0.0, 0.0
    wait_quiet(lambda: False, lambda: False, 0.25, clock=lambda: now[0], sleep=sleep, poll=0.125)
    assert now[0] == pytest.approx(0.25)
    with pytest.raises(WarmupStopped):
        wait_quiet(lambda: True, lambda: now[0] > 1.0, 0.25, clock=lambda: now[0], sleep=sleep, poll=0.125)


def test_a_first_request_needs_the_passes_of_one_row_the_rest_go_cheapest_first() -> None:
    ran: list[tuple[int, int | None]] = []
    passes = [
        WarmupPass(rows, size, functools.partial(ran.append, (rows, size)))
        for rows in batch_buckets(4)
        for size in (16, 8)
    ]
    first, rest = first_request_passes(passes)
    assert [(p.rows, p.size) for p in first] == [(1, 16), (1, 8)]
    assert [(p.rows, p.size) for p in rest] == [(2, 8), (2, 16), (4, 8), (4, 16)]
    gate: list[int] = []
    assert run_warmup(rest, 2, lambda: gate.append(len(ran))) >= 0
    assert gate == [0, 2, 4, 6]  # before each pass, each pass run `steps` times
    assert ran == [(2, 8), (2, 8), (2, 16), (2, 16), (4, 8), (4, 8), (4, 16), (4, 16)]


class PassesModel(FakeModel):
    """A fake model that lists its warmup passes (rows x ``sizes``) and records each run with whether the
    server was ready then (``ready``)."""

    def __init__(self, sizes: tuple[int, ...] = (8, 16)) -> None:
        super().__init__(max_batch_size=0)
        self.sizes = sizes
        self.ready: Callable[[], bool] = lambda: False
        self.runs: list[tuple[int, int, bool]] = []
        self.calibrated_ready: list[bool] = []

    def _run(self, rows: int, size: int) -> None:
        self.runs.append((rows, size, self.ready()))

    def execute(self, prepared: Any) -> dict[str, np.ndarray]:  # the calibration's batches
        self.calibrated_ready.append(self.ready())
        return super().execute(prepared)

    def warmup_passes(self, max_batch_size: int) -> list[WarmupPass]:
        return [
            WarmupPass(rows, size, functools.partial(self._run, rows, size))
            for rows in batch_buckets(max_batch_size)
            for size in self.sizes
        ]

    def warmup(self, max_batch_size: int, steps: int) -> float:
        seconds = run_warmup(self.warmup_passes(max_batch_size), steps)
        self.max_batch_size = max_batch_size
        return seconds


def served(model: PassesModel, monkeypatch: pytest.MonkeyPatch, **warmup: object) -> RuntimeServer:
    monkeypatch.setattr(server_module, "load_model", lambda _cfg: model)
    cfg = RuntimeConfig.model_validate(
        {"model": {"name": "fake"}, "batching": {"max_batch_size": 4}, "warmup": warmup}
    )
    server = RuntimeServer(cfg)
    model.ready = lambda: server.ready
    return server


async def test_ready_after_the_warmup_of_one_row_the_rest_after_then_the_service_time(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = PassesModel()
    server = served(model, monkeypatch)
    try:
        with caplog.at_level(logging.INFO, logger="kubeinfer.runtime.server"):
            await server._load()
        assert server.ready and model.max_batch_size == 4
        before = [(rows, size) for rows, size, ready in model.runs if not ready]
        after = [(rows, size) for rows, size, ready in model.runs if ready]
        assert before == [(1, 8), (1, 16)]
        assert after == [(2, 8), (2, 16), (4, 8), (4, 16)]
        # the service time is calibrated before readiness: a fit from the moment the replica is ready
        assert model.batches == [1, 1, 1, 2, 2, 2, 4, 4, 4] and model.calibrated_ready == [False] * 9
        assert "4 larger batch(es) up to 4 rows after ready" in caplog.text
        assert "background warmup done: 4 batch(es)" in caplog.text
        marks = server.metrics.cold_start.marks
        assert list(marks) == ["fetched", "loaded", "warmed"] and marks["fetched"] <= marks["warmed"]
        text = server.metrics.exposition().decode()
        assert (
            'kubeinfer_cold_start_stage_seconds_count{graph_cache="none",model="fake",stage="warmed"} 1.0'
            in text
        )
    finally:
        server.close()


async def test_before_ready_all_warms_every_batch_before_readiness(monkeypatch: pytest.MonkeyPatch) -> None:
    model = PassesModel()
    server = served(model, monkeypatch, before_ready="all")
    try:
        await server._load()
        assert server.ready and len(model.runs) == 6 and not any(ready for _, _, ready in model.runs)
    finally:
        server.close()


async def test_the_rest_waits_while_a_request_is_in_flight_and_stops_at_the_drain(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = PassesModel()
    server = served(model, monkeypatch)
    server.plane.in_flight = 1  # a request being answered
    try:
        loading = asyncio.create_task(server._load())
        for _ in range(200):
            if server.ready:
                break
            await asyncio.sleep(0.01)
        assert server.ready
        await asyncio.sleep(0.5)  # twice the quiet time: nothing more while the request is in flight
        assert len(model.runs) == 2
        server.plane.in_flight = 0
        for _ in range(200):
            if len(model.runs) > 2:
                break
            await asyncio.sleep(0.01)
        assert len(model.runs) > 2
        await loading
        # a start shut down while the rest waits stops it there
        model2 = PassesModel()
        server2 = served(model2, monkeypatch)
        server2.plane.in_flight = 1
        with caplog.at_level(logging.INFO, logger="kubeinfer.runtime.server"):
            loading = asyncio.create_task(server2._load())
            for _ in range(200):
                if server2.ready:
                    break
                await asyncio.sleep(0.01)
            server2.announce_shutdown()
            await asyncio.wait_for(loading, 5)
        assert (
            len(model2.runs) == 2 and "background warmup stopped: the runtime is shutting down" in caplog.text
        )
        server2.close()
    finally:
        server.close()


@pytest.mark.parametrize("freeze", [False, True])
async def test_a_process_of_its_own_freezes_the_load_out_of_garbage_collection_before_ready(
    freeze: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = PassesModel()
    server = served(model, monkeypatch)
    server._freeze_after_load = freeze
    calls: list[bool] = []  # ready at each call: the freeze must come before readiness

    def freeze_heap() -> int:  # the real one would freeze this test process's heap
        calls.append(server.ready)
        return 268400

    monkeypatch.setattr(server_module, "freeze_heap", freeze_heap)
    try:
        with caplog.at_level(logging.INFO, logger="kubeinfer.runtime.server"):
            await server._load()
        assert server.ready
        assert calls == ([False] if freeze else [])
        frozen = "268400 objects of the load frozen out of garbage collection" in caplog.text
        assert frozen is freeze, caplog.text
    finally:
        server.close()


def test_freeze_heap_collects_the_garbage_first_then_freezes_what_is_alive(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = """
import gc, weakref
from kubeinfer.runtime.process import freeze_heap

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a
dead = weakref.ref(a)
del a, b
kept = [Node() for _ in range(1000)]
frozen = freeze_heap()
assert dead() is None, "a garbage cycle was frozen instead of collected"
assert frozen == gc.get_freeze_count() and frozen > len(kept), frozen
before = gc.get_freeze_count()
gc.collect()
assert gc.get_freeze_count() == before  # a full collection leaves the frozen objects where they are
"""
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
