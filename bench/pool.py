"""Pool benchmark: 20 tiny models under Zipf-distributed traffic, one model pool against one service per
model: memory-seconds, the hot models' P99, the first-request latency of a cold model.

``make bench-pool`` (or ``.venv/bin/python bench/pool.py``) -> ``bench/results/pool.json``.

- **The models**, made at the start into a temporary directory (by code, never downloaded): ``--models``
  (20) of four kinds in turn by popularity rank, so the hottest four are one of each: a Hugging Face text
  classifier and a sentence embedder (the 2-layer, 32-wide BERT of ``hack/devtools/runtime_tiny.py``
  with the bundled tokenizer: tokenization and a transformer pass per request), an ONNX and a
  ``torch.export`` (pt2) MLP. Each model has its own copy of its files.
- **Each model's runtime.yaml** is what the operator renders for an InferenceService of it
  (``builders.configmap.runtime_config``: ``spec.model.uri`` the file's absolute path, ``runtime.device:
  cpu``, everything else the API's defaults), for both sides alike.
- **Side ``services``, one service per model**: one ``kubeinfer-runtime serve`` process per model, each
  on its own port, run as the InferenceService's pod runs it (its runtime.yaml, one process).
- **Side ``pool``, one pool**: one ``kubeinfer-runtime`` in its model repository mode (as a ModelPool's pod
  runs it: the flat ``<model>.yaml`` files of the pool's ConfigMap, ``--memory-budget``, ``--pin``), each
  loaded model in its own process, loaded on its first request, evicted least recently used. The budget is
  ``--budget-share`` (0.2; the pool runs at its budget plus its front process, so a share of a quarter would
  sit just over a quarter of the memory-seconds) of the services' resident bytes together, measured in this
  run: it fits that share of the models at their mean size (``--budget-bytes`` sets it instead). At budget,
  the pool's memory-seconds are that share of the services' (plus its front process, a few dozen MiB). The
  hot models are pinned (``spec.pinned`` of a ModelPool: loaded at start, never evicted; ``--no-pin-hot``:
  pure LRU), so the rest of the budget is the least popular models' working set.
- **Traffic**: open-loop Poisson arrivals at ``--rate`` requests/s in total (latency from each request's
  scheduled arrival), each request's model drawn Zipf (``--zipf`` 1.1: the model of rank k gets a share
  proportional to k^-s); the hot models are the ``--hot`` (3) of the largest shares. Both sides get the
  same arrivals and the same models (one seed per repeat, ``--seed``).
- **Per repeat and side**: a measured window of ``--seconds`` (before the first, each service answers
  one request; before each of the pool's, ``--warmup`` seconds of the traffic, not measured, settle its
  working set): the hot models' P50 and P99, all requests' P99, the failed requests (anything but 200
  within ``CLIENT_TIMEOUT_SECONDS``; must be 0); memory-seconds: the resident bytes of the side's whole
  process tree (its runtime processes and their children, the pool's model processes) read from
  ``/proc`` every ``--sample-interval`` (0.5 s) and integrated over the window (``VmRSS``, and
  ``RssAnon`` beside it: the anonymous pages, without the mapped files of the libraries); for the pool,
  its loads and evictions in the window (``/metrics``), and after it the **cold probe**: the least
  popular model not loaded (``/v2/repository/index``) of one kind (``KINDS`` in turn, one per repeat)
  gets one request alone, timed to its answer (the load included). Each side's start (its processes
  to ready) is reported apart, with its own memory-seconds.
- **Figures**: medians over ``--repeats`` (3); a window holds a dozen hot requests, so
  ``hot_all_repeats`` gives their P99 over all windows together. The issue's measure is the ratio of the
  pool's memory-seconds to the services' (target at most 0.25), with the hot models' P99 within their
  target (``--target-p99``, default an InferenceService's ``autoscaling.targetP99``).

It runs under ``bench/quiet.py`` (the machine-wide bench lock, no measurement over a 1-minute load average
of 0.5 unless ``--noisy``). The sides run one after the other, services first (the pool's budget comes
from it), each started once for all its repeats. Run time with the defaults: 7.4 minutes in a
noisy run at a load of 5 to 8 (the services' start, 20 processes on two cores, 95 s of it; the pool's
windows wait for the loads their requests started); about 5 minutes quietly is an estimate. The
script reports; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import quiet
import runtime_bench as rb  # also puts the repository root on sys.path, for hack.devtools

ROOT = rb.ROOT
#: The model kinds, in turn by popularity rank (the hottest four are one of each).
KINDS = ("hf-classifier", "onnx", "pt2", "hf-embedder")
#: Seconds a request may take before it counts as failed (a cold model's load is inside it).
CLIENT_TIMEOUT_SECONDS = 120.0
#: Seconds the services' processes (and the pool) have to turn ready.
READY_TIMEOUT_SECONDS = 600.0
SERVICES, POOL = "services", "pool"
#: The issue's target: the pool's memory-seconds at most this share of the services'.
MEMORY_RATIO_TARGET = 0.25


def progress(message: str) -> None:
    """A progress line on stdout."""
    print(f"[pool {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- the traffic (pure) ---------------------------------------------------------------------------


def zipf_shares(count: int, s: float) -> np.ndarray:
    """The traffic share of each of ``count`` models by rank (index 0 the most popular): k^-s
    normalized, shape ``[count]``, summing to 1. Raises ``ValueError`` for ``count`` < 1 or ``s`` < 0."""
    if count < 1:
        raise ValueError("at least one model")
    if s < 0:
        raise ValueError("the Zipf exponent must not be negative")
    weights = np.arange(1, count + 1, dtype=np.float64) ** -s
    shares: np.ndarray = weights / weights.sum()
    return shares


def schedule(
    rate: float, seconds: float, shares: Sequence[float] | np.ndarray, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Open-loop Poisson arrivals at ``rate``/s over ``seconds`` and each one's model drawn from
    ``shares``: ``(offsets in seconds from the start, ascending, shape [n]; model indices, int, [n])``.
    The same ``seed`` gives the same schedule. Raises ``ValueError`` for a rate or duration <= 0."""
    if rate <= 0 or seconds <= 0:
        raise ValueError("rate and seconds must be positive")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=int(rate * seconds * 2) + 10)
    offsets = np.cumsum(gaps)
    offsets = offsets[offsets < seconds]
    models = rng.choice(len(shares), size=offsets.size, p=np.asarray(shares, dtype=np.float64))
    return offsets, models.astype(np.int64)


