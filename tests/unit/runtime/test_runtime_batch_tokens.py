"""The token budget (``batching.max_batch_tokens``, TEI's ``max_batch_tokens``): a batch costs its rows
times its longest row's tokens (padded, as a text model pads), and a request that would take it over
the budget ends it, so one long text does not pad a batch of short ones to its length. The pure planner,
a text model's estimate of a request's tokens, and the batcher on a real (tiny) text model."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from kubeinfer.runtime.batching import Batcher, BatchSettings
from kubeinfer.runtime.config import BatchingConfig
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models import load_model
from kubeinfer.runtime.models.huggingface import TextModel

from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir
from tests.unit.runtime.runtime_fakes import texts
from tests.unit.runtime.test_runtime_batching import Item, plan

pytestmark = pytest.mark.timeout(120)


def test_without_a_budget_tokens_change_nothing() -> None:
    items = [Item(1, 0.0, tokens=8), Item(1, 0.0, tokens=256), Item(1, 0.0, tokens=8)]
    assert plan(items, now=1.0).picked == (0, 1, 2)


def test_a_long_request_ends_a_batch_of_short_ones() -> None:
    # 3 short rows (8 tokens) then a long one (256): 4 x 256 = 1024 > 512 ends the batch after 3
    items = [Item(1, 0.0, tokens=8), Item(1, 0.0, tokens=8), Item(1, 0.0, tokens=8), Item(1, 0.0, tokens=256)]
    p = plan(items, now=0.0, max_batch_tokens=512)
    assert p.picked == (0, 1, 2) and p.full  # taken at once, as when rows do not fit
    # the long one alone is over the budget too: it runs alone, not never
    p = plan([Item(2, 0.0, tokens=300)], now=1.0, max_batch_tokens=512)
    assert p.picked == (0,)


def test_the_budget_counts_padding_not_the_sum_of_tokens() -> None:
    # a long head: 2 rows of 200 = 400 fit 512; a third short row pads to 200 too: 600 > 512
    items = [Item(2, 0.0, tokens=200), Item(1, 0.0, tokens=4)]
    assert plan(items, now=1.0, max_batch_tokens=512).picked == (0,)
    assert plan(items, now=1.0, max_batch_tokens=600).picked == (0, 1)


def test_the_setting_is_a_positive_count_and_reaches_the_batcher() -> None:
    assert BatchSettings.from_config(BatchingConfig(max_batch_tokens=4096)).max_batch_tokens == 4096
    assert BatchSettings.from_config(BatchingConfig()).max_batch_tokens is None
    with pytest.raises(ValueError, match="max_batch_tokens"):
        BatchingConfig(max_batch_tokens=0)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> TextModel:
    path = tiny_hf_dir(tmp_path_factory.mktemp("tokens") / "embedder")
    cfg = tiny_hf_config(path, model={"name": "tiny", "source": str(path), "max_sequence_length": 64})
    loaded = load_model(cfg)
    assert isinstance(loaded, TextModel)
    loaded.warmup(8, 1)
    return loaded


def test_a_text_models_estimate_bounds_its_tokens(model: TextModel) -> None:
    rows = ["a b c", "a longer sentence with more words in it", ""]
    estimate = model.tokens({"text": texts(*rows)})
    actual = max(len(ids) for ids in model.tokenizer(rows)["input_ids"])
    assert actual <= estimate <= len(rows[1].encode()) + 2
    assert model.tokens({"text": texts("word " * 500)}) == 64  # never past the window


async def test_the_batcher_keeps_a_long_text_out_of_a_batch_of_short_ones(model: TextModel) -> None:
    metrics = RuntimeMetrics(model.name)
    settings = BatchSettings(max_batch_size=8, max_queue_delay_seconds=0.05, max_batch_tokens=8 * 16)
    batcher = Batcher(model, settings, metrics=metrics)
    batcher.start()
    try:
        short = [batcher.infer({"text": texts("hi there")}) for _ in range(4)]
        long = batcher.infer({"text": texts("word " * 50)})  # 52 tokens: within the 64-token window
        outs = await asyncio.gather(*short, long)
    finally:
        await batcher.drain(5)
    assert all(o["embedding"].shape == (1, model.dim) for o in outs)
    # the four short requests in one batch, the long one in another: two batches, not one of 5 x 64
    text = metrics.exposition().decode()
    batches = [line for line in text.splitlines() if line.startswith("kubeinfer_batch_size_count")]
    assert batches and float(batches[0].split()[-1]) == 2.0, batches
    assert np.isfinite(outs[-1]["embedding"]).all()


def test_a_chunked_text_counts_as_its_windows(tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tiny_hf_dir(tmp_path_factory.mktemp("tokens") / "chunker")
    window = 64
    model = load_model(
        tiny_hf_config(
            path,
            model={"name": "tiny", "source": str(path), "max_sequence_length": window, "overflow": "chunk"},
            limits={"max_text_tokens": 4096},
        )
    )
    assert isinstance(model, TextModel)
    text = "word " * 500  # 500 tokens: 9 windows of 62 content tokens stepping by 55
    windows = model.preprocess([{"text": texts(text)}]).windows
    assert windows is not None
    estimate = model.tokens({"text": texts(text, "a b c")})
    # at least the windows it will run (each padded to the window), from its 2,500 bytes at most
    assert len(windows) * window <= estimate == (1 + -(-(len(text) - 62) // 55)) * window
    assert model.tokens({"text": texts("a b c")}) == 7  # a text that fits one window: as before
