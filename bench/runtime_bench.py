"""Runtime benchmark: service time s(b), the batching limit X(B), and open-loop Poisson load.

``make bench-runtime`` (or ``.venv/bin/python bench/runtime_bench.py``) → ``bench/results/runtime.json``.

1. In process: the bundled all-MiniLM-L6-v2 (quantization ``int8-dynamic`` by default, as in the
   demo) is loaded and warmed up; the service time s(b) of ``preprocess`` + ``execute`` is measured
   for b = 1 … B (B = max batch size, 32), each the median over repeats of batches of b random
   held-out sentences. A least-squares fit s(b) = a + c·b gives the physical limit of a batching
   server X(B) = B / s(B) = B / (a + c·B) (DESIGN.md, "Benchmarks").
2. A real ``kubeinfer-runtime serve`` process (``hack/devtools/runtime_proc.py``) gets open-loop
   Poisson load (seeded arrival times; one random held-out sentence per request, JSON input, binary
   output) at rising rates. The configurations run side by side in ONE process, switched through the
   watched config file (hot reload, verified on ``/metrics``), interleaved rate by rate so the
   shared machine's noise hits them alike: batching off (``max_batch_size: 1``) and batched with a
   few ``max_queue_delay`` values. Per rate: throughput, P50, P99 (latency from each request's
   scheduled arrival, so a slow client cannot hide queueing), errors. A configuration leaves the
   sweep after two rates over the SLO; then each configuration's highest passing rate is refined by
   ``--refine`` bisection rounds (geometric midpoints, interleaved), so the ratios are not quantized
   by the ×1.4 grid. Before the sweep each configuration gets a low-load run whose P99 is compared
   with s(1).
3. Figures: the highest rate whose P99 < 100 ms (with ≥ 99 % of requests answered 200) per
   configuration, as ratios to batching off and to X(B); low-load P99 − s(1). The client is aiohttp
   with keep-alive connections; its own overhead is reported (CPU seconds per request in the
   benchmark process, and the round trip of ``GET /v2/health/live``).
4. Bound at the SLO (``ideal_slo_rate``): the highest Poisson rate at which an ideal batching server
   with the measured s(b) (work-conserving, no front end, no noise) keeps P99 ≤ 100 ms, batched and
   unbatched; the measured rates are also given as a fraction of it.
5. Where the low-load latency goes (``low_load_breakdown``): each low-load request's latency minus
   the in-process s(1) of its own sentence (measured back to back, and after an idle gap as a
   low-load request finds the model), and the server's mean request, queue and compute times over
   the run (/metrics); each sweep point also records the server's mean batch size and compute time.

``--threads 1,2``: one runtime per torch intra-op thread count (``KUBEINFER_TORCH_THREADS``), all
started before the load and interleaved with the others rate by rate, and s(b) for each count in
interleaved rounds: the thread counts side by side in one run (``by_threads``; the top level is the
runtime's default count's).

Targets (2-core CPU): batched max SLO rate ≥ 3× batching off and ≥ 85 % of X(B),
in fp32 (``none``) and ``int8-dynamic``; low-load P99 ≤ s(1) + 5 ms. The script reports what it
measures; it never asserts them.

**Configurations: engine × quantization mode.** ``--engines torch,onnxruntime`` (``model.engine``) and
``--quantization none,int8-dynamic`` (the defaults) make four: torch fp32, torch int8-dynamic,
onnxruntime fp32 (``runtime/models/hf_onnx.py``: the encoder and its pooling exported to ONNX at load,
cached) and onnxruntime int8-dynamic, run in turn through phases 1 and 2 in one process, with the same
model, thread count(s), sentences and seeds (the engine is one more axis of the modes' kind: it picks
what is loaded; the thread counts and batching configurations within each are interleaved as above).
Phase 1 also measures s(b) at each ``--batches`` size above B (default 1, 8, 32, 64; of those, 64),
outside the fit. JSON: the top level is torch int8-dynamic's (the demo's; ``bench/autoscaler_sim.py``
reads its a, c and B), ``by_quantization`` torch's configurations by mode (as before the engine
axis), ``by_engine`` the other engines' (``{engine: {mode: ...}}``, same layout), and ``engines`` the
comparison:
``{reference: "torch/none", threads, batch_sizes, slo_p99_seconds, variants: {"engine/mode": {engine,
quantization, threads, cosine_mean, retrieval_agreement, retrieval_agreement_all (the load's report()
against torch fp32: quantization_cosine_mean_ratio, ..._retrieval_agreement_ratio, ..._all_ratio; 1 for
torch fp32 itself), service_seconds and rows_per_second (b / s(b), in process, the runtime's default
thread count) by batch size, a_seconds, c_seconds, limit_rps, max_slo_rps (best batched configuration)
and max_slo_rps_unbatched (served, P99 ≤ 100 ms), best_batched_config, budget_exhausted, details (where
its full result is), ratio_to_reference: {rows_per_second by batch size, max_slo_rps,
max_slo_rps_unbatched, limit_rps} divided by torch fp32's of this run}}}``; the same as a table at the end.

**Run time.** Each configuration's load phase is bounded by ``--budget`` (low load and sweep, default
300 s) plus ``--refine-budget`` (60 s), plus its loads. The smoke run (``--noisy --repeats 1
--low-seconds 1 --step-seconds 1 --budget 5 --refine 1 --refine-budget 2 --delays 0.002 --start-rate
20``, machine busy) took 163 s for the four configurations: 31 to 47 s each for the in-process load,
warmup, s(b) and the per-sentence s(1), the runtime's start (12 to 17 s) and two low-load runs. At the
defaults a sweep ends at each batching configuration's second rate over the SLO, well inside the budget
(each ×1.4 step costs the four batching configurations about 16 to 25 s): about 14 (torch fp32) to 30
(onnxruntime int8-dynamic) points, which with the low load (4 × ~12 s), 7 repeats of s(b) (5 to 20 s),
the per-sentence s(1) (10 to 25 s) and the refinement (~30 s) makes 3 to 5 minutes a configuration: about 15
to 20 minutes for the four, plus up to ``--settle-seconds`` waiting for a quiet machine; at most about 28
if every sweep ran to its budget. That fits the ~25 minutes the comparison is sized for, so the budgets
stayed as they were (300 s and 60 s a configuration); ``--engines torch`` is the run before the engine
axis (two configurations).

Like every benchmark that measures, it runs under ``bench/quiet.py``: the machine-wide bench lock, and
no measurement while the 1-minute load average is over 0.5 unless ``--noisy`` (the JSON then says
``"noisy": true``); ``machine`` in the JSON records the CPU, the cores and the load before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# ROOT for hack.devtools.runtime_proc; bench/ for quiet, also when a test loads this file by path
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import quiet  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SLO_P99_SECONDS = 0.100
MODEL = "minilm"
#: Default seconds of each configuration's (engine, mode) load phase and of its refinement: see the
#: module docstring for the run time they make with the four default configurations.
BUDGET_SECONDS = 300.0
REFINE_BUDGET_SECONDS = 60.0


def progress(message: str) -> None:
    """A progress line on stdout."""
    print(f"[runtime_bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- 1. service time in process -------------------------------------------------------------------


def _timed_batch(model: Any, data: np.ndarray, threads: int) -> float:
    """Seconds of ``preprocess`` + ``execute`` of one batch of texts with ``threads`` intra-op threads."""
    import torch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model.execute(model.preprocess([{"text": data}]))
    return time.perf_counter() - t0


def load_in_process(engine: str, quantization: str, threads: int) -> Any:
    """The model as a runtime with ``threads`` intra-op threads loads it (``load_model``, not warmed up;
    its ``report()`` has the quality figures against torch fp32 of every non-default engine or mode).

    ``KUBEINFER_TORCH_THREADS`` is ``threads`` while it loads: that sizes an ONNX Runtime session for
    good (torch's count is set again before every timed batch, ``_timed_batch``)."""
    from kubeinfer.runtime.config import RuntimeConfig
    from kubeinfer.runtime.models import load_model
    from kubeinfer.runtime.models.device import THREADS_ENV

    cfg = RuntimeConfig.model_validate(
        {"model": {"engine": engine}, "quantization": quantization_config(quantization), "device": "cpu"}
    )
    saved = os.environ.get(THREADS_ENV)
    os.environ[THREADS_ENV] = str(threads)
    try:
        return load_model(cfg)
    finally:
        if saved is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = saved


def service_batch_sizes(max_batch: int, batches: list[int]) -> list[int]:
    """The batch sizes s(b) is measured at: 1..``max_batch`` (the fit), and those of ``batches``
    above it (rows/s in the engine table only)."""
    return sorted(set(range(1, max_batch + 1)) | set(batches))


def measure_service_time(
    quantization: str,
    max_batch: int,
    repeats: int,
    seed: int,
    threads: list[int],
    low_sentences: list[str],
    gap: float,
    engine: str = "torch",
    batches: list[int] | None = None,
) -> tuple[dict[int, list[dict[str, float]]], dict[Any, list[float]], str, dict[str, float]]:
    """s(b) for b = 1..max_batch (and each b of ``batches`` above it) and each intra-op thread count
    in ``threads``: median seconds of preprocess+execute on b random held-out sentences, the thread
    counts interleaved round by round (``torch.set_num_threads`` before each batch; on ``engine``
    onnxruntime one model per count, its session sized at load) so the shared machine's noise hits
    them alike.

    Also, with ``threads[0]``, s(1) of each sentence of ``low_sentences`` (the low-load run's requests,
    in order; median of 3), so the low-load latencies can be compared request by request with the
    service time of their own sentence.

    And once more with ``threads[0]``, one sentence at a time after an idle ``gap`` (seconds; the low-load
    run's mean gap): key ``"spaced"``.

    Returns ``({threads: rows {"batch_size", "service_seconds"}}, {threads[0] or "spaced": [s(1) of
    each low-load sentence, seconds]}, device, the model's report())``.
    """
    from kubeinfer.runtime.models.huggingface import heldout_sentences

    sizes = service_batch_sizes(max_batch, batches or [])
    # torch's thread count is set per batch; an ONNX Runtime session's is fixed when it is made
    loaded = {
        t: load_in_process(engine, quantization, t)
        for t in (threads if engine == "onnxruntime" else threads[:1])
    }
    models = {t: loaded.get(t, loaded[threads[0]]) for t in threads}
    sentences = [s.encode() for s in heldout_sentences()]
    for t, model in loaded.items():
        model.warmup(max_batch, 1)
        for b in (b for b in sizes if b > max_batch):  # one untimed batch of each size above B
            data = np.empty(b, dtype=object)
            data[:] = [sentences[i % len(sentences)] for i in range(b)]
            _timed_batch(model, data, t)
    model = models[threads[0]]
    report = model.report()
    progress(f"in-process model loaded ({engine}, {quantization}): {report}")
    rng = np.random.default_rng(seed)
    times: dict[int, dict[int, list[float]]] = {t: {b: [] for b in sizes} for t in threads}

    # Rounds over all b in a shuffled order: noise from the shared machine spreads over every b
    # instead of distorting whichever b ran during a busy moment.
    for _ in range(repeats):
        for b in rng.permutation(np.array(sizes)).tolist():
            pick = rng.choice(len(sentences), size=b, replace=True)
            data = np.empty(b, dtype=object)
            data[:] = [sentences[i] for i in pick]
            for t in threads:
                times[t][b].append(_timed_batch(models[t], data, t))
    rows: dict[int, list[dict[str, float]]] = {}
    for t in threads:
        rows[t] = [{"batch_size": b, "service_seconds": statistics.median(times[t][b])} for b in sizes]
        shown = ", ".join(
            f"s({r['batch_size']}) {r['service_seconds'] * 1000:.2f}"
            for r in rows[t]
            if r["batch_size"] in (1, 2, 4, 8, 16, 32) or r["batch_size"] >= max_batch
        )
        progress(f"  {t} thread(s): {shown} ms")
    per_sentence: list[list[float]] = [[] for _ in low_sentences]
    for _ in range(3):
        for i, sentence in enumerate(low_sentences):
            data = np.empty(1, dtype=object)
            data[:] = [sentence.encode()]
            per_sentence[i].append(_timed_batch(model, data, threads[0]))
    s1_by_request: dict[Any, list[float]] = {threads[0]: [statistics.median(x) for x in per_sentence]}
    # The same sentences one at a time with an idle gap before each (as a low-load request finds the
    # server: caches and the CPU's other work have moved on), first thread count only.
    spaced = []
    for sentence in low_sentences:
        time.sleep(gap)
        data = np.empty(1, dtype=object)
        data[:] = [sentence.encode()]
        spaced.append(_timed_batch(model, data, threads[0]))
    s1_by_request["spaced"] = spaced
    device = model.device
    del model
    models.clear()
    loaded.clear()
    gc.collect()
    return rows, s1_by_request, device, report


def fit_service_time(rows: list[dict[str, float]]) -> tuple[float, float]:
    """Least-squares (a, c) of s(b) = a + c·b, seconds."""
    b = np.array([r["batch_size"] for r in rows], dtype=np.float64)
    s = np.array([r["service_seconds"] for r in rows], dtype=np.float64)
    c, a = np.polyfit(b, s, 1)
    return float(a), float(c)


def ideal_slo_rate(
    a: float, c: float, max_batch: int, slo: float = SLO_P99_SECONDS, requests: int = 20000, seed: int = 0
) -> float:
    """The highest Poisson arrival rate (requests/s, one row each) at which an ideal batching server
    with batch service time s(b) = a + c·b (seconds) keeps the P99 latency at or under ``slo``.

    The ideal server has no front end, no client and no noise: one executor, and whenever it is idle
    it starts a batch at once with everything queued, up to ``max_batch`` rows (work-conserving:
    waiting cannot help a server that is idle when nothing else is queued). ``requests`` seeded
    arrivals per rate; bisection between 0 and X(B). A bound for a real work-conserving server with this
    s(b), which also has sentence-length variance, a front end and the machine's noise (not a proof
    that no other dispatch policy could hold more)."""
    unit = np.random.default_rng(seed).exponential(1.0, size=requests)

    def p99(rate: float) -> float:
        t = np.cumsum(unit / rate)
        latency = np.empty(requests)
        free = 0.0
        i = 0
        while i < requests:
            start = max(free, float(t[i]))
            j = min(int(np.searchsorted(t, start, side="right")), i + max_batch)
            free = start + a + c * (j - i)
            latency[i:j] = free - t[i:j]
            i = j
        return float(np.percentile(latency, 99))

    lo, hi = 0.0, max_batch / (a + c * max_batch)
    for _ in range(25):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p99(mid) <= slo else (lo, mid)
    return lo


def quantization_config(mode: str) -> dict[str, Any]:
    """runtime.yaml's ``quantization`` for ``mode``: int8-static calibrates on the bundled texts."""
    return {"mode": mode, **({"calibration_path": "default"} if mode == "int8-static" else {})}


def compare_modes(modes: list[str], max_batch: int, repeats: int, seed: int) -> dict[str, Any]:
    """Optional: every quantization mode side by side in process: the loader's deviation report and
    s(1), s(B), measured in interleaved rounds (median); speed-up relative to ``none``."""
    from kubeinfer.runtime.config import RuntimeConfig
    from kubeinfer.runtime.models import load_model
    from kubeinfer.runtime.models.huggingface import heldout_sentences

    models = {}
    for mode in modes:
        model = load_model(
            RuntimeConfig.model_validate({"quantization": quantization_config(mode), "device": "cpu"})
        )
        model.warmup(max_batch, 1)
        models[mode] = model
        progress(f"  {mode}: {model.report()}")
    sentences = [s.encode() for s in heldout_sentences()]
    rng = np.random.default_rng(seed)
    times: dict[tuple[str, int], list[float]] = {(m, b): [] for m in modes for b in (1, max_batch)}
    for _ in range(repeats):
        for mode in rng.permutation(modes).tolist():
            for b in (1, max_batch):
                data = np.empty(b, dtype=object)
                data[:] = [sentences[i] for i in rng.choice(len(sentences), size=b)]
                t0 = time.perf_counter()
                models[mode].execute(models[mode].preprocess([{"text": data}]))
                times[(mode, b)].append(time.perf_counter() - t0)
    result: dict[str, Any] = {}
    for mode in modes:
        s1 = statistics.median(times[(mode, 1)])
        sb = statistics.median(times[(mode, max_batch)])
        result[mode] = {"report": models[mode].report(), "s1_seconds": s1, "sB_seconds": sb}
    if "none" in result:
        for mode in modes:
            result[mode]["speedup_s1_vs_none"] = result["none"]["s1_seconds"] / result[mode]["s1_seconds"]
            result[mode]["speedup_sB_vs_none"] = result["none"]["sB_seconds"] / result[mode]["sB_seconds"]
    for mode in modes:
        progress(
            f"  {mode:>13}: s(1) {result[mode]['s1_seconds'] * 1000:.1f} ms, s({max_batch}) "
            f"{result[mode]['sB_seconds'] * 1000:.1f} ms, cosine "
            f"{result[mode]['report'].get('quantization_cosine_mean_ratio', float('nan')):.4f}"
        )
    models.clear()
    gc.collect()
    return result


# --- 2. open-loop load ----------------------------------------------------------------------------


def request_sentences(seed: int, count: int = 512) -> list[str]:
    """The sentence of each request body, in order: ``count`` random held-out sentences."""
    from kubeinfer.runtime.models.huggingface import heldout_sentences

    sentences = heldout_sentences()
    rng = np.random.default_rng(seed)
    return [sentences[int(i)] for i in rng.choice(len(sentences), size=count)]


def request_body(text: str, parameters: dict[str, Any] | None = None) -> bytes:
    """One pre-encoded v2 JSON request of one text row, binary output requested; ``parameters``:
    the request's parameters (e.g. ``{"cache": False}``), none when not given."""
    body: dict[str, Any] = {
        "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}],
        "outputs": [{"name": "embedding", "parameters": {"binary_data": True}}],
    }
    if parameters:
        body["parameters"] = parameters
    return json.dumps(body).encode()


def request_bodies(seed: int, count: int = 512) -> list[bytes]:
    """Pre-encoded v2 JSON requests (``request_body``), one random held-out sentence each."""
    return [request_body(sentence) for sentence in request_sentences(seed, count)]


def client_session() -> Any:
    """The load's HTTP client: an ``aiohttp.ClientSession`` with keep-alive connections (up to 1024),
    a 10 s timeout per request and JSON requests; use it as ``async with``."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=1024, force_close=False)
    timeout = aiohttp.ClientTimeout(total=10.0)
    headers = {"Content-Type": "application/json"}
    return aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers)


async def run_rate(
    session: Any,
    url: str,
    bodies: list[bytes],
    rate: float,
    duration: float,
    seed: int,
    per_request: bool = False,
) -> dict[str, Any]:
    """Open-loop Poisson arrivals at ``rate``/s for ``duration`` s; latency from scheduled arrival; the
    client's garbage collector paused for the point (``quiet.collector_paused``).

    Request i sends ``bodies[i % len(bodies)]``. ``per_request``: the point also has
    ``latency_by_request``, ``[i, seconds]`` of each request answered 200."""
    import aiohttp

    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=int(rate * duration * 2) + 10)
    arrivals = np.cumsum(gaps)
    arrivals = arrivals[arrivals < duration]
    latencies: list[float] = []
    by_request: list[list[float]] = []
    errors = 0
    done_at: list[float] = []
    loop = asyncio.get_running_loop()

    async def one(index: int, at: float) -> None:
        nonlocal errors
        try:
            async with session.post(url, data=bodies[index % len(bodies)]) as response:
                await response.read()
                ok = response.status == 200
        except (TimeoutError, aiohttp.ClientError):
            ok = False
        now = loop.time()
        done_at.append(now)
        if ok:
            latencies.append(now - at)
            by_request.append([float(index), now - at])
        else:
            errors += 1

    tasks = []
    with quiet.collector_paused():  # a collection during the point would read as the server's latency
        cpu0 = time.process_time()
        start = loop.time() + 0.05
        for i, offset in enumerate(arrivals):
            at = start + float(offset)
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, at)))
        await asyncio.gather(*tasks)
        cpu = time.process_time() - cpu0
    n = len(arrivals)
    ok = len(latencies)
    span = (max(done_at) - start) if done_at else duration
    lat = np.array(latencies) if latencies else np.array([float("inf")])
    point: dict[str, Any] = {
        "offered_rps": rate,
        "requests": float(n),
        "ok": float(ok),
        "errors": float(errors),
        "throughput_rps": ok / span if span > 0 else 0.0,
        "p50_seconds": float(np.percentile(lat, 50)),
        "p99_seconds": float(np.percentile(lat, 99)),
        "max_seconds": float(lat.max()),
        "client_cpu_seconds_per_request": cpu / n if n else 0.0,
    }
    if per_request:
        point["latency_by_request"] = sorted(by_request)
    return point


def meets_slo(point: dict[str, float]) -> bool:
    """P99 under the SLO and at least 99 % of the requests answered 200."""
    return point["p99_seconds"] < SLO_P99_SECONDS and point["ok"] >= 0.99 * point["requests"]


def gauge_values(metrics_text: str) -> dict[str, float]:
    """``kubeinfer_max_batch_size`` / ``kubeinfer_max_queue_delay_seconds`` from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {"kubeinfer_max_batch_size", "kubeinfer_max_queue_delay_seconds"}
    values = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in wanted and sample.labels.get("model") == MODEL:
                values[sample.name] = sample.value
    return values


def apply_config(rt: Any, base: Any, batch: int, delay: float, timeout: float = 15.0) -> None:
    """Hot-reload the batching section and wait until /metrics shows it in force."""
    cfg = base.model_copy(
        update={
            "batching": base.batching.model_copy(
                update={"max_batch_size": batch, "max_queue_delay_seconds": delay}
            )
        }
    )
    rt.write_config(cfg)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        values = gauge_values(rt.metrics_text())
        if (
            values.get("kubeinfer_max_batch_size") == batch
            and abs(values.get("kubeinfer_max_queue_delay_seconds", -1.0) - delay) < 1e-9
        ):
            return
        time.sleep(0.2)
    raise RuntimeError(
        f"runtime did not apply max_batch_size={batch}, max_queue_delay={delay} in {timeout} s"
    )


def config_name(batch: int, delay: float, threads: int | None = None) -> str:
    """``unbatched`` / ``batched_delay_Xms``, prefixed ``tN/`` when several thread counts run."""
    name = "unbatched" if batch == 1 else f"batched_delay_{delay * 1000:g}ms"
    return name if threads is None else f"t{threads}/{name}"


HISTOGRAMS = (
    "kubeinfer_request_duration_seconds",
    "kubeinfer_queue_duration_seconds",
    "kubeinfer_compute_duration_seconds",
    "kubeinfer_batch_size",
)


def histogram_totals(metrics_text: str) -> dict[str, list[float]]:
    """``{histogram: [sum, count]}`` of the model's ``HISTOGRAMS`` on /metrics (request_duration
    summed over status codes)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {name: [0.0, 0.0] for name in HISTOGRAMS}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            base, _, suffix = sample.name.rpartition("_")
            if base in totals and suffix in ("sum", "count") and sample.labels.get("model") == MODEL:
                totals[base][0 if suffix == "sum" else 1] += sample.value
    return totals


def server_means(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, float | None]:
    """Mean per request (per batch for compute and batch size) between two ``histogram_totals``."""
    out: dict[str, float | None] = {}
    for name in HISTOGRAMS:
        total = after[name][0] - before[name][0]
        count = after[name][1] - before[name][1]
        out[name.removeprefix("kubeinfer_") + "_mean"] = total / count if count else None
    return out


class _Load:
    """What the steps of the load phase share: the runtimes (by intra-op thread count), their base
    config, the arguments, the client session, the request bodies, the configurations
    (``{name: (threads, batch, delay)}``), the phase's start (monotonic s) and the result.

    (A plain class, not a dataclass: tests load this script with ``spec_from_file_location`` and no
    ``sys.modules`` entry, where ``@dataclass`` cannot resolve the module.)"""

    def __init__(
        self,
        runtimes: dict[int, Any],
        base: Any,
        args: argparse.Namespace,
        session: Any,
        bodies: list[bytes],
    ) -> None:
        self.runtimes = runtimes
        self.base = base
        self.args = args
        self.session = session
        self.bodies = bodies
        several = len(runtimes) > 1
        self.configs = {
            config_name(b, d, t if several else None): (t, b, d)
            for t in runtimes
            for b, d in [(1, 0.0)] + [(args.max_batch, d) for d in args.delays]
        }
        self.started = time.monotonic()
        self.result: dict[str, Any] = {"configs": {}, "low_load": {}}

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def url(self, name: str) -> str:
        return f"{self.runtimes[self.configs[name][0]].url}/v2/models/{MODEL}/infer"

    async def switch(self, name: str) -> None:
        """Hot-reload configuration ``name``'s batching settings into its runtime."""
        threads, batch, delay = self.configs[name]
        await asyncio.to_thread(apply_config, self.runtimes[threads], self.base, batch, delay)

    async def run(self, name: str, rate: float, seed: int) -> dict[str, Any]:
        """Switch to configuration ``name``, then one sweep point at ``rate`` with its SLO verdict."""
        await self.switch(name)
        rt = self.runtimes[self.configs[name][0]]
        before = await asyncio.to_thread(rt.metrics_text)
        point: dict[str, Any] = await run_rate(
            self.session, self.url(name), self.bodies, rate, self.args.step_seconds, seed
        )
        point["meets_slo"] = meets_slo(point)
        after = await asyncio.to_thread(rt.metrics_text)
        point["server"] = server_means(histogram_totals(before), histogram_totals(after))
        return point


def _point_line(name: str, rate: float, point: dict[str, Any]) -> str:
    return (
        f"{name:>24} {rate:7.1f}/s → {point['throughput_rps']:7.1f}/s, P50 "
        f"{point['p50_seconds'] * 1000:7.1f} ms, P99 {point['p99_seconds'] * 1000:7.1f} ms, "
        f"errors {point['errors']:.0f}"
    )


async def _client_floor(load: _Load) -> None:
    """Client floor: 100 sequential ``GET /v2/health/live`` round trips, median."""
    rtts = []
    url = next(iter(load.runtimes.values())).url
    for _ in range(100):
        t0 = time.perf_counter()
        async with load.session.get(f"{url}/v2/health/live") as response:
            await response.read()
        rtts.append(time.perf_counter() - t0)
    load.result["client_live_rtt_median_seconds"] = statistics.median(rtts)
    progress(f"client: GET /v2/health/live median round trip {statistics.median(rtts) * 1000:.2f} ms")


async def _low_load(load: _Load) -> None:
    """Each configuration: a short settling run (not recorded), then the low-load run with each
    request's latency, and the server's mean request, queue and compute times over it (/metrics)."""
    args = load.args
    for name, (threads, batch, delay) in load.configs.items():
        rt = load.runtimes[threads]
        await load.switch(name)
        await run_rate(
            load.session, load.url(name), load.bodies, 20.0, 1.0, args.seed
        )  # settle (not recorded)
        before = await asyncio.to_thread(rt.metrics_text)
        point = await run_rate(
            load.session,
            load.url(name),
            load.bodies,
            args.low_rate,
            args.low_seconds,
            args.seed + 1,
            per_request=True,
        )
        point["server"] = server_means(
            histogram_totals(before), histogram_totals(await asyncio.to_thread(rt.metrics_text))
        )
        load.result["low_load"][name] = point
        progress(
            f"{name:>24} low load {args.low_rate:g}/s: P50 {point['p50_seconds'] * 1000:.1f} ms, "
            f"P99 {point['p99_seconds'] * 1000:.1f} ms, errors {point['errors']:.0f}"
        )
        load.result["configs"][name] = {
            "threads": threads,
            "max_batch_size": batch,
            "max_queue_delay_seconds": delay,
            "points": [],
        }


async def _sweep(load: _Load) -> None:
    """Rising rates (×rate_factor a step), configurations interleaved rate by rate; a configuration
    leaves after two rates over the SLO; stops at ``--budget``."""
    args = load.args
    active = list(load.configs)
    misses = dict.fromkeys(active, 0)
    rate = args.start_rate
    step = 0
    while active and load.elapsed() < args.budget:
        for name in list(active):
            point = await load.run(name, rate, args.seed + 100 + step)
            load.result["configs"][name]["points"].append(point)
            progress(
                f"{_point_line(name, rate, point)}, "
                f"client {point['client_cpu_seconds_per_request'] * 1e6:.0f} µs/req, "
                f"batch {point['server']['batch_size_mean'] or 0:.1f} rows in "
                f"{(point['server']['compute_duration_seconds_mean'] or 0) * 1000:.1f} ms"
            )
            misses[name] = 0 if point["meets_slo"] else misses[name] + 1
            if misses[name] >= 2:
                active.remove(name)
            if load.elapsed() > args.budget:
                break
        rate *= args.rate_factor
        step += 1
    load.result["budget_exhausted"] = bool(active)


async def _refine(load: _Load) -> None:
    """The rising sweep resolves the max SLO rate only to a factor rate_factor. Each configuration
    gets the same bisection (geometric midpoints between its highest passing rate and the next rate
    up), interleaved, so the ratios are not quantized by the coarse grid."""
    args = load.args
    configs = load.result["configs"]
    bounds = {}
    for name, cfg in configs.items():
        lo = max_slo_rate(cfg["points"])
        if lo > 0:
            bounds[name] = [lo, lo * args.rate_factor]
    for round_ in range(args.refine):
        for name, (lo, hi) in list(bounds.items()):
            if load.elapsed() > args.budget + args.refine_budget:
                break
            mid = (lo * hi) ** 0.5
            point = await load.run(name, mid, args.seed + 500 + round_)
            point["refinement"] = True
            configs[name]["points"].append(point)
            bounds[name] = [mid, hi] if point["meets_slo"] else [lo, mid]
            progress(f"{_point_line(name, mid, point)} (refinement {round_ + 1})")


async def load_phase(runtimes: dict[int, Any], base: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Low-load runs, then the interleaved rising-rate sweep, then its refinement, for every
    configuration: batching off and ``max_batch`` with each of ``--delays``, on each runtime
    (one per intra-op thread count)."""
    async with client_session() as session:
        load = _Load(runtimes, base, args, session, request_bodies(args.seed))
        await _client_floor(load)
        await _low_load(load)
        await _sweep(load)
        await _refine(load)
    return load.result


def max_slo_rate(points: list[dict[str, Any]]) -> float:
    """The highest offered rate whose point met the SLO, with no failing point at or below it among
    the refinement points (0 if none)."""
    failed_refined = [p["offered_rps"] for p in points if p.get("refinement") and not p["meets_slo"]]
    cap = min(failed_refined, default=float("inf"))
    return max((p["offered_rps"] for p in points if p["meets_slo"] and p["offered_rps"] < cap), default=0.0)


#: The engines ``--engines`` takes (``model.engine``), and the quantization modes each one serves.
ENGINES = ("torch", "onnxruntime")
ENGINE_MODES = {"onnxruntime": ("none", "int8-dynamic", "int8-static")}
#: The variant every other one's figures are divided by in ``engines`` (torch fp32).
REFERENCE = ("torch", "none")


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--quantization",
        default="none,int8-dynamic",
        help="model quantization modes, run one after the other (fp32 'none' and the demo's int8-dynamic)",
    )
    parser.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help="model engines (model.engine), each with every mode of --quantization, one configuration "
        f"after the other as the modes are (onnxruntime: {', '.join(ENGINE_MODES['onnxruntime'])} only); "
        "the engines section compares them with torch fp32",
    )
    parser.add_argument("--max-batch", type=int, default=32, help="B: max batch size (rows)")
    parser.add_argument(
        "--batches",
        default="1,8,32,64",
        help="batch sizes of the in-process rows/s in the engine table (sizes over --max-batch are "
        "measured beside s(1..B), outside the fit)",
    )
    parser.add_argument(
        "--delays", default="0,0.002,0.005", help="max_queue_delay values (s) of the batched runs"
    )
    parser.add_argument("--repeats", type=int, default=7, help="repeats per s(b) (median)")
    parser.add_argument("--start-rate", type=float, default=40.0, help="first offered rate (requests/s)")
    parser.add_argument("--rate-factor", type=float, default=1.4, help="rate multiplier per step")
    parser.add_argument("--step-seconds", type=float, default=3.0, help="seconds of load per rate")
    parser.add_argument("--low-rate", type=float, default=10.0, help="low-load rate (requests/s)")
    parser.add_argument("--low-seconds", type=float, default=10.0, help="low-load duration (s)")
    parser.add_argument(
        "--budget",
        type=float,
        default=BUDGET_SECONDS,
        help="seconds for the load phase of each configuration (engine, mode): low load and sweep",
    )
    parser.add_argument(
        "--refine", type=int, default=2, help="bisection rounds of each max SLO rate after the sweep"
    )
    parser.add_argument(
        "--refine-budget",
        type=float,
        default=REFINE_BUDGET_SECONDS,
        help="extra seconds for refinement, each configuration (engine, mode)",
    )
    parser.add_argument(
        "--threads",
        default="default",
        help="torch intra-op thread counts, one runtime each, side by side in one run (e.g. 1,2); "
        "'default': the runtime's default only (CPUs - 1)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compare-modes",
        default="",
        help="also compare these quantization modes in process, e.g. none,bf16,int8-dynamic,int8-static",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "runtime.json"))
    quiet.add_arguments(parser)
    return parser


def engine_variants(
    parser: argparse.ArgumentParser, modes: list[str], engines: list[str]
) -> list[tuple[str, str]]:
    """``[(engine, mode)]`` of ``--engines`` x ``--quantization`` (engines outer), or ``parser.error``
    for an empty list, a value given twice, an unknown engine, or a mode an engine does not serve."""
    if not modes or not engines:
        parser.error("--quantization and --engines each need at least one value")
    for name, values in (("--quantization", modes), ("--engines", engines)):
        if len(set(values)) != len(values):
            parser.error(f"{name} names a value twice: {','.join(values)}")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        parser.error(f"--engines: unknown engine {unknown[0]!r}; choose from {', '.join(ENGINES)}")
    for engine in engines:
        served = ENGINE_MODES.get(engine)
        refused = [m for m in modes if served is not None and m not in served]
        if refused:
            parser.error(
                f"--engines {engine} serves quantization {', '.join(served or ())} only, not "
                f"{', '.join(refused)}: drop it from --quantization or the engine from --engines"
            )
    return [(e, m) for e in engines for m in modes]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (see ``--help``); a bad value exits through ``parser.error``: status 2, one line.

    Adds ``variants``: ``[(engine, quantization)]``, every engine of ``--engines`` with every mode of
    ``--quantization``, in that order; ``threads`` and ``primary_threads`` (the runtime's default
    count, ``default_threads()``, when among ``--threads``, else the first); ``delays`` and
    ``batches`` as lists."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.variants = engine_variants(parser, _csv(args.quantization), _csv(args.engines))
    try:
        args.delays = [float(d) for d in _csv(args.delays)]
        args.batches = sorted({int(b) for b in _csv(args.batches)})
        threads = None if args.threads == "default" else [int(t) for t in _csv(args.threads)]
    except ValueError as exc:
        parser.error(f"--delays, --batches, --threads: {exc}")
    if not args.batches or min(args.batches) < 1:
        parser.error("--batches needs positive batch sizes")
    if threads is not None and (not threads or min(threads) < 1):
        parser.error("--threads needs positive thread counts (or 'default')")
    from kubeinfer.runtime.models.device import default_threads

    args.primary_threads = default_threads()
    args.threads = [args.primary_threads] if threads is None else threads
    if args.primary_threads not in args.threads:
        args.primary_threads = args.threads[0]
    return args


def variant_name(engine: str, quantization: str) -> str:
    """``torch/none``, ``onnxruntime/int8-dynamic``: one configuration of the engine axis."""
    return f"{engine}/{quantization}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with quiet.quiet_run("runtime_bench", args, log=progress) as run:
        started = time.monotonic()
        results: dict[tuple[str, str], dict[str, Any]] = {}
        for engine, mode in args.variants:
            progress(f"=== engine {engine}, quantization {mode} ===")
            results[(engine, mode)] = run_mode(args, mode, argv, engine=engine)
        result = run.stamp(
            {
                **assemble(results, args.primary_threads, args.batches),
                "elapsed_seconds": time.monotonic() - started,
            }
        )
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for line in engine_table(result["engines"]):
        progress(line)
    progress(f"wrote {out}{' (noisy: not a source of figures)' if run.noisy else ''}")
    return 0


def assemble(
    results: dict[tuple[str, str], dict[str, Any]], threads: int, batches: list[int]
) -> dict[str, Any]:
    """The results JSON (before ``quiet``'s stamp) from each configuration's ``run_mode`` result.

    The top level is torch int8-dynamic's (the demo's; ``bench/autoscaler_sim.py`` reads its a, c and
    B), else int8-dynamic's on the first engine, else the last configuration's. ``by_quantization``:
    that engine's configurations by mode (the layout of a run before the engine axis);
    ``by_engine``: every other engine's, ``{engine: {mode: result}}`` in the same layout; ``engines``:
    ``engine_comparison`` over all of them. The top level's machine is the whole run's (each
    configuration's own stays in its result)."""
    engines = list(dict.fromkeys(e for e, _ in results))
    primary_engine = "torch" if "torch" in engines else engines[0]
    own = {m: r for (e, m), r in results.items() if e == primary_engine}
    primary = own["int8-dynamic"] if "int8-dynamic" in own else list(results.values())[-1]
    by_engine = {
        e: {m: r for (e2, m), r in results.items() if e2 == e} for e in engines if e != primary_engine
    }
    summaries = [engine_summary(r, threads, batches) for r in results.values()]
    for (e, m), summary in zip(results, summaries, strict=True):
        summary["details"] = f"by_quantization.{m}" if e == primary_engine else f"by_engine.{e}.{m}"
    return {
        **primary,
        "by_quantization": own,
        "by_engine": by_engine,
        "engines": engine_comparison(summaries, threads, batches),
    }


def engine_summary(result: dict[str, Any], threads: int, batches: list[int]) -> dict[str, Any]:
    """One configuration's row of the engine comparison, from its ``run_mode`` result: the quality
    figures of its load (``report()``: mean cosine and retrieval agreement against torch fp32; 1 by
    definition for torch fp32 itself), in-process rows/s = b / s(b) at each of ``batches`` with
    ``threads`` intra-op threads, the fit a + c·b and X(B), and the served max rate at the SLO
    (the best batched configuration's, and unbatched)."""
    from kubeinfer.runtime.models.base import (
        REPORT_COSINE_MEAN,
        REPORT_RETRIEVAL_AGREEMENT,
        REPORT_RETRIEVAL_AGREEMENT_ALL,
    )

    fig = result["by_threads"][str(threads)]
    service = {int(r["batch_size"]): float(r["service_seconds"]) for r in fig["service_time"]}
    report = result.get("report") or {}
    return {
        "engine": result["engine"],
        "quantization": result["quantization"],
        "threads": threads,
        "cosine_mean": report.get(REPORT_COSINE_MEAN),
        "retrieval_agreement": report.get(REPORT_RETRIEVAL_AGREEMENT),
        "retrieval_agreement_all": report.get(REPORT_RETRIEVAL_AGREEMENT_ALL),
        "service_seconds": {str(b): service.get(b) for b in batches},
        "rows_per_second": {str(b): b / service[b] if service.get(b) else None for b in batches},
        "a_seconds": fig["a_seconds"],
        "c_seconds": fig["c_seconds"],
        "limit_rps": fig["limit_rps"],
        "max_slo_rps": fig["max_slo_rps"]["batched"],
        "max_slo_rps_unbatched": fig["max_slo_rps"]["unbatched"],
        "best_batched_config": fig["best_batched_config"],
        "budget_exhausted": bool(result.get("budget_exhausted")),
    }


def _ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def engine_comparison(
    summaries: list[dict[str, Any]], threads: int, batches: list[int], reference: tuple[str, str] = REFERENCE
) -> dict[str, Any]:
    """The ``engines`` section: each configuration's ``engine_summary`` with its ratios to the
    ``reference`` configuration's figures of this same run (``ratio_to_reference``: rows/s at each
    batch size, served max rate batched and unbatched, X(B); a ratio is null where either figure is
    missing or zero, and all are null when the reference did not run)."""
    by_name = {variant_name(s["engine"], s["quantization"]): s for s in summaries}
    ref = by_name.get(variant_name(*reference))
    variants = {}
    for name, s in by_name.items():
        ratios = None
        if ref is not None:
            ratios = {
                "rows_per_second": {
                    b: _ratio(v, ref["rows_per_second"].get(b)) for b, v in s["rows_per_second"].items()
                },
                "max_slo_rps": _ratio(s["max_slo_rps"], ref["max_slo_rps"]),
                "max_slo_rps_unbatched": _ratio(s["max_slo_rps_unbatched"], ref["max_slo_rps_unbatched"]),
                "limit_rps": _ratio(s["limit_rps"], ref["limit_rps"]),
            }
        variants[name] = {**s, "ratio_to_reference": ratios}
    return {
        "reference": variant_name(*reference) if ref is not None else None,
        "threads": threads,
        "batch_sizes": list(batches),
        "slo_p99_seconds": SLO_P99_SECONDS,
        "variants": variants,
    }


def _num(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def engine_table(engines: dict[str, Any]) -> list[str]:
    """The engine comparison as text lines: engine, mode, cosine and retrieval agreement to torch
    fp32, in-process rows/s at each batch size, the served max rate at the SLO (``>=``: the sweep's
    budget ran out first, a lower bound), each figure with its ratio to the reference."""
    batches = [str(b) for b in engines["batch_sizes"]]
    slo_ms = engines["slo_p99_seconds"] * 1000
    head = ["engine", "mode", "cosine", "agree"] + [f"b={b} rows/s" for b in batches]
    head.append(f"served/s P99<={slo_ms:.0f}ms")
    rows = [head]
    for s in engines["variants"].values():
        ratio = s["ratio_to_reference"] or {}
        per_batch = ratio.get("rows_per_second") or {}
        row = [
            s["engine"],
            s["quantization"],
            _num(s["cosine_mean"], ".4f"),
            _num(s["retrieval_agreement"], ".4f"),
        ]
        row += [
            f"{_num(s['rows_per_second'].get(b), '.0f')} x{_num(per_batch.get(b), '.2f')}" for b in batches
        ]
        bound = ">=" if s["budget_exhausted"] else ""
        row.append(f"{bound}{_num(s['max_slo_rps'], '.0f')} x{_num(ratio.get('max_slo_rps'), '.2f')}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    reference = engines["reference"] or "none (torch/none did not run)"
    lines = [
        f"engines compared in one run, {engines['threads']} intra-op thread(s); "
        f"xN: ratio to {reference} in this run"
    ]
    lines += [
        "  ".join(
            cell.rjust(w) if i > 1 else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    return lines


def low_load_breakdown(
    point: dict[str, Any], s1_by_request: list[float], spaced: list[float] | None = None
) -> dict[str, Any]:
    """Where a low-load run's latency goes, request by request and on average (seconds).

    - ``service_p99``: P99 over the run's requests of the in-process s(1) of each request's own
      sentence (the model's work alone, sentence lengths included);
    - ``excess_p50``/``excess_p99``: percentiles of latency minus that s(1), request by request (all
      that is not the model: client, HTTP, decoding, queueing, hand-offs, encoding, machine noise);
    - from /metrics over the run: the server's mean request time (receipt to response), queue time
      (enqueue to the start of its batch), compute time (preprocess + execute, per batch); the
      client-side mean minus the server's mean request time (client, TCP, HTTP parsing before receipt);
    - ``spaced_*``: the same with s(1) measured in process one request at a time after an idle gap
      (``spaced``, when given): what a lone request costs the model at this rate.
    """
    pairs = point["latency_by_request"]
    latency = np.array([lat for _, lat in pairs])
    service = np.array([s1_by_request[int(i) % len(s1_by_request)] for i, _ in pairs])
    excess = latency - service
    server = point["server"]
    out: dict[str, Any] = {
        "requests": len(pairs),
        "p50": float(np.percentile(latency, 50)),
        "p99": float(np.percentile(latency, 99)),
        "service_p50": float(np.percentile(service, 50)),
        "service_p99": float(np.percentile(service, 99)),
        "excess_p50": float(np.percentile(excess, 50)),
        "excess_p99": float(np.percentile(excess, 99)),
        "client_mean": float(latency.mean()),
        "service_mean": float(service.mean()),
        **server,
    }
    if spaced is not None:
        cold = np.array([spaced[int(i) % len(spaced)] for i, _ in pairs])
        out["spaced_service_mean"] = float(cold.mean())
        out["spaced_service_p99"] = float(np.percentile(cold, 99))
        out["spaced_excess_p50"] = float(np.percentile(latency - cold, 50))
        out["spaced_excess_p99"] = float(np.percentile(latency - cold, 99))
    if server.get("request_duration_seconds_mean") is not None:
        out["client_minus_server_mean"] = out["client_mean"] - server["request_duration_seconds_mean"]
        out["server_minus_queue_compute_mean"] = (
            server["request_duration_seconds_mean"]
            - (server["queue_duration_seconds_mean"] or 0.0)
            - (server["compute_duration_seconds_mean"] or 0.0)
        )
    return out


def thread_figures(
    load: dict[str, Any],
    threads: int,
    prefix: str,
    rows: list[dict[str, float]],
    s1_by_request: list[float] | None,
    spaced: list[float] | None,
    max_batch: int,
) -> dict[str, Any]:
    """The figures of the runtime with ``threads`` intra-op threads (its configurations are named
    ``prefix`` + config name): s(b) fit, X(B), max SLO rates and their ratios, the low-load P99 of the
    best batched configuration against s(1), and the low-load breakdown of every configuration.
    ``rows``: s(b) at 1..``max_batch``, the fit's, and any sizes above it (kept in ``service_time``)."""
    a, c = fit_service_time([r for r in rows if r["batch_size"] <= max_batch])
    limit = max_batch / (a + c * max_batch)
    ideal = {"batched": ideal_slo_rate(a, c, max_batch), "unbatched": ideal_slo_rate(a, c, 1)}
    s1 = rows[0]["service_seconds"]
    names = [n for n in load["configs"] if n.startswith(prefix)]
    max_slo = {n.removeprefix(prefix): max_slo_rate(load["configs"][n]["points"]) for n in names}
    best = max((n for n in max_slo if n != "unbatched"), key=lambda n: max_slo[n])
    unbatched = max_slo["unbatched"]
    low_p99 = load["low_load"][prefix + best]["p99_seconds"]
    return {
        "threads": threads,
        "a_seconds": a,
        "c_seconds": c,
        "limit_rps": limit,
        "s1_seconds": s1,
        "max_slo_rps": {"batched": max_slo[best], "unbatched": unbatched},
        "best_batched_config": best,
        "max_slo_rps_by_config": max_slo,
        "ratio_batched_to_unbatched": max_slo[best] / unbatched if unbatched else None,
        "ratio_batched_to_limit": max_slo[best] / limit,
        "ideal_slo_rps": ideal,
        "ideal_ratio_batched_to_unbatched": ideal["batched"] / ideal["unbatched"]
        if ideal["unbatched"]
        else None,
        "ideal_ratio_batched_to_limit": ideal["batched"] / limit,
        "ratio_batched_to_ideal": max_slo[best] / ideal["batched"] if ideal["batched"] else None,
        "low_load_p99_seconds": low_p99,
        "low_load_p99_minus_s1_seconds": low_p99 - s1,
        "low_load_p99_seconds_by_config": {
            n.removeprefix(prefix): load["low_load"][n]["p99_seconds"] for n in names
        },
        "low_load_breakdown_seconds": {
            n.removeprefix(prefix): low_load_breakdown(load["low_load"][n], s1_by_request, spaced)
            for n in names
        }
        if s1_by_request is not None
        else None,
        "service_time": rows,
    }


def _pct(x: float | None, fmt: str = ".0%") -> str:
    return "n/a" if x is None else format(x, fmt)


def _report(q: str, fig: dict[str, Any]) -> None:
    """Progress lines with one thread count's figures against the targets."""
    best, rates, ideal = fig["best_batched_config"], fig["max_slo_rps"], fig["ideal_slo_rps"]
    progress(
        f"{q}, {fig['threads']} thread(s): max SLO rate (P99 < {SLO_P99_SECONDS * 1000:.0f} ms): batched "
        f"({best}) {rates['batched']:.0f}/s, unbatched {rates['unbatched']:.0f}/s → "
        f"×{_pct(fig['ratio_batched_to_unbatched'], '.2f')} (target ≥ 3); vs X(B) {fig['limit_rps']:.0f}/s → "
        f"{_pct(fig['ratio_batched_to_limit'])} (target ≥ 85 %)"
    )
    progress(
        f"  an ideal batching server with this s(b) (no front end, no noise, Poisson arrivals): P99 ≤ "
        f"{SLO_P99_SECONDS * 1000:.0f} ms up to {ideal['batched']:.0f}/s batched "
        f"({_pct(fig['ideal_ratio_batched_to_limit'])} of X(B)), {ideal['unbatched']:.0f}/s unbatched "
        f"(×{_pct(fig['ideal_ratio_batched_to_unbatched'], '.2f')}); measured batched = "
        f"{_pct(fig['ratio_batched_to_ideal'])} of it"
    )
    progress(
        f"  low-load P99 {fig['low_load_p99_seconds'] * 1000:.1f} ms vs s(1) "
        f"{fig['s1_seconds'] * 1000:.1f} ms: +{fig['low_load_p99_minus_s1_seconds'] * 1000:.1f} ms "
        f"(target ≤ +5 ms)"
    )
    low = (fig["low_load_breakdown_seconds"] or {}).get(best)
    if low is None:
        return
    ms = {k: (v or 0.0) * 1000 for k, v in low.items() if isinstance(v, float) or v is None}
    progress(
        f"  P99 of the requests' own s(1) {ms['service_p99']:.1f} ms; latency − own s(1): P50 "
        f"{ms['excess_p50']:.1f} ms, P99 {ms['excess_p99']:.1f} ms"
    )
    if "spaced_service_mean" in low:
        progress(
            f"  the same sentences in process after an idle gap: s(1) mean "
            f"{ms['spaced_service_mean']:.1f} ms (back to back {ms['service_mean']:.1f}); server compute "
            f"per batch {ms['compute_duration_seconds_mean']:.1f} ms, queue "
            f"{ms['queue_duration_seconds_mean']:.2f} ms, "
            f"client − server {ms.get('client_minus_server_mean', 0.0):.1f} ms (means)"
        )


def run_mode(
    args: argparse.Namespace, quantization: str, argv: list[str] | None, engine: str = "torch"
) -> dict[str, Any]:
    """Phases 1 and 2 for one configuration (``engine``, quantization mode); the figures (see the
    module docstring)."""
    from kubeinfer.runtime.config import RuntimeConfig
    from kubeinfer.runtime.models.device import THREADS_ENV

    from hack.devtools.runtime_proc import RuntimeProcess

    args = argparse.Namespace(**{**vars(args), "quantization": quantization})
    started = time.monotonic()
    load_before = os.getloadavg()
    threads = args.threads
    low_count = min(512, int(args.low_rate * args.low_seconds * 1.5) + 20)
    extra = [b for b in args.batches if b > args.max_batch]
    progress(
        f"phase 1: service time s(b), b = 1..{args.max_batch}{''.join(f', {b}' for b in extra)}, {engine}, "
        f"{args.quantization}, {args.repeats} repeats, threads {threads}; s(1) of the first {low_count} "
        "request sentences"
    )
    rows, s1_by_request, device, report = measure_service_time(
        args.quantization,
        args.max_batch,
        args.repeats,
        args.seed,
        threads,
        request_sentences(args.seed)[:low_count],
        1.0 / args.low_rate,
        engine=engine,
        batches=args.batches,
    )
    modes = [m.strip() for m in args.compare_modes.split(",") if m.strip()]
    quantization_modes = None
    if modes:
        progress(f"phase 1b: quantization modes side by side: {modes}")
        quantization_modes = compare_modes(modes, args.max_batch, args.repeats * 3, args.seed)

    base = RuntimeConfig.model_validate(
        {
            "model": {"engine": engine},
            "quantization": quantization_config(args.quantization),
            "device": "cpu",
            "batching": {"max_batch_size": args.max_batch, "max_queue_size": 4096},
        }
    )
    progress(f"phase 2: starting kubeinfer-runtime with {THREADS_ENV} = each of {threads} (load + warmup)")
    with contextlib.ExitStack() as stack:
        runtimes = {}
        for t in threads:
            runtimes[t] = stack.enter_context(RuntimeProcess(base, env={THREADS_ENV: str(t)}))
            progress(f"runtime ({t} thread(s)) ready at {runtimes[t].url} (pid {runtimes[t].pid})")
        load = asyncio.run(load_phase(runtimes, base, args))

    several = len(threads) > 1
    by_threads = {
        t: thread_figures(
            load,
            t,
            f"t{t}/" if several else "",
            rows[t],
            s1_by_request.get(t),
            s1_by_request["spaced"] if t == threads[0] else None,
            args.max_batch,
        )
        for t in threads
    }
    for fig in by_threads.values():
        _report(variant_name(engine, args.quantization), fig)
    primary = by_threads[args.primary_threads]
    client_cpu = [
        p["client_cpu_seconds_per_request"] for cfg in load["configs"].values() for p in cfg["points"]
    ]
    return {
        "model": MODEL,
        "engine": engine,
        "quantization": args.quantization,
        "report": report,
        "device": device,
        "max_batch_size": args.max_batch,
        **{k: v for k, v in primary.items() if k not in ("low_load_breakdown_seconds", "service_time")},
        "slo_p99_seconds": SLO_P99_SECONDS,
        "low_load_rps": args.low_rate,
        "low_load_breakdown_seconds": primary["low_load_breakdown_seconds"],
        "client": {
            "library": "aiohttp (keep-alive), JSON input, binary output",
            "cpu_seconds_per_request_median": statistics.median(client_cpu) if client_cpu else None,
            "live_rtt_median_seconds": load["client_live_rtt_median_seconds"],
        },
        "targets": {
            "batched_over_unbatched_ge": 3.0,
            "batched_over_limit_ge": 0.85,
            "low_load_p99_le_s1_plus_seconds": 0.005,
        },
        "service_time": primary["service_time"],
        "by_threads": {str(t): fig for t, fig in by_threads.items()},
        "quantization_modes": quantization_modes,
        "sweep": load["configs"],
        "low_load": load["low_load"],
        "budget_exhausted": load["budget_exhausted"],
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "elapsed_seconds": time.monotonic() - started,
        "command": ["bench/runtime_bench.py", *(sys.argv[1:] if argv is None else argv)],
    }


if __name__ == "__main__":
    sys.exit(main())
