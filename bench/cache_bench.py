"""Response-cache benchmark: what a hit costs, and how much more load repeats let one replica hold.

``make bench-cache`` (or ``.venv/bin/python bench/cache_bench.py``) -> ``bench/results/cache.json``.

One real ``kubeinfer-runtime serve`` process (``hack/devtools/runtime_proc.py``) serves the bundled
all-MiniLM-L6-v2 (``int8-dynamic`` as in the demo and ``examples/minilm.yaml``; default batching:
32 rows, 5 ms) with the response cache on (``cache: {enabled: true, max_bytes: 64 MiB}``). Side by
side in this one run:

1. **Hit latency**: a few texts are sent once to fill the cache; then, one request at a time with
   a pause between (no queueing), each text again as it is (answered from the cache) and with the
   request parameter ``cache: false`` (the model's path: queue, batch of one, model, encode), the
   order of each pair drawn at random. P50 and P99 of both, their ratio; the hits counted on
   ``/metrics`` (``kubeinfer_cache_hits_total``) must be the cached requests sent, and a hit's body
   is compared byte for byte with the model's.
2. **Max rate at the SLO**: open-loop Poisson load (``runtime_bench.run_rate``: latency from each
   request's scheduled arrival, P99 <= 100 ms with >= 99 % answered 200) at rising rates for two
   request streams, interleaved rate by rate so the machine's noise hits both alike: ``repeat_0``,
   every request a text never sent before, and ``repeat_50``, half of the requests (drawn at random)
   one of a small set of texts (``--hot-texts``, each sent once before the sweep so that repeats
   hit from the first point on), the other half new. Texts are held-out sentences
   with a unique number appended, in both streams alike, so the two differ only in their repeats.
   A stream leaves after two rates over the SLO; each one's highest passing rate is then refined by
   bisection (``--refine``), as in ``runtime_bench``. Per point, the hit rate the runtime counted
   (hits / (hits + misses) on ``/metrics``). Reported: each stream's max rate, their ratio, and the
   hit rate at the max rate.

It runs under ``bench/quiet.py``: the machine-wide bench lock, and no measurement while the
1-minute load average is over 0.5 unless ``--noisy`` (then the JSON says ``"noisy": true``). About
4 to 5 minutes on 2 cores: the model's load and warmup, ``--latency-pairs`` pairs, then the sweep
within ``--budget`` plus ``--refine-budget`` seconds. The script reports what it measures; it
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import quiet
import runtime_bench as rb  # also puts the repository root on sys.path, for hack.devtools

ROOT = Path(__file__).resolve().parents[1]
MODEL = rb.MODEL  # the bundled MiniLM's name on the wire and in /metrics
TINY = "tiny"  # hack/devtools/runtime_tiny.py's 2-layer BERT: a quick check of this script, no figures
SLO_P99_SECONDS = rb.SLO_P99_SECONDS
CACHE_COUNTERS = {
    "kubeinfer_cache_hits_total": "hits",
    "kubeinfer_cache_misses_total": "misses",
    "kubeinfer_cache_evictions_total": "evictions",
}


def progress(message: str) -> None:
    """A progress line on stdout."""
    print(f"[cache_bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (see ``--help``); a bad value exits through ``parser.error``: status 2, one line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--model",
        choices=(MODEL, TINY),
        default=MODEL,
        help=f"{MODEL}: the bundled all-MiniLM-L6-v2 (what users serve); {TINY}: a 2-layer BERT with random "
        "weights, to check the script quickly",
    )
    parser.add_argument(
        "--quantization", default="int8-dynamic", help=f"the model's quantization mode ({MODEL} only)"
    )
    parser.add_argument("--cache-bytes", type=int, default=64 * 1024 * 1024, help="cache.max_bytes")
    parser.add_argument("--hot-texts", type=int, default=16, help="the small set of texts repeats draw from")
    parser.add_argument(
        "--repeat-share", type=float, default=0.5, help="share of repeated requests in the repeating stream"
    )
    parser.add_argument("--latency-pairs", type=int, default=300, help="hit / cache:false request pairs")
    parser.add_argument("--latency-gap", type=float, default=0.02, help="seconds between those requests")
    parser.add_argument("--start-rate", type=float, default=50.0, help="first offered rate (requests/s)")
    parser.add_argument("--rate-factor", type=float, default=1.3, help="rate multiplier per step")
    parser.add_argument("--step-seconds", type=float, default=4.0, help="seconds of load per rate")
    parser.add_argument("--budget", type=float, default=140.0, help="seconds for the rising sweep")
    parser.add_argument("--refine", type=int, default=2, help="bisection rounds of each max rate")
    parser.add_argument("--refine-budget", type=float, default=40.0, help="extra seconds for refinement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cache.json"))
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.cache_bytes < 1024:
        parser.error("--cache-bytes must be at least 1024 (cache.max_bytes)")
    if args.hot_texts < 1:
        parser.error("--hot-texts must be at least 1")
    if not 0.0 < args.repeat_share < 1.0:
        parser.error("--repeat-share must be between 0 and 1 (exclusive)")
    if args.latency_pairs < 1:
        parser.error("--latency-pairs must be at least 1")
    if args.start_rate <= 0 or args.step_seconds <= 0:
        parser.error("--start-rate and --step-seconds must be positive")
    if args.rate_factor <= 1.0:
        parser.error("--rate-factor must be over 1")
    if args.refine < 0:
        parser.error("--refine must be at least 0")
    return args


def stream_name(share: float) -> str:
    """``repeat_0``, ``repeat_50``: a stream by its share of repeated requests, in per cent."""
    return f"repeat_{round(share * 100)}"


# --- request texts --------------------------------------------------------------------------------


class Texts:
    """Request texts never sent before: held-out sentences, each with a number of its own appended
    (so every text is distinct; a repeat is only ever a repeat on purpose), from ``seed``."""

    def __init__(self, sentences: list[str], seed: int) -> None:
        self.sentences = sentences
        self.rng = np.random.default_rng(seed)
        self.issued = 0

    def fresh(self) -> str:
        """A text not issued before."""
        self.issued += 1
        return f"{self.sentences[int(self.rng.integers(len(self.sentences)))]} #{self.issued}"


def stream_texts(
    texts: Texts, hot: list[str], share: float, count: int, rng: np.random.Generator
) -> list[str]:
    """``count`` request texts: each, with probability ``share``, one of ``hot`` (uniformly), else
    ``texts.fresh()``."""
    repeat = rng.random(count) < share
    picks = rng.integers(len(hot), size=count)
    return [hot[int(p)] if r else texts.fresh() for r, p in zip(repeat, picks, strict=True)]


def arrivals_bound(rate: float, seconds: float) -> int:
    """How many bodies a ``run_rate`` point may need: its gaps array's length (``rb.run_rate``), so
    ``bodies[i % len(bodies)]`` never wraps round to a body already sent."""
    return int(rate * seconds * 2) + 10


# --- /metrics -------------------------------------------------------------------------------------


def cache_counts(metrics_text: str, model: str = MODEL) -> dict[str, float]:
    """``model``'s response-cache counters on ``/metrics``: ``hits``, ``misses``, ``evictions`` (0
    when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    counts = dict.fromkeys(CACHE_COUNTERS.values(), 0.0)
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            key = CACHE_COUNTERS.get(sample.name)
            if key is not None and sample.labels.get("model") == model:
                counts[key] += sample.value
    return counts


