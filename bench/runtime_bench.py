"""Runtime benchmark: service time s(b), the batching limit X(B), and open-loop Poisson load.

``make bench-runtime`` (or ``.venv/bin/python bench/runtime_bench.py``) → ``bench/results/runtime.json``.

1. In process: the bundled all-MiniLM-L6-v2 (quantization ``int8-dynamic`` by default, as in the
   demo) is loaded and warmed up; the service time s(b) of ``preprocess`` + ``execute`` is measured
   for b = 1 … B (B = max batch size, 32), each the median over repeats of batches of b random
   held-out sentences. A least-squares fit s(b) = a + c·b gives the physical limit of a batching
   server X(B) = B / s(B) = B / (a + c·B) (DESIGN.md, "Benchmarks").
2. A real ``kubeinfer-runtime serve`` process (``tests/support/runtime_proc.py``) gets open-loop
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

Targets (issue 13 item 5, 2-core CPU): batched max SLO rate ≥ 3× batching off and ≥ 85 % of X(B),
in fp32 (``none``) and ``int8-dynamic``; low-load P99 ≤ s(1) + 5 ms. Every mode in ``--quantization``
runs in turn (``by_quantization``); the top-level figures are int8-dynamic's. The script reports what
it measures; it never asserts them. Run time per mode is bounded by ``--budget`` (default 300 s) plus
``--refine-budget`` plus the model loads.
"""

from __future__ import annotations

import argparse
import asyncio
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for tests.support.runtime_proc

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SLO_P99_SECONDS = 0.100
MODEL = "minilm"


def progress(message: str) -> None:
    """A progress line on stdout."""
    print(f"[runtime_bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- 1. service time in process -------------------------------------------------------------------


def measure_service_time(
    quantization: str, max_batch: int, repeats: int, seed: int
) -> tuple[list[dict[str, float]], str]:
    """s(b) for b = 1..max_batch: median seconds of preprocess+execute on b random held-out sentences.

    Returns the rows ``{"batch_size", "service_seconds"}`` and the device string.
    """
    from kubeinfer.runtime.config import RuntimeConfig
    from kubeinfer.runtime.models import load_model
    from kubeinfer.runtime.models.huggingface import heldout_sentences

    cfg = RuntimeConfig.model_validate({"quantization": {"mode": quantization}, "device": "cpu"})
    model = load_model(cfg)
    progress(f"in-process model loaded ({quantization}): {model.report()}")
    model.warmup(max_batch, 1)
    sentences = [s.encode() for s in heldout_sentences()]
    rng = np.random.default_rng(seed)
    times: dict[int, list[float]] = {b: [] for b in range(1, max_batch + 1)}
    # Rounds over all b in a shuffled order: noise from the shared machine spreads over every b
    # instead of distorting whichever b ran during a busy moment.
    for _ in range(repeats):
        for b in rng.permutation(np.arange(1, max_batch + 1)).tolist():
            pick = rng.choice(len(sentences), size=b, replace=True)
            data = np.empty(b, dtype=object)
            data[:] = [sentences[i] for i in pick]
            t0 = time.perf_counter()
            model.execute(model.preprocess([{"text": data}]))
            times[b].append(time.perf_counter() - t0)
    rows = []
    for b in range(1, max_batch + 1):
        s = statistics.median(times[b])
        rows.append({"batch_size": b, "service_seconds": s})
        if b in (1, 2, 4, 8, 16, 32) or b == max_batch:
            progress(f"  s({b}) = {s * 1000:.2f} ms  ({b / s:.0f} rows/s)")
    device = model.device
    del model
    gc.collect()
    return rows, device


def fit_service_time(rows: list[dict[str, float]]) -> tuple[float, float]:
    """Least-squares (a, c) of s(b) = a + c·b, seconds."""
    b = np.array([r["batch_size"] for r in rows], dtype=np.float64)
    s = np.array([r["service_seconds"] for r in rows], dtype=np.float64)
    c, a = np.polyfit(b, s, 1)
    return float(a), float(c)


def compare_modes(modes: list[str], max_batch: int, repeats: int, seed: int) -> dict[str, Any]:
    """Optional: every quantization mode side by side in process: the loader's deviation report and
    s(1), s(B), measured in interleaved rounds (median); speed-up relative to ``none``."""
    from kubeinfer.runtime.config import RuntimeConfig
    from kubeinfer.runtime.models import load_model
    from kubeinfer.runtime.models.huggingface import heldout_sentences

    models = {}
    for mode in modes:
        quant: dict[str, Any] = {"mode": mode}
        if mode == "int8-static":
            quant["calibration_path"] = "default"
        model = load_model(RuntimeConfig.model_validate({"quantization": quant, "device": "cpu"}))
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


def request_bodies(seed: int, count: int = 512) -> list[bytes]:
    """Pre-encoded v2 JSON requests, one random held-out sentence each, binary output requested."""
    from kubeinfer.runtime.models.huggingface import heldout_sentences

    sentences = heldout_sentences()
    rng = np.random.default_rng(seed)
    bodies = []
    for i in rng.choice(len(sentences), size=count):
        body = {
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [sentences[int(i)]]}],
            "outputs": [{"name": "embedding", "parameters": {"binary_data": True}}],
        }
        bodies.append(json.dumps(body).encode())
    return bodies


