"""Triton's system shared-memory extension: tensors a client in the same pod leaves in ``/dev/shm``.

A client (a sidecar sharing the pod's ``/dev/shm``, or a process on the same machine) creates a POSIX
shared-memory object (``tritonclient.utils.shared_memory.create_shared_memory_region``), registers it
under a name with its key, offset and size, and then names the region instead of sending the bytes:
an input with ``parameters.shared_memory_region`` (and ``shared_memory_byte_size``, optionally
``shared_memory_offset``) is read from it, an output with the same parameters is written into it and
answered without data. The protocol (Triton's ``docs/protocol/extension_shared_memory.md``):

- REST ``GET v2/systemsharedmemory[/region/NAME]/status``, ``POST v2/systemsharedmemory/region/NAME/
  register`` (``{"key", "offset", "byte_size"}``), ``POST v2/systemsharedmemory[/region/NAME]/
  unregister``; gRPC ``SystemSharedMemoryStatus``, ``SystemSharedMemoryRegister``,
  ``SystemSharedMemoryUnregister``.
- CUDA shared memory (``v2/cudasharedmemory/...``): this server holds no CUDA regions; status lists
  none, unregistering all succeeds, registering one is refused (400).

The registry lives in the model process (``DataPlane``); front-end processes pass the region names
through, so whichever process a client's registration reached, every request sees it. An input's
bytes are copied out of the region when the request arrives (the client may reuse the region once
it has its answer). Keys name objects under ``/dev/shm`` only (no ``/`` inside, no symbolic links).
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from typing import Any

from kubeinfer.runtime.errors import InputError
from kubeinfer.runtime.protocol import RegionRef

#: Where POSIX shared-memory objects live (``shm_open``).
SHM_DIR = "/dev/shm"


@dataclass
class _Region:
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap


class SharedMemoryRegistry:
    """The system shared-memory regions registered with this server, by name. Thread-safe."""

    def __init__(self, shm_dir: str = SHM_DIR) -> None:
        self.shm_dir = shm_dir
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of the shared-memory object ``key`` as region ``name``.

        Raises:
            InputError: 400 for a name already registered, a key that is no object under the shm
                directory (or contains ``/``), or a range beyond the object's size.
        """
        if not name:
            raise InputError("shared memory region name must not be empty")
        plain = key.removeprefix("/")
        if not plain or "/" in plain or plain in (".", ".."):
            raise InputError(f"shared memory key '{key}' must name an object in {self.shm_dir}")
        if isinstance(offset, bool) or isinstance(byte_size, bool) or offset < 0 or byte_size <= 0:
            raise InputError(f"shared memory region '{name}': offset must be >= 0 and byte_size > 0")
        with self._lock:
            if name in self._regions:
                raise InputError(f"shared memory region '{name}' is already registered")
            try:
                fd = os.open(os.path.join(self.shm_dir, plain), os.O_RDWR | os.O_NOFOLLOW)
            except OSError as exc:
                raise InputError(
                    f"unable to open shared memory region '{name}' (key '{key}'): {exc.strerror}"
                ) from None
            try:
                size = os.fstat(fd).st_size
                if offset + byte_size > size:
                    raise InputError(
                        f"shared memory region '{name}': offset {offset} + byte_size {byte_size} is beyond "
                        f"the {size} bytes of key '{key}'"
                    )
                mapping = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            self._regions[name] = _Region(key, offset, byte_size, mapping)

    def unregister(self, name: str | None = None) -> None:
        """Forget region ``name`` (every region when None); a name not registered is no error."""
        with self._lock:
            names = list(self._regions) if name is None else [name]
            for n in names:
                region = self._regions.pop(n, None)
                if region is not None:
                    region.mapping.close()

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """``[{"name", "key", "offset", "byte_size"}]`` of region ``name`` (every region when None).

        Raises:
            InputError: 400 for a name not registered.
        """
        with self._lock:
            if name is not None and name not in self._regions:
                raise InputError(f"unable to find system shared memory region '{name}'")
            names = sorted(self._regions) if name is None else [name]
            return [
                {"name": n, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                for n, r in ((n, self._regions[n]) for n in names)
            ]

    def _span(self, ref: RegionRef, tensor: str) -> tuple[_Region, int]:
        region = self._regions.get(ref.region)
        if region is None:
            raise InputError(
                f"tensor '{tensor}': shared memory region '{ref.region}' is not registered", tensor=tensor
            )
        if ref.offset + ref.byte_size > region.byte_size:
            raise InputError(
                f"tensor '{tensor}': offset {ref.offset} + byte_size {ref.byte_size} is beyond the "
                f"{region.byte_size} bytes of shared memory region '{ref.region}'",
                tensor=tensor,
            )
        return region, region.offset + ref.offset

    def read(self, ref: RegionRef, tensor: str) -> bytes:
        """A copy of the ``ref.byte_size`` bytes at ``ref``. Raises ``InputError`` 400 (unknown region,
        beyond it)."""
        with self._lock:
            region, start = self._span(ref, tensor)
            return region.mapping[start : start + ref.byte_size]

    def write(self, ref: RegionRef, tensor: str, data: bytes | memoryview | Any) -> None:
        """Write an output's raw bytes at ``ref``. Raises ``InputError`` 400 (unknown region, beyond it,
        or an output larger than the ``byte_size`` the request gave it)."""
        view = memoryview(data).cast("B")
        if len(view) > ref.byte_size:
            raise InputError(
                f"output '{tensor}' has {len(view)} bytes, over the shared_memory_byte_size "
                f"{ref.byte_size} the request gave it",
                tensor=tensor,
            )
        with self._lock:
            region, start = self._span(ref, tensor)
            region.mapping[start : start + len(view)] = view

    def close(self) -> None:
        """Unmap every region."""
        self.unregister(None)