def cache_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """The counters' growth between two ``cache_counts``, and ``hit_rate`` = hits / (hits + misses)
    over it (None without a look-up)."""
    delta: dict[str, float | None] = {k: after[k] - before[k] for k in before}
    hits, misses = delta["hits"] or 0.0, delta["misses"] or 0.0
    delta["hit_rate"] = hits / (hits + misses) if hits + misses else None
    return delta


def percentiles(seconds: list[float]) -> dict[str, float]:
    """P50, P99 and mean of latencies (seconds)."""
    values = np.array(seconds, dtype=np.float64)
    return {
        "requests": float(values.size),
        "p50_seconds": float(np.percentile(values, 50)),
        "p99_seconds": float(np.percentile(values, 99)),
        "mean_seconds": float(values.mean()),
    }


# --- 1. hit latency -------------------------------------------------------------------------------


async def _timed_post(session: Any, url: str, body: bytes) -> tuple[float, bytes, int]:
    t0 = time.perf_counter()
    async with session.post(url, data=body) as response:
        payload = await response.read()
        status = response.status
    return time.perf_counter() - t0, payload, status


async def hit_latency(session: Any, rt: Any, args: argparse.Namespace, texts: Texts) -> dict[str, Any]:
    """Phase 1 (module docstring): hits against ``cache: false`` for the same texts, one at a time."""
    url = f"{rt.url}/v2/models/{args.model}/infer"
    hot = [texts.fresh() for _ in range(args.hot_texts)]
    for text in hot:  # fill the cache
        _, _, status = await _timed_post(session, url, rb.request_body(text))
        if status != 200:
            raise RuntimeError(f"priming request answered {status}")
    rng = np.random.default_rng(args.seed + 1)
    before = await asyncio.to_thread(lambda: cache_counts(rt.metrics_text(), args.model))
    hit: list[float] = []
    model: list[float] = []
    same, errors = 0, 0
    for i in range(args.latency_pairs):
        text = hot[i % len(hot)]
        bodies = {"hit": rb.request_body(text), "model": rb.request_body(text, {"cache": False})}
        answers = {}
        for kind in ("hit", "model") if rng.random() < 0.5 else ("model", "hit"):
            await asyncio.sleep(args.latency_gap)
            seconds, payload, status = await _timed_post(session, url, bodies[kind])
            if status != 200:
                errors += 1
                continue
            (hit if kind == "hit" else model).append(seconds)
            answers[kind] = payload
        same += int(len(answers) == 2 and answers["hit"] == answers["model"])
        if (i + 1) % 100 == 0:
            progress(f"  {i + 1}/{args.latency_pairs} pairs")
    after = await asyncio.to_thread(lambda: cache_counts(rt.metrics_text(), args.model))
    if not hit or not model:
        raise RuntimeError(f"phase 1: no request answered 200 ({errors} errors)")
    delta = cache_delta(before, after)
    result = {
        "pairs": args.latency_pairs,
        "gap_seconds": args.latency_gap,
        "hit": percentiles(hit),
        "model": percentiles(model),
        "errors": errors,
        "cached_requests_sent": len(hit),
        "hits_counted": delta["hits"],
        "misses_counted": delta["misses"],
        "identical_body_share": same / args.latency_pairs,
    }
    result["p50_ratio_model_to_hit"] = result["model"]["p50_seconds"] / result["hit"]["p50_seconds"]
    result["p99_ratio_model_to_hit"] = result["model"]["p99_seconds"] / result["hit"]["p99_seconds"]
    ms = {k: {q: result[k][f"{q}_seconds"] * 1000 for q in ("p50", "p99")} for k in ("hit", "model")}
    progress(
        f"hit P50 {ms['hit']['p50']:.2f} ms, P99 {ms['hit']['p99']:.2f} ms; cache:false P50 "
        f"{ms['model']['p50']:.2f} ms, P99 {ms['model']['p99']:.2f} ms "
        f"(x{result['p50_ratio_model_to_hit']:.1f} at P50); hits counted {delta['hits']:.0f} of {len(hit)} "
        f"sent; identical bodies {result['identical_body_share']:.0%}"
    )
    return result