def hot_models(shares: Sequence[float] | np.ndarray, count: int) -> list[int]:
    """The indices of the ``count`` largest shares (ties: the lower index), largest first."""
    order = sorted(range(len(shares)), key=lambda i: (-float(shares[i]), i))
    return order[: max(0, count)]


def latency_figures(latencies: Iterable[float]) -> dict[str, float | None]:
    """``requests``, ``p50_seconds``, ``p99_seconds``, ``max_seconds`` of ``latencies`` (seconds; the
    percentiles None when there are none)."""
    values = np.asarray(list(latencies), dtype=np.float64)
    if values.size == 0:
        return {"requests": 0.0, "p50_seconds": None, "p99_seconds": None, "max_seconds": None}
    return {
        "requests": float(values.size),
        "p50_seconds": float(np.percentile(values, 50)),
        "p99_seconds": float(np.percentile(values, 99)),
        "max_seconds": float(values.max()),
    }


# --- memory (pure) --------------------------------------------------------------------------------


def memory_seconds(samples: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """The integral of a sampled quantity over ``[start, end]`` (byte-seconds for bytes): ``samples`` are
    ``(time, value)`` in ascending time, joined by straight lines; before the first sample the first
    value holds, after the last the last (a window a little wider than the samples is not lost). 0 when
    ``end <= start``. Raises ``ValueError`` without samples."""
    if not samples:
        raise ValueError("no samples")
    if end <= start:
        return 0.0
    times = np.array([t for t, _ in samples], dtype=np.float64)
    values = np.array([v for _, v in samples], dtype=np.float64)
    inside = (times > start) & (times < end)
    xs = np.concatenate(([start], times[inside], [end]))
    ys = np.interp(xs, times, values)
    return float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2.0))


def tree(parents: Mapping[int, int], roots: Iterable[int]) -> set[int]:
    """The processes of ``roots`` and all their descendants, from ``parents`` (pid -> parent pid); a
    root not in ``parents`` (gone) is left out."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [r for r in roots if r in parents]
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.add(pid)
        stack.extend(children.get(pid, ()))
    return found


def budget_bytes(per_process_rss: Sequence[int], share: float) -> int:
    """A pool budget of ``share`` of the services' resident bytes together (bytes): it fits that share
    of the models at their mean size. Raises ``ValueError`` without sizes or for ``share`` <= 0."""
    if not per_process_rss or share <= 0:
        raise ValueError("need resident sizes and a positive share")
    return int(share * sum(per_process_rss))


def median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None; None when none is."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# --- /proc ----------------------------------------------------------------------------------------


def process_parents() -> dict[int, int]:
    """Every process's parent, pid -> ppid (``/proc/PID/stat``; a process gone meanwhile left out)."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name (field 2) may hold spaces and parentheses: the fields after its last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            parents[int(entry.name)] = int(fields[1])
    return parents


