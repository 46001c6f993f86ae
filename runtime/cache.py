"""The response cache: outputs of requests already answered, by a hash of their input tensors.

Triton's response cache, in the model process's data plane (``DataPlane``), so that one cache serves
every transport and every front end. ``cache.enabled`` turns it on, ``cache.max_bytes`` bounds it.

- **Key**: BLAKE2b-128 over each input tensor's name, datatype, shape and raw bytes (the protocol's
  raw layout, ``protocol.raw_buffer``), in name order. Request parameters are not in it: none of
  those the runtime takes (``priority``, ``timeout``) changes a model's outputs. One runtime serves
  one version of one model, so a key never crosses models or versions (the cache dies with the
  process).
- **Value**: every output the model returned for the request (token counts included), as read-only
  copies; a hit answers with the same arrays, so the encoded response is byte-identical.
- **Opt-out**: a request with the parameter ``cache`` false neither reads nor fills the cache.
- **Eviction**: least recently used first, until the entries' bytes fit. An entry's bytes are what
  it holds on the heap, not only its arrays' data: the key object, the dict of outputs, each array's
  header and data (an object array's elements too), the entry's tuple and its slot in the LRU map
  (``entry_bytes``). For small outputs (one score per request) the overhead is most of it: counting
  the data alone held about 20 times ``max_bytes``.
- Only successful answers are kept. Two identical requests that arrive before either is answered
  both run (no coalescing).

Pure: no clock, no I/O, no locks (the data plane calls it on its event loop).
"""

from __future__ import annotations

import collections
import hashlib
import sys
from collections.abc import Mapping

import numpy as np
from kubeinfer.runtime.dtypes import datatype_of
from kubeinfer.runtime.protocol import raw_buffer

#: Bytes a key takes (BLAKE2b digest size), counted with its entry.
KEY_BYTES = 16


def cache_key(inputs: Mapping[str, np.ndarray]) -> bytes:
    """The key of a request's input tensors (name -> array of a protocol datatype).

    Raises ``ValueError`` for an array of no protocol datatype."""
    digest = hashlib.blake2b(digest_size=KEY_BYTES)
    for name in sorted(inputs):
        array = inputs[name]
        datatype = datatype_of(array)
        digest.update(f"{len(name)}:{name}:{datatype}:{list(array.shape)}:".encode())
        raw = raw_buffer(array, datatype)
        digest.update(raw if isinstance(raw, bytes) else raw.data)
    return digest.digest()


#: Bytes one entry's slot in the LRU map (``collections.OrderedDict``) takes beyond the objects it
#: refers to: the hash table's entry (24), its index and fast-node pointer (4 + 8 per slot, 1.5 to 3
#: slots per entry), the linked-list node (32), and the deleted entries' room that an LRU's churn
#: leaves in the table until it is resized. Measured with ``tracemalloc`` on CPython 3.11: 70 to 115
#: per entry filled once, 140 to 200 under churn; this is the middle of the latter (the steady state).
SLOT_BYTES = 160


def _array_bytes(array: np.ndarray) -> int:
    """The heap bytes of an array that owns its data: the object with its data, shape and strides
    (``sys.getsizeof``) and, for an object array, every element."""
    total = sys.getsizeof(array)
    if array.base is not None:  # a view's getsizeof leaves the data out
        total += array.nbytes
    if array.dtype == object:
        total += sum(sys.getsizeof(v) for v in array.reshape(-1))
    return total


def entry_bytes(key: bytes, outputs: Mapping[str, np.ndarray]) -> int:
    """The bytes one cache entry holds on the heap: ``key`` (a bytes object), the ``outputs`` dict
    (name -> array as stored: each owning its data) and every array in it (``_array_bytes``), the
    entry's ``(outputs, size)`` tuple and its size, and ``SLOT_BYTES`` for its slot in the LRU map.
    An estimate within 10 % of what ``tracemalloc`` measures of a full cache, for one float32 score
    per entry as for 384-float embeddings (``bench/cache_accounting.py``). Bytes, >= 0."""
    total = sys.getsizeof(key) + sys.getsizeof(outputs) + SLOT_BYTES
    total += sys.getsizeof((None, None)) + sys.getsizeof(1 << 30)  # the entry's tuple and its size
    for array in outputs.values():
        total += _array_bytes(array)
    return total


class ResponseCache:
    """An LRU map from ``cache_key`` to a request's outputs, within ``max_bytes``.

    Attributes: ``hits``, ``misses``, ``evictions`` (counts), ``bytes`` (held now, every entry's
    ``entry_bytes``: the heap it takes, overhead included), ``entries``.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[bytes, tuple[dict[str, np.ndarray], int]] = (
            collections.OrderedDict()
        )
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def entries(self) -> int:
        """Requests held."""
        return len(self._entries)

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        """The outputs stored under ``key`` (now the most recently used), or None; counts a hit or miss."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return dict(entry[0])

    def put(self, key: bytes, outputs: Mapping[str, np.ndarray]) -> int:
        """Store read-only copies of ``outputs`` under ``key``, evicting the least recently used entries
        until it fits (entries counted by ``entry_bytes``). An entry larger than ``max_bytes`` is not
        stored. Returns the entries evicted."""
        if key in self._entries or sum(a.nbytes for a in outputs.values()) > self.max_bytes:
            return 0
        copies: dict[str, np.ndarray] = {}
        for name, array in outputs.items():
            copy = np.array(array, copy=True)
            copy.flags.writeable = False
            copies[name] = copy
        size = entry_bytes(key, copies)
        if size > self.max_bytes:
            return 0
        evicted = 0
        while self.bytes + size > self.max_bytes and self._entries:
            _, (_, freed) = self._entries.popitem(last=False)
            self.bytes -= freed
            evicted += 1
        self._entries[key] = (copies, size)
        self.bytes += size
        self.evictions += evicted
        return evicted
