"""``server.http_workers`` 2 on the tiny BERT: a front-end process killed under load is started again,
only the requests on its connections fail, every other request succeeds, and ``/metrics`` (proxied by
whichever front end answers) counts for the whole pod. The batching, drain and reload tests run with
two front ends too (``test_runtime_bad_requests_and_signals.py``, ``test_runtime_serve.py``)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from kubeinfer.runtime.config import BatchingConfig, RuntimeConfig
from prometheus_client.parser import text_string_to_metric_families

from hack.devtools.runtime_proc import RuntimeProcess
from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir
from tests.support.model_config import assert_unknown_model_is_not_found, model_config_pair, tensors

pytestmark = pytest.mark.timeout(300)

INFER = "/v2/models/tiny/infer"
_STARTED = re.compile(r"front end (\d+) started \(pid (\d+)\)")


def _row(text: str) -> dict[str, object]:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    cfg = tiny_hf_config(
        tiny_hf_dir(tmp_path_factory.mktemp("tiny")),
        batching={"max_batch_size": 8, "max_queue_delay_seconds": 0.005},
        limits={"max_text_tokens": 32},
        server={"http_workers": 2},
    )
    with RuntimeProcess(cfg, ready_timeout=90) as rt:
        yield rt


def _frontends(rt: RuntimeProcess) -> dict[int, int]:
    """slot -> pid of the last front end started in it."""
    return {int(m.group(1)): int(m.group(2)) for m in _STARTED.finditer(rt.log_text())}


def _served_by(pid: int, port: int) -> int:
    return sum(
        1
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.raddr
    )


def test_two_front_ends_share_the_port_and_tritonclient_works_unchanged(runtime: RuntimeProcess) -> None:
    pids = _frontends(runtime)
    assert sorted(pids) == [0, 1] and all(psutil.pid_exists(p) for p in pids.values())
    assert {p.pid for p in psutil.Process(runtime.pid).children()} == set(pids.values())
    # each front end, once started, froze its heap out of garbage collection, and so did the model process
    frozen = re.findall(r"front end \d+ listening on .*; (\d+) objects frozen", runtime.log_text())
    assert len(frozen) >= 2 and all(int(n) > 10_000 for n in frozen), runtime.log_text()
    assert "objects of the load frozen out of garbage collection" in runtime.log_text()
    client = httpclient.InferenceServerClient(runtime.address, concurrency=16)
    texts = [f"sentence number {i}" for i in range(32)]
    for binary in (True, False):
        futures = []
        for t in texts:
            inp = httpclient.InferInput("text", [1], "BYTES")
            inp.set_data_from_numpy(np.array([t.encode()], dtype=object), binary_data=binary)
            out = [httpclient.InferRequestedOutput("embedding", binary_data=binary)]
            futures.append(client.async_infer("tiny", [inp], outputs=out))
        results = [f.get_result().as_numpy("embedding") for f in futures]
        assert all(r is not None and r.shape == (1, 32) for r in results)
        assert len({tuple(np.round(r[0, :4], 5)) for r in results}) == 32  # each request got its own row
    client.close()
    # 16 kept-alive connections: the kernel spreads them over both front ends
    conns = [httpx.Client(base_url=runtime.url, timeout=30) for _ in range(16)]
    for c in conns:
        assert c.get("/v2/health/ready").status_code == 200
    assert all(_served_by(pid, runtime.port) > 0 for pid in pids.values()), "one front end got nothing"
    for c in conns:
        c.close()


def test_the_front_ends_serve_grpc_too(runtime: RuntimeProcess) -> None:
    """gRPC is decoded and encoded in the front-end processes (SO_REUSEPORT on the gRPC port), not in
    the model process; its outcomes are counted in the model process's metrics like REST's."""
    import tritonclient.grpc as grpcclient

    pids = _frontends(runtime)

    def listening(pid: int) -> bool:
        return any(
            c.status == psutil.CONN_LISTEN and c.laddr.port == runtime.grpc_port
            for c in psutil.Process(pid).net_connections(kind="tcp")
        )

    assert all(listening(pid) for pid in pids.values())
    assert not listening(runtime.pid)

    def ok_count() -> float:
        text = httpx.get(f"{runtime.url}/metrics", timeout=10).text
        match = re.search(r'kubeinfer_requests_total\{code="200",model="tiny"\} (\S+)', text)
        return float(match.group(1)) if match else 0.0

    before = ok_count()
    own_connection = [("grpc.use_local_subchannel_pool", 1)]  # one TCP connection per client
    clients = [
        grpcclient.InferenceServerClient(runtime.grpc_address, channel_args=own_connection) for _ in range(8)
    ]
    for i, client in enumerate(clients):
        inp = grpcclient.InferInput("text", [1], "BYTES")
        inp.set_data_from_numpy(np.array([f"grpc sentence {i}".encode()], dtype=object))
        out = client.infer("tiny", [inp]).as_numpy("embedding")
        assert out is not None and out.shape == (1, 32)
    assert clients[0].is_server_ready() and clients[0].is_model_ready("tiny")
    assert clients[0].get_model_metadata("tiny").name == "tiny"
    assert ok_count() == before + 8
    assert sum(_served_by(pid, runtime.grpc_port) for pid in pids.values()) >= 8  # each channel, a front end
    for client in clients:
        client.close()


class _Load:
    """``clients`` threads, each posting one-row requests on its own kept-alive connection until
    ``stop``; a lost connection is counted and replaced by a new one."""

    def __init__(self, rt: RuntimeProcess, clients: int) -> None:
        self.rt = rt
        self.outcomes: Counter[str] = Counter()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,)) for i in range(clients)]
        for t in self.threads:
            t.start()

    def served(self) -> int:
        with self.lock:
            return self.outcomes["200"]

    def _loop(self, i: int) -> None:
        c = httpx.Client(base_url=self.rt.url, timeout=30)
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                r = c.post(INFER, json=_row(f"client {i} request {n}"))
                ok = r.status_code == 200 and r.json()["outputs"][0]["shape"] == [1, 32]
                outcome = "200" if ok else f"{r.status_code}: {r.text[:100]}"
            except httpx.TransportError:  # the connection was on the killed front end
                outcome = "connection lost"
                c.close()
                c = httpx.Client(base_url=self.rt.url, timeout=30)
            with self.lock:
                self.outcomes[outcome] += 1
        c.close()

    def stop(self) -> Counter[str]:
        self._stop.set()
        for t in self.threads:
            t.join(30)
        return self.outcomes


def _wait_until_it_serves(rt: RuntimeProcess, pid: int) -> None:
    """Fresh connections all succeed, until some land on front end ``pid``."""
    deadline = time.monotonic() + 20
    while True:
        conns = [httpx.Client(base_url=rt.url, timeout=30) for _ in range(16)]
        rs = [c.post(INFER, json=_row(f"after restart {i}")) for i, c in enumerate(conns)]
        assert [r.status_code for r in rs] == [200] * 16, [r.text for r in rs]
        landed = _served_by(pid, rt.port)
        for c in conns:
            c.close()
        if landed:
            return
        assert time.monotonic() < deadline, "no connection reached the restarted front end"
        time.sleep(0.5)


def test_a_killed_front_end_is_restarted_and_only_its_requests_fail(runtime: RuntimeProcess) -> None:
    before = _frontends(runtime)
    victim = before[0]
    load = _Load(runtime, clients=12)
    time.sleep(1.5)
    served_before_kill = load.served()
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while _frontends(runtime)[0] == victim:
        assert time.monotonic() < deadline, runtime.tail()
        time.sleep(0.1)
    time.sleep(2.0)  # keep the load on while the new front end starts
    outcomes = load.stop()
    after = _frontends(runtime)
    assert after[1] == before[1], "the other front end was restarted too"
    assert after[0] != victim and psutil.pid_exists(after[0])
    assert f"front end 0 (pid {victim}) exited" in runtime.log_text()
    restarts = [
        (sample.labels["frontend"], sample.value)
        for family in text_string_to_metric_families(runtime.metrics_text())
        for sample in family.samples
        if sample.name == "kubeinfer_frontend_restarts_total"
    ]
    assert restarts == [("0", 1.0)], restarts  # the killed one, once; the other never
    assert served_before_kill > 0 and outcomes["200"] > served_before_kill
    failed = {k: v for k, v in outcomes.items() if k != "200"}
    # only requests on the dead process's connections: at most one per client connection
    assert set(failed) <= {"connection lost"} and failed.get("connection lost", 0) <= 12, outcomes
    print(f"outcomes: {dict(outcomes)}")
    _wait_until_it_serves(runtime, after[0])
    assert runtime.get("/v2/health/ready")[0] == 200


def test_metrics_are_one_view_of_the_pod(runtime: RuntimeProcess) -> None:
    def count(code: int) -> float:
        pattern = rf'^kubeinfer_requests_total\{{code="{code}",model="tiny"\}} ([0-9.e+]+)$'
        m = re.search(pattern, runtime.metrics_text(), re.M)
        return float(m.group(1)) if m else 0.0

    def ok_count() -> float:
        return count(200)

    def bad_count() -> float:
        return count(400)

    ok0, bad0 = ok_count(), bad_count()
    conns = [httpx.Client(base_url=runtime.url, timeout=30) for _ in range(8)]  # over both front ends
    for i, c in enumerate(conns):
        assert c.post(INFER, json=_row(f"counted {i}")).status_code == 200
        assert c.post(INFER, content=b'{"inputs": [').status_code == 400  # refused by the front end itself
    # every front end answers /metrics with the same counts (the model process's)
    views = {(ok_count(), bad_count()) for _ in range(8)}
    assert views == {(ok0 + 8, bad0 + 8)}
    for c in conns:
        c.close()


def test_reload_priority_displacement_and_429_cross_the_front_ends(runtime: RuntimeProcess) -> None:
    """Hot reload (the watcher is in the model process) to a queue of 4 with a 0.5 s max queue delay; a
    burst of 4 priority-2 requests fills it; a priority-1 arrival displaces the newest of them, which
    gets 429 with Retry-After through its front end; the others are served."""
    base = RuntimeConfig.load(runtime.config_path)
    small = base.model_copy(deep=True)
    small.batching = BatchingConfig(max_batch_size=8, max_queue_delay_seconds=0.5, max_queue_size=4)
    runtime.write_config(small)
    deadline = time.monotonic() + 10
    while 'kubeinfer_max_queue_delay_seconds{model="tiny"} 0.5' not in runtime.metrics_text():
        assert time.monotonic() < deadline, "the reload did not reach the model process"
        time.sleep(0.2)

    async def run() -> tuple[list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(base_url=runtime.url, timeout=30) as c:
            # a burst first: the batcher has seen arrivals within its 1 s window, so the next requests
            # wait for their max queue delay instead of starting alone (its early dispatch at low load)
            warm = await asyncio.gather(*(c.post(INFER, json=_row(f"warm {i}")) for i in range(4)))
            assert [r.status_code for r in warm] == [200] * 4
            low = [asyncio.create_task(c.post(INFER, json=_row(f"low {i}"))) for i in range(4)]
            await asyncio.sleep(0.25)  # queued: 4 rows < 8, the burst waits for its 0.5 s
            high = await c.post(INFER, json={**_row("high"), "parameters": {"priority": 1}})
            return list(await asyncio.gather(*low)), high

    try:
        low, high = asyncio.run(run())
    finally:
        runtime.write_config(base)
    assert high.status_code == 200, high.text
    shed = [r for r in low if r.status_code == 429]
    assert len(shed) == 1 and [r.status_code for r in low].count(200) == 3, [r.text for r in low]
    assert shed[0].headers["retry-after"] and "queue full" in shed[0].json()["error"]


def test_the_model_configuration_crosses_the_front_ends_with_the_delay_in_force(
    runtime: RuntimeProcess,
) -> None:
    """perf_analyzer's first question, answered by the front ends (HTTP and gRPC) from the model
    process: a hot reload's batching settings are in the next answer."""

    def wait_for(batch: int, delay_us: int) -> Any:
        # both front ends answer the new settings (one read of each; a reload landing between the
        # two reads shows as a disagreement, read again)
        deadline = time.monotonic() + 10
        while True:
            _, cfg, over_grpc = model_config_pair(runtime.address, runtime.grpc_address, "tiny")
            if over_grpc == cfg and (
                cfg.max_batch_size,
                cfg.dynamic_batching.max_queue_delay_microseconds,
            ) == (batch, delay_us):
                return cfg
            assert time.monotonic() < deadline, f"the reload did not reach both: {cfg} {over_grpc}"
            time.sleep(0.2)

    # the fixture's settings (an earlier test's reload back to them may still be on its way)
    cfg = wait_for(8, 5000)
    assert tensors(cfg, "input") == [("text", "TYPE_STRING", [1])]
    assert tensors(cfg, "output") == [("embedding", "TYPE_FP32", [32])]
    assert_unknown_model_is_not_found(runtime.address, runtime.grpc_address)

    base = RuntimeConfig.load(runtime.config_path)
    changed = base.model_copy(deep=True)
    changed.batching = BatchingConfig(max_batch_size=4, max_queue_delay_seconds=0.0125)
    runtime.write_config(changed)
    try:
        wait_for(4, 12500)
    finally:
        runtime.write_config(base)
    wait_for(8, 5000)


def test_liveness_follows_the_model_process(runtime: RuntimeProcess) -> None:
    """A stopped (hung) model process makes the front ends answer live 503, so the kubelet restarts
    the pod; it is live again once the model process runs."""
    assert runtime.get("/v2/health/live") == (200, b'{"live":true}')
    os.kill(runtime.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        status, body = runtime.get("/v2/health/live", timeout=10)
        took = time.monotonic() - t0
    finally:
        os.kill(runtime.pid, signal.SIGCONT)
    assert status == 503 and b'"live":false' in body and 2.5 < took < 5.0, (status, body, took)
    assert runtime.get("/v2/health/live")[0] == 200
    assert runtime.get("/v2/health/ready")[0] == 200


def test_sigterm_stops_every_front_end(tmp_path: Path) -> None:
    cfg = tiny_hf_config(tiny_hf_dir(tmp_path / "tiny"), server={"http_workers": 2})
    rt = RuntimeProcess(cfg, ready_timeout=90)
    with rt:
        pids = list(_frontends(rt).values())
        code = rt.stop(timeout=60)
        assert code == 0, rt.tail()
    for pid in pids:
        deadline = time.monotonic() + 5
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, f"front end {pid} outlived the model process"
            time.sleep(0.1)