def process_memory(pid: int) -> tuple[int, int]:
    """``(VmRSS, RssAnon)`` of ``pid`` in bytes; zeros when the process is gone."""
    rss = anon = 0
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0, 0
    return rss, anon


class MemorySampler:
    """Samples the resident bytes of the process trees of its roots every ``interval`` seconds in a
    thread: ``samples`` of ``(monotonic time, VmRSS total, RssAnon total)``, and the last sample's
    VmRSS per root (``by_root``)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.roots: list[int] = []
        self.samples: list[tuple[float, int, int]] = []
        self.by_root: dict[int, int] = {}
        self.processes = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def add(self, pid: int) -> None:
        """Sample ``pid``'s tree from now on."""
        with self._lock:
            self.roots.append(pid)

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def sample(self) -> None:
        """Take one sample now."""
        with self._lock:
            roots = list(self.roots)
        parents = process_parents()
        total = anon = 0
        by_root: dict[int, int] = {}
        members: set[int] = set()
        for root in roots:
            pids = tree(parents, [root])
            members |= pids
            root_rss = 0
            for pid in pids:
                rss, rss_anon = process_memory(pid)
                root_rss += rss
                total += rss
                anon += rss_anon
            by_root[root] = root_rss
        with self._lock:
            self.samples.append((time.monotonic(), total, anon))
            self.by_root = by_root
            self.processes = len(members)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def window(self, start: float, end: float) -> dict[str, float]:
        """The window's memory figures: byte-seconds (``rss_byte_seconds``, ``anon_byte_seconds``), the
        mean (byte-seconds over the window's length) and the peak of the samples inside it, bytes."""
        with self._lock:
            samples = list(self.samples)
        rss = [(t, float(v)) for t, v, _ in samples]
        anon = [(t, float(a)) for t, _, a in samples]
        inside = [v for t, v, _ in samples if start <= t <= end]
        length = max(end - start, 1e-9)
        rss_s, anon_s = memory_seconds(rss, start, end), memory_seconds(anon, start, end)
        return {
            "seconds": end - start,
            "rss_byte_seconds": rss_s,
            "anon_byte_seconds": anon_s,
            "rss_mean_bytes": rss_s / length,
            "anon_mean_bytes": anon_s / length,
            "rss_peak_bytes": float(max(inside)) if inside else float(rss[-1][1]),
            "samples": float(len(inside)),
        }


# --- the models -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    """One of the benchmark's models: its name on the wire, kind, popularity rank (1 the most popular),
    traffic share and files."""

    name: str
    kind: str
    rank: int
    share: float
    source: Path


def make_models(root: Path, shares: Sequence[float] | np.ndarray) -> list[Model]:
    """One model per share under ``root`` (kinds in turn, ``KINDS``), each with its own copy of its
    kind's files, made once per kind (seeded: the same weights every run)."""
    from hack.devtools import runtime_tiny

    makers: dict[str, tuple[str, Callable[[Path], Path]]] = {
        "hf-classifier": ("classifier", runtime_tiny.tiny_hf_classifier),
        "onnx": ("mlp.onnx", runtime_tiny.tiny_onnx_mlp),
        "pt2": ("mlp.pt2", runtime_tiny.tiny_pt2_mlp),
        "hf-embedder": ("embedder", runtime_tiny.tiny_hf_dir),
    }
    originals = root / "originals"
    originals.mkdir(parents=True)
    made: dict[str, Path] = {}
    models = []
    for index, share in enumerate(shares):
        kind = KINDS[index % len(KINDS)]
        filename, maker = makers[kind]
        if kind not in made:
            made[kind] = maker(originals / filename)
        name = f"m{index + 1:02d}-{kind}"
        directory = root / "models" / name
        directory.mkdir(parents=True)
        source = directory / filename
        if made[kind].is_dir():
            shutil.copytree(made[kind], source)
        else:
            shutil.copyfile(made[kind], source)
        models.append(Model(name, kind, index + 1, float(share), source))
    return models


def service_config(model: Model) -> Any:
    """The ``RuntimeConfig`` the operator renders for an InferenceService of ``model``
    (``builders.configmap.runtime_config``): ``spec.model.uri`` the model's absolute path, its format,
    ``runtime.device: cpu``, the API's defaults otherwise."""
    from kubeinfer.operator import api
    from kubeinfer.operator.builders.configmap import runtime_config

    fmt = "huggingface" if model.kind.startswith("hf-") else model.kind
    body = {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": model.name, "namespace": "bench", "uid": "bench"},
        "spec": {
            "model": {"uri": str(model.source), "format": fmt, "name": model.name},
            "runtime": {"device": "cpu"},
        },
    }
    isvc = api.InferenceService.from_body(body)
    return runtime_config(isvc, isvc.spec.max_queue_delay_in_force(None))


