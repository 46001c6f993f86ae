"""Adversarial runtime checks on the tiny BERT (fast to load): bad requests mixed into a concurrent
batch of good ones, SIGTERM with requests queued behind a long batch timeout, SIGKILL and restart of
the same ``RuntimeProcess``; each with one process and with ``server.http_workers`` 2."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hack.devtools.runtime_proc import RuntimeProcess
from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir

INFER = "/v2/models/tiny/infer"


def _row(text: str) -> dict[str, object]:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_dir(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(params=[1, 2], ids=["http_workers=1", "http_workers=2"])
def runtime(tiny_dir: Path, request: pytest.FixtureRequest) -> Iterator[RuntimeProcess]:
    # a long batch timeout keeps requests queued: a batch runs when 8 rows wait or after 0.4 s; every test
    # runs on one process and on two HTTP front-end processes in front of the model process
    cfg = tiny_hf_config(
        tiny_dir,
        batching={"max_batch_size": 8, "max_queue_delay_seconds": 0.4},
        limits={"max_text_tokens": 32},
        server={"http_workers": request.param},
    )
    with RuntimeProcess(cfg, ready_timeout=60) as rt:
        yield rt


def test_bad_requests_fail_alone_in_a_batch_of_good_ones(runtime: RuntimeProcess) -> None:
    bad: list[tuple[str, dict[str, object]]] = [
        ("too-long", {"json": _row("word " * 200)}),
        ("malformed", {"content": b'{"inputs": [', "headers": {"content-type": "application/json"}}),
        ("nested", {"content": b"[" * 100_000 + b"]" * 100_000}),
        (
            "int-for-bytes",
            {"json": {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [5]}]}},
        ),
        ("bad-priority", {"json": {**_row("x"), "parameters": {"priority": "high"}}}),
    ]

    async def run() -> tuple[list[httpx.Response], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=runtime.url, timeout=30) as c:
            good = [c.post(INFER, json=_row(f"good sentence {i}")) for i in range(12)]
            wrong = [c.post(INFER, **kw) for _, kw in bad]  # type: ignore[arg-type]
            rs = await asyncio.gather(*good[:6], *wrong, *good[6:])
            return [*rs[:6], *rs[6 + len(wrong) :]], list(rs[6 : 6 + len(wrong)])

    good_rs, bad_rs = asyncio.run(run())
    assert [r.status_code for r in good_rs] == [200] * 12, [r.text for r in good_rs]
    assert all(r.json()["outputs"][0]["shape"] == [1, 32] for r in good_rs)
    statuses = {name: r.status_code for (name, _), r in zip(bad, bad_rs, strict=True)}
    assert statuses == {
        "too-long": 413,
        "malformed": 400,
        "nested": 400,
        "int-for-bytes": 400,
        "bad-priority": 400,
    }
    for r in bad_rs:
        assert "error" in r.json()
    assert runtime.get("/v2/health/live")[0] == 200


def test_sigterm_with_requests_queued_answers_every_one(runtime: RuntimeProcess) -> None:
    async def run() -> Counter[object]:
        async with httpx.AsyncClient(base_url=runtime.url, timeout=30) as c:
            await c.get("/v2")

            async def one(i: int) -> object:
                try:
                    return (await c.post(INFER, json=_row(f"queued {i}"))).status_code
                except httpx.HTTPError as exc:
                    return type(exc).__name__

            tasks = [asyncio.create_task(one(i)) for i in range(5)]  # < max_batch_size: they wait 0.4 s
            await asyncio.sleep(0.2)
            assert not any(t.done() for t in tasks)
            os.kill(runtime.pid, signal.SIGTERM)
            return Counter(await asyncio.gather(*tasks))

    assert asyncio.run(run()) == Counter({200: 5})
    assert runtime.proc is not None and runtime.proc.wait(30) == 0


def test_sigkill_then_restart_serves_on_the_new_port(runtime: RuntimeProcess) -> None:
    old_port = runtime.port
    runtime.kill()
    t0 = time.monotonic()
    runtime.start()
    assert runtime.port and runtime.get("/v2/health/ready")[0] == 200, (old_port, runtime.port)
    r = httpx.post(
        runtime.url + INFER, json={**_row("after restart"), "parameters": {"priority": 1}}, timeout=30
    )
    assert r.status_code == 200, r.text
    assert time.monotonic() - t0 < 60