async def run_rate(
    session: Any, url: str, bodies: list[bytes], rate: float, duration: float, seed: int
) -> dict[str, float]:
    """Open-loop Poisson arrivals at ``rate``/s for ``duration`` s; latency from scheduled arrival."""
    import aiohttp

    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=int(rate * duration * 2) + 10)
    arrivals = np.cumsum(gaps)
    arrivals = arrivals[arrivals < duration]
    latencies: list[float] = []
    errors = 0
    done_at: list[float] = []
    loop = asyncio.get_running_loop()
    cpu0 = time.process_time()
    start = loop.time() + 0.05

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
        else:
            errors += 1

    tasks = []
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
    return {
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


def config_name(batch: int, delay: float) -> str:
    return "unbatched" if batch == 1 else f"batched_delay_{delay * 1000:g}ms"


class _Load:
    """What the steps of the load phase share: the runtime, its base config, the arguments, the client
    session, the infer URL, the request bodies, the phase's start (monotonic s) and the result.

    (A plain class, not a dataclass: tests load this script with ``spec_from_file_location`` and no
    ``sys.modules`` entry, where ``@dataclass`` cannot resolve the module.)"""

    def __init__(
        self, rt: Any, base: Any, args: argparse.Namespace, session: Any, url: str, bodies: list[bytes]
    ) -> None:
        self.rt = rt
        self.base = base
        self.args = args
        self.session = session
        self.url = url
        self.bodies = bodies
        self.started = time.monotonic()
        self.result: dict[str, Any] = {"configs": {}, "low_load": {}}

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    async def run(self, batch: int, delay: float, rate: float, seed: int) -> dict[str, Any]:
        """Switch to (batch, delay), then one sweep point at ``rate`` with its SLO verdict."""
        await asyncio.to_thread(apply_config, self.rt, self.base, batch, delay)
        point: dict[str, Any] = await run_rate(
            self.session, self.url, self.bodies, rate, self.args.step_seconds, seed
        )
        point["meets_slo"] = meets_slo(point)
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
    for _ in range(100):
        t0 = time.perf_counter()
        async with load.session.get(f"{load.rt.url}/v2/health/live") as response:
            await response.read()
        rtts.append(time.perf_counter() - t0)
    load.result["client_live_rtt_median_seconds"] = statistics.median(rtts)
    progress(f"client: GET /v2/health/live median round trip {statistics.median(rtts) * 1000:.2f} ms")


async def _low_load(load: _Load, configs: list[tuple[int, float]]) -> None:
    """Each configuration: a short settling run (not recorded), then the low-load run."""
    args = load.args
    for batch, delay in configs:
        name = config_name(batch, delay)
        await asyncio.to_thread(apply_config, load.rt, load.base, batch, delay)
        await run_rate(load.session, load.url, load.bodies, 20.0, 1.0, args.seed)  # settle (not recorded)
        point = await run_rate(
            load.session, load.url, load.bodies, args.low_rate, args.low_seconds, args.seed + 1
        )
        load.result["low_load"][name] = point
        progress(
            f"{name:>24} low load {args.low_rate:g}/s: P50 {point['p50_seconds'] * 1000:.1f} ms, "
            f"P99 {point['p99_seconds'] * 1000:.1f} ms, errors {point['errors']:.0f}"
        )
        load.result["configs"][name] = {
            "max_batch_size": batch,
            "max_queue_delay_seconds": delay,
            "points": [],
        }


async def _sweep(load: _Load, configs: list[tuple[int, float]]) -> None:
    """Rising rates (×rate_factor a step), configurations interleaved rate by rate; a configuration
    leaves after two rates over the SLO; stops at ``--budget``."""
    args = load.args
    active = {config_name(b, d): (b, d) for b, d in configs}
    misses = dict.fromkeys(active, 0)
    rate = args.start_rate
    step = 0
    while active and load.elapsed() < args.budget:
        for name, (batch, delay) in list(active.items()):
            point = await load.run(batch, delay, rate, args.seed + 100 + step)
            load.result["configs"][name]["points"].append(point)
            progress(
                f"{_point_line(name, rate, point)}, "
                f"client {point['client_cpu_seconds_per_request'] * 1e6:.0f} µs/req"
            )
            misses[name] = 0 if point["meets_slo"] else misses[name] + 1
            if misses[name] >= 2:
                del active[name]
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
            batch, delay = configs[name]["max_batch_size"], configs[name]["max_queue_delay_seconds"]
            point = await load.run(batch, delay, mid, args.seed + 500 + round_)
            point["refinement"] = True
            configs[name]["points"].append(point)
            bounds[name] = [mid, hi] if point["meets_slo"] else [lo, mid]
            progress(f"{_point_line(name, mid, point)} (refinement {round_ + 1})")


async def load_phase(rt: Any, base: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Low-load runs, then the interleaved rising-rate sweep, then its refinement, for every
    configuration: batching off and ``max_batch`` with each of ``--delays``."""
    import aiohttp

    configs = [(1, 0.0)] + [(args.max_batch, d) for d in args.delays]
    connector = aiohttp.TCPConnector(limit=1024, force_close=False)
    timeout = aiohttp.ClientTimeout(total=10.0)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        load = _Load(
            rt=rt,
            base=base,
            args=args,
            session=session,
            url=f"{rt.url}/v2/models/{MODEL}/infer",
            bodies=request_bodies(args.seed),
        )
        await _client_floor(load)
        await _low_load(load, configs)
        await _sweep(load, configs)
        await _refine(load)
    return load.result


def max_slo_rate(points: list[dict[str, Any]]) -> float:
    """The highest offered rate whose point met the SLO, with no failing point at or below it among
    the refinement points (0 if none)."""
    failed_refined = [p["offered_rps"] for p in points if p.get("refinement") and not p["meets_slo"]]
    cap = min(failed_refined, default=float("inf"))
    return max((p["offered_rps"] for p in points if p["meets_slo"] and p["offered_rps"] < cap), default=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quantization",
        default="none,int8-dynamic",
        help="model quantization modes, run one after the other (fp32 'none' and the demo's int8-dynamic)",
    )
    parser.add_argument("--max-batch", type=int, default=32, help="B: max batch size (rows)")
    parser.add_argument(
        "--delays", default="0,0.002,0.005", help="max_queue_delay values (s) of the batched runs"
    )
    parser.add_argument("--repeats", type=int, default=7, help="repeats per s(b) (median)")
    parser.add_argument("--start-rate", type=float, default=40.0, help="first offered rate (requests/s)")
    parser.add_argument("--rate-factor", type=float, default=1.4, help="rate multiplier per step")
    parser.add_argument("--step-seconds", type=float, default=3.0, help="seconds of load per rate")
    parser.add_argument("--low-rate", type=float, default=10.0, help="low-load rate (requests/s)")
    parser.add_argument("--low-seconds", type=float, default=10.0, help="low-load duration (s)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds for the load phase")
    parser.add_argument(
        "--refine", type=int, default=2, help="bisection rounds of each max SLO rate after the sweep"
    )
    parser.add_argument("--refine-budget", type=float, default=60.0, help="extra seconds for refinement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compare-modes",
        default="",
        help="also compare these quantization modes in process, e.g. none,bf16,int8-dynamic,int8-static",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "runtime.json"))
    args = parser.parse_args(argv)
    args.delays = [float(d) for d in args.delays.split(",") if d.strip()]
    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    modes = [q.strip() for q in args.quantization.split(",") if q.strip()]
    results = {}
    for mode in modes:
        progress(f"=== quantization {mode} ===")
        results[mode] = run_mode(args, mode, argv)
    # top level: int8-dynamic (the demo's mode; bench/autoscaler_sim.py reads its a, c and B), every
    # mode's figures under by_quantization, measured one after the other in this run
    primary = "int8-dynamic" if "int8-dynamic" in results else modes[-1]
    result = {**results[primary], "by_quantization": results, "elapsed_seconds": time.monotonic() - started}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    progress(f"wrote {out}")
    return 0


def run_mode(args: argparse.Namespace, quantization: str, argv: list[str] | None) -> dict[str, Any]:
    """Phases 1 and 2 for one quantization mode; the figures (see the module docstring)."""
    args = argparse.Namespace(**{**vars(args), "quantization": quantization})
    started = time.monotonic()
    load_before = os.getloadavg()

    progress(
        f"phase 1: service time s(b), b = 1..{args.max_batch}, {args.quantization}, {args.repeats} repeats"
    )
    rows, device = measure_service_time(args.quantization, args.max_batch, args.repeats, args.seed)
    a, c = fit_service_time(rows)
    limit = args.max_batch / (a + c * args.max_batch)
    s1 = rows[0]["service_seconds"]
    progress(
        f"fit s(b) = {a * 1000:.2f} ms + {c * 1000:.3f} ms·b; X({args.max_batch}) = {limit:.0f} rows/s; "
        f"s(1) = {s1 * 1000:.2f} ms"
    )

    modes = [m.strip() for m in args.compare_modes.split(",") if m.strip()]
    quantization_modes = None
    if modes:
        progress(f"phase 1b: quantization modes side by side: {modes}")
        quantization_modes = compare_modes(modes, args.max_batch, args.repeats * 3, args.seed)

    from kubeinfer.runtime.config import RuntimeConfig

    from tests.support.runtime_proc import RuntimeProcess

    base = RuntimeConfig.model_validate(
        {
            "quantization": {"mode": args.quantization},
            "device": "cpu",
            "batching": {"max_batch_size": args.max_batch, "max_queue_size": 4096},
        }
    )
    progress("phase 2: starting kubeinfer-runtime (load + warmup)")
    with RuntimeProcess(base) as rt:
        progress(f"runtime ready at {rt.url} (pid {rt.pid})")
        load = asyncio.run(load_phase(rt, base, args))

    max_slo = {name: max_slo_rate(cfg["points"]) for name, cfg in load["configs"].items()}
    batched_names = [n for n in max_slo if n != "unbatched"]
    best = max(batched_names, key=lambda n: max_slo[n])
    unbatched = max_slo["unbatched"]
    low_p99 = load["low_load"][best]["p99_seconds"]
    client_cpu = [
        p["client_cpu_seconds_per_request"] for cfg in load["configs"].values() for p in cfg["points"]
    ]
    result: dict[str, Any] = {
        "model": MODEL,
        "quantization": args.quantization,
        "device": device,
        "max_batch_size": args.max_batch,
        "a_seconds": a,
        "c_seconds": c,
        "limit_rps": limit,
        "slo_p99_seconds": SLO_P99_SECONDS,
        "max_slo_rps": {"batched": max_slo[best], "unbatched": unbatched},
        "best_batched_config": best,
        "max_slo_rps_by_config": max_slo,
        "ratio_batched_to_unbatched": max_slo[best] / unbatched if unbatched else None,
        "ratio_batched_to_limit": max_slo[best] / limit,
        "s1_seconds": s1,
        "low_load_p99_seconds": low_p99,
        "low_load_p99_minus_s1_seconds": low_p99 - s1,
        "low_load_p99_seconds_by_config": {n: p["p99_seconds"] for n, p in load["low_load"].items()},
        "low_load_rps": args.low_rate,
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
        "service_time": rows,
        "quantization_modes": quantization_modes,
        "sweep": load["configs"],
        "low_load": load["low_load"],
        "budget_exhausted": load["budget_exhausted"],
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "elapsed_seconds": time.monotonic() - started,
        "command": ["bench/runtime_bench.py", *(sys.argv[1:] if argv is None else argv)],
    }
    ratio_u = result["ratio_batched_to_unbatched"]
    progress(
        f"max SLO rate (P99 < {SLO_P99_SECONDS * 1000:.0f} ms): batched ({best}) {max_slo[best]:.0f}/s, "
        f"unbatched {unbatched:.0f}/s → ×{ratio_u:.2f} (target ≥ 3); vs X(B) {limit:.0f}/s → "
        f"{result['ratio_batched_to_limit']:.0%} (target ≥ 85 %)"
        if ratio_u is not None
        else f"unbatched met the SLO at no rate; batched {max_slo[best]:.0f}/s"
    )
    progress(
        f"low-load P99 {low_p99 * 1000:.1f} ms vs s(1) {s1 * 1000:.1f} ms: "
        f"+{(low_p99 - s1) * 1000:.1f} ms (target ≤ +5 ms)"
    )
    return result


if __name__ == "__main__":
    sys.exit(main())