def default_target_p99() -> float:
    """An InferenceService's default ``autoscaling.targetP99``, seconds."""
    from kubeinfer.operator import api

    return float(api.AutoscalingSpec().target_p99)


def request_body(model: Model, sentence: str, number: int) -> bytes:
    """One v2 JSON request of one row for ``model``: a text (the Hugging Face kinds) or three floats."""
    if model.kind.startswith("hf-"):
        tensor: dict[str, Any] = {"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [sentence]}
    else:
        row = [float((number * 7 + j) % 11) / 10.0 for j in range(3)]
        tensor = {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": row}
    return json.dumps({"inputs": [tensor]}).encode()


# --- the sides ------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class Side:
    """One side's processes: where each model's requests go (``urls``), the roots of its process tree."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.urls: dict[str, str] = {}
        self.processes: list[Any] = []
        self.pool_url: str | None = None  # the pool's base URL (its /metrics, its repository index)
        self.budget: int | None = None

    def close(self) -> None:
        """SIGTERM to every process at once (each drains in parallel), then wait for each."""
        for rt in self.processes:
            if rt.proc is not None and rt.proc.poll() is None:
                rt.proc.send_signal(signal.SIGTERM)
        for rt in self.processes:
            rt.close()


def log_path(logs: Path | None, name: str) -> Path | None:
    """Where a runtime's log goes: ``logs/<name>.log`` (None: a temporary file, gone at its end)."""
    if logs is None:
        return None
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"{name}.log"


def start_services(models: Sequence[Model], sampler: MemorySampler, logs: Path | None = None) -> Side:
    """One ``serve`` process per model, started together; returns when all are ready. Raises
    ``RuntimeError`` (with the log's tail) when one fails. ``logs``: a folder that keeps their logs."""
    from hack.devtools.runtime_proc import RuntimeProcess

    side = Side(SERVICES)
    try:
        for model in models:
            rt = RuntimeProcess(
                service_config(model),
                env=_env(),
                ready_timeout=READY_TIMEOUT_SECONDS,
                wait_ready=False,
                log_path=log_path(logs, f"service-{model.name}"),
            )
            side.processes.append(rt)
            rt.start()
            sampler.add(rt.pid)
            side.urls[model.name] = f"{rt.url}/v2/models/{model.name}/infer"
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        for rt in side.processes:
            rt.wait_until_ready(max(1.0, deadline - time.monotonic()))
    except BaseException:
        side.close()
        raise
    return side


def start_pool(
    models: Sequence[Model],
    root: Path,
    budget: int,
    pinned: Sequence[str],
    sampler: MemorySampler,
    logs: Path | None = None,
) -> Side:
    """One runtime in its model repository mode over ``root`` (a flat ``<model>.yaml`` per model, the
    services' configuration each) with ``budget`` bytes and ``pinned`` loaded at start; returns when it
    is ready (the pinned models loaded)."""
    from kubeinfer.runtime.config import RuntimeConfig

    from hack.devtools.runtime_proc import RuntimeProcess
    from kubeinfer.contract.pool import model_file

    root.mkdir(parents=True, exist_ok=True)
    for model in models:
        (root / model_file(model.name)).write_text(service_config(model).to_yaml(), encoding="utf-8")
    cfg = RuntimeConfig.model_validate(
        {"repository": {"path": str(root), "memory_budget_bytes": budget, "pinned": list(pinned)}}
    )
    side = Side(POOL)
    rt = RuntimeProcess(
        cfg,
        env=_env(),
        ready_timeout=READY_TIMEOUT_SECONDS,
        wait_ready=False,
        log_path=log_path(logs, "pool"),
    )
    side.processes.append(rt)
    try:
        rt.start()
        sampler.add(rt.pid)
        rt.wait_until_ready(READY_TIMEOUT_SECONDS)
    except BaseException:
        side.close()
        raise
    side.urls = {m.name: f"{rt.url}/v2/models/{m.name}/infer" for m in models}
    side.pool_url = rt.url
    side.budget = budget
    return side


# --- the load -------------------------------------------------------------------------------------


def client_session() -> Any:
    """The load's HTTP client: keep-alive connections, ``CLIENT_TIMEOUT_SECONDS`` per request."""
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1024),
        timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_SECONDS),
        headers={"Content-Type": "application/json"},
    )


