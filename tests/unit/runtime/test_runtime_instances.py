"""A model's instances (``instances`` of ``runtime.yaml``, Triton's ``instance_group`` count): that many
batches of the one queue run at once, through the server a runtime builds from its file (a service's
own, or a pooled model's file as its model process reads it), and the model configuration says so."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from kubeinfer.runtime.config import RuntimeConfig
from kubeinfer.runtime.repository import model_config
from kubeinfer.runtime.server import RuntimeServer

from tests.unit.runtime.runtime_fakes import FakeModel, rows
from tests.unit.runtime.test_runtime_server import triton_body

pytestmark = pytest.mark.timeout(30)

#: Rows per batch: one, so each request is a batch of its own.
BATCH = {"max_batch_size": 1, "max_queue_delay_seconds": 0.0}


class SlowModel(FakeModel):
    """A ``FakeModel`` whose batches hold their executor until :attr:`release` is set, counting how many
    run at once (:attr:`peak`)."""

    def __init__(self) -> None:
        super().__init__(max_batch_size=1)
        self.release = threading.Event()
        self.running = 0
        self.peak = 0

    def execute(self, prepared: Any) -> dict[str, np.ndarray]:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            self.release.wait(10)
            return super().execute(prepared)
        finally:
            with self.lock:
                self.running -= 1


async def settle(model: SlowModel, expected: int) -> None:
    """Wait until ``expected`` batches run at once (5 s at most), then 0.2 s more for any further one to
    start (a bug running more than ``expected`` shows in ``peak``)."""
    deadline = time.monotonic() + 5.0
    while model.peak < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.2)


@pytest.mark.parametrize("instances", [1, 2, 3])
async def test_the_files_instances_run_that_many_batches_at_once(instances: int) -> None:
    text = RuntimeConfig.model_validate(
        {"model": {"name": "fake"}, "batching": BATCH, "instances": instances}
    ).to_yaml()
    server = RuntimeServer(RuntimeConfig.from_yaml(text))
    model = SlowModel()
    server.attach(model)
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        body, headers = triton_body(np.ones((1, 2), np.float32))
        posts = [
            asyncio.ensure_future(client.post("/v2/models/fake/infer", content=body, headers=headers))
            for _ in range(4)
        ]
        await settle(model, instances)
        assert model.peak == instances  # one queue, `instances` batches of it running together
        model.release.set()
        assert [r.status_code for r in await asyncio.gather(*posts)] == [200] * 4
        config = (await client.get("/v2/models/fake/config")).json()
    assert model.batches == [1, 1, 1, 1]
    assert config["instance_group"] == [{"name": "kubeinfer", "count": instances, "kind": "KIND_CPU"}]
    server.close()


def _pooled(repository: Path, name: str, data: Mapping[str, Any]) -> RuntimeConfig:
    """The configuration a pooled model's process gets from its file ``<name>.yaml`` in the flat layout."""
    file = RuntimeConfig.model_validate({"model": {"name": name}, **data})
    (repository / f"{name}.yaml").write_text(file.to_yaml())
    return model_config(repository / f"{name}.yaml", name)


async def test_a_pooled_models_file_gives_its_process_its_instances(tmp_path: Path) -> None:
    assert _pooled(tmp_path, "one", {"batching": BATCH}).instances == 1
    cfg = _pooled(tmp_path, "fake", {"batching": BATCH, "instances": 3})
    assert cfg.instances == 3
    # what the model process runs (``cli.serve_model_process``): a server on the IPC endpoint only
    server = RuntimeServer(cfg, ipc_address="ipc://@unused")
    model = SlowModel()
    server.attach(model)
    batcher = server.plane.batcher
    assert batcher is not None
    calls = [asyncio.ensure_future(batcher.infer(rows(float(i)))) for i in range(5)]
    await settle(model, 3)
    assert model.peak == 3
    model.release.set()
    await asyncio.gather(*calls)
    assert sorted(model.batches) == [1] * 5
    server.close()
