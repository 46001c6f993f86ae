"""kubeinfer against the servers its users compare it with, like with like: each peer at the best of its
documented settings, and on the same engine and model file as kubeinfer where it can be.

    make bench-peers                          # installs the peers' venvs, then runs this (35 to 45 minutes)
    .venv/bin/python bench/peers_bench.py     # -> bench/results/peers.json
    .venv/bin/python bench/peers_bench.py --quick --noisy --out /tmp/peers.json   # smoke: about 5 minutes

**Servers** (``SERVERS``), each alone on the machine, serving the bundled all-MiniLM-L6-v2 (mean
pooling, L2-normalized, 256 tokens at most), in precision-matched pairs (``PAIRS``):

- **int8, the same graph file**: ``kubeinfer`` (``kubeinfer-runtime serve``, engine ``onnxruntime``,
  ``int8-dynamic``, max batch 32, the default queue delay and thread count, and the instance count the
  operator gives a replica of this machine's CPUs without a GPU (``default_instances``: two on two
  cores): its best configuration at cosine >= 0.99 to fp32) against ``mlserver-onnx`` (MLServer 1.7.1,
  ``.cache/peer-mlserver``, with the runtime class a user writes around an ONNX graph,
  ``bench/peers/mlserver_onnx.py``) and
  ``litserve-onnx`` (LitServe 0.2.19, ``.cache/peer-litserve``, its ``LitAPI`` and batching,
  ``bench/peers/litserve_onnx.py``). Both peers open the very file kubeinfer serves (its graph cache:
  ``hf_onnx.int8_dynamic_path``, made by loading the model in this process first) with the same
  tokenizer and session options, on kubeinfer's intra-op thread count (``default_threads``: the CPUs
  less one). infinity-emb is not in this pair: its ONNX engine (optimum's
  ``ORTModelForFeatureExtraction``, infinity-emb 0.0.78's ``transformer/embedder/optimum.py``) runs a
  graph for its ``last_hidden_state`` and pools it itself, and kubeinfer's graph ends in its pooled,
  normalized ``embedding``: infinity cannot serve that file.
- **torch fp32**: ``kubeinfer-torch`` (the same runtime on its torch engine) against ``mlserver-torch``
  (MLServer with ``bench/peers/mlserver_minilm.py``: the same tokenizer, torch and pooling as
  kubeinfer's torch engine) and ``infinity-torch`` (infinity-emb 0.0.78, ``infinity_emb v2``, torch
  engine on the CPU).
- Not in the default order (``--order`` adds them): ``kubeinfer-fp32`` (ONNX Runtime fp32),
  ``kubeinfer-2threads`` (``kubeinfer`` with two intra-op threads and one instance) and
  ``kubeinfer-1instance`` (``kubeinfer`` with ``instances: 1``, one batch computed at a time, the
  default before the operator's CPU default; its ratios to ``kubeinfer`` and the int8 peers are in
  ``ratios``).

**Each peer at its best** (``peer_settings``, ``search_peer``): before the measured visits, each peer
of ``--order`` is started once per setting of a short grid over the settings its documentation names
(MLServer: ``parallel_workers`` 0, 1 (its default) and 2, ``max_batch_size``, ``max_batch_time``, for
torch also torch's own thread count; LitServe: ``workers_per_device``, ``max_batch_size``,
``batch_timeout``; infinity: ``--batch-size`` and torch's thread count), and each setting gets a coarse
rate probe per text kind: the ramp of the search below with ``--search-seconds`` points, no
bisection and a 1 s warmup. Per text kind, the setting with the highest rate at the SLO goes on to the
measured visits, with the next best when its probe came within one ramp step (x1.4) of it
(``contenders``: 3 s points cannot tell such settings apart; MLServer's torch workers 1 and 2 swapped
places between runs); every setting tried and its figures are in the JSON (``search``). ``--quick``
tries only the first setting of each grid.

**Texts** (``TEXT_KINDS``): ``sentences``, one random held-out sentence per request (the sentences of
``make bench-runtime``), and ``passages``, held-out sentences joined until each has at least 100
MiniLM tokens. Every server gets the same requests in the same order: v2 JSON in, v2 JSON out for
kubeinfer, MLServer and LitServe (``/v2/models/minilm/infer``, input ``text`` BYTES [1], no binary
extension, which MLServer does not speak); OpenAI ``/embeddings`` for infinity (its only API).

**Same answers**: each server start (search or visit) first embeds 32 sentences and 8 passages, one
request each, and compares them with sentence-transformers' in this process and with kubeinfer's own
answers for the same texts (its model loaded in this process as the runtime loads it, one text per
call: the int8 graph for the int8 pair, the torch engine for fp32): ``same_model_check``, recorded; a
server under cosine 0.999 to kubeinfer's answers is reported, not hidden.

**Order** (``--order``, default ``DEFAULT_ORDER``): the measured visits run one server at a time,
each starting it (a peer once per contending setting, each with the text kinds it contends for),
checking its answers, warming it up, finding its highest rate at P99 <= 100 ms,
then stopping it. kubeinfer is visited first and last, so a drift of the machine shows as a difference
between its own visits; a server's figure is the median of its visits (for a peer visited with two
settings, the better setting's). Every visit records the machine's load average at its start and end.

**The search** (``max_slo_rate``): open-loop Poisson arrivals (``runtime_bench.run_rate``: seeded,
latency from the scheduled arrival, the same aiohttp client), from ``--start-rate`` (or 0.7 of the
server's previous visit or of its best setting's probe) up by x1.4 per ``--step-seconds`` point until a
point misses the SLO (P99 >= 100 ms or under 99 % answered 200), then ``--refine`` rounds of bisection
at geometric midpoints, ``--refine-seconds`` each. A start that misses halves the rate until one
passes. Every point keeps P50, P99, the throughput, errors, and the server's CPU seconds per request
(its whole process tree, psutil). The client's own garbage collector is paused during each point
(``quiet.collector_paused``): this process holds sentence-transformers, and a full collection of it
stopped the client's event loop 136 to 152 ms, read as the server's P99.

**Figures** (``summarize``): per text kind, each server's highest rate at the SLO (the median of its
visits with its best setting, and each visit's), the P99 at every rate it was offered
(``p99_by_rate``: the tail beside the peers'), the setting it ran with, each kubeinfer / peer ratio,
and per pair the ratio of kubeinfer to the best peer of its precision (``pairs``). The script reports;
it asserts no target.

Like every benchmark that measures, it runs under ``bench/quiet.py`` (the bench lock; no measurement
over a 1-minute load of 0.5 unless ``--noisy``, and then the JSON says so).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# ROOT for hack.*; bench/ for quiet and runtime_bench, also when a test loads this file by path
for _path in (str(ROOT), str(ROOT / "bench")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import quiet  # noqa: E402
import runtime_bench as rb  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "peers.json"
MODEL = "minilm"
SLO_P99_SECONDS = rb.SLO_P99_SECONDS
#: Tokens a passage has at least (MiniLM's tokenizer, special tokens included).
PASSAGE_TOKENS = 100
TEXT_KINDS = ("sentences", "passages")
#: The venvs ``make bench-peers`` installs (``hack/setup.sh --peers``, from requirements/NAME.txt).
PEER_VENVS = {
    "mlserver": ROOT / ".cache" / "peer-mlserver",
    "litserve": ROOT / ".cache" / "peer-litserve",
    "infinity": ROOT / ".cache" / "peer-infinity",
}
#: kubeinfer's configurations: (engine, quantization mode, intra-op threads or None for the runtime's
#: default: the CPUs less one, so one core stays for the event loop, HTTP and tokenization; instances:
#: ``instances``, batches of the one queue computed at once, each on that many threads, or None for the
#: operator's default on a replica of this machine's CPUs without a GPU, ``default_instances``).
KUBEINFER: dict[str, tuple[str, str, int | None, int | None]] = {
    "kubeinfer": ("onnxruntime", "int8-dynamic", None, None),
    "kubeinfer-fp32": ("onnxruntime", "none", None, None),
    "kubeinfer-torch": ("torch", "none", None, None),
    "kubeinfer-2threads": ("onnxruntime", "int8-dynamic", 2, 1),
    "kubeinfer-1instance": ("onnxruntime", "int8-dynamic", None, 1),
}


def default_instances() -> int:
    """The instance count the operator gives a replica of this machine's CPUs (``available_cpus``) and no
    GPU (``InferenceServiceSpec.instances_in_force``): what a user of the bundled model gets on a node
    like this one."""
    from kubeinfer.operator.api import InferenceServiceSpec
    from kubeinfer.runtime.models.device import available_cpus

    spec = InferenceServiceSpec.model_validate({"resources": {"gpus": 0, "cpu": str(available_cpus())}})
    return spec.instances_in_force()


def instances_of(name: str) -> int:
    """The instance count of kubeinfer configuration ``name`` (one of ``KUBEINFER``)."""
    instances = KUBEINFER[name][3]
    return default_instances() if instances is None else instances


@dataclass(frozen=True)
class Peer:
    """A peer server: which venv's server (``PEER_VENVS``) and which engine it runs: ``onnxruntime``
    (kubeinfer's int8 graph file) or ``torch`` (fp32)."""

    server: str
    engine: str


PEERS = {
    "mlserver-onnx": Peer("mlserver", "onnxruntime"),
    "litserve-onnx": Peer("litserve", "onnxruntime"),
    "mlserver-torch": Peer("mlserver", "torch"),
    "infinity-torch": Peer("infinity", "torch"),
}
SERVERS = (*KUBEINFER, *PEERS)
#: Precision-matched pairs: (name, the kubeinfer server, its peers on the same precision and engine kind).
PAIRS = (
    ("int8", "kubeinfer", ("mlserver-onnx", "litserve-onnx")),
    ("torch_fp32", "kubeinfer-torch", ("mlserver-torch", "infinity-torch")),
)
#: The kubeinfer configuration whose answers a server's are compared with (``same_model_check``).
KUBEINFER_REFERENCE = {
    **{
        name: "kubeinfer" if mode == "int8-dynamic" else "kubeinfer-torch"
        for name, (_, mode, _t, _i) in KUBEINFER.items()
    },
    **{
        name: "kubeinfer" if peer.engine == "onnxruntime" else "kubeinfer-torch"
        for name, peer in PEERS.items()
    },
}
DEFAULT_ORDER = (
    "kubeinfer", "mlserver-onnx", "litserve-onnx", "kubeinfer-torch", "mlserver-torch", "infinity-torch",
    "kubeinfer",
)  # fmt: skip
#: ``--quick``: every server once.
QUICK_ORDER = DEFAULT_ORDER[:-1]
#: Seconds of warmup before each text kind of a setting's probe (the probe is coarse: a short warmup).
SEARCH_WARMUP_SECONDS = 1.0
#: Rate multiplier between two points of the ramp.
STEP = 1.4
#: A server's answers match kubeinfer's when the cosine of every probed text is at least this.
SAME_ANSWER_COSINE = 0.999
#: The ratios of each kubeinfer server to each peer of its pair: (name, numerator, denominator).
RATIOS = (
    *(
        (f"{kube.replace('-', '_')}_to_{peer.replace('-', '_')}", kube, peer)
        for _, kube, peers in PAIRS
        for peer in peers
    ),
    ("kubeinfer_2threads_to_kubeinfer", "kubeinfer-2threads", "kubeinfer"),
    ("kubeinfer_to_kubeinfer_1instance", "kubeinfer", "kubeinfer-1instance"),
    *(
        (f"kubeinfer_1instance_to_{peer.replace('-', '_')}", "kubeinfer-1instance", peer)
        for peer in PAIRS[0][2]
    ),
)


def peer_settings(name: str, threads: int) -> list[dict[str, Any]]:
    """The settings ``search_peer`` tries for peer ``name`` (one of ``PEERS``), the first being the one
    ``--quick`` uses; ``threads`` is kubeinfer's intra-op thread count, which the ONNX Runtime peers
    use as it does. A ``threads`` of None in a setting is the library's own default (torch: one
    thread per core). Raises ``KeyError`` for an unknown peer.

    - MLServer: ``parallel_workers`` (0: inference in the server's process; 1, its default: one worker
      process; 2), ``max_batch_size`` and ``max_batch_time`` (seconds) of its adaptive batching;
      torch also at torch's own thread count.
    - LitServe: ``workers_per_device``, ``max_batch_size``, ``batch_timeout`` (seconds).
    - infinity: ``batch_size`` and torch's thread count.
    """
    peer = PEERS[name]
    if peer.server == "mlserver":
        grid = [
            (0, 16, 0.01), (0, 32, 0.005), (0, 8, 0.002), (1, 16, 0.01), (2, 16, 0.01),
        ]  # fmt: skip
        out: list[dict[str, Any]] = [
            {"parallel_workers": w, "max_batch_size": b, "max_batch_time": t, "threads": threads}
            for w, b, t in grid
        ]
        if peer.engine == "torch":
            out.append({"parallel_workers": 0, "max_batch_size": 16, "max_batch_time": 0.01, "threads": None})
        return out
    if peer.server == "litserve":
        grid = [(1, 16, 0.01), (1, 32, 0.005), (1, 8, 0.002), (2, 16, 0.01)]
        return [
            {"workers_per_device": w, "max_batch_size": b, "batch_timeout": t, "threads": threads}
            for w, b, t in grid
        ]
    return [{"batch_size": b, "threads": t} for b, t in ((32, threads), (8, threads), (32, None), (8, None))]


def progress(message: str) -> None:
    """One progress line on stderr, flushed (the benchmark runs for minutes)."""
    print(f"[peers {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- texts and requests ---------------------------------------------------------------------------


def make_passages(
    sentences: Sequence[str], count_tokens: Callable[[str], int], count: int, seed: int
) -> list[str]:
    """``count`` passages, each random sentences of ``sentences`` joined by a space until
    ``count_tokens(passage) >= PASSAGE_TOKENS``; deterministic for a ``seed``. Raises ``ValueError``
    when ``sentences`` is empty."""
    if not sentences:
        raise ValueError("make_passages: no sentences")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        parts: list[str] = []
        while not parts or count_tokens(" ".join(parts)) < PASSAGE_TOKENS:
            parts.append(sentences[int(rng.integers(len(sentences)))])
        out.append(" ".join(parts))
    return out


def v2_body(text: str) -> bytes:
    """A v2 (Open Inference Protocol) JSON request: input ``text`` BYTES [1], JSON outputs."""
    return json.dumps(
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}
    ).encode()


def openai_body(text: str) -> bytes:
    """An OpenAI embeddings request (``POST /embeddings``) of one text for the model ``MODEL``."""
    return json.dumps({"model": MODEL, "input": [text]}).encode()


def v2_embeddings(answer: dict[str, Any]) -> np.ndarray:
    """The ``embedding`` output of a v2 JSON response as float32 [rows, dim]; ``KeyError`` without it."""
    out = next(o for o in answer["outputs"] if o["name"] == "embedding")
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def openai_embeddings(answer: dict[str, Any]) -> np.ndarray:
    """The vectors of an OpenAI embeddings response, in input order, float32 [rows, dim]."""
    rows = sorted(answer["data"], key=lambda d: d["index"])
    return np.asarray([r["embedding"] for r in rows], dtype=np.float32)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two float arrays [rows, dim]: float64 [rows]."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return np.asarray((a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)))


# --- the servers ----------------------------------------------------------------------------------


#: MLServer's runtime class per engine (files of bench/peers/, on the server's PYTHONPATH).
MLSERVER_CLASS = {"torch": "mlserver_minilm.MiniLM", "onnxruntime": "mlserver_onnx.MiniLMOnnx"}


def mlserver_folder(
    folder: Path, ports: dict[str, int], engine: str, model_path: Path, graph: Path, setting: dict[str, Any]
) -> Path:
    """Write MLServer's ``settings.json`` (host 127.0.0.1, ``ports``: http, grpc, metrics, and
    ``setting["parallel_workers"]``) and the model's ``minilm/model-settings.json`` (the runtime class
    of ``engine``, ``MLSERVER_CLASS``; adaptive batching ``setting["max_batch_size"]`` rows /
    ``setting["max_batch_time"]`` seconds; ``parameters.uri``: ``model_path`` for torch, ``graph`` for
    onnxruntime, whose class also gets ``parameters.extra`` ``tokenizer`` = ``model_path`` and
    ``threads`` = ``setting["threads"]``) under ``folder``; returns ``folder``, the argument of
    ``mlserver start``. Raises ``KeyError`` for an engine without a class."""
    (folder / MODEL).mkdir(parents=True, exist_ok=True)
    settings = {
        "host": "127.0.0.1",
        "http_port": ports["http"],
        "grpc_port": ports["grpc"],
        "metrics_port": ports["metrics"],
        "parallel_workers": setting["parallel_workers"],
        "debug": False,
    }
    (folder / "settings.json").write_text(json.dumps(settings, indent=1))
    parameters: dict[str, Any] = {"uri": str(model_path)}
    if engine == "onnxruntime":
        parameters = {
            "uri": str(graph),
            "extra": {"tokenizer": str(model_path), "threads": setting["threads"]},
        }
    model = {
        "name": MODEL,
        "implementation": MLSERVER_CLASS[engine],
        "max_batch_size": setting["max_batch_size"],
        "max_batch_time": setting["max_batch_time"],
        "parameters": parameters,
    }
    (folder / MODEL / "model-settings.json").write_text(json.dumps(model, indent=1))
    return folder


def litserve_command(
    venv: Path, graph: Path, model_path: Path, port: int, setting: dict[str, Any]
) -> list[str]:
    """The command line of ``bench/peers/litserve_onnx.py`` in ``venv`` serving ``graph`` (tokenizer of
    ``model_path``) on 127.0.0.1:``port`` with ``setting``'s ``threads``, ``max_batch_size``,
    ``batch_timeout`` and ``workers_per_device``."""
    return [
        str(venv / "bin" / "python"), str(ROOT / "bench" / "peers" / "litserve_onnx.py"),
        "--graph", str(graph),
        "--tokenizer", str(model_path),
        "--threads", str(setting["threads"]),
        "--port", str(port),
        "--max-batch-size", str(setting["max_batch_size"]),
        "--batch-timeout", str(setting["batch_timeout"]),
        "--workers-per-device", str(setting["workers_per_device"]),
    ]  # fmt: skip


def infinity_command(venv: Path, model_path: Path, port: int, batch: int) -> list[str]:
    """The command line of ``infinity_emb v2`` serving ``model_path`` as ``MODEL`` on 127.0.0.1:``port``
    with the torch engine on the CPU and ``batch`` rows per batch."""
    return [
        str(venv / "bin" / "infinity_emb"), "v2",
        "--model-id", str(model_path),
        "--served-model-name", MODEL,
        "--engine", "torch",
        "--device", "cpu",
        "--batch-size", str(batch),
        "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip


def torch_threads_env(threads: int | None) -> dict[str, str]:
    """The environment that sets torch's intra-op threads (``OMP_NUM_THREADS``, read at import), none
    for torch's own default."""
    return {} if threads is None else {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


@dataclass(frozen=True)
class Endpoint:
    """Where a started server takes requests: its inference URL, the body of one text, how to read
    the vectors back, and the pid of its top process (its tree is what ``server_cpu`` counts)."""

    url: str
    body: Callable[[str], bytes]
    vectors: Callable[[dict[str, Any]], np.ndarray]
    pid: int


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    """Poll ``url`` until it answers 200; ``RuntimeError`` with the log's tail when the process exits
    or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(url, timeout=2) as answer,
        ):
            if answer.status == 200:
                return
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    state = (
        f"exited with {proc.returncode}" if proc.poll() is not None else f"not ready after {timeout:.0f} s"
    )
    raise RuntimeError(f"{' '.join(map(str, proc.args))}: {state} ({url}); log tail:\n{tail}")  # type: ignore[arg-type]


@contextlib.contextmanager
def peer_process(
    cmd: list[str], ready_url: str, log: Path, env: dict[str, str], timeout: float
) -> Iterator[int]:
    """Start ``cmd`` in its own process group (output to ``log``, in ``log``'s folder: never the
    repository root, whose ``operator/`` would shadow the standard library's module in the peer's
    worker processes), wait for ``ready_url``; yield its pid; stop the whole group on exit (SIGTERM,
    then SIGKILL after 20 s)."""
    from hack.procs import die_with_parent

    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=log.parent,
            start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip
    try:
        _wait_http(ready_url, proc, timeout, log)
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


#: Environment of the peers: no telemetry, no Hub lookups (the model is a local directory).
PEER_ENV = {"HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}


@contextlib.contextmanager
def start_server(
    name: str,
    setting: dict[str, Any] | None,
    model_path: Path,
    graph: Path,
    workdir: Path,
    args: argparse.Namespace,
) -> Iterator[tuple[Endpoint, dict[str, Any]]]:
    """Start server ``name`` (one of ``SERVERS``) serving the bundled MiniLM; a peer with ``setting``
    (one of ``peer_settings``; None for kubeinfer), the ONNX Runtime peers on the graph file ``graph``.
    Yield its ``Endpoint`` and what it reports about itself (configuration; for kubeinfer its load
    report). Raises ``RuntimeError`` (the server's log tail) when it does not start,
    ``FileNotFoundError`` when a peer's venv is missing (``make bench-peers`` installs it)."""
    from hack.procs import free_port

    log = workdir / f"{name}.log"
    if name in KUBEINFER:
        from kubeinfer.runtime.config import RuntimeConfig
        from kubeinfer.runtime.models.device import THREADS_ENV

        from hack.devtools.runtime_proc import RuntimeProcess

        engine, mode, threads, _ = KUBEINFER[name]
        instances = instances_of(name)
        cfg = RuntimeConfig.model_validate(
            {
                "model": {"engine": engine},
                "quantization": {"mode": mode},
                "device": "cpu",
                "batching": {"max_batch_size": 32, "max_queue_size": 4096},
                "instances": instances,
            }
        )
        env = {THREADS_ENV: str(threads)} if threads else {}
        with RuntimeProcess(cfg, log_path=log, env=env) as rt:
            about = {
                "engine": engine,
                "quantization": mode,
                "threads": threads or "default",
                "instances": instances,
                "batching": cfg.batching.model_dump(mode="json"),
                "report": _kubeinfer_report(rt.metrics_text()),
            }
            yield Endpoint(f"{rt.url}/v2/models/{MODEL}/infer", v2_body, v2_embeddings, rt.pid), about
        return
    peer = PEERS[name]
    if setting is None:
        raise ValueError(f"{name}: a peer needs a setting (peer_settings)")
    venv = PEER_VENVS[peer.server]
    if not (venv / "bin" / "python").exists():
        raise FileNotFoundError(f"{venv} is missing: `make bench-peers` installs the peers' venvs")
    about = {
        "setting": setting,
        "engine": peer.engine,
        "graph": str(graph) if peer.engine == "onnxruntime" else None,
    }
    threads_env = torch_threads_env(setting["threads"]) if peer.engine == "torch" else {}
    # the runtime classes import each other by name from bench/peers/
    env = {**PEER_ENV, **threads_env, "PYTHONPATH": str(ROOT / "bench" / "peers")}
    if peer.server == "mlserver":
        ports = {k: free_port() for k in ("http", "grpc", "metrics")}
        folder = mlserver_folder(workdir / name, ports, peer.engine, model_path, graph, setting)
        base = f"http://127.0.0.1:{ports['http']}"
        cmd = [str(venv / "bin" / "mlserver"), "start", str(folder)]
        with peer_process(cmd, f"{base}/v2/models/{MODEL}/ready", log, env, args.start_timeout) as pid:
            yield Endpoint(f"{base}/v2/models/{MODEL}/infer", v2_body, v2_embeddings, pid), about
        return
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    if peer.server == "litserve":
        cmd = litserve_command(venv, graph, model_path, port, setting)
        with peer_process(cmd, f"{base}/health", log, env, args.start_timeout) as pid:
            yield Endpoint(f"{base}/v2/models/{MODEL}/infer", v2_body, v2_embeddings, pid), about
        return
    cmd = infinity_command(venv, model_path, port, setting["batch_size"])
    with peer_process(cmd, f"{base}/health", log, env, args.start_timeout) as pid:
        yield Endpoint(f"{base}/embeddings", openai_body, openai_embeddings, pid), about


def _kubeinfer_report(metrics_text: str) -> dict[str, float]:
    """The runtime's load report from its /metrics text: the ``kubeinfer_quantization_*`` gauges
    (cosine and agreement against fp32), ``kubeinfer_model_load_seconds`` and
    ``kubeinfer_warmup_seconds`` of ``MODEL``, without the ``kubeinfer_`` prefix."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            name = sample.name.removeprefix("kubeinfer_")
            if sample.labels.get("model") == MODEL and name.startswith(
                ("quantization_", "model_load", "warmup")
            ):
                out[name] = sample.value
    return out


def peer_versions() -> dict[str, str | None]:
    """The installed version of each peer's server package (None when its venv is missing)."""
    out: dict[str, str | None] = {}
    for name, package in (("mlserver", "mlserver"), ("litserve", "litserve"), ("infinity", "infinity_emb")):
        python = PEER_VENVS[name] / "bin" / "python"
        if not python.exists():
            out[name] = None
            continue
        # -P: from the repository root, its operator/ would shadow the standard library module
        code = f"import importlib.metadata as m; print(m.version({package!r}))"
        done = subprocess.run([str(python), "-P", "-c", code], capture_output=True, text=True, check=False)
        out[name] = done.stdout.strip() or None
    return out


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` and all its descendants (0 for the
    ones that exited in between)."""
    import psutil

    total = 0.0
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = p.cpu_times()
            total += t.user + t.system
    return total


# --- the search -----------------------------------------------------------------------------------

Measure = Callable[[float, float], Awaitable[dict[str, Any]]]


async def max_slo_rate(
    measure: Measure, start: float, step_seconds: float, refine: int, refine_seconds: float
) -> dict[str, Any]:
    """The highest rate at which ``measure(rate, seconds)`` meets the SLO (``runtime_bench.meets_slo``).

    Ramp from ``start`` by x``STEP`` per ``step_seconds`` point until a point misses (a start that
    misses halves the rate, at most 6 times); then ``refine`` bisection rounds at the geometric
    midpoint of the highest passing and lowest missing rate, ``refine_seconds`` each. Returns
    ``{"max_slo_rps": rate or 0.0, "first_miss_rps": rate or None, "points": [...]}`` with every
    point in the order measured."""
    points: list[dict[str, Any]] = []

    async def at(rate: float, seconds: float) -> bool:
        point = await measure(rate, seconds)
        point["meets_slo"] = rb.meets_slo(point)
        points.append(point)
        return bool(point["meets_slo"])

    best, miss = 0.0, None
    rate = start
    for _ in range(7):
        if await at(rate, step_seconds):
            best = rate
            break
        miss, rate = rate, rate / 2
    if best:
        rate = best * STEP
        while await at(rate, step_seconds):
            best, rate = rate, rate * STEP
        miss = rate
        for _ in range(refine):
            mid = math.sqrt(best * miss)
            if await at(mid, refine_seconds):
                best = mid
            else:
                miss = mid
    return {"max_slo_rps": best, "first_miss_rps": miss, "points": points}


@dataclass(frozen=True)
class Search:
    """How one server start is measured: the text kinds, where each kind's search starts (req/s), the
    seconds of each ramp point, the bisection rounds and the seconds of each, the seconds of warmup
    before each kind's search."""

    kinds: tuple[str, ...]
    starts: dict[str, float]
    step_seconds: float
    refine: int
    refine_seconds: float
    warmup_seconds: float


def same_model_check(
    got: dict[str, np.ndarray], reference: dict[str, np.ndarray], kubeinfer: dict[str, np.ndarray]
) -> dict[str, dict[str, Any]]:
    """Per text kind, a server's vectors ``got`` (float32 [rows, dim]) against sentence-transformers'
    (``reference``) and kubeinfer's answers for the same texts (``kubeinfer``; a kind missing there is
    left out): the min and mean cosines, and ``same_as_kubeinfer`` (every cosine >=
    ``SAME_ANSWER_COSINE``)."""
    out: dict[str, dict[str, Any]] = {}
    for kind, vectors in got.items():
        st = cosines(vectors, reference[kind])
        entry: dict[str, Any] = {
            "cosine_min": float(st.min()), "cosine_mean": float(st.mean()), "texts": len(vectors),
        }  # fmt: skip
        if kind in kubeinfer:
            ki = cosines(vectors, kubeinfer[kind])
            entry["cosine_min_to_kubeinfer"] = float(ki.min())
            entry["same_as_kubeinfer"] = bool(ki.min() >= SAME_ANSWER_COSINE)
        out[kind] = entry
    return out


async def visit(
    name: str, endpoint: Endpoint, texts: dict[str, list[str]], references: dict[str, dict[str, np.ndarray]],
    search: Search, args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """One start of a server: the answers checked (``same_model_check``; ``references``: ``"st"`` and
    each kubeinfer configuration's in-process answers, ``kubeinfer_answers``), then for each kind of
    ``search.kinds`` a warmup and ``max_slo_rate``; the figures, with the machine's load average at
    the start and the end."""
    load_start = os.getloadavg()
    async with rb.client_session() as session:
        got = {}
        for kind in TEXT_KINDS:
            rows = []
            for text in texts[kind][: len(references["st"][kind])]:
                async with session.post(endpoint.url, data=endpoint.body(text)) as response:
                    body = await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"{name}: {response.status} {body[:300]!r}")
                    rows.append(endpoint.vectors(json.loads(body))[0])
            got[kind] = np.stack(rows)
        check = same_model_check(got, references["st"], references.get(KUBEINFER_REFERENCE[name], {}))
        progress(
            f"{name}: same answers? min cosine to sentence-transformers / to kubeinfer: "
            + ", ".join(
                f"{k} {v['cosine_min']:.4f} / {v.get('cosine_min_to_kubeinfer', math.nan):.4f}"
                for k, v in check.items()
            )
        )
        if not all(v.get("same_as_kubeinfer", True) for v in check.values()):
            progress(
                f"{name}: ANSWERS DIFFER from kubeinfer's (cosine < {SAME_ANSWER_COSINE}, same_model_check)"
            )
        result: dict[str, Any] = {"server": name, "same_model_check": check, "texts": {}}
        for kind in search.kinds:
            bodies = [endpoint.body(t) for t in texts[kind]]
            seed = args.seed

            async def measure(
                rate: float, seconds: float, bodies: list[bytes] = bodies, kind: str = kind
            ) -> dict[str, Any]:
                nonlocal seed
                seed += 1
                cpu0 = server_cpu(endpoint.pid)
                point = await rb.run_rate(session, endpoint.url, bodies, rate, seconds, seed)
                used = server_cpu(endpoint.pid) - cpu0
                point["server_cpu_seconds_per_request"] = used / point["ok"] if point["ok"] else None
                line = f"{name} {kind} {rate:7.1f}/s: P50 {point['p50_seconds'] * 1000:6.1f} ms, "
                line += (
                    f"P99 {point['p99_seconds'] * 1000:7.1f} ms, {point['ok']:.0f}/{point['requests']:.0f} ok"
                )
                progress(line)
                return point

            start = search.starts[kind]
            progress(f"{name} {kind}: warmup {search.warmup_seconds:.0f} s at {start / 2:.0f}/s")
            await rb.run_rate(session, endpoint.url, bodies, start / 2, search.warmup_seconds, args.seed)
            found = await max_slo_rate(
                measure, start, search.step_seconds, search.refine, search.refine_seconds
            )
            slo_ms = SLO_P99_SECONDS * 1000
            progress(f"{name} {kind}: highest rate at P99 <= {slo_ms:.0f} ms: {found['max_slo_rps']:.1f}/s")
            result["texts"][kind] = found
    result["loadavg_start"], result["loadavg_end"] = list(load_start), list(os.getloadavg())
    return result


def first_starts(args: argparse.Namespace) -> dict[str, float]:
    """Where a server's first search starts, per text kind: ``--start-rate`` for sentences, a quarter
    of it for passages."""
    return {"sentences": args.start_rate, "passages": args.start_rate / 4}


def best_settings(tried: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Per text kind, the index in ``tried`` (``search_peer``'s settings, each with ``texts``: kind ->
    ``{"max_slo_rps": ...}``) of the highest rate at the SLO; the first of equals; a kind no setting
    measured is left out."""
    return {kind: indices[0] for kind, indices in contenders(tried).items()}


def contenders(tried: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    """Per text kind, the indices in ``tried`` (as ``best_settings``) of the settings the measured
    visits run: the best probe's first, then the next best when its probe came within the probe's
    resolution of it (at least the best's rate / ``STEP``: one step of the ramp, where two settings'
    coarse 3 s points cannot tell them apart). A kind no setting measured is left out."""
    out: dict[str, list[int]] = {}
    for kind in TEXT_KINDS:
        probed = [(i, t["texts"][kind]) for i, t in enumerate(tried) if kind in t.get("texts", {})]
        rates = sorted(((found["max_slo_rps"], -i) for i, found in probed), reverse=True)
        if not rates:
            continue
        best = rates[0][0]
        out[kind] = [-rates[0][1]]
        if len(rates) > 1 and best > 0 and rates[1][0] * STEP >= best:
            out[kind].append(-rates[1][1])
    return out


def search_peer(
    name: str, settings: Sequence[dict[str, Any]], model_path: Path, graph: Path, workdir: Path,
    texts: dict[str, list[str]], references: dict[str, dict[str, np.ndarray]], args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """Start peer ``name`` once per setting of ``settings`` and probe each text kind coarsely (the ramp
    of ``max_slo_rate`` with ``--search-seconds`` points, no bisection; each setting's search starts at
    0.7 of the best rate so far). Returns ``{"settings": [{"setting", "ready_seconds", "texts", ...}],
    "best": {kind: index}, "contenders": {kind: [index, ...]}}`` (``contenders``: the settings the
    measured visits run); a setting whose server does not start is kept with its ``error``."""
    tried: list[dict[str, Any]] = []
    starts = first_starts(args)
    best_rate: dict[str, float] = {}
    for i, setting in enumerate(settings, 1):
        progress(f"search {name} {i}/{len(settings)}: {setting}")
        t0 = time.monotonic()
        try:
            with start_server(name, setting, model_path, graph, workdir, args) as (endpoint, _):
                ready = time.monotonic() - t0
                warmup = min(args.warmup_seconds, SEARCH_WARMUP_SECONDS)
                search = Search(TEXT_KINDS, dict(starts), args.search_seconds, 0, 0.0, warmup)
                result = asyncio.run(visit(name, endpoint, texts, references, search, args))
        except RuntimeError as exc:
            progress(f"search {name}: {setting} failed: {str(exc)[:500]}")
            tried.append({"setting": setting, "error": str(exc)[-3000:]})
            continue
        result.update({"setting": setting, "ready_seconds": ready, "visit_seconds": time.monotonic() - t0})
        tried.append(result)
        for kind, found in result["texts"].items():
            best_rate[kind] = max(best_rate.get(kind, 0.0), found["max_slo_rps"])
            if best_rate[kind]:
                starts[kind] = 0.7 * best_rate[kind]
    chosen = contenders(tried)
    for kind, indices in chosen.items():
        probes = [f"{tried[i]['setting']} ({tried[i]['texts'][kind]['max_slo_rps']:.0f}/s)" for i in indices]
        progress(f"search {name} {kind}: visits {' and '.join(probes)}")
    return {"settings": tried, "best": {k: v[0] for k, v in chosen.items()}, "contenders": chosen}


# --- the engine's own limit ------------------------------------------------------------------------

#: Rows per batch of the in-process limit (kubeinfer's max batch size).
LIMIT_BATCH = 32
#: Smaller batches timed alone beside it (``small_batch_seconds``): under P99 <= 100 ms a 100-token
#: passage's batches stay this small.
SMALL_BATCHES = (1, 2, 4, 8)


def _instances_rate(model: Any, batches: Sequence[np.ndarray], threads: int, instances: int) -> float:
    """Rows/s of ``batches`` run by ``instances`` threads at once on the one ``model`` (each taking the
    next batch when its last is done, as the runtime's executor threads take batches from its queue):
    all rows over the wall time from the first start to the last end."""
    import concurrent.futures

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(instances) as pool:
        list(pool.map(lambda batch: rb._timed_batch(model, batch, threads), batches))
    return sum(len(batch) for batch in batches) / (time.perf_counter() - t0)


def in_process_limits(
    names: Sequence[str], texts: dict[str, list[str]], repeats: int, seed: int
) -> dict[str, dict[str, Any]]:
    """For each kubeinfer configuration of ``names`` (with its default thread count, 1 on two cores): the
    model loaded in this process as the runtime loads it, warmed up, then ``repeats`` batches of
    ``LIMIT_BATCH`` random texts of each kind (``preprocess`` + ``execute``): ``{name: {kind:
    {"rows_per_second", "batch_seconds", "small_batch_seconds", "threads", "instances"}}}``
    (``small_batch_seconds``: the median seconds of a batch of each of ``SMALL_BATCHES`` rows, alone).
    One instance: one batch at a time, rows/s = ``LIMIT_BATCH`` / the median batch's seconds. Several:
    that many threads take the batches at once on the one model (``_instances_rate``), rows/s = all rows
    / the wall time, ``batch_seconds`` the median batch alone before them. That is the most a server of
    that engine could serve with full batches and nothing else on the machine: the ceiling of its served
    rate, whatever the front end does (with ``instances`` as the CPUs, every core computing)."""
    import gc

    from kubeinfer.runtime.models.device import default_threads

    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(n for n in names if n in KUBEINFER):
        engine, mode, threads, _ = KUBEINFER[name]
        instances = instances_of(name)
        t = threads or default_threads()
        progress(
            f"in process: {name} ({engine}, {mode}, {instances} x {t} thread(s)), "
            f"{repeats} batches of {LIMIT_BATCH}"
        )
        model = rb.load_in_process(engine, mode, t)
        model.warmup(LIMIT_BATCH, 1)
        figures = {}
        for kind in TEXT_KINDS:
            pool = [t.encode() for t in texts[kind]]
            batches = []
            for _ in range(repeats + 2):
                batch = np.empty(LIMIT_BATCH, dtype=object)  # BYTES rows, as the runtime decodes them
                batch[:] = [pool[int(i)] for i in rng.integers(len(pool), size=LIMIT_BATCH)]
                batches.append(batch)
            for batch in batches[:2]:
                rb._timed_batch(model, batch, t)
            median = statistics.median(rb._timed_batch(model, batch, t) for batch in batches[2:])
            rate = LIMIT_BATCH / median
            if instances > 1:
                rate = _instances_rate(model, batches[2:] * instances, t, instances)
            # small batches, the sizes a P99 of SLO_P99_SECONDS leaves room for on long texts
            small = {
                b: statistics.median(rb._timed_batch(model, batch[:b], t) for batch in batches[2:])
                for b in SMALL_BATCHES
            }
            figures[kind] = {
                "rows_per_second": rate,
                "batch_seconds": median,
                "small_batch_seconds": {str(b): seconds for b, seconds in small.items()},
                "threads": t,
                "instances": instances,
            }
            sizes = ", ".join(f"s({b}) {seconds * 1000:.0f} ms" for b, seconds in small.items())
            progress(f"  {kind}: {rate:.0f} rows/s ({median * 1000:.1f} ms a batch alone; {sizes})")
        out[name] = figures
        del model
        gc.collect()
    return out


# --- the figures ----------------------------------------------------------------------------------


def ratios_and_pairs(by_server: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``summarize``'s ``ratios`` and ``pairs`` of one text kind from its servers' figures."""
    ratios = {}
    for rname, num, den in RATIOS:
        if num in by_server and den in by_server and by_server[den]["max_slo_rps"] > 0:
            ratios[rname] = {"value": by_server[num]["max_slo_rps"] / by_server[den]["max_slo_rps"]}
            if "limit_rps" in by_server[num]:
                ratios[rname]["ceiling"] = by_server[num]["limit_rps"] / by_server[den]["max_slo_rps"]
    pairs = {}
    for pname, kube, peers in PAIRS:
        ran = [(by_server[p]["max_slo_rps"], p) for p in peers if p in by_server]
        if kube in by_server and ran and max(ran)[0] > 0:
            rate, best = max(ran)
            pairs[pname] = {
                "kubeinfer": kube,
                "best_peer": best,
                "value": by_server[kube]["max_slo_rps"] / rate,
            }
    return {"ratios": ratios, "pairs": pairs}


def summarize(
    visits: Sequence[dict[str, Any]], limits: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Per text kind: each server's highest rate at the SLO (``max_slo_rps``: the median over the
    visits of each setting it ran with, the best setting's; ``by_visit``: each visit's, in order;
    ``by_setting``: ``[setting, median]`` per setting, in the order first visited, and ``setting``: the
    one whose median is the figure), the P50 and P99 at that rate in its best visit (``at_max``), the
    P99 at every rate it was offered in its visits (``p99_by_rate``: ``[rate, P99 seconds, met the
    SLO]``, by rate) and a peer's ``settings`` (those its visits ran with, in order);
    ``ratios``: for each of ``RATIOS`` whose servers both ran and whose denominator served something,
    ``{"value"}``; ``pairs``: for each of ``PAIRS`` whose kubeinfer server and at least one peer
    serving something ran, ``{"kubeinfer", "best_peer", "value"}``, kubeinfer's rate over its best
    peer's. With ``limits`` (``in_process_limits``), a kubeinfer server also has ``limit_rps`` (its
    engine's in-process rows/s) and ``served_to_limit``, and each ratio whose numerator has a limit has
    ``ceiling``: the ratio it would reach served at that limit, the most any front end could give that
    engine."""
    out: dict[str, Any] = {}
    for kind in TEXT_KINDS:
        by_server: dict[str, dict[str, Any]] = {}
        for v in visits:
            found = v["texts"].get(kind)
            if found is None:
                continue
            entry = by_server.setdefault(
                v["server"], {"by_visit": [], "at_max": None, "p99_by_rate": [], "_by_setting": {}}
            )
            entry["by_visit"].append(found["max_slo_rps"])
            key = json.dumps(v.get("setting"), sort_keys=True)
            entry["_by_setting"].setdefault(key, (v.get("setting"), []))[1].append(found["max_slo_rps"])
            if v.get("setting") is not None:
                entry.setdefault("settings", []).append(v["setting"])
            entry["p99_by_rate"] += [
                [p["offered_rps"], p.get("p99_seconds"), bool(p.get("meets_slo"))] for p in found["points"]
            ]
            passing = [
                p for p in found["points"] if p.get("meets_slo") and p["offered_rps"] == found["max_slo_rps"]
            ]
            if passing and (
                entry["at_max"] is None or found["max_slo_rps"] >= entry["at_max"]["offered_rps"]
            ):
                p = passing[-1]
                entry["at_max"] = {
                    k: p.get(k)
                    for k in ("offered_rps", "p50_seconds", "p99_seconds", "server_cpu_seconds_per_request")
                }
        for name, entry in by_server.items():
            visited = entry.pop("_by_setting").values()
            per_setting = [[setting, statistics.median(rates)] for setting, rates in visited]
            entry["by_setting"] = per_setting
            entry["setting"], entry["max_slo_rps"] = max(per_setting, key=lambda sr: sr[1])
            entry["p99_by_rate"].sort(key=lambda r: r[0])
            limit = (limits or {}).get(name, {}).get(kind)
            if limit:
                entry["limit_rps"] = limit["rows_per_second"]
                entry["served_to_limit"] = entry["max_slo_rps"] / limit["rows_per_second"]
        out[kind] = {"servers": by_server, **ratios_and_pairs(by_server)}
    return out


def table(summary: dict[str, Any]) -> list[str]:
    """The summary as text lines: per text kind, each server's rate (visits), P99 at every rate
    offered, the ratios and the pairs."""
    lines = []
    for kind, fig in summary.items():
        lines.append(f"{kind}: highest rate at P99 <= {SLO_P99_SECONDS * 1000:.0f} ms")
        for name, entry in fig["servers"].items():
            visits = ", ".join(f"{r:.0f}" for r in entry["by_visit"])
            at = entry["at_max"] or {}
            p50 = f"P50 {at['p50_seconds'] * 1000:.1f} ms, " if at.get("p50_seconds") is not None else ""
            p99 = f"P99 {at['p99_seconds'] * 1000:.1f} ms" if at.get("p99_seconds") is not None else ""
            limit = ""
            if "limit_rps" in entry:
                limit = f"; {entry['served_to_limit']:.0%} of its in-process {entry['limit_rps']:.0f} rows/s"
            lines.append(f"  {name:18s} {entry['max_slo_rps']:7.1f}/s  (visits {visits}; {p50}{p99}{limit})")
            if entry.get("setting") is not None:
                others = [f"{r:.0f}/s with {st}" for st, r in entry["by_setting"] if st != entry["setting"]]
                also = f" (also {'; '.join(others)})" if others else ""
                lines.append(f"    setting {entry['setting']}{also}")
            tail = ", ".join(
                f"{r:.3g}:{p * 1000:.0f}" for r, p, _ in entry["p99_by_rate"] if p is not None and p == p
            )
            lines.append(f"    P99 ms by rate: {tail}")
        for rname, r in fig["ratios"].items():
            ceiling = f"; x{r['ceiling']:.2f} at its engine's in-process limit" if "ceiling" in r else ""
            lines.append(f"  {rname}: x{r['value']:.2f}{ceiling}")
        for pname, pair in fig["pairs"].items():
            lines.append(
                f"  pair {pname}: {pair['kubeinfer']} / {pair['best_peer']} (best peer) x{pair['value']:.2f}"
            )
    return lines


# --- main -----------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench/peers_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--order",
        default=None,
        help=f"servers in visit order, of {', '.join(SERVERS)} (default {','.join(DEFAULT_ORDER)})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: every server once, the first setting of each peer (no settings search), "
        "2 s points, no bisection, 64 texts, no in-process limit; with --noisy and --out under /tmp",
    )
    parser.add_argument(
        "--start-rate",
        type=float,
        default=40.0,
        help="first rate of a sentences search, req/s (passages: a quarter)",
    )
    parser.add_argument("--step-seconds", type=float, default=None, help="seconds of each ramp point (6)")
    parser.add_argument("--refine", type=int, default=None, help="bisection rounds after the ramp (3)")
    parser.add_argument("--refine-seconds", type=float, default=10.0, help="seconds of each bisection point")
    parser.add_argument(
        "--search-seconds", type=float, default=3.0, help="seconds of each point of a peer setting's probe"
    )
    parser.add_argument(
        "--warmup-seconds", type=float, default=None, help="seconds of load before each search (3)"
    )
    parser.add_argument("--texts", type=int, default=None, help="distinct requests per text kind (512)")
    parser.add_argument(
        "--start-timeout", type=float, default=300.0, help="seconds a server may take to be ready"
    )
    parser.add_argument(
        "--limit-repeats",
        type=int,
        default=None,
        help="batches timed for the in-process limit (15; 0: skip it)",
    )
    parser.add_argument(
        "--limits-only",
        action="store_true",
        help="only the in-process limits of the kubeinfer configurations of --order (the engine's "
        "ceiling on this machine; a few minutes), no server started",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    quiet.add_arguments(parser)
    return parser


#: The options ``--quick`` changes, (full run, quick run), unless given.
QUICK_DEFAULTS = {
    "step_seconds": (6.0, 2.0),
    "refine": (3, 0),
    "warmup_seconds": (3.0, 1.0),
    "texts": (512, 64),
    "limit_repeats": (15, 0),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (``--help``); ``order`` becomes a list of known server names (``SystemExit`` with
    the unknown one named otherwise); ``--quick`` sets ``QUICK_DEFAULTS``' quick values of the options
    not given and the order ``QUICK_ORDER``."""
    parser = _parser()
    args = parser.parse_args(argv)
    for key, (full, quick) in QUICK_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    if args.order is None:
        args.order = ",".join(QUICK_ORDER if args.quick else DEFAULT_ORDER)
    order = [s.strip() for s in args.order.split(",") if s.strip()]
    unknown = [s for s in order if s not in SERVERS]
    if unknown or not order:
        parser.error(f"--order: unknown server(s) {unknown} (known: {', '.join(SERVERS)})")
    args.order = order
    return args


def load_texts(args: argparse.Namespace) -> tuple[Path, dict[str, list[str]], dict[str, np.ndarray]]:
    """The model directory, the requests' texts per kind, and the reference vectors (sentence-
    transformers in this process, fp32) of the first 32 sentences and 8 passages."""
    from kubeinfer.runtime.models.huggingface import bundled_model_dir, heldout_sentences
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    model_path = bundled_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    sentences = rb.request_sentences(args.seed, args.texts)
    passages = make_passages(
        heldout_sentences(), lambda t: len(tokenizer(t)["input_ids"]), args.texts, args.seed
    )
    texts = {"sentences": sentences, "passages": passages}
    st = SentenceTransformer(str(model_path), device="cpu")
    reference = {
        "sentences": st.encode(sentences[:32], convert_to_numpy=True),
        "passages": st.encode(passages[:8], convert_to_numpy=True),
    }
    return model_path, texts, reference


def kubeinfer_answers(
    names: Sequence[str], texts: dict[str, list[str]], counts: dict[str, int]
) -> tuple[dict[str, dict[str, np.ndarray]], Path]:
    """kubeinfer's answers for the probe texts (the first ``counts[kind]`` of each kind), from each
    configuration of ``names`` (``KUBEINFER`` names) loaded in this process as the runtime loads it,
    one text per call as one request is served: ``{name: {kind: float32 [rows, dim]}}``; and the int8
    graph file kubeinfer's ``onnxruntime`` engine serves (its graph cache, made now when absent: the
    file the ONNX Runtime peers open). Raises ``FileNotFoundError`` when the graph is not there after
    the load."""
    import gc

    from kubeinfer.runtime.models.device import default_threads
    from kubeinfer.runtime.models.hf_onnx import export_path, int8_dynamic_path
    from kubeinfer.runtime.models.huggingface import bundled_model_dir

    out: dict[str, dict[str, np.ndarray]] = {}
    for name in dict.fromkeys(["kubeinfer", *names]):
        engine, mode, threads, _ = KUBEINFER[name]
        progress(f"kubeinfer's answers in process: {name} ({engine}, {mode})")
        model = rb.load_in_process(engine, mode, threads or default_threads())
        out[name] = {
            kind: np.concatenate([model.embed_texts([t]) for t in texts[kind][: counts[kind]]])
            for kind in TEXT_KINDS
        }
        del model
        gc.collect()
    graph = int8_dynamic_path(export_path(bundled_model_dir()))
    if not graph.is_file():
        raise FileNotFoundError(f"kubeinfer's int8 graph {graph} is missing after loading the model")
    return out, graph


def run_visits(
    args: argparse.Namespace, searches: dict[str, dict[str, Any]], starts: dict[str, dict[str, float]],
    model_path: Path, graph: Path, workdir: Path, texts: dict[str, list[str]],
    references: dict[str, dict[str, np.ndarray]],
) -> list[dict[str, Any]]:  # fmt: skip
    """The measured visits of ``args.order``, each a peer with its contending settings per text kind
    (``searches``' ``contenders``: the best probe's, and the next best's when the probe could not tell
    them apart), each search starting at ``starts`` (per server and kind; updated with 0.7 of each
    visit's rate); the visits' figures in order."""
    visits: list[dict[str, Any]] = []
    progress(f"{len(args.order)} visits: {', '.join(args.order)}")
    for i, name in enumerate(args.order, 1):
        # a peer runs each text kind with each of its contending settings: one start per setting
        runs: list[tuple[dict[str, Any] | None, tuple[str, ...]]] = [(None, TEXT_KINDS)]
        if name in PEERS:
            tried, chosen = searches[name]["settings"], searches[name]["contenders"]
            by_index: dict[int, tuple[str, ...]] = {}
            for kind in TEXT_KINDS:
                for index in chosen.get(kind, []):
                    by_index[index] = (*by_index.get(index, ()), kind)
            runs = [(tried[index]["setting"], kinds) for index, kinds in by_index.items()]
        for setting, kinds in runs:
            progress(f"visit {i}/{len(args.order)}: starting {name}" + (f" {setting}" if setting else ""))
            t0 = time.monotonic()
            with start_server(name, setting, model_path, graph, workdir, args) as (endpoint, about):
                ready = time.monotonic() - t0
                progress(f"{name} ready in {ready:.0f} s")
                own = {**first_starts(args), **starts.get(name, {})}
                search = Search(
                    kinds, own, args.step_seconds, args.refine, args.refine_seconds, args.warmup_seconds
                )
                result = asyncio.run(visit(name, endpoint, texts, references, search, args))
            result.update(
                {
                    "setting": setting,
                    "about": about,
                    "ready_seconds": ready,
                    "visit_seconds": time.monotonic() - t0,
                }
            )
            starts.setdefault(name, {}).update(
                {k: 0.7 * f["max_slo_rps"] for k, f in result["texts"].items() if f["max_slo_rps"]}
            )
            visits.append(result)
    return visits


def _write(args: argparse.Namespace, argv: list[str] | None, run: Any, result: dict[str, Any]) -> Path:
    """``result`` with the command and ``run``'s stamp (machine, load, noisy) written to ``--out``."""
    result = run.stamp(
        {**result, "command": ["bench/peers_bench.py", *(sys.argv[1:] if argv is None else argv)]}
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the settings searches and the visits (``parse_args``' options) under the bench lock and
    write ``--out``."""
    args = parse_args(argv)
    peers_used = {PEERS[n].server for n in args.order if n in PEERS and not args.limits_only}
    missing = [n for n in peers_used if not (PEER_VENVS[n] / "bin" / "python").exists()]
    if missing:
        print(
            f"peers_bench: no venv for {', '.join(sorted(missing))}: run `make bench-peers`", file=sys.stderr
        )
        return 1
    from kubeinfer.runtime.models.device import default_threads

    threads = default_threads()
    with quiet.quiet_run("peers_bench", args, log=progress) as run:
        started = time.monotonic()
        model_path, texts, reference = load_texts(args)
        if args.limits_only:
            limits = in_process_limits(args.order, texts, args.limit_repeats or 15, args.seed)
            result = {"model": MODEL, "intra_op_threads": threads, "order": args.order, "in_process": limits}
            out = _write(args, argv, run, {**result, "elapsed_seconds": time.monotonic() - started})
            progress(f"wrote {out}{' (noisy: not a source of figures)' if run.noisy else ''}")
            return 0
        tokens = {k: [len(t.split()) for t in v] for k, v in texts.items()}
        counts = {k: len(v) for k, v in reference.items()}
        answers, graph = kubeinfer_answers([KUBEINFER_REFERENCE[n] for n in args.order], texts, counts)
        references = {"st": reference, **answers}
        limits = (
            in_process_limits(args.order, texts, args.limit_repeats, args.seed) if args.limit_repeats else {}
        )
        searches: dict[str, dict[str, Any]] = {}
        starts: dict[str, dict[str, float]] = {}
        with tempfile.TemporaryDirectory(prefix="kubeinfer-peers-") as tmp:
            workdir = Path(tmp)
            for name in dict.fromkeys(n for n in args.order if n in PEERS):
                settings = peer_settings(name, threads)
                if args.quick:
                    searches[name] = {
                        "settings": [{"setting": settings[0]}],
                        "best": dict.fromkeys(TEXT_KINDS, 0),
                        "contenders": {kind: [0] for kind in TEXT_KINDS},
                    }
                    continue
                searches[name] = search_peer(
                    name, settings, model_path, graph, workdir, texts, references, args
                )
                starts[name] = {
                    kind: 0.7 * searches[name]["settings"][i]["texts"][kind]["max_slo_rps"]
                    for kind, i in searches[name]["best"].items()
                    if searches[name]["settings"][i]["texts"][kind]["max_slo_rps"]
                }
            visits = run_visits(args, searches, starts, model_path, graph, workdir, texts, references)
        summary = summarize(visits, limits)
        result_json = {
            "model": MODEL,
            "slo_p99_seconds": SLO_P99_SECONDS,
            "order": args.order,
            "quick": args.quick,
            "versions": peer_versions(),
            "intra_op_threads": threads,
            "graph": graph.name,
            "texts": {
                k: {
                    "count": len(v),
                    "words_median": statistics.median(tokens[k]),
                    "min_tokens": PASSAGE_TOKENS if k == "passages" else None,
                }
                for k, v in texts.items()
            },
            "in_process": limits,
            "search": searches,
            "summary": summary,
            "visits": visits,
            "elapsed_seconds": time.monotonic() - started,
        }
        out = _write(args, argv, run, result_json)
    for line in table(summary):
        progress(line)
    progress(f"wrote {out}{' (noisy: not a source of figures)' if run.noisy else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
