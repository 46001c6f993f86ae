"""A request run as windows (``overflow: chunk``) queues one part at a time, each below the whole requests
of its priority level (aged so that it still runs), so a short request never waits behind a window that
has not started: the pure packing and ordering, the batcher with a fake model whose "long" requests run
as windows (order of batches, aging, failure, cancellation, timeout, shedding, drain), and a tiny real
embedder whose windowed answer equals the whole request's."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from kubeinfer.runtime.batching import (
    WINDOW_PART_MAX_PASSES,
    Batcher,
    BatchSettings,
    ServingError,
    parts_first,
)
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models import load_model
from kubeinfer.runtime.models.base import WindowParts, pack_windows
from kubeinfer.runtime.models.huggingface import TextEmbeddingModel

from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir
from tests.unit.runtime.runtime_fakes import FakeModel, keyed, rows, texts

pytestmark = pytest.mark.timeout(60)


# ----- the pure packing ----------------------------------------------------------------------------
def test_windows_pack_into_parts_of_one_windows_padded_tokens() -> None:
    # 256-token windows each fill a part; short ones share one while their padded cost fits
    assert pack_windows([256, 256, 100], 256, 8) == [range(0, 1), range(1, 2), range(2, 3)]
    assert pack_windows([20, 30, 40, 250, 10], 256, 8) == [range(0, 3), range(3, 4), range(4, 5)]
    assert pack_windows([10] * 5, 256, 2) == [range(0, 2), range(2, 4), range(4, 5)]  # rows bound
    assert pack_windows([300, 5], 256, 8) == [range(0, 1), range(1, 2)]  # one over alone: its own part
    assert pack_windows([], 256, 8) == []


# ----- the batcher, a fake model --------------------------------------------------------------------
class WindowedFake(FakeModel):
    """A ``FakeModel`` whose request of one row with first value v >= 100 runs as v // 100 windows, each a
    part of one row (first values v, v + 1, ...; second value 0; the third -1 when the request's second
    value is -1: that window's execute raises); merged, it answers ``y`` = the sum of the windows' ``y``.
    Its batch key is the second value (``keyed``)."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(delay=delay, name="fake")
        self.merged = 0

    def batch_key(self, inputs: Mapping[str, np.ndarray]) -> Any:
        return float(inputs["x"][0, 1])

    def window_parts(
        self, inputs: Mapping[str, np.ndarray], max_rows: int, overflow: str | None = None
    ) -> WindowParts | None:
        first, second = (float(v) for v in inputs["x"][0])
        if first < 100:
            return None
        values = [first + k for k in range(int(first // 100))]
        if second == -1:
            values[2] = -1.0
        parts = [rows(v) for v in values]

        def merge(outputs: Any) -> dict[str, np.ndarray]:
            self.merged += 1
            total = sum(float(out["y"][0, 0]) for out in outputs)
            return {"y": np.array([[total, 0.0]], dtype=np.float32), "n": np.array([len(outputs)])}

        return WindowParts(parts=parts, rows=[1] * len(parts), tokens=[1] * len(parts), merge=merge)


def batcher_of(model: FakeModel, **settings: Any) -> Batcher:
    args: dict[str, Any] = {"max_batch_size": 8, "max_queue_delay_seconds": 0.001}
    args.update(settings)
    batcher = Batcher(model, BatchSettings(**args), metrics=RuntimeMetrics("fake"))
    batcher.start()
    return batcher


async def started(event: threading.Event) -> None:
    for _ in range(400):
        if event.is_set():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the model never started")


def batch_of(model: FakeModel, value: float) -> int:
    """The position of the batch that ran the row of first value ``value``."""
    return next(i for i, firsts in enumerate(model.firsts) if value in firsts)


async def test_a_short_request_waits_for_one_part_not_the_whole_chunked_request() -> None:
    model = WindowedFake(delay=0.02)
    batcher = batcher_of(model)
    try:
        long = asyncio.ensure_future(batcher.infer(rows(600)))  # 6 windows, one batch each
        await started(model.started)  # its first window runs
        short = await batcher.infer(rows(1))
        out = await long
    finally:
        await batcher.drain(5)
    assert short["y"][0, 0] == 2.0
    assert out["y"][0, 0] == 2 * sum(600 + k for k in range(6)) and model.merged == 1
    # the short request ran in the batch right after the first window's (the second window queued
    # behind it), not after all six windows
    assert batch_of(model, 1.0) == 1, model.firsts
    assert batch_of(model, 605.0) > batch_of(model, 1.0)


async def test_short_requests_arriving_meanwhile_go_before_the_next_window() -> None:
    model = WindowedFake()
    model.gate = threading.Event()
    batcher = batcher_of(model, max_batch_size=2)
    try:
        long = asyncio.ensure_future(batcher.infer(rows(300)))
        await started(model.started)
        shorts = [asyncio.ensure_future(batcher.infer(rows(v))) for v in (1, 2, 3)]
        await asyncio.sleep(0.02)
        model.gate.set()
        await asyncio.gather(long, *shorts)
    finally:
        await batcher.drain(5)
    # window 300 alone, then the three shorts (2 rows a batch) before the window queued after them;
    # a window never shares a batch with a whole request (it would pad its rows to a window)
    assert model.firsts == [[300.0], [1.0, 2.0], [3.0], [301.0], [302.0]], model.firsts


async def test_a_failed_window_fails_its_request_alone_and_no_later_window_runs() -> None:
    model = WindowedFake()
    batcher = batcher_of(model)
    try:
        poisoned = {"x": np.array([[500.0, -1.0]], dtype=np.float32)}  # its third window raises
        long = asyncio.ensure_future(batcher.infer(poisoned))
        short = asyncio.ensure_future(batcher.infer(rows(1)))
        with pytest.raises(ServingError) as err:
            await long
        assert (await short)["y"][0, 0] == 2.0
    finally:
        await batcher.drain(5)
    assert err.value.status == 500 and "poisoned row" in str(err.value)
    ran = [v for firsts in model.firsts for v in firsts]
    assert 500.0 in ran and 501.0 in ran and 503.0 not in ran and 504.0 not in ran
    assert model.merged == 0


async def test_a_client_that_leaves_drops_the_windows_still_to_run() -> None:
    model = WindowedFake()
    model.gate = threading.Event()
    batcher = batcher_of(model)
    try:
        long = asyncio.ensure_future(batcher.infer(rows(400)))
        await started(model.started)
        long.cancel()
        model.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await long
        assert await batcher.drain(5)
    finally:
        batcher.close()
    assert model.firsts == [[400.0]] and batcher.queued == 0


async def test_the_timeout_holds_until_the_first_window_starts() -> None:
    model = WindowedFake()
    model.gate = threading.Event()
    batcher = batcher_of(model)
    try:
        blocker = asyncio.ensure_future(batcher.infer(rows(1)))
        await started(model.started)
        long = asyncio.ensure_future(batcher.infer(rows(300), timeout_us=20_000))
        with pytest.raises(ServingError) as err:
            await long
        assert err.value.status == 504
        model.gate.set()
        await blocker
        # once its first window started, later windows wait without a timeout: the third is queued
        # 40 ms after the request, past its 30 ms
        model.delay = 0.02
        out = await batcher.infer(rows(300), timeout_us=30_000)
    finally:
        await batcher.drain(5)
    assert out["y"][0, 0] == 2 * (300 + 301 + 302)
    assert 300.0 in model.firsts[-3]


async def test_priority_holds_for_every_window() -> None:
    model = WindowedFake()
    model.gate = threading.Event()
    batcher = batcher_of(model, priority_min_share=0.0)
    try:
        blocker = asyncio.ensure_future(batcher.infer(keyed(1, 1), priority=2))
        await started(model.started)
        low = asyncio.ensure_future(batcher.infer(keyed(1, 2, 3), priority=2))
        high = asyncio.ensure_future(batcher.infer(rows(300), priority=1))  # windows of key 0
        await asyncio.sleep(0.02)
        model.gate.set()
        await asyncio.gather(blocker, high, low)
    finally:
        await batcher.drain(5)
    # each later window of the high-priority request goes before the lower level's request
    assert model.firsts == [[1.0], [300.0], [301.0], [302.0], [2.0, 3.0]], model.firsts


async def test_a_levels_windows_do_not_join_a_higher_levels_while_its_short_requests_wait() -> None:
    model = WindowedFake()
    model.gate = threading.Event()
    batcher = batcher_of(model, priority_min_share=0.0)
    try:
        blocker = asyncio.ensure_future(batcher.infer(rows(7), priority=2))
        await started(model.started)
        low_long = asyncio.ensure_future(batcher.infer(rows(400), priority=2))
        short = asyncio.ensure_future(batcher.infer(rows(1), priority=2))
        high_long = asyncio.ensure_future(batcher.infer(rows(300), priority=1))
        await asyncio.sleep(0.02)
        model.gate.set()
        await asyncio.gather(blocker, low_long, short, high_long)
    finally:
        await batcher.drain(5)
    # 400 would fit the batches of 300's windows, but the short request of its level goes first
    assert model.firsts == [[7.0], [300.0], [301.0], [302.0], [1.0], [400.0], [401.0], [402.0], [403.0]], (
        model.firsts
    )


async def test_drain_waits_for_a_chunked_requests_last_window() -> None:
    model = WindowedFake(delay=0.01)
    batcher = batcher_of(model)
    long = asyncio.ensure_future(batcher.infer(rows(500)))
    await started(model.started)
    assert await batcher.drain(5)
    assert long.done() and long.result()["y"][0, 0] == 2 * sum(500 + k for k in range(5))
    batcher.close()


# ----- a tiny real embedder ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> TextEmbeddingModel:
    path = tiny_hf_dir(tmp_path_factory.mktemp("windows") / "embedder")
    model = load_model(
        tiny_hf_config(
            path,
            model={"name": "tiny", "source": str(path), "max_sequence_length": 64, "overflow": "chunk"},
            limits={"max_text_tokens": 4096},
        )
    )
    assert isinstance(model, TextEmbeddingModel)
    model.warmup(8, 1)
    return model


def test_an_embedder_splits_a_long_text_into_parts_of_one_window(embedder: TextEmbeddingModel) -> None:
    long = "word " * 500  # 500 tokens: 9 windows of the 64-token window
    parts = embedder.window_parts({"text": texts("a b", long, "c d e")}, max_rows=8)
    assert parts is not None
    assert sum(parts.rows) == 11 and len(parts.parts) == len(parts.rows)
    assert all(rows * tokens <= 64 for rows, tokens in zip(parts.rows, parts.tokens, strict=True))
    assert embedder.window_parts({"text": texts("a b", "c d e")}, max_rows=8) is None  # all fit


async def test_a_windowed_answer_equals_the_whole_requests(embedder: TextEmbeddingModel) -> None:
    long = "word " * 300 + "end " * 200
    inputs = {"text": texts("a short one", long, "another short sentence")}
    whole = embedder.execute(embedder.preprocess([inputs]))  # pooled in one batch
    batcher = Batcher(embedder, BatchSettings(max_batch_size=8), metrics=RuntimeMetrics("tiny"))
    batcher.start()
    try:
        out, short, pieces = await asyncio.gather(
            batcher.infer(inputs),
            batcher.infer({"text": texts("a short one")}),
            batcher.infer_pieces({"text": texts(*(["x y"] * 10), long)}),
        )
    finally:
        await batcher.drain(5)
    np.testing.assert_allclose(out["embedding"], whole["embedding"], atol=1e-6)
    np.testing.assert_array_equal(out["token_count"], whole["token_count"])
    np.testing.assert_allclose(short["embedding"][0], whole["embedding"][0], atol=1e-6)
    assert pieces["embedding"].shape == (11, embedder.dim)
    np.testing.assert_allclose(pieces["embedding"][10], whole["embedding"][1], atol=1e-6)


def test_a_levels_parts_go_first_when_none_of_its_whole_requests_waits_or_once_passed_over() -> None:
    assert parts_first(whole_queued=False, passed=0)
    assert not parts_first(whole_queued=True, passed=0)
    assert not parts_first(whole_queued=True, passed=WINDOW_PART_MAX_PASSES - 1)
    assert parts_first(whole_queued=True, passed=WINDOW_PART_MAX_PASSES)
    assert parts_first(whole_queued=True, passed=2, max_passes=2)


async def test_at_overload_short_requests_go_before_the_windows_still_to_run() -> None:
    model = WindowedFake()
    model.gate = threading.Event()
    batcher = batcher_of(model, max_batch_size=2)
    try:
        long = asyncio.ensure_future(batcher.infer(rows(300)))
        await started(model.started)
        shorts = [asyncio.ensure_future(batcher.infer(rows(v))) for v in (1, 2, 3, 4, 5, 6)]
        await asyncio.sleep(0.02)
        model.gate.set()
        await asyncio.gather(long, *shorts)
    finally:
        await batcher.drain(5)
    # [1, 2] was taken ahead while 300 ran; 301 then waits below every short batch queued, not
    # between them
    assert model.firsts == [[300.0], [1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [301.0], [302.0]], model.firsts


async def test_a_window_queued_first_is_not_taken_ahead_of_a_short_request() -> None:
    model = WindowedFake()
    model.gate = threading.Event()
    batcher = batcher_of(model, max_batch_size=1)  # every batch is full: a candidate to take ahead
    try:
        blocker = asyncio.ensure_future(batcher.infer(rows(7)))
        await started(model.started)
        long = asyncio.ensure_future(batcher.infer(rows(300)))  # its first window queues, not taken
        await asyncio.sleep(0.02)
        short = asyncio.ensure_future(batcher.infer(rows(1)))
        await asyncio.sleep(0.02)
        model.gate.set()
        await asyncio.gather(blocker, long, short)
    finally:
        await batcher.drain(5)
    assert model.firsts == [[7.0], [1.0], [300.0], [301.0], [302.0]], model.firsts


async def test_windows_passed_over_run_under_a_continuous_load_of_short_requests() -> None:
    model = WindowedFake()
    model.gate = threading.Event()
    batcher = batcher_of(model, max_batch_size=1)
    try:
        blocker = asyncio.ensure_future(batcher.infer(rows(7)))
        await started(model.started)
        long = asyncio.ensure_future(batcher.infer(rows(300)))
        await asyncio.sleep(0.01)
        # a backlog of short requests larger than the chunked request's whole run: one always waits
        shorts = [asyncio.ensure_future(batcher.infer(rows(v))) for v in range(1, 31)]
        await asyncio.sleep(0.02)
        model.gate.set()
        await asyncio.gather(blocker, long, *shorts)
    finally:
        await batcher.drain(5)
    ran = [firsts[0] for firsts in model.firsts]
    windows = [ran.index(v) for v in (300.0, 301.0, 302.0)]
    # each window runs after WINDOW_PART_MAX_PASSES short batches at most (one more, taken ahead while
    # the window before it ran, when it queues), and the long request ends while shorts still wait
    gaps = [windows[0] - 1] + [b - a - 1 for a, b in itertools.pairwise(windows)]
    assert all(gap <= WINDOW_PART_MAX_PASSES + 1 for gap in gaps), ran
    assert windows[-1] < ran.index(30.0), ran
    assert sorted(ran) == sorted([7.0, 300.0, 301.0, 302.0, *range(1, 31)])


async def test_a_full_queue_displaces_a_whole_request_before_a_window() -> None:
    model = WindowedFake()
    model.gate = threading.Event()
    batcher = batcher_of(model, max_batch_size=1, max_queue_size=2)
    try:
        blocker = asyncio.ensure_future(batcher.infer(rows(7), priority=2))
        await started(model.started)
        ahead = asyncio.ensure_future(batcher.infer(rows(8), priority=2))  # taken ahead
        await asyncio.sleep(0.02)
        short = asyncio.ensure_future(batcher.infer(rows(1), priority=2))
        long = asyncio.ensure_future(batcher.infer(rows(300), priority=2))  # the newest queued
        await asyncio.sleep(0.02)
        high = asyncio.ensure_future(batcher.infer(rows(2), priority=1))
        with pytest.raises(ServingError) as err:
            await short
        model.gate.set()
        await asyncio.gather(blocker, ahead, long, high)
    finally:
        await batcher.drain(5)
    assert err.value.status == 429
    assert [firsts[0] for firsts in model.firsts] == [7.0, 8.0, 2.0, 300.0, 301.0, 302.0], model.firsts


async def test_a_close_between_two_windows_answers_503_not_never() -> None:
    model = WindowedFake()
    model.gate = threading.Event()
    batcher = batcher_of(model)
    long = asyncio.ensure_future(batcher.infer(rows(300)))
    await started(model.started)
    batcher.close()  # while its first window runs: no dispatcher will take the next
    model.gate.set()
    with pytest.raises(ServingError) as err:
        await asyncio.wait_for(long, 5)
    assert err.value.status == 503 and model.firsts == [[300.0]]


async def test_an_arrival_displaces_one_request_when_a_later_window_filled_the_queue_past_its_size() -> None:
    # a later window queues without admission (its request holds its place from its first window on),
    # so the queue may hold more than max_queue_size; a high-priority arrival still displaces one
    # request for its one place, not every request down to the size
    model = WindowedFake()
    model.gate = threading.Event()
    batcher = batcher_of(model, max_batch_size=8, max_queue_size=2)
    try:
        long = asyncio.ensure_future(batcher.infer(rows(300), priority=2))
        await started(model.started)  # its first window runs
        batcher.update_settings(BatchSettings(max_batch_size=8, max_queue_delay_seconds=10, max_queue_size=2))
        first = asyncio.ensure_future(batcher.infer(rows(1), priority=2))  # not full, not due: wait
        second = asyncio.ensure_future(batcher.infer(rows(2), priority=2))
        await asyncio.sleep(0.02)
        model.gate.set()  # the first window ends; the second queues: three queued
        for _ in range(200):
            if batcher.queued == 3:
                break
            await asyncio.sleep(0.005)
        assert batcher.queued == 3
        high = asyncio.ensure_future(batcher.infer(rows(3), priority=1))
        with pytest.raises(ServingError) as err:
            await second
        await asyncio.sleep(0.02)
        assert not first.done()  # kept: the arrival needed one place
    finally:
        await batcher.drain(5)
    await asyncio.gather(long, first, high)
    assert err.value.status == 429