# --- 2. max rate at the SLO -----------------------------------------------------------------------


class _Sweep:
    """What the sweep's points share: the runtime, the client session, the arguments, the texts, each
    stream's hot set and random generator, and the points so far (``{stream: [point]}``)."""

    def __init__(self, rt: Any, session: Any, args: argparse.Namespace, texts: Texts) -> None:
        self.rt = rt
        self.session = session
        self.args = args
        self.texts = texts
        self.url = f"{rt.url}/v2/models/{args.model}/infer"
        self.shares = {stream_name(s): s for s in (0.0, args.repeat_share)}
        self.hot = {name: [texts.fresh() for _ in range(args.hot_texts)] for name in self.shares}
        self.rng = {name: np.random.default_rng(args.seed + 10 + i) for i, name in enumerate(self.shares)}
        self.points: dict[str, list[dict[str, Any]]] = {name: [] for name in self.shares}
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    async def prime(self) -> None:
        """Send each hot text once, so the repeats hit from the first point on (a served model's
        popular requests are in its cache already; the first sight of each is not what is measured)."""
        for name, texts in self.hot.items():
            for text in texts if self.shares[name] else []:
                await _timed_post(self.session, self.url, rb.request_body(text))

    async def point(self, name: str, rate: float, seed: int, refinement: bool = False) -> dict[str, Any]:
        """One open-loop point of stream ``name`` at ``rate``, with its SLO verdict and the cache's
        counts over it (``refinement``: a point of the bisection, as ``rb.max_slo_rate`` reads it)."""
        args = self.args
        count = arrivals_bound(rate, args.step_seconds)
        texts = stream_texts(self.texts, self.hot[name], self.shares[name], count, self.rng[name])
        bodies = [rb.request_body(t) for t in texts]
        before = await asyncio.to_thread(lambda: cache_counts(self.rt.metrics_text(), args.model))
        point: dict[str, Any] = await rb.run_rate(
            self.session, self.url, bodies, rate, args.step_seconds, seed
        )
        point["meets_slo"] = rb.meets_slo(point)
        if refinement:
            point["refinement"] = True
        after = await asyncio.to_thread(lambda: cache_counts(self.rt.metrics_text(), args.model))
        point["cache"] = cache_delta(before, after)
        self.points[name].append(point)
        hit_rate = point["cache"]["hit_rate"]
        progress(
            f"{name:>10} {rate:7.1f}/s -> {point['throughput_rps']:7.1f}/s, P50 "
            f"{point['p50_seconds'] * 1000:6.1f} ms, P99 {point['p99_seconds'] * 1000:7.1f} ms, errors "
            f"{point['errors']:.0f}, hit rate {'n/a' if hit_rate is None else format(hit_rate, '.0%')}"
            f"{'' if point['meets_slo'] else ' (over the SLO)'}{' (refinement)' if refinement else ''}"
        )
        return point

    async def sweep(self) -> bool:
        """Rising rates, the streams interleaved; a stream leaves after two rates over the SLO. Returns
        whether ``--budget`` ran out with a stream still in."""
        args = self.args
        active = list(self.shares)
        misses = dict.fromkeys(active, 0)
        rate, step = args.start_rate, 0
        while active and self.elapsed() < args.budget:
            for name in list(active):
                point = await self.point(name, rate, args.seed + 100 + step)
                misses[name] = 0 if point["meets_slo"] else misses[name] + 1
                if misses[name] >= 2:
                    active.remove(name)
            rate *= args.rate_factor
            step += 1
        return bool(active)

    async def refine(self) -> None:
        """Geometric bisection between each stream's highest passing rate and the next rate up,
        interleaved, within ``--refine-budget`` (``runtime_bench``'s refinement)."""
        args = self.args
        bounds = {}
        for name, points in self.points.items():
            lo = rb.max_slo_rate(points)
            if lo > 0:
                bounds[name] = (lo, lo * args.rate_factor)
        for round_ in range(args.refine):
            for name, (lo, hi) in list(bounds.items()):
                if self.elapsed() > args.budget + args.refine_budget:
                    return
                mid = (lo * hi) ** 0.5
                point = await self.point(name, mid, args.seed + 500 + round_, refinement=True)
                bounds[name] = (mid, hi) if point["meets_slo"] else (lo, mid)


