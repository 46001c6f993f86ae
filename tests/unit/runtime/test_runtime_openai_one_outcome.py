"""One OpenAI request, one outcome, in one process and through a front end (``RemotePlane`` over real
ZeroMQ): over the size of one request it is a 413 naming ``input`` before anything is queued; its
texts are admitted together (a queue without room for all of them: one 429, nothing computed); it
counts once in the request counter and the latency histogram, with its final status."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from kubeinfer.runtime.batching import BatchSettings
from kubeinfer.runtime.config import RuntimeConfig

from tests.unit.runtime.runtime_fakes import FakeEmbedder
from tests.unit.runtime.test_runtime_transports import Transports, open_transports, until

pytestmark = pytest.mark.timeout(60)


# --- through the data plane, in one process and through a front end --------------------------------------


@pytest.fixture
async def embedder(tmp_path: Path) -> AsyncIterator[tuple[Transports, FakeEmbedder]]:
    batching = {"max_batch_size": 4, "max_queue_size": 8}  # as the model process and the front ends read it
    cfg = RuntimeConfig.model_validate({"model": {"name": "fake"}, "batching": batching})
    async with open_transports(tmp_path, cfg) as t:
        model = FakeEmbedder(max_batch_size=4)
        t.plane.attach(
            model, BatchSettings(max_batch_size=4, max_queue_delay_seconds=0.001, max_queue_size=8)
        )
        yield t, model


def counted(t: Transports) -> Callable[[], dict[int, float]]:
    def now() -> dict[int, float]:
        return {status: t.count(status) for status in (200, 413, 429)}

    return now


async def test_an_openai_request_counts_once_with_its_final_status(
    embedder: tuple[Transports, FakeEmbedder],
) -> None:
    t, model = embedder
    counts = counted(t)
    for client in (t.rest, t.frontend):
        before = counts()
        r = await client.post("/v1/embeddings", json={"model": "fake", "input": [f"t{i}" for i in range(10)]})
        assert (
            r.status_code == 200 and len(r.json()["data"]) == 10 and r.json()["usage"]["total_tokens"] == 20
        )
        assert [d["embedding"][0] for d in r.json()["data"]] == [2.0] * 10
        r = await client.post("/v1/embeddings", json={"model": "fake", "input": ["x"] * 100_000})
        assert r.status_code == 413 and r.json()["error"]["param"] == "input"
        assert "over the limit of 2048" in r.json()["error"]["message"]
        r = await client.post("/v1/embeddings", json={"model": "fake", "input": ["x"] * 40})  # 10 pieces > 8
        assert r.status_code == 413 and r.json()["error"]["param"] == "input"
        r = await client.post("/v1/rerank", json={"model": "fake", "query": "q", "documents": ["d"] * 3000})
        assert r.status_code == 413 and r.json()["error"]["param"] == "documents"
        await until(lambda before=before: counts()[413] >= before[413] + 3)
        await asyncio.sleep(0.02)
        after = counts()
        assert {s: after[s] - before[s] for s in after} == {200: 1.0, 413: 3.0, 429: 0.0}
    assert sum(model.batches) == 20  # the two 10-text requests; nothing of the refused ones
    duration = t.plane.metrics.registry.get_sample_value(
        "kubeinfer_request_duration_seconds_count", {"model": "fake"}
    )
    assert duration == 8.0  # the latency histogram too: one observation a request


async def test_an_openai_request_whose_pieces_do_not_fit_is_one_429_and_computes_nothing(
    embedder: tuple[Transports, FakeEmbedder],
) -> None:
    t, model = embedder
    counts = counted(t)
    model.gate = threading.Event()
    # fill the queue (8 places) but 2: one request runs (blocked), one is taken ahead, 6 wait
    held = [asyncio.ensure_future(t.rest.post("/v1/embeddings", json={"model": "fake", "input": ["h"] * 4}))]
    await asyncio.to_thread(model.started.wait, 5)
    held += [
        asyncio.ensure_future(t.rest.post("/v1/embeddings", json={"model": "fake", "input": ["h"] * 4}))
        for _ in range(7)
    ]
    assert t.plane.batcher is not None
    batcher = t.plane.batcher
    await until(lambda: batcher.queued == 6)
    for client in (t.rest, t.frontend):
        before = counts()
        r = await client.post("/v1/embeddings", json={"model": "fake", "input": ["n"] * 12})  # 3 pieces
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        assert "needs 3 places" in r.json()["error"]["message"] and r.headers["retry-after"] == "1"
        assert batcher.queued == 6
        await asyncio.sleep(0.02)
        after = counts()
        assert {s: after[s] - before[s] for s in after} == {200: 0.0, 413: 0.0, 429: 1.0}
    model.gate.set()
    assert all(r.status_code == 200 for r in await asyncio.gather(*held))
    assert b"n" not in {t for batch in model.texts for t in batch}
