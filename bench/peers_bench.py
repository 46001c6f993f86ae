"""kubeinfer against the servers its users compare it with: MLServer and infinity-emb, same model, same load.

    make bench-peers                          # installs the peers' venvs, then runs this
    .venv/bin/python bench/peers_bench.py     # -> bench/results/peers.json

**Servers** (``SERVERS``), each alone on the machine with its own defaults, serving the bundled
all-MiniLM-L6-v2 (mean pooling, L2-normalized, 256 tokens at most):

- ``kubeinfer``: ``kubeinfer-runtime serve``, engine ``onnxruntime``, quantization ``int8-dynamic``: its
  best configuration at cosine >= 0.99 to fp32 (its load report's ``quantization_cosine_mean_ratio`` is
  recorded; ``docs/runtime.md`` has the recipe), max batch 32, the default max queue delay and thread count.
- ``kubeinfer-fp32``: the same runtime, ``onnxruntime`` without quantization (cosine 1.0 to torch).
- ``kubeinfer-2threads``: ``kubeinfer`` with two intra-op threads instead of the default one (the
  model sharing both cores with the front end and the tokenizer): what thread placement gives.
- ``kubeinfer-torch``: the same runtime on the torch engine, fp32; not in the default order (``--order``
  adds it: the engine comparison is ``make bench-runtime``'s).
- ``mlserver``: MLServer 1.7.1 (``.cache/peer-mlserver``) with the runtime class a user writes for it
  (``bench/peers/mlserver_minilm.py``: the same tokenizer, torch and pooling as kubeinfer's torch engine)
  and adaptive batching (``--mlserver-batch`` 16, ``--mlserver-delay`` 10 ms: the configuration of the
  measurement that set the targets); its other settings are its defaults (one inference worker process).
- ``mlserver-1thread``, ``infinity-1thread``: the same peers with torch on one intra-op thread
  (``OMP_NUM_THREADS=1``): the setting a user who profiles them on a small node picks; not in the
  default order (``--order`` adds them).
- ``infinity``: infinity-emb 0.0.78 (``.cache/peer-infinity``), ``infinity_emb v2`` with the torch
  engine on the CPU, batch size 32 (its default), its other defaults.

**Texts** (``TEXT_KINDS``): ``sentences``, one random held-out sentence per request (the sentences of
``make bench-runtime``), and ``passages``, held-out sentences joined until each has at least 100
MiniLM tokens. Every server gets the same requests in the same order: v2 JSON in, v2 JSON out for
kubeinfer and MLServer (``/v2/models/minilm/infer``, input ``text`` BYTES [1], no binary extension,
which MLServer does not speak); OpenAI ``/embeddings`` for infinity (its only API).

**Order** (``--order``, default ``DEFAULT_ORDER``): servers run one at a time, each visit starting the
server, checking that it serves the same model (cosine of its embeddings of 32 sentences and 8
passages to sentence-transformers' in this process, recorded; a server under 0.99 is reported, not
hidden), warming it up, then finding its highest rate at P99 <= 100 ms for each text kind, then
stopping it. kubeinfer and MLServer are visited twice in A-B-A fashion (kubeinfer, MLServer, ...,
MLServer, kubeinfer; kubeinfer-fp32, infinity and kubeinfer-2threads once, between them), so a drift
of the machine shows as a difference between a server's own visits; a server's figure is the median
of its visits.

**The search** (``max_slo_rate``): open-loop Poisson arrivals (``runtime_bench.run_rate``: seeded,
latency from the scheduled arrival, the same aiohttp client), from ``--start-rate`` (or 0.7 of the
server's previous visit) up by x1.4 per ``--step-seconds`` point until a point misses the SLO (P99 >=
100 ms or under 99 % answered 200), then ``--refine`` rounds of bisection at geometric midpoints,
``--refine-seconds`` each. A start that misses halves the rate until one passes. Every point keeps
P50, P99, the throughput, errors, and the server's CPU seconds per request (its whole process tree,
psutil) and the client's.

**Figures** (``summarize``): per text kind, each server's highest rate at the SLO (median of its
visits, and each visit's), and the ratios the targets are stated in: kubeinfer / MLServer (target >=
4 at cosine >= 0.99), kubeinfer-fp32 / MLServer (target >= 1.5), kubeinfer / infinity. The script
reports; it asserts no target.

Like every benchmark that measures, it runs under ``bench/quiet.py`` (the bench lock; no measurement
over a 1-minute load of 0.5 unless ``--noisy``, and then the JSON says so). Run time at the defaults:
about 3 minutes a visit (server start, the checks, two searches), 20 to 25 minutes for the seven visits.
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
PEER_VENVS = {"mlserver": ROOT / ".cache" / "peer-mlserver", "infinity": ROOT / ".cache" / "peer-infinity"}
#: kubeinfer's configurations: (engine, quantization mode, intra-op threads or None for the runtime's
#: default: the CPUs less one, so one core stays for the event loop, HTTP and tokenization).
KUBEINFER: dict[str, tuple[str, str, int | None]] = {
    "kubeinfer": ("onnxruntime", "int8-dynamic", None),
    "kubeinfer-fp32": ("onnxruntime", "none", None),
    "kubeinfer-torch": ("torch", "none", None),
    "kubeinfer-2threads": ("onnxruntime", "int8-dynamic", 2),
}
#: Peer configurations beside each peer's defaults: torch on one intra-op thread (``OMP_NUM_THREADS=1``,
#: which torch reads at import). On two cores a peer's default two threads spin-wait against its own
#: HTTP process: 20 to 30 ms of CPU per sentence where one thread needs about 5.
ONE_THREAD = {"mlserver-1thread": "mlserver", "infinity-1thread": "infinity"}
SERVERS = (*KUBEINFER, "mlserver", "infinity", *ONE_THREAD)
DEFAULT_ORDER = (
    "kubeinfer", "mlserver", "kubeinfer-fp32", "infinity", "kubeinfer-2threads", "mlserver", "kubeinfer",
)  # fmt: skip
#: Rate multiplier between two points of the ramp.
STEP = 1.4
#: The ratios the targets are stated in: (name, numerator server, denominator server, target or None).
RATIOS = (
    ("kubeinfer_to_mlserver", "kubeinfer", "mlserver", 4.0),
    ("kubeinfer_fp32_to_mlserver", "kubeinfer-fp32", "mlserver", 1.5),
    ("kubeinfer_to_infinity", "kubeinfer", "infinity", None),
    ("kubeinfer_fp32_to_infinity", "kubeinfer-fp32", "infinity", None),
    ("mlserver_to_infinity", "mlserver", "infinity", None),
    ("kubeinfer_2threads_to_kubeinfer", "kubeinfer-2threads", "kubeinfer", None),
    ("kubeinfer_to_mlserver_1thread", "kubeinfer", "mlserver-1thread", 4.0),
    ("kubeinfer_fp32_to_mlserver_1thread", "kubeinfer-fp32", "mlserver-1thread", 1.5),
    ("kubeinfer_to_infinity_1thread", "kubeinfer", "infinity-1thread", None),
)


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


def mlserver_folder(folder: Path, model_path: Path, ports: dict[str, int], batch: int, delay: float) -> Path:
    """Write MLServer's ``settings.json`` (host 127.0.0.1 and ``ports``: http, grpc, metrics) and the
    model's ``minilm/model-settings.json`` (``bench/peers/mlserver_minilm.py``'s class, adaptive
    batching ``batch`` rows / ``delay`` seconds, ``parameters.uri`` = ``model_path``) under
    ``folder``; returns ``folder``, the argument of ``mlserver start``."""
    (folder / MODEL).mkdir(parents=True, exist_ok=True)
    settings = {
        "host": "127.0.0.1",
        "http_port": ports["http"],
        "grpc_port": ports["grpc"],
        "metrics_port": ports["metrics"],
        "debug": False,
    }
    (folder / "settings.json").write_text(json.dumps(settings, indent=1))
    model = {
        "name": MODEL,
        "implementation": "mlserver_minilm.MiniLM",
        "max_batch_size": batch,
        "max_batch_time": delay,
        "parameters": {"uri": str(model_path)},
    }
    (folder / MODEL / "model-settings.json").write_text(json.dumps(model, indent=1))
    return folder


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
    name: str, model_path: Path, workdir: Path, args: argparse.Namespace
) -> Iterator[tuple[Endpoint, dict[str, Any]]]:
    """Start server ``name`` (one of ``SERVERS``) serving the bundled MiniLM; yield its ``Endpoint``
    and what it reports about itself (versions, configuration; for kubeinfer its load report). Raises
    ``RuntimeError`` (the server's log tail) when it does not start, ``FileNotFoundError`` when a
    peer's venv is missing (``make bench-peers`` installs it)."""
    from hack.procs import free_port

    log = workdir / f"{name}.log"
    if name in KUBEINFER:
        from kubeinfer.runtime.config import RuntimeConfig
        from kubeinfer.runtime.models.device import THREADS_ENV

        from hack.devtools.runtime_proc import RuntimeProcess

        engine, mode, threads = KUBEINFER[name]
        cfg = RuntimeConfig.model_validate(
            {
                "model": {"engine": engine},
                "quantization": {"mode": mode},
                "device": "cpu",
                "batching": {"max_batch_size": 32, "max_queue_size": 4096},
            }
        )
        env = {THREADS_ENV: str(threads)} if threads else {}
        with RuntimeProcess(cfg, log_path=log, env=env) as rt:
            about = {
                "engine": engine,
                "quantization": mode,
                "threads": threads or "default",
                "batching": cfg.batching.model_dump(mode="json"),
                "report": _kubeinfer_report(rt.metrics_text()),
            }
            yield Endpoint(f"{rt.url}/v2/models/{MODEL}/infer", v2_body, v2_embeddings, rt.pid), about
        return
    threads_env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if name in ONE_THREAD else {}
    name = ONE_THREAD.get(name, name)
    venv = PEER_VENVS[name]
    if not (venv / "bin" / "python").exists():
        raise FileNotFoundError(f"{venv} is missing: `make bench-peers` installs the peers' venvs")
    if name == "mlserver":
        ports = {k: free_port() for k in ("http", "grpc", "metrics")}
        folder = mlserver_folder(
            workdir / "mlserver", model_path, ports, args.mlserver_batch, args.mlserver_delay
        )
        base = f"http://127.0.0.1:{ports['http']}"
        env = {**PEER_ENV, **threads_env, "PYTHONPATH": str(ROOT / "bench" / "peers")}
        cmd = [str(venv / "bin" / "mlserver"), "start", str(folder)]
        with peer_process(cmd, f"{base}/v2/models/{MODEL}/ready", log, env, args.start_timeout) as pid:
            about = {
                "batching": {"max_batch_size": args.mlserver_batch, "max_batch_time": args.mlserver_delay}
            }
            yield Endpoint(f"{base}/v2/models/{MODEL}/infer", v2_body, v2_embeddings, pid), about
        return
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = infinity_command(venv, model_path, port, args.infinity_batch)
    with peer_process(cmd, f"{base}/health", log, {**PEER_ENV, **threads_env}, args.start_timeout) as pid:
        yield (
            Endpoint(f"{base}/embeddings", openai_body, openai_embeddings, pid),
            {"batch_size": args.infinity_batch},
        )


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
    for name, package in (("mlserver", "mlserver"), ("infinity", "infinity_emb")):
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


async def visit(
    name: str, endpoint: Endpoint, texts: dict[str, list[str]], reference: dict[str, np.ndarray],
    starts: dict[str, float], args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """One visit of a started server: the same-model check, the warmup, then ``max_slo_rate`` for each
    text kind; the visit's figures."""
    async with rb.client_session() as session:
        check = {}
        for kind in TEXT_KINDS:
            probe = texts[kind][: len(reference[kind])]
            got = []
            for text in probe:
                async with session.post(endpoint.url, data=endpoint.body(text)) as response:
                    body = await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"{name}: {response.status} {body[:300]!r}")
                    got.append(endpoint.vectors(json.loads(body))[0])
            cos = cosines(np.stack(got), reference[kind])
            check[kind] = {
                "cosine_min": float(cos.min()),
                "cosine_mean": float(cos.mean()),
                "texts": len(probe),
            }
        progress(
            f"{name}: same model? cosine to sentence-transformers min "
            + ", ".join(f"{k} {v['cosine_min']:.4f}" for k, v in check.items())
        )
        result: dict[str, Any] = {"server": name, "same_model_check": check, "texts": {}}
        for kind in TEXT_KINDS:
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

            start = starts.get(kind, args.start_rate if kind == "sentences" else args.start_rate / 4)
            progress(f"{name} {kind}: warmup {args.warmup_seconds:.0f} s at {start / 2:.0f}/s")
            await rb.run_rate(session, endpoint.url, bodies, start / 2, args.warmup_seconds, args.seed)
            found = await max_slo_rate(measure, start, args.step_seconds, args.refine, args.refine_seconds)
            slo_ms = SLO_P99_SECONDS * 1000
            progress(f"{name} {kind}: highest rate at P99 <= {slo_ms:.0f} ms: {found['max_slo_rps']:.1f}/s")
            result["texts"][kind] = found
    return result


# --- the engine's own limit ------------------------------------------------------------------------

#: Rows per batch of the in-process limit (kubeinfer's max batch size).
LIMIT_BATCH = 32


def in_process_limits(
    names: Sequence[str], texts: dict[str, list[str]], repeats: int, seed: int
) -> dict[str, dict[str, Any]]:
    """For each kubeinfer configuration of ``names`` (with its default thread count, 1 on two cores):
    the model loaded in this process as the runtime loads it, warmed up, then ``repeats`` batches of
    ``LIMIT_BATCH`` random texts of each kind (``preprocess`` + ``execute``, one batch at a time):
    ``{name: {kind: {"rows_per_second": LIMIT_BATCH / median seconds, "batch_seconds": median}}}``.
    That is the most a server of that engine could serve with full batches and nothing else on its
    thread: the ceiling of its served rate, whatever the front end does."""
    import gc

    from kubeinfer.runtime.models.device import default_threads

    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(n for n in names if n in KUBEINFER):
        engine, mode, threads = KUBEINFER[name]
        t = threads or default_threads()
        progress(f"in process: {name} ({engine}, {mode}, {t} thread(s)), {repeats} batches of {LIMIT_BATCH}")
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
            figures[kind] = {"rows_per_second": LIMIT_BATCH / median, "batch_seconds": median, "threads": t}
            progress(f"  {kind}: {LIMIT_BATCH / median:.0f} rows/s ({median * 1000:.1f} ms a batch)")
        out[name] = figures
        del model
        gc.collect()
    return out


# --- the figures ----------------------------------------------------------------------------------


def summarize(
    visits: Sequence[dict[str, Any]], limits: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Per text kind: each server's highest rate at the SLO (``max_slo_rps``: the median over its
    visits; ``by_visit``: each visit's, in order), the P50 and P99 at that rate in its best visit, and
    ``ratios``: for each of ``RATIOS`` whose servers both ran, ``{value, target, meets_target}``
    (``meets_target`` None for a ratio without a target). With ``limits`` (``in_process_limits``), a
    kubeinfer server also has ``limit_rps`` (its engine's in-process rows/s) and ``served_to_limit``
    (target 0.85), and each ratio whose numerator has a limit has ``ceiling``: the ratio it would
    reach served at that limit, the most any front end could give that engine."""
    out: dict[str, Any] = {}
    for kind in TEXT_KINDS:
        by_server: dict[str, dict[str, Any]] = {}
        for v in visits:
            found = v["texts"].get(kind)
            if found is None:
                continue
            entry = by_server.setdefault(v["server"], {"by_visit": [], "at_max": None})
            entry["by_visit"].append(found["max_slo_rps"])
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
            entry["max_slo_rps"] = statistics.median(entry["by_visit"])
            limit = (limits or {}).get(name, {}).get(kind)
            if limit:
                entry["limit_rps"] = limit["rows_per_second"]
                entry["served_to_limit"] = entry["max_slo_rps"] / limit["rows_per_second"]
        ratios = {}
        for rname, num, den, target in RATIOS:
            if num in by_server and den in by_server and by_server[den]["max_slo_rps"] > 0:
                value = by_server[num]["max_slo_rps"] / by_server[den]["max_slo_rps"]
                ratios[rname] = {
                    "value": value,
                    "target": target,
                    "meets_target": None if target is None else value >= target,
                }
                if "limit_rps" in by_server[num]:
                    ratios[rname]["ceiling"] = by_server[num]["limit_rps"] / by_server[den]["max_slo_rps"]
        out[kind] = {"servers": by_server, "ratios": ratios}
    return out


def table(summary: dict[str, Any]) -> list[str]:
    """The summary as text lines: per text kind, each server's rate (visits) and the ratios."""
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
            lines.append(f"  {name:16s} {entry['max_slo_rps']:7.1f}/s  (visits {visits}; {p50}{p99}{limit})")
        for rname, r in fig["ratios"].items():
            target = (
                ""
                if r["target"] is None
                else f" (target >= {r['target']}: {'met' if r['meets_target'] else 'not met'})"
            )
            ceiling = f"; x{r['ceiling']:.2f} at its engine's in-process limit" if "ceiling" in r else ""
            lines.append(f"  {rname}: x{r['value']:.2f}{target}{ceiling}")
    return lines


# --- main -----------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench/peers_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--order", default=",".join(DEFAULT_ORDER), help=f"servers in visit order, of {', '.join(SERVERS)}"
    )
    parser.add_argument(
        "--start-rate",
        type=float,
        default=40.0,
        help="first rate of a sentences search, req/s (passages: a quarter)",
    )
    parser.add_argument("--step-seconds", type=float, default=6.0, help="seconds of each ramp point")
    parser.add_argument("--refine", type=int, default=3, help="bisection rounds after the ramp")
    parser.add_argument("--refine-seconds", type=float, default=10.0, help="seconds of each bisection point")
    parser.add_argument(
        "--warmup-seconds", type=float, default=5.0, help="seconds of load before each search"
    )
    parser.add_argument("--texts", type=int, default=512, help="distinct requests per text kind")
    parser.add_argument("--mlserver-batch", type=int, default=16, help="MLServer max_batch_size")
    parser.add_argument("--mlserver-delay", type=float, default=0.01, help="MLServer max_batch_time, seconds")
    parser.add_argument("--infinity-batch", type=int, default=32, help="infinity-emb --batch-size")
    parser.add_argument(
        "--start-timeout", type=float, default=300.0, help="seconds a server may take to be ready"
    )
    parser.add_argument(
        "--limit-repeats", type=int, default=15, help="batches timed for the in-process limit (0: skip it)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    quiet.add_arguments(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (``--help``); ``order`` becomes a list of known server names (``SystemExit`` with
    the unknown one named otherwise)."""
    parser = _parser()
    args = parser.parse_args(argv)
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


def main(argv: list[str] | None = None) -> int:
    """Run the visits (``parse_args``' options) under the bench lock and write ``--out``."""
    args = parse_args(argv)
    peers_used = {ONE_THREAD.get(n, n) for n in args.order}
    missing = [n for n in peers_used if n in PEER_VENVS and not (PEER_VENVS[n] / "bin" / "python").exists()]
    if missing:
        print(
            f"peers_bench: no venv for {', '.join(sorted(missing))}: run `make bench-peers`", file=sys.stderr
        )
        return 1
    with quiet.quiet_run("peers_bench", args, log=progress) as run:
        started = time.monotonic()
        model_path, texts, reference = load_texts(args)
        tokens = {k: [len(t.split()) for t in v] for k, v in texts.items()}
        limits = (
            in_process_limits(args.order, texts, args.limit_repeats, args.seed) if args.limit_repeats else {}
        )
        progress(f"{len(args.order)} visits: {', '.join(args.order)}")
        visits: list[dict[str, Any]] = []
        starts: dict[str, dict[str, float]] = {}
        with tempfile.TemporaryDirectory(prefix="kubeinfer-peers-") as tmp:
            for i, name in enumerate(args.order, 1):
                progress(f"visit {i}/{len(args.order)}: starting {name}")
                t0 = time.monotonic()
                with start_server(name, model_path, Path(tmp), args) as (endpoint, about):
                    ready = time.monotonic() - t0
                    progress(f"{name} ready in {ready:.0f} s")
                    result = asyncio.run(visit(name, endpoint, texts, reference, starts.get(name, {}), args))
                result.update(
                    {"about": about, "ready_seconds": ready, "visit_seconds": time.monotonic() - t0}
                )
                starts[name] = {
                    k: 0.7 * f["max_slo_rps"] for k, f in result["texts"].items() if f["max_slo_rps"]
                }
                visits.append(result)
        summary = summarize(visits, limits)
        result_json = {
            "model": MODEL,
            "slo_p99_seconds": SLO_P99_SECONDS,
            "order": args.order,
            "versions": peer_versions(),
            "texts": {
                k: {
                    "count": len(v),
                    "words_median": statistics.median(tokens[k]),
                    "min_tokens": PASSAGE_TOKENS if k == "passages" else None,
                }
                for k, v in texts.items()
            },
            "in_process": limits,
            "summary": summary,
            "visits": visits,
            "elapsed_seconds": time.monotonic() - started,
            "command": ["bench/peers_bench.py", *(sys.argv[1:] if argv is None else argv)],
        }
        result_json = run.stamp(result_json)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result_json, indent=1) + "\n", encoding="utf-8")
    for line in table(summary):
        progress(line)
    progress(f"wrote {out}{' (noisy: not a source of figures)' if run.noisy else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