async def send(session: Any, url: str, body: bytes) -> tuple[int, str]:
    """POST ``body``; ``(status, error text)``: status 0 and the exception's name when none came."""
    import aiohttp

    try:
        async with session.post(url, data=body) as response:
            text = await response.read()
            return response.status, "" if response.status == 200 else text[:200].decode(errors="replace")
    except (TimeoutError, aiohttp.ClientError) as exc:
        return 0, type(exc).__name__


async def drive(
    side: Side, models: Sequence[Model], offsets: np.ndarray, picks: np.ndarray, sentences: Sequence[str]
) -> tuple[float, list[tuple[int, float | None, str]]]:
    """Send the schedule (``offsets`` from now, ``picks`` model indices) open loop; returns the start
    (monotonic) and per request ``(model index, latency from its scheduled arrival or None when it
    failed, error)``."""
    results: list[tuple[int, float | None, str]] = []
    async with client_session() as session:
        start = time.monotonic() + 0.05

        async def one(index: int, at: float, number: int) -> None:
            model = models[index]
            body = request_body(model, sentences[number % len(sentences)], number)
            status, error = await send(session, side.urls[model.name], body)
            done = time.monotonic()
            results.append((index, done - at if status == 200 else None, error or str(status)))

        tasks = []
        for number, (offset, index) in enumerate(zip(offsets, picks, strict=True)):
            at = start + float(offset)
            delay = at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(int(index), at, number)))
        await asyncio.gather(*tasks)
    return start, results


def window_figures(
    results: Sequence[tuple[int, float | None, str]], hot: Sequence[int], models: Sequence[Model]
) -> dict[str, Any]:
    """A window's latency figures: the hot models' together (``hot``; ``hot_latencies``, their seconds
    each), each hot model's, all requests' (``all``), and the failed requests (count and the first few
    errors)."""
    ok = [(i, s) for i, s, _ in results if s is not None]
    failed = [(models[i].name, e) for i, s, e in results if s is None]
    return {
        "hot_latencies": [round(s, 6) for i, s in ok if i in hot],
        "requests": len(results),
        "failed": len(failed),
        "failed_examples": failed[:5],
        "hot": latency_figures(s for i, s in ok if i in hot),
        "all": latency_figures(s for _, s in ok),
        "by_hot_model": {models[i].name: latency_figures(s for j, s in ok if j == i) for i in hot},
    }


def pool_counters(url: str) -> dict[str, float]:
    """The pool's load and eviction counters, summed over its models (``loads_success``,
    ``loads_failure``, ``evictions``), and the loaded models' measured bytes (``resident_bytes``), from
    its ``/metrics``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    out = {"loads_success": 0.0, "loads_failure": 0.0, "evictions": 0.0, "resident_bytes": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "kubeinfer_model_loads_total":
                key = "loads_success" if s.labels.get("outcome") == "success" else "loads_failure"
                out[key] += s.value
            elif s.name == "kubeinfer_model_evictions_total":
                out["evictions"] += s.value
            elif s.name == "kubeinfer_repository_resident_bytes":
                out["resident_bytes"] = s.value
    return out


def model_resident_bytes(url: str) -> dict[str, float]:
    """Each loaded model's measured resident bytes (``kubeinfer_model_resident_bytes``) in the pool."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        s.labels["model"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "kubeinfer_model_resident_bytes" and s.value > 0
    }


def probe_target(models: Sequence[Model], kind: str, ready: Iterable[str]) -> Model | None:
    """The model a cold probe of ``kind`` asks: the least popular of that kind not in ``ready`` (None
    when all are loaded)."""
    loaded = set(ready)
    cold = [m for m in models if m.kind == kind and m.name not in loaded]
    return max(cold, key=lambda m: m.rank) if cold else None


async def cold_probe(
    side: Side, models: Sequence[Model], kind: str, sentences: Sequence[str]
) -> dict[str, Any] | None:
    """One request alone to the least popular model of ``kind`` not loaded in the pool (its repository
    index): the seconds to its answer, the load included. None when every model of ``kind`` is loaded."""
    import httpx

    assert side.pool_url is not None
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_SECONDS) as client:
        index = (await client.post(f"{side.pool_url}/v2/repository/index")).json()
    model = probe_target(models, kind, (e["name"] for e in index if e.get("state") == "READY"))
    if model is None:
        return None
    async with client_session() as session:
        started = time.monotonic()
        status, error = await send(session, side.urls[model.name], request_body(model, sentences[0], 0))
        seconds = time.monotonic() - started
    return {"model": model.name, "kind": kind, "status": status, "error": error, "seconds": seconds}


