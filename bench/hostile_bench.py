"""Hostile request bodies against a real runtime: what one refused request costs the server.

``.venv/bin/python bench/hostile_bench.py`` -> ``bench/results/hostile.json``.

For each case below, sent alone to ``kubeinfer-runtime serve`` with the tiny BERT of
``hack/devtools/runtime_tiny.py`` and the default ``limits`` (16 MiB of tensor bytes, 1M elements), in
one process and with ``--workers`` HTTP front-end processes (``server.httpWorkers``):

- the answer (status, or the gRPC code, and the start of its message) and the seconds it took;
- ``rss_peak_mb``: the largest growth of the resident memory summed over the pod's processes (the
  model process and its front ends, ``psutil``, sampled every 5 ms) over the median before the request;
- ``rss_after_mb``: that growth half a second after the answer (memory left behind);
- ``live_max_ms``: the slowest ``GET /v2/health/live`` of a client asking it back to back (on its own
  keep-alive connection) while the request was in flight, and ``live_not_200`` how many were not 200
  (with front ends: 503 when the model process did not answer within 3 s);
- ``wire_bytes``: the bytes on the wire (the gzip body's compressed size).

Cases: ``gzip-16M`` (a 64 MB JSON of 16M one-character strings sent gzipped), ``json-13M`` (52 MB JSON
of 13M one-character strings), ``json-13M-shape1`` (the same data under a declared shape of [1]),
``json-16M-floats`` (64 MB of FP32 numbers), ``binary-15.7M`` (15.7M empty BYTES elements in the binary
extension), ``grpc-raw-15.7M`` (the same as gRPC ``raw_input_contents``), ``grpc-typed-15.7M`` (as 15.7M
empty ``bytes_contents``), ``grpc-raw-4M`` and ``grpc-typed-4M`` (4M empty elements: a message within
gRPC's cap, over the element limit) and ``grpc-typed-overflow`` (``contents`` of shape [2**62, 4]).

Memory is what matters here, not time, but the liveness latency is a time: like every benchmark it
runs under ``bench/quiet.py`` (``--noisy`` on a busy machine; such a result is never committed).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
# ROOT for hack.devtools; bench/ for quiet
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import quiet  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402

from hack.devtools.runtime_proc import RuntimeProcess  # noqa: E402
from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir  # noqa: E402

INFER = "/v2/models/tiny/infer"
SAMPLE_SECONDS = 0.005


def progress(message: str) -> None:
    """One progress line on stderr."""
    print(f"hostile_bench: {message}", file=sys.stderr, flush=True)


def json_strings(count: int, shape: list[int], char: bytes = b"a") -> bytes:
    """A v2 JSON body of ``count`` strings of ``char`` under a declared ``shape``."""
    item = b'"' + char + b'"'
    data = b",".join([item] * count)
    head = b'{"inputs":[{"name":"text","datatype":"BYTES","shape":' + json.dumps(shape).encode()
    return head + b',"data":[' + data + b"]}]}"


def json_floats(count: int) -> bytes:
    """A v2 JSON body of ``count`` FP32 numbers (1.5)."""
    data = b",".join([b"1.5"] * count)
    return b'{"inputs":[{"name":"text","datatype":"FP32","shape":[%d],"data":[%s]}]}' % (count, data)


def binary_empty(count: int) -> tuple[bytes, dict[str, str]]:
    """A binary-extension body of ``count`` empty BYTES elements, and its headers."""
    raw = struct.pack("<I", 0) * count
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [count],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    ).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "content-type": "application/octet-stream",
    }
    return header + raw, headers


def grpc_request(kind: str, count: int = 15_700_000) -> bytes:
    """A serialized ``ModelInferRequest`` for the gRPC cases: ``count`` empty BYTES elements."""
    request = service_pb2.ModelInferRequest(model_name="tiny")
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "text", "BYTES"
    if kind == "raw":
        tensor.shape.append(count)
        request.raw_input_contents.append(struct.pack("<I", 0) * count)
    elif kind == "typed":
        tensor.shape.append(count)
        tensor.contents.bytes_contents.extend([b""] * count)
    else:  # the product of the shape overflows int64
        tensor.datatype = "FP32"
        tensor.shape.extend([2**62, 4])  # no contents: the product overflows to 0
    return bytes(request.SerializeToString())


class Case:
    """One hostile request: how it is sent (``send`` returns the answer's status and message)."""

    def __init__(self, name: str, wire: int, send: Callable[[RuntimeProcess], tuple[str, str]]) -> None:
        self.name, self.wire, self.send = name, wire, send


def rest_case(name: str, body: bytes, headers: dict[str, str], wire: int | None = None) -> Case:
    def send(rt: RuntimeProcess) -> tuple[str, str]:
        r = httpx.post(rt.url + INFER, content=body, headers=headers, timeout=300)
        return str(r.status_code), r.text[:200]

    return Case(name, wire or len(body), send)


def grpc_case(name: str, message: bytes) -> Case:
    def send(rt: RuntimeProcess) -> tuple[str, str]:
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        with grpc.insecure_channel(rt.grpc_address, options=options) as channel:
            call = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            try:
                call(message, timeout=300)
            except grpc.RpcError as exc:
                return str(exc.code()), str(exc.details())[:200]
            return "OK", ""

    return Case(name, len(message), send)


def cases(selected: set[str] | None) -> list[Case]:
    """The cases, built on demand (each body is tens of MB)."""
    builders: dict[str, Callable[[], Case]] = {
        "gzip-16M": lambda: _gzip_case(),
        "json-13M": lambda: rest_case("json-13M", json_strings(13_000_000, [13_000_000]), {}),
        "json-13M-shape1": lambda: rest_case("json-13M-shape1", json_strings(13_000_000, [1]), {}),
        "json-16M-floats": lambda: rest_case("json-16M-floats", json_floats(16_000_000), {}),
        "binary-15.7M": lambda: rest_case("binary-15.7M", *binary_empty(15_700_000)),
        "grpc-raw-15.7M": lambda: grpc_case("grpc-raw-15.7M", grpc_request("raw")),
        "grpc-typed-15.7M": lambda: grpc_case("grpc-typed-15.7M", grpc_request("typed")),
        "grpc-raw-4M": lambda: grpc_case("grpc-raw-4M", grpc_request("raw", 4_000_000)),
        "grpc-typed-4M": lambda: grpc_case("grpc-typed-4M", grpc_request("typed", 4_000_000)),
        "grpc-typed-overflow": lambda: grpc_case("grpc-typed-overflow", grpc_request("overflow")),
    }
    return [build() for name, build in builders.items() if selected is None or name in selected]


def _gzip_case() -> Case:
    body = gzip.compress(json_strings(16_000_000, [16_000_000]), compresslevel=9)
    return rest_case("gzip-16M", body, {"content-encoding": "gzip"})


def pod_rss(root: psutil.Process) -> int:
    """Resident bytes of ``root`` and its descendants."""
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


def measure(rt: RuntimeProcess, case: Case) -> dict[str, Any]:
    """Send ``case`` once; the RSS and liveness figures while it runs."""
    root = psutil.Process(rt.pid)
    before = statistics.median(pod_rss(root) for _ in range(20))
    samples: list[int] = []
    lives: list[tuple[float, float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(pod_rss(root))
            time.sleep(SAMPLE_SECONDS)

    def live() -> None:
        with httpx.Client(base_url=rt.url, timeout=60) as client:
            while not stop.is_set():
                t0 = time.monotonic()
                status = client.get("/v2/health/live").status_code
                lives.append((t0, time.monotonic() - t0, status))

    threads = [threading.Thread(target=sample), threading.Thread(target=live)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    status, message = case.send(rt)
    t1 = time.monotonic()
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    after = statistics.median(pod_rss(root) for _ in range(5))
    during = [(lat, code) for start, lat, code in lives if start + lat >= t0 and start <= t1]
    return {
        "case": case.name,
        "wire_bytes": case.wire,
        "status": status,
        "message": message,
        "seconds": round(t1 - t0, 3),
        "rss_peak_mb": round((max(samples) - before) / 1e6, 1),
        "rss_after_mb": round((after - before) / 1e6, 1),
        "live_max_ms": round(max((lat for lat, _ in during), default=0.0) * 1000, 1),
        "live_checks": len(during),
        "live_not_200": sum(code != 200 for _, code in during),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="front-end process counts, comma-separated")
    parser.add_argument("--cases", default="", help="case names, comma-separated (default: all)")
    parser.add_argument("--out", default="bench/results/hostile.json")
    quiet.add_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run every case against each front-end count; write ``--out``."""
    args = parse_args(argv)
    selected = set(args.cases.split(",")) if args.cases else None
    results: dict[str, list[dict[str, Any]]] = {}
    with quiet.quiet_run("hostile_bench", args, log=progress) as run:
        with tempfile.TemporaryDirectory(prefix="kubeinfer-hostile-") as tmp:
            model = tiny_hf_dir(Path(tmp) / "tiny")
            for workers in (int(w) for w in args.workers.split(",")):
                cfg = tiny_hf_config(model, server={"http_workers": workers})
                rows = results[str(workers)] = []
                with RuntimeProcess(cfg, ready_timeout=120) as rt:
                    for case in cases(selected):
                        row = measure(rt, case)
                        progress(f"workers={workers} {json.dumps(row)}")
                        rows.append(row)
        run.write(
            {
                "workers": results,
                "command": ["bench/hostile_bench.py", *(sys.argv[1:] if argv is None else argv)],
            },
            args.out,
            log=progress,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
