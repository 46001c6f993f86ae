"""Response-cache accounting: the bytes the cache counts against what it holds on the heap.

``.venv/bin/python bench/cache_accounting.py`` -> ``bench/results/cache_accounting.json``.

For two kinds of rows, the outputs of one request as the data plane stores them, a
``ResponseCache`` of ``--max-bytes`` (8 MiB by default) is filled with distinct keys, then churned
(``--churn`` times as many entries again, each evicting the least recently used: the steady state of a
full cache). ``tracemalloc`` measures the heap the cache holds (traced bytes after minus before, the
rows sent in freed) once filled and once churned, and compares it with ``cache.bytes``:

- ``embedding``: ``embedding`` float32 [1, 384] and ``token_count`` int64 [1] (MiniLM);
- ``score``: ``score`` float32 [1] and ``token_count`` int64 [1] (a reranker or classifier).

Deterministic (no clock; no need for a quiet machine), a few seconds. It reports; it asserts nothing
(``tests/unit/runtime/test_runtime_cache.py`` holds the 10 % bound).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))

import quiet  # noqa: E402
from kubeinfer.runtime.cache import ResponseCache  # noqa: E402

ROWS: dict[str, Callable[[int], dict[str, np.ndarray]]] = {
    "embedding": lambda i: {
        "embedding": np.full((1, 384), i, np.float32),
        "token_count": np.array([7], np.int64),
    },
    "score": lambda i: {"score": np.array([i], np.float32), "token_count": np.array([7], np.int64)},
}


def key(i: int) -> bytes:
    """A distinct 16-byte key, as ``cache_key`` makes."""
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()


def measure(kind: str, max_bytes: int, churn: float) -> dict[str, object]:
    """Fill a cache of ``max_bytes`` with ``kind`` rows until the first eviction, then put ``churn``
    times as many more; the counted and measured bytes (traced heap) at both points."""
    make = ROWS[kind]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = ResponseCache(max_bytes)
        i = 0
        while cache.evictions == 0:
            cache.put(key(i), make(i))
            i += 1
        gc.collect()
        filled = {"entries": cache.entries, "counted": cache.bytes}
        filled["measured"] = tracemalloc.get_traced_memory()[0] - before
        for j in range(i, i + int(churn * i)):
            cache.put(key(j), make(j))
        gc.collect()
        churned = {"entries": cache.entries, "counted": cache.bytes}
        churned["measured"] = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    for point in (filled, churned):
        point["measured_over_counted"] = round(point["measured"] / point["counted"], 4)
        point["bytes_per_entry"] = round(point["measured"] / point["entries"], 1)
    return {"filled": filled, "churned": churned}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-bytes", type=int, default=8 << 20)
    parser.add_argument("--churn", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cache_accounting.json")
    # heap bytes, not time: the machine and its load are recorded, not checked (quiet.py's simulation)
    quiet.add_arguments(parser, simulation=True)
    args = parser.parse_args()
    results: dict[str, object] = {
        "max_bytes": args.max_bytes,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
    }
    with quiet.quiet_run("cache_accounting", args, simulation=True) as run:
        for kind in ROWS:
            results[kind] = got = measure(kind, args.max_bytes, args.churn)
            for point, values in got.items():
                print(
                    f"{kind:9} {point:7}: {values['entries']:7} entries, counted {values['counted']:>9} B, "
                    f"measured {values['measured']:>9} B ({values['measured_over_counted']:.3f}x, "
                    f"{values['bytes_per_entry']} B/entry)"
                )
        run.write(results, args.out)


if __name__ == "__main__":
    main()