async def warm_each(side: Side, models: Sequence[Model], sentences: Sequence[str]) -> int:
    """One request to each model in turn (a served process's first request); returns how many failed."""
    failed = 0
    async with client_session() as session:
        for model in models:
            status, _ = await send(session, side.urls[model.name], request_body(model, sentences[0], 0))
            failed += status != 200
    return failed


# --- a run ----------------------------------------------------------------------------------------


def measure_side(
    side: Side,
    models: Sequence[Model],
    args: argparse.Namespace,
    sampler: MemorySampler,
    sentences: Sequence[str],
) -> list[dict[str, Any]]:
    """Every repeat of one side: the measured window and, for the pool, its counters and a cold probe (of
    the kind ``KINDS[repeat]``, in turn). The services' models each answer one request first; the pool
    gets ``--warmup`` seconds of the traffic before each window (its working set settles, after the
    previous probe's load too)."""
    shares = [m.share for m in models]
    hot = hot_models(shares, args.hot)
    pool = side.pool_url is not None
    if not pool:
        failed = asyncio.run(warm_each(side, models, sentences))
        if failed:
            raise RuntimeError(f"{failed} of the services' first requests failed")
    repeats = []
    for repeat in range(args.repeats):
        seed = args.seed + 1000 * (repeat + 1)
        if pool and args.warmup > 0:
            warm_offsets, warm_picks = schedule(args.rate, args.warmup, shares, seed + 1)
            asyncio.run(drive(side, models, warm_offsets, warm_picks, sentences))
        before = pool_counters(side.pool_url) if side.pool_url else None
        offsets, picks = schedule(args.rate, args.seconds, shares, seed)
        start, results = asyncio.run(drive(side, models, offsets, picks, sentences))
        end = start + args.seconds
        time.sleep(max(0.0, end + args.sample_interval - time.monotonic()))  # a sample after the end
        figures: dict[str, Any] = {
            "repeat": repeat + 1,
            "seed": seed,
            **window_figures(results, hot, models),
            "memory": sampler.window(start, end),
        }
        if side.pool_url and before is not None:
            after = pool_counters(side.pool_url)
            figures["pool"] = {
                k: after[k] - before[k] for k in ("loads_success", "loads_failure", "evictions")
            }
            figures["pool"]["resident_bytes_at_end"] = after["resident_bytes"]
            # at rest (every request answered): the loaded models' measured bytes against the budget
            figures["pool_over_budget_at_end"] = after["resident_bytes"] > (side.budget or 0)
            probe = asyncio.run(cold_probe(side, models, KINDS[repeat % len(KINDS)], sentences))
            figures["cold_probe"] = [] if probe is None else [probe]
        repeats.append(figures)
        progress(f"{side.name} repeat {repeat + 1}/{args.repeats}: {repeat_line(figures)}")
    return repeats


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.1f} ms"


def repeat_line(figures: Mapping[str, Any]) -> str:
    """One repeat (or a side's medians) as a progress line."""
    memory = figures["memory"]
    line = (
        f"hot P50 {_ms(figures['hot']['p50_seconds'])} P99 {_ms(figures['hot']['p99_seconds'])}, all P99 "
        f"{_ms(figures['all']['p99_seconds'])}, {figures['requests']:.0f} requests, {figures['failed']:.0f} "
        f"failed; memory {memory['rss_byte_seconds'] / 2**30:.1f} GiB-s (mean "
        f"{memory['rss_mean_bytes'] / 2**20:.0f} MiB, anon {memory['anon_mean_bytes'] / 2**20:.0f} MiB)"
    )
    if "pool" in figures:
        pool = figures["pool"]
        line += f"; loads {pool['loads_success']:.0f}, evictions {pool['evictions']:.0f}"
    if figures.get("cold_probe"):
        line += "; cold " + ", ".join(f"{p['kind']} {p['seconds']:.2f} s" for p in figures["cold_probe"])
    return line


