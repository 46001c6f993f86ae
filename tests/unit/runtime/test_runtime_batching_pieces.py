"""A request of more rows than one batch (an OpenAI request of many texts) is queued as pieces admitted
all together or not at all (``Batcher.infer_pieces``: 429 for all of them, or 413 when no queue could
hold them), a failed or cancelled one leaves no piece queued, and its queue time counts once; the size
cap of one OpenAI request (``openai_api.check_size``)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from kubeinfer.runtime.batching import Batcher, BatchSettings, join_rows, split_rows
from kubeinfer.runtime.config import LimitsConfig
from kubeinfer.runtime.errors import InputError, ServingError
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.openai_api import MAX_INPUTS, OpenAIError, check_size, max_rows

from tests.unit.runtime.runtime_fakes import FakeEmbedder
from tests.unit.runtime.test_runtime_batching_shed import shed, wait_for

pytestmark = pytest.mark.timeout(60)


def texts(*values: str) -> dict[str, np.ndarray]:
    return {"text": np.array([v.encode() for v in values], dtype=object)}


# --- pure parts ------------------------------------------------------------------------------------------


def test_split_rows_cuts_every_input_alike_and_join_rows_puts_them_back_in_order() -> None:
    inputs = {"a": np.arange(10), "b": np.arange(20).reshape(10, 2)}
    pieces = split_rows(inputs, 4)
    assert [len(p["a"]) for p in pieces] == [4, 4, 2] and [len(p["b"]) for p in pieces] == [4, 4, 2]
    joined = join_rows(pieces)
    np.testing.assert_array_equal(joined["a"], inputs["a"])
    np.testing.assert_array_equal(joined["b"], inputs["b"])
    assert len(split_rows(inputs, 10)) == 1 and len(split_rows(inputs, 64)) == 1


def test_the_rows_cap_is_openais_or_the_servers_element_limit_whichever_is_smaller() -> None:
    assert max_rows(LimitsConfig()) == MAX_INPUTS == 2048
    assert max_rows(LimitsConfig(max_request_elements=1000)) == 1000
    assert max_rows(LimitsConfig(max_request_elements=1000), columns=2) == 500
    check_size("input", 2048, 1, 100, LimitsConfig())  # at the cap: fine
    with pytest.raises(OpenAIError) as over:
        check_size("input", 100_000, 1, 100, LimitsConfig())
    assert (over.value.status, over.value.param) == (413, "input")
    assert "'input' has 100000 items, over the limit of 2048" in over.value.message
    with pytest.raises(OpenAIError) as docs:
        check_size("documents", 600, 2, 100, LimitsConfig(max_request_elements=1000))
    assert (docs.value.status, docs.value.param) == (
        413,
        "documents",
    ) and "limit of 500" in docs.value.message
    with pytest.raises(OpenAIError) as heavy:
        check_size("input", 10, 1, 2_000, LimitsConfig(max_request_bytes=1_000))
    assert (heavy.value.status, heavy.value.param) == (413, "input") and "2000 bytes" in heavy.value.message


# --- the batcher: all pieces or none ---------------------------------------------------------------------


async def blocked(model: FakeEmbedder, **settings: object) -> tuple[Batcher, list[asyncio.Future[object]]]:
    """A batcher (max_batch_size 1) whose one executor is blocked in ``execute`` with one batch and one
    more taken ahead: whatever is submitted next stays queued until ``model.gate`` is set."""
    model.gate = threading.Event()
    b = Batcher(
        model,
        BatchSettings(max_batch_size=1, max_queue_delay_seconds=0.0, **settings),  # type: ignore[arg-type]
        metrics=RuntimeMetrics(model.name),
    )
    b.start()
    running = [asyncio.ensure_future(b.infer(texts("100")))]
    await asyncio.to_thread(model.started.wait, 5)
    running.append(asyncio.ensure_future(b.infer(texts("101"))))  # taken ahead: the look-ahead slot
    await wait_for(lambda: b._in_flight == 2 and b.queued == 0)
    return b, running


async def test_pieces_that_do_not_all_fit_are_refused_together_and_nothing_is_queued() -> None:
    model = FakeEmbedder()
    b, running = await blocked(model, max_queue_size=4)
    others = [asyncio.ensure_future(b.infer(texts(f"q{i}"))) for i in range(2)]
    await wait_for(lambda: b.queued == 2)
    with pytest.raises(ServingError) as info:  # 3 pieces of 1 row, 2 places left
        await b.infer_pieces(texts("a", "b", "c"))
    assert info.value.status == 429 and "needs 3 places" in info.value.message
    assert b.queued == 2 and shed(b, 2, "refused") == 1.0  # one refusal, nothing queued
    fits = asyncio.ensure_future(b.infer_pieces(texts("dd", "e")))  # 2 pieces, 2 places: both queued
    await wait_for(lambda: b.queued == 4)
    assert model.gate is not None
    model.gate.set()
    out = await fits
    np.testing.assert_array_equal(out["embedding"][:, 0], [2.0, 1.0])  # the rows in input order
    await asyncio.gather(*running, *others)
    computed = [t for batch in model.texts for t in batch]
    assert not {b"a", b"b", b"c"} & set(computed)  # the refused request computed nothing
    b.close()


async def test_a_group_displaces_lower_levels_only_when_that_makes_room_for_all_of_it() -> None:
    model = FakeEmbedder()
    b, running = await blocked(model, max_queue_size=3, priority_levels=3, default_priority_level=3)
    low = [asyncio.ensure_future(b.infer(texts(f"low{i}"), priority=3)) for i in range(2)]
    mid = asyncio.ensure_future(b.infer(texts("mid"), priority=2))
    await wait_for(lambda: b.queued == 3)
    with pytest.raises(ServingError) as refused:  # 3 places needed, 2 lower-priority requests to take
        await b.infer_pieces(texts("a", "b", "c"), priority=2)
    assert refused.value.status == 429 and not any(f.done() for f in low)  # nothing displaced
    high = asyncio.ensure_future(b.infer_pieces(texts("x", "y"), priority=1))
    await wait_for(lambda: all(f.done() for f in low))
    for f in low:
        with pytest.raises(ServingError, match="displaced by a request of priority 1"):
            await f
    assert shed(b, 3, "displaced") == 2.0 and b.queued == 3
    assert model.gate is not None
    model.gate.set()
    await asyncio.gather(*running, mid, high)
    b.close()


async def test_more_pieces_than_the_queue_holds_is_a_413_naming_the_input() -> None:
    b = Batcher(
        FakeEmbedder(), BatchSettings(max_batch_size=2, max_queue_size=3), metrics=RuntimeMetrics("fake")
    )
    b.start()
    with pytest.raises(InputError) as info:
        await b.infer_pieces(texts(*"abcdefg"))  # 4 pieces of 2 rows
    assert (
        info.value.status == 413 and info.value.tensor == "text" and "max_queue_size 3" in info.value.message
    )
    assert b.queued == 0
    b.close()


async def test_a_failed_or_cancelled_request_takes_its_queued_pieces_out_of_the_queue() -> None:
    model = FakeEmbedder()
    b, running = await blocked(model, max_queue_size=8)
    waiting = asyncio.ensure_future(b.infer_pieces(texts("a", "b", "c")))
    await wait_for(lambda: b.queued == 3)
    waiting.cancel()
    await wait_for(lambda: b.queued == 0)
    expiring = asyncio.ensure_future(b.infer_pieces(texts("d", "e"), timeout_us=20_000))
    with pytest.raises(ServingError) as info:
        await expiring
    assert info.value.status == 504 and b.queued == 0
    assert model.gate is not None
    model.gate.set()
    await asyncio.gather(*running)
    assert [t for batch in model.texts for t in batch] == [b"100", b"101"]  # nothing of theirs ran
    b.close()


async def test_the_queue_time_of_a_request_in_pieces_counts_once() -> None:
    model = FakeEmbedder()
    metrics = RuntimeMetrics("fake")
    b = Batcher(model, BatchSettings(max_batch_size=2, max_queue_delay_seconds=0.0), metrics=metrics)
    b.start()
    out = await b.infer_pieces(texts("a", "bb", "ccc", "dddd", "e"))  # 3 pieces
    np.testing.assert_array_equal(out["embedding"][:, 0], [1, 2, 3, 4, 1])
    assert metrics.registry.get_sample_value("kubeinfer_queue_duration_seconds_count", {"model": "fake"}) == 1
    b.close()


async def test_more_pieces_than_the_level_holds_is_a_413_too() -> None:
    settings = BatchSettings(
        max_batch_size=2, priority_levels=2, default_priority_level=2, priority_queue_sizes={2: 2}
    )
    b = Batcher(FakeEmbedder(), settings, metrics=RuntimeMetrics("fake"))
    b.start()
    with pytest.raises(InputError) as info:
        await b.infer_pieces(texts(*"abcde"))  # 3 pieces, the default level holds 2
    assert info.value.status == 413 and "priority_queue_sizes[2] 2" in info.value.message
    out = await b.infer_pieces(texts(*"abcde"), priority=1)  # level 1 has no limit of its own
    assert len(out["embedding"]) == 5
    b.close()


async def test_a_request_in_pieces_displaced_counts_once_and_leaves_no_piece_queued() -> None:
    model = FakeEmbedder()
    b, running = await blocked(model, max_queue_size=3, priority_levels=3, default_priority_level=3)
    low = asyncio.ensure_future(b.infer_pieces(texts("a", "b", "c"), priority=3))
    await wait_for(lambda: b.queued == 3)
    high = asyncio.ensure_future(b.infer_pieces(texts("x", "y"), priority=1))  # displaces 2 pieces
    with pytest.raises(ServingError, match="displaced by a request of priority 1"):
        await low
    assert shed(b, 3, "displaced") == 1.0 and b.queued == 2  # only the high one's pieces are left
    assert model.gate is not None
    model.gate.set()
    await asyncio.gather(*running, high)
    assert not {b"a", b"b", b"c"} & {t for batch in model.texts for t in batch}
    b.close()
