"""Token-budget benchmark: the short requests' tail latency when 5 % of the requests are 10,000-character
texts, with and without ``batching.max_batch_tokens``.

``make bench-token-budget`` (or ``.venv/bin/python bench/token_budget.py``) ->
``bench/results/token_budget.json``.

One real ``kubeinfer-runtime serve`` process (``hack/devtools/runtime_proc.py``) per ``--overflow`` mode
(``chunk``: a long text runs as its windows of the model's 256 tokens, pooled; ``truncate``: it is cut to
the window) and per ``--instances`` count (default 1; ``1,2`` measures two instances after one, each with
the default intra-op threads, keyed ``"chunk, 2 instances"``) serves the bundled all-MiniLM-L6-v2
(``int8-dynamic``, as the demo; default batching: 32 rows, 5 ms; ``limits.max_text_tokens`` 4096, so that
a 10,000-character text, about 2,600 tokens, is chunked, not refused). It gets open-loop Poisson load at
``--rate`` (latency from each request's scheduled arrival, as ``runtime_bench.run_rate`` measures it):
each request, drawn with probability ``--long-share`` (5 %), one ``--long-chars``-character text
(held-out sentences joined, a number of its own in front) or else one short held-out sentence. The token
budgets (``--budgets``: ``off``, i.e. no ``max_batch_tokens``, and the values given) are switched in the
same process through the watched config file (hot reload, seen in the runtime's log), interleaved within
each repeat in an order that rotates from repeat to repeat, and every budget of a repeat gets the same
arrivals and the same texts (one seed per repeat), so the machine's drift and the draw of long requests
hit them alike.

Per point: the short requests' P50, P99 and maximum, the long requests' P50, P99 and maximum (a few
dozen per point: their P99 is near their maximum), errors of each (a request not answered 200 within
the client's 10 s), and the server's mean batch size and compute time per batch (``/metrics``). Per
mode and budget: the median over ``--repeats`` of each figure, and the short requests' median P99 as a
ratio to ``off``'s. The issue's target: with a budget, the short requests' P99 stays within the SLO
(100 ms, ``runtime_bench.SLO_P99_SECONDS``) while long requests come and go.

It runs under ``bench/quiet.py``: the machine-wide bench lock, and no measurement while the 1-minute load
average is over 0.5 unless ``--noisy`` (then the JSON says ``"noisy": true``). Run time: for each mode
the runtime's start (load, int8, warmup: 15 to 30 s), a short warm-up of both request kinds, then
``--repeats`` x budgets x ``--seconds`` of load (defaults: 5 x 3 x 15 s) plus the switches: about 5
minutes a mode, 10 for both. ``--model tiny`` (a 2-layer random BERT) checks the script in seconds; its
figures mean nothing. The script reports what it measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import quiet
import runtime_bench as rb  # also puts the repository root on sys.path, for hack.devtools

ROOT = Path(__file__).resolve().parents[1]
MODEL = rb.MODEL  # the served model's name on the wire and in /metrics, whichever ``--model``
TINY = "tiny"
OFF = "off"
OVERFLOWS = ("chunk", "truncate")
#: ``limits.max_text_tokens`` served: room for a 10,000-character text (about 2,600 MiniLM tokens).
MAX_TEXT_TOKENS = 4096
#: Seconds to wait for a hot-reloaded budget to show in the runtime's log.
SWITCH_TIMEOUT = 15.0


def progress(message: str) -> None:
    """A progress line on stdout."""
    print(f"[token_budget {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_budgets(text: str) -> list[int | None]:
    """``off,1024,4096`` -> ``[None, 1024, 4096]``: ``off`` is no budget; each value at least 1, none
    twice. Raises ``ValueError`` naming the bad value."""
    budgets: list[int | None] = []
    for part in _csv(text):
        value: int | None = None
        if part != OFF:
            try:
                value = int(part)
            except ValueError:
                raise ValueError(f"{part!r} is neither {OFF!r} nor a token count") from None
            if value < 1:
                raise ValueError(f"{part}: a token budget is at least 1")
        if value in budgets:
            raise ValueError(f"{part} given twice")
        budgets.append(value)
    if not budgets:
        raise ValueError("no budget given")
    return budgets


def budget_name(budget: int | None) -> str:
    """``off`` or the budget's token count as text (the JSON's keys)."""
    return OFF if budget is None else str(budget)


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
    parser.add_argument(
        "--overflow",
        default=",".join(OVERFLOWS),
        help="model.overflow modes, one runtime each (chunk,truncate)",
    )
    parser.add_argument(
        "--budgets",
        default="off,256,1024,4096",
        help="batching.max_batch_tokens values side by side, 'off' for none (a window is 256 tokens)",
    )
    parser.add_argument(
        "--rate", type=float, default=25.0, help="offered requests/s, short and long together"
    )
    parser.add_argument("--long-share", type=float, default=0.05, help="share of long requests")
    parser.add_argument("--long-chars", type=int, default=10_000, help="characters of a long text")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds of load per point")
    parser.add_argument(
        "--repeats", type=int, default=5, help="points per budget and mode (medians over them)"
    )
    parser.add_argument(
        "--instances",
        default="1",
        help="the model's instance counts, one runtime each per overflow mode (1,2: side by side; "
        "executor threads on the one queue, each with the default intra-op threads)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "token_budget.json"))
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        args.budgets = parse_budgets(args.budgets)
    except ValueError as exc:
        parser.error(f"--budgets: {exc}")
    args.overflow = _csv(args.overflow)
    unknown = [m for m in args.overflow if m not in OVERFLOWS]
    if unknown or not args.overflow:
        parser.error(f"--overflow: {', '.join(unknown) or 'none given'}; choose from {', '.join(OVERFLOWS)}")
    if not 0.0 < args.long_share < 1.0:
        parser.error("--long-share must be between 0 and 1 (exclusive)")
    try:
        args.instances = [int(n) for n in _csv(args.instances)]
    except ValueError:
        parser.error(f"--instances: whole numbers, comma-separated: {args.instances!r}")
    if not args.instances or min(args.instances) < 1:
        parser.error("--instances: at least 1 each")
    if args.rate <= 0 or args.seconds <= 0:
        parser.error("--rate and --seconds must be positive")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.long_chars < 1:
        parser.error("--long-chars must be at least 1")
    return args


# --- the requests ---------------------------------------------------------------------------------


def long_text(sentences: list[str], chars: int, number: int) -> str:
    """A text of exactly ``chars`` characters: ``#number`` then held-out sentences joined, from the one
    at ``number`` on (each long request a text of its own)."""
    parts = [f"#{number}"]
    i = number
    while sum(len(p) + 1 for p in parts) < chars:
        parts.append(sentences[i % len(sentences)])
        i += 1
    return " ".join(parts)[:chars]


def arrivals_bound(rate: float, seconds: float) -> int:
    """How many requests a ``runtime_bench.run_rate`` point may send: its gaps array's length, so
    request ``i`` sends ``bodies[i]`` (no wrap-around)."""
    return int(rate * seconds * 2) + 10


def point_requests(
    sentences: list[str], args: argparse.Namespace, seed: int
) -> tuple[list[bytes], list[bool]]:
    """The bodies of one point's requests in arrival order and which are long (``seed``: the same for
    every budget of a repeat, so each gets the same texts in the same order)."""
    rng = np.random.default_rng(seed)
    count = arrivals_bound(args.rate, args.seconds)
    long = [bool(x) for x in rng.random(count) < args.long_share]
    picks = rng.integers(len(sentences), size=count)
    bodies = [
        rb.request_body(long_text(sentences, args.long_chars, seed * count + i) if is_long else sentences[p])
        for i, (is_long, p) in enumerate(zip(long, picks, strict=True))
    ]
    return bodies, long


def split_latencies(point: dict[str, Any], long: list[bool]) -> dict[str, dict[str, float | None]]:
    """The short and the long requests' figures from a ``run_rate(..., per_request=True)`` point:
    ``requests``, ``ok``, ``errors`` and P50, P99, max latency (seconds; None without an answer)."""
    sent = int(point["requests"])
    answered = {int(i): seconds for i, seconds in point["latency_by_request"]}
    out: dict[str, dict[str, float | None]] = {}
    for kind, want in (("short", False), ("long", True)):
        indices = [i for i in range(sent) if long[i] == want]
        seconds = np.array([answered[i] for i in indices if i in answered], dtype=np.float64)
        out[kind] = {
            "requests": float(len(indices)),
            "ok": float(seconds.size),
            "errors": float(len(indices) - seconds.size),
            "p50_seconds": float(np.percentile(seconds, 50)) if seconds.size else None,
            "p99_seconds": float(np.percentile(seconds, 99)) if seconds.size else None,
            "max_seconds": float(seconds.max()) if seconds.size else None,
        }
    return out


#: The figures of a point that are summarized as medians over the repeats: (kind, figure).
FIGURES = (
    ("short", "p50_seconds"),
    ("short", "p99_seconds"),
    ("short", "max_seconds"),
    ("short", "errors"),
    ("long", "p50_seconds"),
    ("long", "p99_seconds"),
    ("long", "max_seconds"),
    ("long", "errors"),
    ("server", "batch_size_mean"),
    ("server", "compute_duration_seconds_mean"),
)


def medians(points: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each of :data:`FIGURES` as the median over ``points`` (those that have it; None when none has)."""
    out: dict[str, dict[str, float | None]] = {}
    for kind, figure in FIGURES:
        values = [p[kind][figure] for p in points if p.get(kind, {}).get(figure) is not None]
        out.setdefault(kind, {})[figure] = statistics.median(values) if values else None
    return out