def summarize(repeats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A side's medians over its repeats: requests, failed (the sum), hot and all latencies, memory; for
    the pool its loads and evictions and the cold probe's seconds per kind."""
    out: dict[str, Any] = {
        "requests": sum(r["requests"] for r in repeats),
        "failed": sum(r["failed"] for r in repeats),
        "hot": {k: median_of(r["hot"][k] for r in repeats) for k in ("p50_seconds", "p99_seconds")},
        "all": {k: median_of(r["all"][k] for r in repeats) for k in ("p50_seconds", "p99_seconds")},
        "memory": {k: median_of(r["memory"][k] for r in repeats) for k in repeats[0]["memory"]},
        # a window holds a few dozen hot requests: their P99 over every repeat's, beside the median
        "hot_all_repeats": latency_figures(s for r in repeats for s in r["hot_latencies"]),
    }
    if "pool" in repeats[0]:
        out["pool"] = {k: median_of(r["pool"][k] for r in repeats) for k in repeats[0]["pool"]}
        kinds = {p["kind"] for r in repeats for p in r.get("cold_probe", [])}
        out["cold_first_request_seconds"] = median_of(
            p["seconds"] for r in repeats for p in r.get("cold_probe", [])
        )
        out["cold_first_request_seconds_by_kind"] = {
            kind: median_of(p["seconds"] for r in repeats for p in r["cold_probe"] if p["kind"] == kind)
            for kind in sorted(kinds)
        }
        out["repeats_over_budget_at_end"] = sum(bool(r.get("pool_over_budget_at_end")) for r in repeats)
        out["cold_probe_failed"] = sum(p["status"] != 200 for r in repeats for p in r.get("cold_probe", []))
    return out


def run_side(
    name: str,
    start: Callable[[MemorySampler], Side],
    models: Sequence[Model],
    args: argparse.Namespace,
    sentences: Sequence[str],
) -> tuple[dict[str, Any], dict[int, int]]:
    """Start one side (timed, its memory during the start reported apart), measure its repeats, stop
    it. Returns its result and the last sample's resident bytes per process (the services' sizes)."""
    sampler = MemorySampler(args.sample_interval).start()
    started = time.monotonic()
    side = None
    try:
        progress(f"{name}: starting")
        side = start(sampler)
        ready = time.monotonic()
        sampler.sample()
        startup = {**sampler.window(started, ready), "processes": float(sampler.processes)}
        progress(f"{name}: ready in {ready - started:.1f} s ({sampler.processes} processes)")
        repeats = measure_side(side, models, args, sampler, sentences)
        by_root = dict(sampler.by_root)
        # each runtime process's own resident bytes (the pool's: its front process without its models)
        roots_rss = sorted(process_memory(rt.pid)[0] for rt in side.processes)
        resident = model_resident_bytes(side.pool_url) if side.pool_url else None
    finally:
        if side is not None:
            side.close()
        sampler.stop()
    result: dict[str, Any] = {
        "startup": startup,
        "median": summarize(repeats),
        "runtime_process_rss_bytes_at_end": roots_rss,
        "repeats": repeats,
    }
    if resident is not None:
        result["model_resident_bytes_at_end"] = resident
    return result, by_root


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (see ``--help``); a bad value exits through ``parser.error``: status 2, one line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--models", type=int, default=20, help="tiny models (kinds in turn by rank)")
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent s of the models' shares")
    parser.add_argument("--rate", type=float, default=0.5, help="offered requests/s over all models")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of each measured window")
    parser.add_argument(
        "--warmup", type=float, default=5.0, help="seconds of traffic before each of the pool's windows"
    )
    parser.add_argument("--repeats", type=int, default=3, help="windows per side (medians over them)")
    parser.add_argument("--hot", type=int, default=3, help="the hot models: this many of the top shares")
    parser.add_argument(
        "--budget-share",
        type=float,
        default=0.2,
        help="the pool's budget: this share of the services' resident bytes together (0.25 fits 5 of 20 "
        "models of the mean size)",
    )
    parser.add_argument("--budget-bytes", type=int, default=None, help="the pool's budget (instead)")
    parser.add_argument(
        "--pin-hot",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the pool pins the hot models (ModelPool spec.pinned: loaded at start, never evicted)",
    )
    parser.add_argument(
        "--target-p99",
        type=float,
        default=None,
        help="the hot models' P99 target, seconds (default: an InferenceService's autoscaling.targetP99)",
    )
    parser.add_argument("--sample-interval", type=float, default=0.5, help="seconds between memory samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--logs", type=Path, default=None, help="a folder that keeps every runtime's log (default: none kept)"
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "pool.json"))
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.models < 1 or args.repeats < 1 or args.hot < 1:
        parser.error("--models, --repeats and --hot must be at least 1")
    if args.hot > args.models:
        parser.error("--hot must not exceed --models")
    if args.rate <= 0 or args.seconds <= 0 or args.warmup < 0 or args.sample_interval <= 0:
        parser.error("--rate, --seconds and --sample-interval must be positive, --warmup not negative")
    if args.zipf < 0:
        parser.error("--zipf must not be negative")
    if args.budget_share <= 0 or (args.budget_bytes is not None and args.budget_bytes < 1):
        parser.error("the budget must be positive")
    if args.target_p99 is not None and args.target_p99 <= 0:
        parser.error("--target-p99 must be positive")
    return args


