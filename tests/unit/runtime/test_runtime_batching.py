"""The dynamic batcher with a fake model: triggers, priorities, timeouts, bounds, isolation, reload, drain."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubeinfer.runtime.batching import Batcher, BatchSettings, ServingError, plan_batch
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models.base import InputError

from tests.unit.runtime.runtime_fakes import FakeModel, KeyedFakeModel, keyed, rows

pytestmark = pytest.mark.timeout(30)


@dataclass
class Item:
    rows: int
    enqueued: float
    key: object = None
    tokens: int = 0


def plan(items: list[Item], **kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {
        "max_batch_size": 4,
        "max_queue_delay_seconds": 0.01,
        "now": 0.0,
        "in_flight": 0,
        "executors": 1,
    }
    args.update(kw)
    oldest = min((i.enqueued for i in items), default=None)
    return plan_batch(items, oldest, **args)  # type: ignore[arg-type]


# ----- the pure policy -----------------------------------------------------------------------------
def test_policy_waits_for_delay_then_takes_what_fits() -> None:
    items = [Item(1, 0.0), Item(2, 0.001)]
    p = plan(items, now=0.005)
    assert (p.take, p.wake_at) == (0, pytest.approx(0.01))
    p = plan(items, now=0.01)
    assert p.take == 2 and not p.full


def test_policy_size_trigger_and_no_split() -> None:
    assert plan([Item(2, 0.0), Item(2, 0.0), Item(1, 0.0)]).take == 2  # 4 rows: full at once
    p = plan([Item(3, 0.0), Item(2, 0.0)])  # the 2-row request does not fit: full with 3 rows
    assert (p.take, p.full) == (1, True)
    p = plan([Item(9, 0.0), Item(1, 0.0)])  # larger than max_batch_size: runs alone
    assert (p.take, p.full) == (1, True)


def test_policy_delay_zero_takes_at_once_when_idle() -> None:
    assert plan([Item(1, 5.0)], max_queue_delay_seconds=0.0, now=5.0).take == 1
    # all executors busy and the batch not full: keep collecting rows
    assert plan([Item(1, 5.0)], max_queue_delay_seconds=0.0, now=5.0, in_flight=1) == plan_batch(
        [], None, max_batch_size=4, max_queue_delay_seconds=0, now=0, in_flight=0, executors=1
    )


def test_policy_early_dispatch_when_no_arrival_is_expected_in_time() -> None:
    one = [Item(1, 0.0)]
    p = plan(one, max_queue_delay_seconds=0.01, now=0.0, arrival_gap=0.02)  # next arrival after due
    assert (p.take, p.full) == (1, False)
    p = plan(one, max_queue_delay_seconds=0.01, now=0.0, arrival_gap=0.005)  # one may join: wait
    assert (p.take, p.wake_at) == (0, pytest.approx(0.01))
    assert plan(one, max_queue_delay_seconds=0.01, now=0.0, arrival_gap=None).take == 0  # unknown: wait
    # a busy executor takes only full batches, expected arrivals or not
    assert plan(one, max_queue_delay_seconds=0.01, now=0.0, arrival_gap=1.0, in_flight=1).take == 0


def test_policy_full_batch_is_prepared_ahead_but_bounded() -> None:
    full = [Item(1, 0.0)] * 4
    assert plan(full, in_flight=1).take == 4  # preprocessing overlaps the running batch
    assert plan(full, in_flight=2).take == 0  # one lookahead batch per executor
    assert plan(full, in_flight=3, executors=2).take == 4


def test_policy_preferred_batch_size_is_dispatched_at_once() -> None:
    items = [Item(1, 0.0)] * 5
    assert plan(items, max_batch_size=8).take == 0  # not full, not due
    p = plan(items, max_batch_size=8, preferred_batch_sizes=(2, 4))
    assert (p.take, p.full) == (4, True)
    assert plan([Item(3, 0.0)], max_batch_size=8, preferred_batch_sizes=(2, 4)).take == 0


def test_policy_draining_makes_everything_due() -> None:
    assert plan([Item(1, 0.0)], max_queue_delay_seconds=10.0, draining=True).take == 1


def test_policy_batches_only_the_head_key_and_skips_others_in_place() -> None:
    items = [Item(1, 0.0, "a"), Item(1, 0.001, "b"), Item(1, 0.002, "a"), Item(1, 0.003, "b")]
    p = plan(items, max_batch_size=4, now=0.01)  # due: the head's key only, in order
    assert (p.take, p.picked, p.full) == (2, (0, 2), False)
    # the other key does not make the head's batch full: it waits for the delay trigger
    assert plan(items, max_batch_size=4, now=0.005).take == 0
    # a same-key request that does not fit makes it full; other keys behind it are not overtaken
    p = plan([Item(3, 0.0, "a"), Item(1, 0.0, "b"), Item(2, 0.0, "a")], max_batch_size=4)
    assert (p.picked, p.full) == ((0,), True)
    # once the head's requests are served, the other key is the head and runs on its own delay
    p = plan([Item(1, 0.001, "b"), Item(1, 0.003, "b")], max_batch_size=4, now=0.011)
    assert p.picked == (0, 1)


def test_policy_key_respects_size_and_preferred_triggers() -> None:
    items = [Item(1, 0.0, k) for k in "abababab"]
    p = plan(items, max_batch_size=4)  # 4 rows of key a found among 8 requests: full at once
    assert (p.picked, p.full) == ((0, 2, 4, 6), True)
    p = plan(items, max_batch_size=8, preferred_batch_sizes=(2,))
    assert (p.picked, p.full) == ((0, 2), True)


# ----- the batcher on a loop -----------------------------------------------------------------------
async def make(model: FakeModel, **settings: object) -> Batcher:
    b = Batcher(model, BatchSettings(**settings), metrics=RuntimeMetrics(model.name))  # type: ignore[arg-type]
    b.start()
    return b


async def test_size_trigger_forms_one_full_batch_before_the_delay() -> None:
    model = FakeModel()
    b = await make(model, max_batch_size=4, max_queue_delay_seconds=5.0)
    t0 = time.monotonic()
    outs = await asyncio.gather(*(b.infer(rows(i)) for i in range(4)))
    assert time.monotonic() - t0 < 1.0
    assert model.batches == [4]
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out["y"], [[2.0 * i, 0.0]])
        assert out["n"].tolist() == [4]
    b.close()


async def test_delay_trigger_waits_max_queue_delay_for_more_rows() -> None:
    model = FakeModel()
    b = await make(model, max_batch_size=64, max_queue_delay_seconds=0.08)
    t0 = time.monotonic()
    await asyncio.gather(*(b.infer(rows(i)) for i in range(3)))
    waited = time.monotonic() - t0
    assert model.batches == [3]
    assert 0.07 <= waited < 1.0
    b.close()


async def test_lone_request_at_low_load_skips_the_delay_but_a_burst_waits() -> None:
    from kubeinfer.runtime.batching import ARRIVAL_WINDOW_SECONDS

    model = FakeModel()
    b = await make(model, max_batch_size=64, max_queue_delay_seconds=0.5)
    assert ARRIVAL_WINDOW_SECONDS == 1.0
    t0 = time.monotonic()
    await b.infer(rows(0))  # within the first window: no estimate yet, the delay applies
    assert time.monotonic() - t0 >= 0.45
    await asyncio.sleep(1.05)  # a window with no arrival: the next one is not expected within 0.5 s
    t0 = time.monotonic()
    await b.infer(rows(1))
    assert time.monotonic() - t0 < 0.25
    t0 = time.monotonic()  # 6 more at once: 7 a second expected, so the batch waits for more rows
    await asyncio.gather(*(b.infer(rows(i)) for i in range(6)))
    assert time.monotonic() - t0 >= 0.45
    assert model.batches == [1, 1, 6]
    b.close()


async def test_a_sequential_client_never_waits_for_the_delay_but_two_clients_batch() -> None:
    model = FakeModel()
    b = await make(model, max_batch_size=64, max_queue_delay_seconds=0.2)
    await asyncio.sleep(1.05)  # past the first window (no estimate yet)
    t0 = time.monotonic()
    for i in range(20):  # back to back, far more often than the delay: each waits for its answer
        await b.infer(rows(i))
    assert time.monotonic() - t0 < 0.2 * 5  # each waiting out the delay: 4 s
    assert model.batches == [1] * 20

    async def client(first: int) -> None:
        for i in range(first, first + 3):
            await b.infer(rows(i))

    model.batches.clear()
    t0 = time.monotonic()
    await asyncio.gather(client(0), client(10))  # their arrivals overlap: the delay applies again
    assert time.monotonic() - t0 >= 0.2
    assert 2 in model.batches

    model.batches.clear()
    sent = []
    for i in range(12):  # open loop at 10/s: arrivals unrelated to the answers, the delay batches them
        sent.append(asyncio.ensure_future(b.infer(rows(i))))
        await asyncio.sleep(0.1)
    await asyncio.gather(*sent)
    assert len(model.batches) < 12
    b.close()


async def test_delay_zero_runs_at_once_and_batches_what_queued_while_busy() -> None:
    model = FakeModel()
    model.gate = threading.Event()
    b = await make(model, max_batch_size=64, max_queue_delay_seconds=0.0)
    first = asyncio.ensure_future(b.infer(rows(0)))
    await asyncio.to_thread(model.started.wait, 5)
    rest = [asyncio.ensure_future(b.infer(rows(i))) for i in range(1, 6)]
    await asyncio.sleep(0.05)
    assert model.batches == []  # the first batch is still executing
    model.gate.set()
    await asyncio.gather(first, *rest)
    assert model.batches == [1, 5]
    b.close()


async def test_priority_one_is_served_first() -> None:
    model = FakeModel()
    model.gate = threading.Event()
    b = await make(model, max_batch_size=1, max_queue_delay_seconds=0.0)
    first = asyncio.ensure_future(b.infer(rows(0)))
    await asyncio.to_thread(model.started.wait, 5)
    low = [asyncio.ensure_future(b.infer(rows(v), priority=2)) for v in (1, 2)]
    default = asyncio.ensure_future(b.infer(rows(3)))  # no priority = default level 2
    high = asyncio.ensure_future(b.infer(rows(9), priority=1))
    await asyncio.sleep(0.02)
    model.gate.set()
    await asyncio.gather(first, *low, default, high)
    assert model.firsts == [[0.0], [9.0], [1.0], [2.0], [3.0]]
    with pytest.raises(InputError, match="priority"):
        await b.infer(rows(1), priority=3)
    b.close()


async def test_timeout_is_enforced_while_queued() -> None:
    model = FakeModel()
    model.gate = threading.Event()
    b = await make(model, max_batch_size=1, max_queue_delay_seconds=0.0)
    first = asyncio.ensure_future(b.infer(rows(0)))
    await asyncio.to_thread(model.started.wait, 5)
    t0 = time.monotonic()
    with pytest.raises(ServingError) as info:
        await b.infer(rows(1), timeout_us=50_000)
    assert info.value.status == 504 and "timed out" in str(info.value)
    assert 0.04 <= time.monotonic() - t0 < 1.0  # while the executor is still blocked
    assert b.queued == 0
    no_limit = asyncio.ensure_future(b.infer(rows(2), timeout_us=0))  # 0 = no timeout (Triton)
    await asyncio.sleep(0.05)
    assert not no_limit.done()
    model.gate.set()
    await first
    await no_limit
    assert model.firsts == [[0.0], [2.0]]  # the expired request never ran
    b.close()


async def test_queue_bound_rejects_with_429_and_retry_after() -> None:
    model = FakeModel()
    model.gate = threading.Event()
    b = await make(model, max_batch_size=1, max_queue_delay_seconds=0.0, max_queue_size=2)
    first = asyncio.ensure_future(b.infer(rows(0)))
    await asyncio.to_thread(model.started.wait, 5)
    queued = [asyncio.ensure_future(b.infer(rows(i))) for i in (1, 2)]
    # the batcher may take one more full batch ahead (lookahead); fill until the queue holds 2
    await asyncio.sleep(0.02)
    extra = []
    while b.queued < 2:
        extra.append(asyncio.ensure_future(b.infer(rows(7))))
        await asyncio.sleep(0.01)
    with pytest.raises(ServingError) as info:
        await b.infer(rows(3))
    assert info.value.status == 429 and int(info.value.headers["Retry-After"]) >= 1
    model.gate.set()
    await asyncio.gather(first, *queued, *extra)
    b.close()


async def test_failing_request_is_isolated_by_bisection(caplog: pytest.LogCaptureFixture) -> None:
    model = FakeModel()
    b = await make(model, max_batch_size=8, max_queue_delay_seconds=0.05)
    reqs = [b.infer(rows(i, i)) for i in (1, 2, -1, 3)]
    reqs.append(b.infer(rows(-2)))
    reqs.extend(b.infer(rows(i)) for i in (4, 5))  # 8 rows: full
    with caplog.at_level("WARNING", logger="kubeinfer.runtime.executor"):
        results = await asyncio.gather(*reqs, return_exceptions=True)
    assert [r for r in caplog.records if "bisecting" in r.getMessage()]
    ok = [r for r in results if isinstance(r, dict)]
    assert len(ok) == 5
    assert isinstance(results[0], dict) and results[0]["y"].tolist() == [[2.0, 0.0], [2.0, 0.0]]
    bad = results[2]
    assert isinstance(bad, ServingError) and bad.status == 500 and "poisoned row" in str(bad)
    refused = results[4]
    assert isinstance(refused, InputError) and refused.status == 413
    b.close()


async def test_multi_row_requests_oversized_runs_alone_and_over_warmed_is_413() -> None:
    model = FakeModel(max_batch_size=16)
    b = await make(model, max_batch_size=4, max_queue_delay_seconds=0.01)
    big, _small = await asyncio.gather(b.infer(rows(*range(6))), b.infer(rows(1, 2)))
    assert big["y"][:, 0].tolist() == [2.0 * v for v in range(6)]
    assert sorted(model.batches) == [2, 6]
    with pytest.raises(InputError) as info:
        await b.infer(rows(*range(17)))
    assert info.value.status == 413
    b.close()


async def test_hot_reload_applies_without_dropping_requests() -> None:
    model = FakeModel(max_batch_size=8)
    model.gate = threading.Event()
    b = await make(model, max_batch_size=8, max_queue_delay_seconds=0.0)
    first = asyncio.ensure_future(b.infer(rows(0)))
    await asyncio.to_thread(model.started.wait, 5)
    queued = [asyncio.ensure_future(b.infer(rows(i))) for i in range(1, 6)]
    await asyncio.sleep(0.02)
    b.update_settings(BatchSettings(max_batch_size=2, max_queue_delay_seconds=0.0, max_queue_size=16))
    assert b.metrics is not None
    exposition = b.metrics.exposition().decode()
    assert 'kubeinfer_max_batch_size{model="fake"} 2.0' in exposition
    assert 'kubeinfer_max_queue_size{model="fake"} 16.0' in exposition
    with pytest.raises(ValueError, match="warmed maximum"):
        b.update_settings(BatchSettings(max_batch_size=9))
    assert b.settings.max_batch_size == 2
    model.gate.set()
    await asyncio.gather(first, *queued)
    assert model.batches[0] == 1 and max(model.batches[1:]) <= 2 and sum(model.batches) == 6
    b.close()


async def test_drain_finishes_queued_work_and_refuses_new() -> None:
    model = FakeModel(delay=0.01)
    b = await make(model, max_batch_size=4, max_queue_delay_seconds=10.0)
    pending = [asyncio.ensure_future(b.infer(rows(i))) for i in range(10)]
    await asyncio.sleep(0.01)
    t0 = time.monotonic()
    assert await b.drain(timeout=5.0)
    assert time.monotonic() - t0 < 2.0  # did not wait for the 10 s delay
    assert all(p.done() and not p.exception() for p in pending)
    with pytest.raises(ServingError) as info:
        await b.infer(rows(1))
    assert info.value.status == 503
    b.close()


async def test_preprocess_of_next_full_batch_overlaps_execution() -> None:
    model = FakeModel()
    model.gate = threading.Event()
    b = await make(model, max_batch_size=2, max_queue_delay_seconds=5.0)
    first = [asyncio.ensure_future(b.infer(rows(i))) for i in (0, 1)]
    await asyncio.to_thread(model.started.wait, 5)
    second = [asyncio.ensure_future(b.infer(rows(i))) for i in (2, 3)]
    for _ in range(100):
        await asyncio.sleep(0.01)
        if model.prepared == 2:
            break
    assert model.prepared == 2 and model.batches == []  # prepared while the first still runs
    model.gate.set()
    await asyncio.gather(*first, *second)
    assert model.batches == [2, 2]
    b.close()


async def test_requests_of_different_batch_keys_never_share_a_batch() -> None:
    model = KeyedFakeModel()
    model.gate = threading.Event()
    b = Batcher(
        model,
        BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.0),
        metrics=RuntimeMetrics(model.name),
    )
    b.start()
    first = asyncio.ensure_future(b.infer(keyed(1.0, 0)))
    await asyncio.to_thread(model.started.wait, 5)
    # queued while the executor is busy, keys interleaved: a1 b1 a2 b2 ...
    rest = [asyncio.ensure_future(b.infer(keyed(float(k), 10 * k + i))) for i in range(4) for k in (1, 2)]
    await asyncio.sleep(0.02)
    model.gate.set()
    outs = await asyncio.gather(first, *rest)
    assert model.mixed == 0  # no batch mixed keys, so none went through the isolation path
    assert model.batches == [1, 4, 4]
    assert model.firsts[1:] == [[10, 11, 12, 13], [20, 21, 22, 23]]  # each key in arrival order
    for req, out in zip(rest, outs[1:], strict=True):
        assert out["n"].tolist() == [4]
        assert req.done()
    b.close()


async def test_other_key_waits_for_the_next_batch_not_forever() -> None:
    model = KeyedFakeModel()
    b = Batcher(
        model,
        BatchSettings(max_batch_size=64, max_queue_delay_seconds=0.05),
        metrics=RuntimeMetrics(model.name),
    )
    b.start()
    t0 = time.monotonic()
    outs = await asyncio.gather(b.infer(keyed(1.0, 1)), b.infer(keyed(2.0, 2)), b.infer(keyed(1.0, 3)))
    waited = time.monotonic() - t0
    assert model.mixed == 0
    assert sorted(model.batches) == [1, 2]
    assert [o["y"][0, 0] for o in outs] == [2.0, 4.0, 6.0]
    assert waited < 1.0  # the second key ran right after the first batch, on its own delay
    b.close()


async def test_two_executors_run_two_batches_at_once() -> None:
    model = FakeModel()
    model.gate = threading.Event()
    b = Batcher(
        model,
        BatchSettings(max_batch_size=2, max_queue_delay_seconds=0.0),
        executors=2,
        metrics=RuntimeMetrics(model.name),
    )
    b.start()
    reqs = [asyncio.ensure_future(b.infer(rows(i))) for i in range(4)]
    for _ in range(200):  # both executors blocked inside execute at the same time
        await asyncio.sleep(0.005)
        if b.executor.saturated:
            break
    assert b.executor.saturated and model.batches == []
    model.gate.set()
    await asyncio.gather(*reqs)
    assert sum(model.batches) == 4
    b.close()


async def test_cancelled_client_leaves_the_queue() -> None:
    model = FakeModel()
    b = await make(model, max_batch_size=4, max_queue_delay_seconds=10.0)
    task = asyncio.ensure_future(b.infer(rows(1)))
    await asyncio.sleep(0.01)
    assert b.queued == 1
    task.cancel()
    await asyncio.sleep(0.01)
    assert b.queued == 0
    b.close()


async def test_metrics_record_batches_and_busy_time() -> None:
    model = FakeModel(delay=0.02)
    b = await make(model, max_batch_size=4, max_queue_delay_seconds=0.0)
    await asyncio.gather(*(b.infer(rows(i)) for i in range(4)))
    assert b.metrics is not None
    text = b.metrics.exposition().decode()
    assert 'kubeinfer_batch_size_count{model="fake"}' in text
    assert 'kubeinfer_queue_duration_seconds_count{model="fake"} 4.0' in text
    assert b.metrics.busy.ratio() > 0
    b.close()


async def test_idle_executor_preprocesses_and_executes_in_one_hand_off() -> None:
    class Recording(FakeModel):
        def __init__(self) -> None:
            super().__init__()
            self.threads: list[tuple[str, str]] = []

        def preprocess(self, batch):  # type: ignore[no-untyped-def]
            self.threads.append(("preprocess", threading.current_thread().name))
            return super().preprocess(batch)

        def execute(self, prepared):  # type: ignore[no-untyped-def]
            self.threads.append(("execute", threading.current_thread().name))
            return super().execute(prepared)

    model = Recording()
    b = await make(model, max_batch_size=4, max_queue_delay_seconds=0.0)
    out = await b.infer(rows(1))
    np.testing.assert_array_equal(out["y"], [[2.0, 0.0]])
    # both stages ran on the same executor thread: no round trip through the event loop between them
    (_, prep_thread), (_, exec_thread) = model.threads
    assert prep_thread == exec_thread and prep_thread.startswith("kubeinfer-exec")
    b.close()


async def test_torchscript_requests_of_different_widths_batch_apart_without_isolation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import torch
    from kubeinfer.runtime.config import RuntimeConfig
    from kubeinfer.runtime.models import load_model

    class RowSum(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.sum(dim=-1)

    path = tmp_path / "rowsum.pt"
    torch.jit.save(torch.jit.script(RowSum().eval()), str(path))
    cfg = RuntimeConfig.model_validate(
        {
            "model": {
                "name": "rowsum",
                "source": str(path),
                "format": "torchscript",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1]}],
                "outputs": [{"name": "s", "datatype": "FP32", "shape": [-1]}],
            },
            "device": "cpu",
        }
    )
    model = load_model(cfg)
    b = Batcher(
        model,
        BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.05),
        metrics=RuntimeMetrics(model.name),
    )
    b.start()
    widths = [3, 5, 3, 5, 3, 5]
    with caplog.at_level("WARNING", logger="kubeinfer.runtime.executor"):
        outs = await asyncio.gather(*(b.infer({"x": np.ones((1, w), dtype=np.float32)}) for w in widths))
    assert [float(o["s"][0]) for o in outs] == [float(w) for w in widths]
    assert not [r for r in caplog.records if "bisecting" in r.getMessage()]  # no failed mixed batch
    b.close()


class SlowPreprocessModel(FakeModel):
    """A ``FakeModel`` whose preprocessing takes ``PREP_SECONDS``."""

    PREP_SECONDS = 0.2

    def preprocess(self, batch: Any) -> Any:
        time.sleep(self.PREP_SECONDS)
        return super().preprocess(batch)


async def test_a_batch_preprocessed_ahead_counts_its_preprocessing_once_not_as_queue_time() -> None:
    model = SlowPreprocessModel()
    model.gate = threading.Event()
    b = await make(model, max_batch_size=1, max_queue_delay_seconds=0.0)
    first = asyncio.ensure_future(b.infer(rows(0)))  # runs at once, then holds the executor
    await asyncio.to_thread(model.started.wait, 5)
    second = asyncio.ensure_future(b.infer(rows(1)))  # full: taken ahead, preprocessed while waiting
    await asyncio.sleep(0.5)
    model.gate.set()
    await asyncio.gather(first, second)
    assert b.metrics is not None
    text = b.metrics.exposition().decode()

    def sample(name: str) -> float:
        (line,) = [x for x in text.splitlines() if x.startswith(name + "{")]
        return float(line.rsplit(" ", 1)[1])

    # the second waited about 0.5 s before it ran, 0.2 s of it preprocessing: 0.3 s of queue
    queued = sample("kubeinfer_queue_duration_seconds_sum")
    assert 0.2 <= queued <= 0.45, queued
    # Triton's statistics agree: queue 0.3 s in all, compute input both preprocessings (0.4 s)
    stats = b.metrics.statistics.doc("fake", "1")["inference_stats"]
    assert 0.2e9 <= stats["queue"]["ns"] <= 0.45e9, stats["queue"]
    assert 0.4e9 <= stats["compute_input"]["ns"] <= 0.6e9, stats["compute_input"]
    b.close()
