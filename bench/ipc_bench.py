"""IPC benchmark of ``server.http_workers``: CPU per call of the front-end <-> model-process messages.

``.venv/bin/python bench/ipc_bench.py [--calls N] [--concurrency C]`` -> ``bench/results/ipc.json``.

An echo ``ModelEndpoint`` (``kubeinfer.runtime.ipc``) in one process, a ``ModelClient`` in this one,
``--calls`` infer messages of one BYTES row each with ``--concurrency`` in flight; reported: calls per
second, the endpoint process's CPU per call (its share of the model process's event loop) and the
client's (its share of a front end's), medians of ``--repeats`` runs.

Like every benchmark that measures, it runs under ``bench/quiet.py``: the machine-wide bench lock, and
no measurement while the 1-minute load average is over 0.5 unless ``--noisy`` (the JSON then says
``"noisy": true``); ``machine`` in the JSON records the CPU, the cores and the load before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import quiet

ROOT = Path(__file__).resolve().parents[1]
ADDRESS = f"ipc://@kubeinfer-ipc-bench-{os.getpid()}"


def _server(queue: Any) -> None:
    import uvloop
    from kubeinfer.runtime import ipc

    async def main() -> None:
        stop = asyncio.Event()

        async def echo(header: ipc.Header, frames: list[Any]) -> tuple[ipc.Header, list[Any]] | None:
            if header.op == "stop":
                stop.set()
                return None
            return ipc.Header(op="reply", tensors=header.tensors), frames

        endpoint = ipc.ModelEndpoint(ADDRESS, echo)
        task = asyncio.create_task(endpoint.run())
        queue.put("up")
        cpu0 = time.process_time()
        await stop.wait()
        queue.put(time.process_time() - cpu0)
        task.cancel()
        endpoint.close()

    uvloop.run(main())


def _client(calls: int, concurrency: int) -> tuple[float, float]:
    import uvloop
    from kubeinfer.runtime import ipc

    async def main() -> tuple[float, float]:
        client = ipc.ModelClient(ADDRESS)
        await client.start()
        specs, frames = ipc.encode_tensors({"text": np.array([b"A man is playing a guitar."], dtype=object)})
        sem = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                await client.call(ipc.Header(op="infer", tensors=specs, received=1.0), frames)

        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one() for _ in range(calls)))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        await client.send(ipc.Header(op="stop"))
        await asyncio.sleep(0.1)
        await client.close()
        return elapsed, cpu

    result: tuple[float, float] = uvloop.run(main())
    return result


def run_once(calls: int, concurrency: int) -> dict[str, float]:
    """One endpoint process, one client run."""
    queue: Any = mp.Queue()
    proc = mp.Process(target=_server, args=(queue,))
    proc.start()
    queue.get(timeout=30)
    elapsed, client_cpu = _client(calls, concurrency)
    server_cpu = queue.get(timeout=30)
    proc.join(10)
    return {
        "calls_per_second": calls / elapsed,
        "endpoint_cpu_us_per_call": server_cpu / calls * 1e6,
        "client_cpu_us_per_call": client_cpu / calls * 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "ipc.json"))
    quiet.add_arguments(parser)
    args = parser.parse_args()
    with quiet.quiet_run("ipc_bench", args) as run:
        runs = [run_once(args.calls, args.concurrency) for _ in range(args.repeats)]
        result: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        result.update(
            runs=runs,
            calls=args.calls,
            concurrency=args.concurrency,
            command=["bench/ipc_bench.py", f"--calls={args.calls}", f"--concurrency={args.concurrency}"],
        )
        result = run.stamp(result)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(
        f"{result['calls_per_second']:.0f} calls/s, endpoint "
        f"{result['endpoint_cpu_us_per_call']:.1f} µs/call, client "
        f"{result['client_cpu_us_per_call']:.1f} µs/call (median of {args.repeats}) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
