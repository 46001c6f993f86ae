"""Which activator gRPC port an InferenceService routed to the activator gets. Pure: no I/O, no clock.

The activator cannot tell through which Service a gRPC call came, so each service at the activator has
a port of its own, in the contract's range (:func:`kubeinfer.contract.activator.is_target_grpc_port`);
its EndpointSlice ``<isvc>-activator`` carries it as the port ``grpc`` and the activator listens on it
for that service. The operator allocates:

- a service keeps its allocation in this process, else the port its existing slice names (restarts
  and re-reconciles keep it), unless another service holds that port (two slices naming one port:
  the service with the smaller ``(namespace, name)`` keeps it, the other moves);
- else the port from a stable hash of ``namespace/name`` (:func:`preferred_port`), else the next free
  one above it (wrapping round), skipping every port that another service's slice names (as watched)
  or that this process allocated to another service;
- none free: ``None``; the reconciler then names the activator's shared port.

:class:`GrpcPorts` is the allocation of one operator process. ``allocate`` chooses and records in one
synchronous call, so two reconciles running concurrently in the process never get one port.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from kubeinfer.contract.activator import ACTIVATOR_GRPC_PORTS_COUNT, ACTIVATOR_GRPC_PORTS_FIRST

__all__ = ["GrpcPorts", "Held", "Key", "preferred_port"]

#: An InferenceService: ``(namespace, name)``.
Key = tuple[str, str]
#: The ports the operator's activator EndpointSlices name, as watched: port -> the InferenceServices
#: whose slice names it (usually one).
Held = Mapping[int, Collection[Key]]


def preferred_port(
    key: Key, first: int = ACTIVATOR_GRPC_PORTS_FIRST, count: int = ACTIVATOR_GRPC_PORTS_COUNT
) -> int:
    """The port ``key`` tries first: ``first`` plus the SHA-256 of ``namespace/name`` modulo ``count``
    (the same in every process and Python version; ``hash()`` is salted). Raises ``ValueError`` for a
    ``count`` below 1."""
    if count < 1:
        raise ValueError("an empty port range")
    digest = hashlib.sha256(f"{key[0]}/{key[1]}".encode()).digest()
    return first + int.from_bytes(digest[:8], "big") % count


@dataclass
class GrpcPorts:
    """The activator gRPC ports one operator process allocated: ``count`` ports from ``first`` (the
    contract's range by default), by service and by port (see the module docstring)."""

    first: int = ACTIVATOR_GRPC_PORTS_FIRST
    count: int = ACTIVATOR_GRPC_PORTS_COUNT
    _by_key: dict[Key, int] = field(default_factory=dict)
    _by_port: dict[int, Key] = field(default_factory=dict)

    def port_of(self, key: Key) -> int | None:
        """The port allocated to ``key`` in this process, or ``None``."""
        return self._by_key.get(key)

    def allocated(self) -> dict[Key, int]:
        """Every allocation, by service (a copy)."""
        return dict(self._by_key)

    def allocate(self, key: Key, current: int | None, held: Held) -> int | None:
        """The port of ``key``, chosen and recorded (see the module docstring).

        ``current``: the port its existing activator EndpointSlice names (``None``: no slice, or no
        ``grpc`` port); ``held``: port -> the services whose slice names it, as watched (``key``'s own
        entries are ignored). Returns ``None`` when every port of the range is taken (nothing recorded).
        """
        mine = self._by_key.get(key)
        if mine is not None:
            return mine
        if current is not None and self._in_range(current) and self._free(key, current, held, keep=True):
            return self._record(key, current)
        start = preferred_port(key, self.first, self.count) - self.first
        for step in range(self.count):
            port = self.first + (start + step) % self.count
            if self._free(key, port, held, keep=False):
                return self._record(key, port)
        return None

    def release(self, key: Key) -> None:
        """Forget the allocation of ``key`` (its slice was deleted, or the service was); none: nothing."""
        port = self._by_key.pop(key, None)
        if port is not None and self._by_port.get(port) == key:
            del self._by_port[port]

    def _in_range(self, port: int) -> bool:
        return self.first <= port < self.first + self.count

    def _free(self, key: Key, port: int, held: Held, *, keep: bool) -> bool:
        """Whether ``key`` may have ``port``: no other service has it in this process, and no other
        service's slice names it; or, to keep a port its own slice names (``keep``), every other slice
        naming it is of a service after ``key``."""
        if self._by_port.get(port, key) != key:
            return False
        others = [k for k in held.get(port, ()) if k != key]
        return not others or (keep and key < min(others))

    def _record(self, key: Key, port: int) -> int:
        self._by_key[key] = port
        self._by_port[port] = key
        return port