def rotated(items: list[Any], repeat: int) -> list[Any]:
    """``items`` started at position ``repeat`` (modulo), the rest in order: each budget goes first
    as often as the others over the repeats."""
    k = repeat % len(items)
    return items[k:] + items[:k]


def summarize(points: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One mode's result: per budget the medians (:func:`medians`), and each budget's median short P99
    divided by ``off``'s (None without ``off`` or a figure)."""
    configs = {name: {"median": medians(pts), "points": pts} for name, pts in points.items()}
    reference = configs.get(OFF, {}).get("median", {}).get("short", {}).get("p99_seconds")
    ratios: dict[str, float | None] = {}
    for name, config in configs.items():
        p99 = config["median"]["short"]["p99_seconds"]
        ratios[name] = p99 / reference if p99 is not None and reference else None
    return {"budgets": configs, "short_p99_ratio_to_off": ratios}


# --- the runtime ----------------------------------------------------------------------------------


def runtime_config(args: argparse.Namespace, overflow: str, workdir: Path, instances: int = 1) -> Any:
    """The ``RuntimeConfig`` served in mode ``overflow`` with ``instances`` model instances: ``--model``
    on the CPU (the tiny BERT written under ``workdir``) named :data:`MODEL`, default batching with room
    to queue (4096), ``limits.max_text_tokens`` :data:`MAX_TEXT_TOKENS`, no token budget (switched
    later)."""
    from kubeinfer.runtime.config import RuntimeConfig

    sections: dict[str, Any] = {
        "batching": {"max_queue_size": 4096},
        "limits": {"max_text_tokens": MAX_TEXT_TOKENS},
        "device": "cpu",
        "instances": instances,
    }
    if args.model == TINY:
        from hack.devtools.runtime_tiny import tiny_hf_dir

        path = workdir / TINY
        if not path.exists():
            tiny_hf_dir(path)
        model = {"name": MODEL, "source": str(path), "overflow": overflow}
        return RuntimeConfig.model_validate({"model": model, **sections})
    return RuntimeConfig.model_validate(
        {"model": {"overflow": overflow}, "quantization": {"mode": args.quantization}, **sections}
    )


def apply_budget(rt: Any, base: Any, budget: int | None, timeout: float = SWITCH_TIMEOUT) -> None:
    """Hot-reload ``batching.max_batch_tokens`` = ``budget`` (another value than the one in force) and
    wait for the runtime's log to say it applied it. Raises ``RuntimeError`` after ``timeout`` s."""
    marker = "batching settings applied"
    seen = rt.log_text().count(marker)
    rt.write_config(
        base.model_copy(update={"batching": base.batching.model_copy(update={"max_batch_tokens": budget})})
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [line for line in rt.log_text().splitlines() if marker in line]
        if len(lines) > seen and f"max_batch_tokens={budget}" in lines[-1]:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the runtime did not apply max_batch_tokens={budget} in {timeout} s:\n{rt.tail()}")


async def run_point(
    rt: Any, session: Any, args: argparse.Namespace, bodies: list[bytes], long: list[bool], seed: int
) -> dict[str, Any]:
    """One open-loop point at ``--rate`` for ``--seconds``: the short and long requests' figures
    (:func:`split_latencies`), the server's means (``/metrics``) and the throughput."""
    url = f"{rt.url}/v2/models/{MODEL}/infer"
    before = await asyncio.to_thread(rt.metrics_text)
    point = await rb.run_rate(session, url, bodies, args.rate, args.seconds, seed, per_request=True)
    after = await asyncio.to_thread(rt.metrics_text)
    figures: dict[str, Any] = split_latencies(point, long)
    figures["server"] = rb.server_means(rb.histogram_totals(before), rb.histogram_totals(after))
    figures["throughput_rps"] = point["throughput_rps"]
    figures["offered_rps"] = args.rate
    return figures


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.1f} ms"


def point_line(where: str, point: dict[str, Any]) -> str:
    """One point (or a budget's medians) as a progress line."""
    short, lng = point["short"], point["long"]
    batch = (point.get("server") or {}).get("batch_size_mean")
    return (
        f"{where}: short P50 {_ms(short['p50_seconds'])}, P99 {_ms(short['p99_seconds'])}; long P50 "
        f"{_ms(lng['p50_seconds'])}, max {_ms(lng['max_seconds'])}; errors {short['errors']:.0f} short, "
        f"{lng['errors']:.0f} long; mean batch {'n/a' if batch is None else format(batch, '.1f')}"
    )


def mode_name(overflow: str, instances: int) -> str:
    """The key of one runtime's figures: the overflow mode, and the instance count when not 1."""
    return overflow if instances == 1 else f"{overflow}, {instances} instances"


async def measure_mode(
    args: argparse.Namespace, overflow: str, workdir: Path, instances: int = 1
) -> dict[str, Any]:
    """One ``--overflow`` mode with ``instances`` model instances: start its runtime, warm both request
    kinds, then the repeats with every budget, interleaved (module docstring)."""
    from kubeinfer.runtime.models.huggingface import heldout_sentences

    from hack.devtools.runtime_proc import RuntimeProcess

    cfg = runtime_config(args, overflow, workdir, instances)
    sentences = heldout_sentences()
    name = mode_name(overflow, instances)
    progress(f"starting kubeinfer-runtime: {args.model}, overflow {name} (load + warmup)")
    points: dict[str, list[dict[str, Any]]] = {budget_name(b): [] for b in args.budgets}
    with RuntimeProcess(cfg) as rt:
        progress(f"runtime ready at {rt.url} (pid {rt.pid})")
        async with rb.client_session() as session:
            url = f"{rt.url}/v2/models/{MODEL}/infer"
            warm = (sentences[0], long_text(sentences, args.long_chars, 0))  # the long path warmed too
            for body in map(rb.request_body, warm):
                async with session.post(url, data=body) as response:
                    if response.status != 200:
                        raise RuntimeError(f"warm-up answered {response.status}: {await response.text()}")
            in_force: int | None = None  # runtime_config serves no budget
            for repeat in range(args.repeats):
                seed = args.seed + 1000 * (repeat + 1)
                bodies, long = point_requests(sentences, args, seed)
                for budget in rotated(list(args.budgets), repeat):
                    if budget != in_force:
                        await asyncio.to_thread(apply_budget, rt, cfg, budget)
                        in_force = budget
                    point = await run_point(rt, session, args, bodies, long, seed)
                    points[budget_name(budget)].append(point)
                    where = f"{name} repeat {repeat + 1}/{args.repeats} budget {budget_name(budget)}"
                    progress(point_line(where, point))
    return {**summarize(points), "batching": cfg.batching.model_dump(mode="json")}


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Every ``--overflow`` mode with every ``--instances`` count in turn; the figures (module
    docstring), keyed by ``mode_name``."""
    by_overflow = {
        mode_name(mode, n): await measure_mode(args, mode, workdir, n)
        for mode in args.overflow
        for n in args.instances
    }
    return {
        "model": args.model,
        "quantization": args.quantization if args.model == MODEL else "none",
        "rate_rps": args.rate,
        "instances": args.instances,
        "long_share": args.long_share,
        "long_chars": args.long_chars,
        "seconds_per_point": args.seconds,
        "repeats": args.repeats,
        "budgets": [budget_name(b) for b in args.budgets],
        "max_text_tokens": MAX_TEXT_TOKENS,
        "slo_p99_seconds": rb.SLO_P99_SECONDS,
        "by_overflow": by_overflow,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (``parse_args``' options) under the bench lock and write ``--out``."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with quiet.quiet_run("token_budget", args, log=progress) as run:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="kubeinfer-token-budget-") as tmp:
            result = asyncio.run(measure(args, Path(tmp)))
        result["elapsed_seconds"] = time.monotonic() - started
        result["command"] = ["bench/token_budget.py", *(sys.argv[1:] if argv is None else argv)]
        result = run.stamp(result)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for mode, figures in result["by_overflow"].items():
        for name, config in figures["budgets"].items():
            ratio = figures["short_p99_ratio_to_off"][name]
            of_off = "n/a" if ratio is None else format(ratio, ".2f")
            progress(
                point_line(f"{mode} budget {name} (medians; short P99 x{of_off} of off)", config["median"])
            )
    progress(f"wrote {out}{' (noisy: not a source of figures)' if run.noisy else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
