"""Load shedding by priority: with the queue full, a higher-priority arrival displaces the newest request
of the lowest queued level (429 + Retry-After), per-level queue limits, the shed count per level."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import numpy as np
import pydantic
import pytest
from kubeinfer.runtime.batching import Batcher, BatchSettings, ServingError
from kubeinfer.runtime.config import BatchingConfig, RuntimeConfig
from kubeinfer.runtime.metrics import RuntimeMetrics

from tests.unit.runtime.runtime_fakes import FakeModel, rows

pytestmark = pytest.mark.timeout(30)


async def wait_for(cond: Callable[[], bool]) -> None:
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def shed(b: Batcher, priority: int, reason: str) -> float:
    value = b.metrics.registry.get_sample_value(
        "kubeinfer_shed_requests_total", {"model": "fake", "priority": str(priority), "reason": reason}
    )
    return 0.0 if value is None else value


async def blocked(model: FakeModel, **settings: object) -> tuple[Batcher, list[asyncio.Future[object]]]:
    """A batcher whose one executor is blocked in ``execute`` with one batch and one more taken ahead
    (max_batch_size 1): whatever is submitted next stays queued until ``model.gate`` is set."""
    model.gate = threading.Event()
    b = Batcher(
        model,
        BatchSettings(max_batch_size=1, max_queue_delay_seconds=0.0, **settings),  # type: ignore[arg-type]
        metrics=RuntimeMetrics(model.name),
    )
    b.start()
    running = [asyncio.ensure_future(b.infer(rows(100)))]
    await asyncio.to_thread(model.started.wait, 5)
    running.append(asyncio.ensure_future(b.infer(rows(101))))  # taken ahead: the look-ahead slot
    await wait_for(lambda: b._in_flight == 2 and b.queued == 0)
    return b, running


async def test_higher_priority_displaces_the_newest_of_the_lowest_level() -> None:
    model = FakeModel()
    b, running = await blocked(model, max_queue_size=3, priority_levels=3, default_priority_level=3)
    low_old = asyncio.ensure_future(b.infer(rows(1), priority=3))
    mid = asyncio.ensure_future(b.infer(rows(2), priority=2))
    low_new = asyncio.ensure_future(b.infer(rows(3), priority=3))
    await wait_for(lambda: b.queued == 3)
    high = asyncio.ensure_future(b.infer(rows(4), priority=1))
    await wait_for(lambda: low_new.done())
    with pytest.raises(ServingError) as info:
        await low_new
    assert info.value.status == 429 and info.value.headers["Retry-After"] == "1"
    assert "displaced by a request of priority 1" in info.value.message
    assert b.queued == 3
    assert (shed(b, 3, "displaced"), shed(b, 1, "refused"), shed(b, 3, "refused")) == (1.0, 0.0, 0.0)
    model.gate.set()
    outs = await asyncio.gather(*running, low_old, mid, high)
    # the queued ones ran by priority: high (1), mid (2), then the older low (3)
    assert [o["y"][0, 0] for o in outs[2:]] == [2.0, 4.0, 8.0]  # type: ignore[index]
    assert model.firsts[2:] == [[4.0], [2.0], [1.0]]
    b.close()


async def test_arrival_not_above_the_lowest_queued_level_is_refused() -> None:
    model = FakeModel()
    b, running = await blocked(model, max_queue_size=2, priority_levels=2, default_priority_level=2)
    queued = [asyncio.ensure_future(b.infer(rows(i), priority=1)) for i in (1, 2)]
    await wait_for(lambda: b.queued == 2)
    for priority in (1, 2):  # nothing of a lower priority than the arrival is queued: it is refused
        with pytest.raises(ServingError, match=r"queue full \(2 requests queued, max_queue_size 2\)") as info:
            await b.infer(rows(9), priority=priority)
        assert info.value.status == 429 and info.value.headers["Retry-After"].isdigit()
    assert (shed(b, 1, "refused"), shed(b, 2, "refused"), shed(b, 2, "displaced")) == (1.0, 1.0, 0.0)
    assert not any(f.done() for f in queued)
    model.gate.set()
    await asyncio.gather(*running, *queued)
    b.close()


async def test_equal_priority_never_displaces() -> None:
    model = FakeModel()
    b, running = await blocked(model, max_queue_size=1)
    first = asyncio.ensure_future(b.infer(rows(1)))
    await wait_for(lambda: b.queued == 1)
    with pytest.raises(ServingError) as info:
        await b.infer(rows(2))  # default level 2, same as the queued one
    assert info.value.status == 429 and not first.done()
    assert shed(b, 2, "refused") == 1.0
    model.gate.set()
    await asyncio.gather(*running, first)
    b.close()


async def test_per_level_queue_limit_refuses_only_that_level() -> None:
    model = FakeModel()
    b, running = await blocked(model, max_queue_size=10, priority_queue_sizes={2: 1})
    low = asyncio.ensure_future(b.infer(rows(1), priority=2))
    await wait_for(lambda: b.queued == 1)
    with pytest.raises(ServingError, match="1 requests queued at priority 2, limit 1") as info:
        await b.infer(rows(2), priority=2)
    assert info.value.status == 429 and "Retry-After" in info.value.headers
    high = [asyncio.ensure_future(b.infer(rows(i), priority=1)) for i in (3, 4)]  # level 1: no limit
    await wait_for(lambda: b.queued == 3)
    assert (shed(b, 2, "refused"), shed(b, 1, "refused")) == (1.0, 0.0)
    model.gate.set()
    await asyncio.gather(*running, low, *high)
    b.close()


async def test_displaced_request_leaves_the_queue_with_its_timer() -> None:
    model = FakeModel()
    b, running = await blocked(model, max_queue_size=1)
    low = asyncio.ensure_future(b.infer(rows(1), priority=2, timeout_us=200_000))
    await wait_for(lambda: b.queued == 1)
    high = asyncio.ensure_future(b.infer(rows(2), priority=1))
    with pytest.raises(ServingError) as info:
        await low
    assert info.value.status == 429  # displaced, and its queue timeout no longer fires a 504
    await asyncio.sleep(0.3)
    assert b.queued == 1 and not high.done()
    model.gate.set()
    out = await high
    np.testing.assert_array_equal(out["y"], [[4.0, 0.0]])
    await asyncio.gather(*running)
    b.close()


def test_config_priority_queue_sizes() -> None:
    cfg = BatchingConfig(priority_levels=3, priority_queue_sizes={1: 5, 3: 2})
    assert BatchSettings.from_config(cfg).priority_queue_sizes == {1: 5, 3: 2}
    for bad in ({4: 1}, {0: 1}, {1: 0}):
        with pytest.raises(pydantic.ValidationError, match="priority_queue_sizes"):
            BatchingConfig(priority_levels=3, priority_queue_sizes=bad)
    # unset, the rendered file is what it was before the setting existed; set, it round-trips
    assert "priority_queue_sizes" not in RuntimeConfig().to_yaml()
    full = RuntimeConfig(batching=cfg)
    assert RuntimeConfig.from_yaml(full.to_yaml()) == full