def verdict(services: Mapping[str, Any], pool: Mapping[str, Any], target_p99: float) -> dict[str, Any]:
    """The issue's measure from the two sides' medians: the pool's memory-seconds over the services'
    (VmRSS and RssAnon), whether it is at most ``MEMORY_RATIO_TARGET``, each side's hot P99 against
    ``target_p99`` (seconds), and the failed requests of each."""
    ratio = pool["memory"]["rss_byte_seconds"] / services["memory"]["rss_byte_seconds"]
    anon = pool["memory"]["anon_byte_seconds"] / services["memory"]["anon_byte_seconds"]

    def within(side: Mapping[str, Any]) -> bool | None:
        p99 = side["hot"]["p99_seconds"]
        return None if p99 is None else bool(p99 <= target_p99)

    return {
        "memory_seconds_ratio_pool_to_services": ratio,
        "anon_memory_seconds_ratio_pool_to_services": anon,
        "memory_ratio_target": MEMORY_RATIO_TARGET,
        "memory_within_target": bool(ratio <= MEMORY_RATIO_TARGET),
        "target_p99_seconds": target_p99,
        "hot_p99_within_target": {SERVICES: within(services), POOL: within(pool)},
        "failed_requests": {SERVICES: services["failed"], POOL: pool["failed"]},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (``parse_args``' options) under the bench lock and write ``--out``."""
    args = parse_args(argv)
    target_p99 = args.target_p99 if args.target_p99 is not None else default_target_p99()
    from kubeinfer.runtime.models.huggingface import heldout_sentences

    sentences = heldout_sentences()
    shares = zipf_shares(args.models, args.zipf)
    with quiet.quiet_run("pool", args, log=progress) as run:
        began = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="kubeinfer-pool-bench-") as tmp:
            root = Path(tmp)
            models = make_models(root, shares)
            progress(f"made {len(models)} models in {time.monotonic() - began:.1f} s")
            services, sizes = run_side(
                SERVICES, lambda s: start_services(models, s, args.logs), models, args, sentences
            )
            budget = args.budget_bytes or budget_bytes(list(sizes.values()), args.budget_share)
            progress(f"pool budget {budget / 2**20:.0f} MiB")
            pinned = [models[i].name for i in hot_models(shares, args.hot)] if args.pin_hot else []
            pool, _ = run_side(
                POOL,
                lambda s: start_pool(models, root / "repository", budget, pinned, s, args.logs),
                models,
                args,
                sentences,
            )
        result: dict[str, Any] = {
            "benchmark": "pool",
            "command": ["bench/pool.py", *(sys.argv[1:] if argv is None else argv)],
            "setup": {
                "models": [
                    {"name": m.name, "kind": m.kind, "rank": m.rank, "share": round(m.share, 5)}
                    for m in models
                ],
                "hot_models": [models[i].name for i in hot_models(shares, args.hot)],
                "hot_share": float(sum(shares[i] for i in hot_models(shares, args.hot))),
                "zipf_s": args.zipf,
                "rate_rps": args.rate,
                "window_seconds": args.seconds,
                "warmup_seconds": args.warmup,
                "repeats": args.repeats,
                "seed": args.seed,
                "sample_interval_seconds": args.sample_interval,
                "services_rss_bytes": sorted(sizes.values()),
                "pool_budget_bytes": budget,
                "pool_budget_share": args.budget_share if args.budget_bytes is None else None,
                "pool_pinned": pinned,
                "client_timeout_seconds": CLIENT_TIMEOUT_SECONDS,
                "runtime_config": "an InferenceService's (operator builders.configmap.runtime_config), cpu",
            },
            "sides": {SERVICES: services, POOL: pool},
            "verdict": verdict(services["median"], pool["median"], target_p99),
            "elapsed_seconds": time.monotonic() - began,
        }
        run.write(result, args.out, log=progress)
    v = result["verdict"]
    progress(
        f"pool / services memory-seconds {v['memory_seconds_ratio_pool_to_services']:.3f} (anon "
        f"{v['anon_memory_seconds_ratio_pool_to_services']:.3f}, target <= {MEMORY_RATIO_TARGET}); hot P99 "
        f"services {_ms(services['median']['hot']['p99_seconds'])}, pool "
        f"{_ms(pool['median']['hot']['p99_seconds'])} (target {_ms(target_p99)}); failed "
        f"{v['failed_requests']}; cold first request {pool['median'].get('cold_first_request_seconds')}; "
        f"{result['elapsed_seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