def stream_figures(points: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream's max rate at the SLO (``rb.max_slo_rate``; ``bounded``: some rate failed, so it is
    not only a lower bound), the hit rate at that point and over all its points."""
    best = rb.max_slo_rate(points)
    at_best = next((p for p in points if p.get("offered_rps") == best and p["meets_slo"]), None)
    hits = sum(p["cache"]["hits"] for p in points)
    misses = sum(p["cache"]["misses"] for p in points)
    return {
        "max_slo_rps": best,
        "bounded": any(not p["meets_slo"] for p in points),
        "hit_rate_at_max": at_best["cache"]["hit_rate"] if at_best else None,
        "p99_seconds_at_max": at_best["p99_seconds"] if at_best else None,
        "hit_rate_all_points": hits / (hits + misses) if hits + misses else None,
    }


def runtime_config(args: argparse.Namespace, workdir: Path) -> Any:
    """The ``RuntimeConfig`` served: ``--model`` on the CPU (the tiny BERT written under ``workdir``),
    default batching (what ``examples/minilm.yaml`` serves) with room to queue (4096), the cache on
    with ``--cache-bytes``."""
    from kubeinfer.runtime.config import RuntimeConfig

    sections: dict[str, Any] = {
        "batching": {"max_queue_size": 4096},
        "cache": {"enabled": True, "max_bytes": args.cache_bytes},
    }
    if args.model == TINY:
        from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir

        return tiny_hf_config(tiny_hf_dir(workdir / TINY), **sections)
    return RuntimeConfig.model_validate(
        {"quantization": {"mode": args.quantization}, "device": "cpu", **sections}
    )


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Start the runtime with the cache on, then phases 1 and 2; the figures (module docstring)."""
    from kubeinfer.runtime.models.huggingface import heldout_sentences

    from hack.devtools.runtime_proc import RuntimeProcess

    cfg = runtime_config(args, workdir)
    texts = Texts(heldout_sentences(), args.seed)
    progress(
        f"starting kubeinfer-runtime: {args.model}, quantization {cfg.quantization.mode}, cache "
        f"{args.cache_bytes} bytes (load + warmup)"
    )
    with RuntimeProcess(cfg) as rt:
        progress(f"runtime ready at {rt.url} (pid {rt.pid})")
        async with rb.client_session() as session:
            progress(f"phase 1: hit latency, {args.latency_pairs} pairs of a cached request and cache:false")
            latency = await hit_latency(session, rt, args, texts)
            progress(
                f"phase 2: max rate at P99 <= {SLO_P99_SECONDS * 1000:.0f} ms, "
                f"{args.repeat_share:.0%} repeats vs none, cache on"
            )
            sweep = _Sweep(rt, session, args, texts)
            await sweep.prime()
            exhausted = await sweep.sweep()
            await sweep.refine()
        final = cache_counts(rt.metrics_text(), args.model)
    streams = {name: stream_figures(points) for name, points in sweep.points.items()}
    none, some = streams[stream_name(0.0)], streams[stream_name(args.repeat_share)]
    ratio = some["max_slo_rps"] / none["max_slo_rps"] if none["max_slo_rps"] else None
    return {
        "model": args.model,
        "quantization": cfg.quantization.mode,
        "cache": {"enabled": True, "max_bytes": args.cache_bytes},
        "batching": cfg.batching.model_dump(mode="json"),
        "slo_p99_seconds": SLO_P99_SECONDS,
        "hit_latency": latency,
        "max_slo_rps": {name: s["max_slo_rps"] for name, s in streams.items()},
        "ratio_repeat_to_no_repeat": ratio,
        "streams": {
            name: {
                **streams[name],
                "repeat_share": share,
                "hot_texts": args.hot_texts if share else 0,
                "points": sweep.points[name],
            }
            for name, share in sweep.shares.items()
        },
        "budget_exhausted": exhausted,
        "cache_totals": final,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (``parse_args``' options) under the bench lock and write ``--out``."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with quiet.quiet_run("cache_bench", args, log=progress) as run:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="kubeinfer-cache-bench-") as tmp:
            result = asyncio.run(measure(args, Path(tmp)))
        result["elapsed_seconds"] = time.monotonic() - started
        result["command"] = ["bench/cache_bench.py", *(sys.argv[1:] if argv is None else argv)]
        result = run.stamp(result)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    latency, rates = result["hit_latency"], result["max_slo_rps"]
    none, some = stream_name(0.0), stream_name(args.repeat_share)
    ratio, hit_rate = result["ratio_repeat_to_no_repeat"], result["streams"][some]["hit_rate_at_max"]
    progress(
        f"hit P50 {latency['hit']['p50_seconds'] * 1000:.2f} ms vs cache:false "
        f"{latency['model']['p50_seconds'] * 1000:.2f} ms; max rate at the SLO: {some} {rates[some]:.0f}/s, "
        f"{none} {rates[none]:.0f}/s, x{'n/a' if ratio is None else format(ratio, '.2f')}; hit rate at "
        f"{some}'s max {'n/a' if hit_rate is None else format(hit_rate, '.0%')}"
    )
    progress(f"wrote {out}{' (noisy: not a source of figures)' if run.noisy else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
