"""The OpenAI-compatible embeddings route of a real ``kubeinfer-runtime`` process (tiny BERT), driven by
the official ``openai`` SDK (sync and async), in one process and behind two HTTP front-end processes:
the same vectors as the v2 route for the same texts, the model's token counts as ``usage``, OpenAI's
error shape, and v2 and OpenAI requests batched together."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import transformers
import tritonclient.http as httpclient

from hack.devtools.runtime_proc import RuntimeProcess
from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir

pytestmark = pytest.mark.timeout(300)

TEXTS = [
    "A man is playing a guitar on stage.",
    "The new movie is awesome.",
    "A cat sits on the windowsill in the sun.",
    "The stock market fell sharply on Monday.",
    "She is cooking pasta for dinner.",
    "Children are playing football in the park.",
    "word",
    "",
    "Ünïcödé text, with punctuation!",
    "one two three four five six seven eight nine ten",
]


#: The runtime's ``batching.max_queue_size``: a request of ``4 * QUEUE`` texts fills its queue.
QUEUE = 16


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_dir(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module", params=[1, 2], ids=["http_workers=1", "http_workers=2"])
def runtime(tiny_dir: Path, request: pytest.FixtureRequest) -> Iterator[RuntimeProcess]:
    # max_batch_size 4: the 10 texts of one OpenAI request go to the batcher as three pieces;
    # max_queue_size 16: 64 texts fill the queue (test_one_request_one_outcome)
    cfg = tiny_hf_config(
        tiny_dir,
        batching={"max_batch_size": 4, "max_queue_delay_seconds": 0.3, "max_queue_size": QUEUE},
        limits={"max_text_tokens": 32},
        server={"http_workers": request.param},
    )
    with RuntimeProcess(cfg, ready_timeout=60) as rt:
        yield rt


def v2_embeddings(rt: RuntimeProcess, texts: list[str]) -> np.ndarray:
    client = httpclient.InferenceServerClient(rt.address)
    rows = []
    for i in range(0, len(texts), 4):
        inp = httpclient.InferInput("text", [len(texts[i : i + 4])], "BYTES")
        inp.set_data_from_numpy(np.array([t.encode() for t in texts[i : i + 4]], dtype=object))
        out = client.infer("tiny", [inp]).as_numpy("embedding")
        assert out is not None
        rows.append(out)
    return np.concatenate(rows)


def stats(rt: RuntimeProcess) -> dict[str, object]:
    status, body = rt.get("/v2/models/tiny/stats")
    assert status == 200
    (stat,) = json.loads(body)["model_stats"]
    return stat  # type: ignore[no-any-return]


def test_the_sdk_gets_the_v2_vectors_and_the_token_counts(runtime: RuntimeProcess, tiny_dir: Path) -> None:
    client = openai.OpenAI(base_url=f"{runtime.url}/v1", api_key="unused", max_retries=0)
    expected = v2_embeddings(runtime, TEXTS)
    # the SDK asks for base64 when the caller names no encoding_format, and decodes it
    default = client.embeddings.create(model="tiny", input=TEXTS)
    floats = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float", dimensions=32)
    for response in (default, floats):
        assert [d.index for d in response.data] == list(range(len(TEXTS)))
        got = np.array([d.embedding for d in response.data], dtype=np.float32)
        np.testing.assert_allclose(got, expected, atol=1e-6)
        assert response.model == "tiny" and response.object == "list"
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_dir))
    tokens = sum(len(ids) for ids in tokenizer(TEXTS)["input_ids"])
    assert default.usage.prompt_tokens == default.usage.total_tokens == tokens
    one = client.embeddings.create(model="tiny", input=TEXTS[0])
    np.testing.assert_allclose(one.data[0].embedding, expected[0], atol=1e-6)
    assert [m.id for m in client.models.list()] == ["tiny"]

    async def concurrently() -> list[list[float]]:
        aclient = openai.AsyncOpenAI(base_url=f"{runtime.url}/v1", api_key="unused", max_retries=0)
        results = await asyncio.gather(*(aclient.embeddings.create(model="tiny", input=t) for t in TEXTS))
        await aclient.close()
        return [r.data[0].embedding for r in results]

    np.testing.assert_allclose(np.array(asyncio.run(concurrently())), expected, atol=1e-6)


def test_errors_come_in_openais_shape_and_are_counted(runtime: RuntimeProcess) -> None:
    client = openai.OpenAI(base_url=f"{runtime.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as not_found:
        client.embeddings.create(model="text-embedding-3-small", input="x")
    assert not_found.value.code == "model_not_found" and "serves 'tiny'" in not_found.value.message
    with pytest.raises(openai.BadRequestError) as shorten:
        client.embeddings.create(model="tiny", input="x", dimensions=8)
    assert shorten.value.param == "dimensions" and "32-dimensional" in shorten.value.message
    with pytest.raises(openai.BadRequestError) as token_arrays:
        client.embeddings.create(model="tiny", input=[[101, 2023, 102]])
    assert token_arrays.value.param == "input" and "token arrays" in token_arrays.value.message
    with pytest.raises(openai.APIStatusError) as too_long:  # the v2 route's status: 413, over a limit
        client.embeddings.create(model="tiny", input=["word " * 100])
    assert too_long.value.status_code == 413 and "over the limit of 32 tokens" in too_long.value.message
    r = httpx.post(f"{runtime.url}/v1/embeddings", content=b"{not json", timeout=10)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error" and "JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{runtime.url}/v1/embeddings", json={"model": "tiny", "input": "ok"}, timeout=10)
    assert r.status_code == 200 and r.json()["data"][0]["object"] == "embedding"


def test_v2_and_openai_requests_batch_together(runtime: RuntimeProcess) -> None:
    client = openai.OpenAI(base_url=f"{runtime.url}/v1", api_key="unused", max_retries=0)
    inp = httpclient.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"from v2"], dtype=object))
    tries = []
    # Two OpenAI texts and two v2 rows sent at once fill one batch of 4 rows when they all arrive within
    # the 0.3 s queue delay; a busy machine can start one client late, so up to three tries. Only rows
    # of both protocols together make a batch of 4 (the OpenAI request has 2 rows, each v2 request 1).
    for _ in range(3):
        before = stats(runtime)
        sizes_before = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}  # type: ignore[union-attr,index]
        # a client per try: tritonclient's sockets belong to the gevent hub of the thread that opened
        # them, and a try's pool threads are gone at the next ("cannot switch to a different thread")
        v2 = httpclient.InferenceServerClient(runtime.address, concurrency=2)  # two requests at once
        with v2, concurrent.futures.ThreadPoolExecutor(3) as pool:
            futures = [
                pool.submit(client.embeddings.create, model="tiny", input=["from openai", "and again"]),
                pool.submit(v2.infer, "tiny", [inp]),
                pool.submit(v2.infer, "tiny", [inp]),
            ]
            for f in futures:
                f.result(timeout=30)
        after = stats(runtime)
        sizes_after = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}  # type: ignore[union-attr,index]
        assert after["inference_count"] == before["inference_count"] + 4  # type: ignore[operator]
        tries.append((sizes_before, sizes_after))
        if sizes_after.get(4, 0) == sizes_before.get(4, 0) + 1:
            return
    raise AssertionError(f"no batch of 4 rows in 3 tries (batch sizes before, after): {tries}")


def test_langchains_openai_embeddings_class_works_unchanged(runtime: RuntimeProcess) -> None:
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: LangChain then sends the text, not tiktoken's token ids
    # (an OpenAI model's vocabulary, which no other model shares)
    embeddings = OpenAIEmbeddings(
        model="tiny",
        base_url=f"{runtime.url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    expected = v2_embeddings(runtime, TEXTS)
    np.testing.assert_allclose(np.array(embeddings.embed_documents(TEXTS)), expected, atol=1e-6)
    np.testing.assert_allclose(np.array(embeddings.embed_query(TEXTS[2])), expected[2], atol=1e-6)


def requests_by_code(rt: RuntimeProcess) -> dict[str, float]:
    text = rt.metrics_text()
    found = re.findall(r'^kubeinfer_requests_total\{code="(\d+)",model="tiny"\} (\S+)$', text, re.MULTILINE)
    counts = {code: float(value) for code, value in found}
    m = re.search(r'^kubeinfer_request_duration_seconds_count\{model="tiny"\} (\S+)$', text, re.MULTILINE)
    counts["latency"] = float(m.group(1)) if m else 0.0
    return counts


def counted_since(rt: RuntimeProcess, before: dict[str, float]) -> dict[str, float]:
    after = requests_by_code(rt)
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def test_one_request_one_outcome(runtime: RuntimeProcess) -> None:
    """Over the size of one request: 413 naming ``input``, fast, nothing queued; texts whose pieces do
    not all fit the queue: one 429, nothing computed; each request counted once with its status."""
    url = f"{runtime.url}/v1/embeddings"
    before, stats_before = requests_by_code(runtime), stats(runtime)
    t0 = time.monotonic()
    r = httpx.post(url, json={"model": "tiny", "input": ["hello world"] * 100_000}, timeout=30)
    seconds = time.monotonic() - t0
    assert r.status_code == 413 and r.json()["error"]["param"] == "input", r.text
    assert "over the limit of 2048" in r.json()["error"]["message"]
    assert seconds < 5.0, seconds  # was a 429 after 14.5 s, the queue full of its 3,125 pieces
    print(f"100k inputs ({len(r.request.content)} bytes): 413 in {seconds:.3f} s")
    r = httpx.post(url, json={"model": "tiny", "input": ["x"] * (4 * QUEUE + 1)}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["param"] == "input"  # more pieces than the queue
    assert "max_queue_size 16" in r.json()["error"]["message"], r.text
    assert counted_since(runtime, before) == {"413": 2.0, "latency": 2.0}
    assert stats(runtime)["inference_count"] == stats_before["inference_count"]

    # bursts of requests that each fill the whole queue: each is served whole or refused whole
    text = "a sentence of some length, so that the model takes its time"  # under 32 tokens
    body = {"model": "tiny", "input": [text] * (4 * QUEUE)}
    for _ in range(5):
        before, stats_before = requests_by_code(runtime), stats(runtime)
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(lambda _: httpx.post(url, json=body, timeout=60), range(6)))
        ok = [r for r in codes if r.status_code == 200]
        refused = [r for r in codes if r.status_code == 429]
        assert len(ok) + len(refused) == 6, [r.text for r in codes]
        assert all(len(r.json()["data"]) == 4 * QUEUE for r in ok)
        assert all(r.json()["error"]["type"] == "rate_limit_error" for r in refused)
        computed = stats(runtime)["inference_count"] - stats_before["inference_count"]  # type: ignore[operator]
        assert computed == 4 * QUEUE * len(ok)  # nothing of a refused request ran
        expected = {"200": float(len(ok)), "429": float(len(refused)), "latency": 6.0}
        assert counted_since(runtime, before) == {k: v for k, v in expected.items() if v}
        print(f"burst of 6 requests of {4 * QUEUE} texts: {len(ok)} served, {len(refused)} refused")
        if refused and ok:
            break
    assert refused and ok, "no burst overlapped: every request found the queue empty"
