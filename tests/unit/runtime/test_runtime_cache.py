"""The response cache: keys that tell every input apart, LRU eviction within the byte limit, bytes
counted as the heap measures them."""

from __future__ import annotations

import gc
import hashlib
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
from kubeinfer.runtime.cache import KEY_BYTES, ResponseCache, cache_key, entry_bytes


def test_the_key_tells_names_datatypes_shapes_and_bytes_apart() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    base = cache_key({"x": x})
    assert cache_key({"x": x.copy()}) == base  # same tensors, same key
    assert cache_key({"x": np.ascontiguousarray(x.T).T}) == base  # layout in memory does not matter
    others = [
        cache_key({"y": x}),  # name
        cache_key({"x": x.astype(np.float64)}),  # datatype
        cache_key({"x": x.reshape(3, 2)}),  # shape, same bytes
        cache_key({"x": x + 1}),  # values
        cache_key({"x": x, "k": np.zeros(1, np.int64)}),  # one more input
    ]
    assert len({base, *others}) == len(others) + 1
    texts = np.array([b"ab", b"c"], dtype=object)
    assert cache_key({"t": texts}) != cache_key({"t": np.array([b"a", b"bc"], dtype=object)})
    assert cache_key({"a": x, "b": x}) == cache_key({"b": x, "a": x})  # input order does not matter


def test_hits_are_read_only_copies_and_lru_eviction_keeps_the_byte_limit() -> None:
    row = np.zeros(100, np.float32)  # 400 bytes of data, plus the entry's objects
    size = entry_bytes(bytes([0]) * KEY_BYTES, {"y": row})
    assert size > 400 + KEY_BYTES
    cache = ResponseCache(max_bytes=3 * size)
    for i in range(3):
        assert cache.put(bytes([i]) * KEY_BYTES, {"y": row + i}) == 0
    assert (cache.entries, cache.bytes) == (3, 3 * size)
    hit = cache.get(bytes([0]) * KEY_BYTES)  # 0 is now the most recently used
    assert hit is not None and hit["y"][0] == 0 and not hit["y"].flags.writeable
    assert cache.put(bytes([3]) * KEY_BYTES, {"y": row + 3}) == 1  # evicts 1, the least recently used
    assert cache.get(bytes([1]) * KEY_BYTES) is None
    assert cache.get(bytes([0]) * KEY_BYTES) is not None and cache.get(bytes([3]) * KEY_BYTES) is not None
    assert (cache.hits, cache.misses, cache.evictions, cache.bytes) == (3, 1, 1, 3 * size)
    source = row + 9
    cache.put(b"k" * KEY_BYTES, {"y": source})
    source[0] = 42.0  # the cache holds its own copy
    stored = cache.get(b"k" * KEY_BYTES)
    assert stored is not None and stored["y"][0] == 9.0
    assert cache.put(b"big" * 6, {"y": np.zeros(10_000, np.float32)}) == 0  # over max_bytes: not kept
    assert cache.get(b"big" * 6) is None


@pytest.mark.parametrize("value", ["yes", 1, [True]])
def test_the_cache_parameter_must_be_a_boolean(value: object) -> None:
    from kubeinfer.runtime.errors import ProtocolError
    from kubeinfer.runtime.protocol import cache_parameter

    assert cache_parameter(None) is True and cache_parameter(False) is False
    with pytest.raises(ProtocolError, match="parameter 'cache' must be true or false"):
        cache_parameter(value)


ROWS: dict[str, Callable[[int], dict[str, np.ndarray]]] = {
    "embedding": lambda i: {
        "embedding": np.full((1, 384), i, np.float32),
        "token_count": np.array([7], np.int64),
    },
    "score": lambda i: {"score": np.array([i], np.float32), "token_count": np.array([7], np.int64)},
}


@pytest.mark.parametrize("kind", sorted(ROWS))
def test_the_bytes_counted_are_the_heap_held_within_ten_percent(kind: str) -> None:
    """Filled to its budget, then churned (each put evicting one): the heap tracemalloc measures is
    within 10 % of ``cache.bytes``, for 384-float embeddings as for one score per request (where the
    data alone is 5 % of it)."""
    make = ROWS[kind]

    def key(i: int) -> bytes:
        return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=KEY_BYTES).digest()

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = ResponseCache(max_bytes=1 << 20)
        i = 0
        while cache.evictions == 0:
            cache.put(key(i), make(i))
            i += 1
        gc.collect()
        filled = tracemalloc.get_traced_memory()[0] - before, cache.bytes
        for j in range(i, 3 * i):
            cache.put(key(j), make(j))
        gc.collect()
        churned = tracemalloc.get_traced_memory()[0] - before, cache.bytes
    finally:
        tracemalloc.stop()
    assert cache.bytes <= cache.max_bytes and cache.evictions >= 2 * i - 1
    for measured, counted in (filled, churned):
        assert abs(measured - counted) <= 0.1 * counted, (kind, measured, counted)
