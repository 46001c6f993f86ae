"""The hold: requests for a target wait, bounded, until the target is ready (pure: asyncio only, no I/O).

One mechanism for every "the thing that answers is not there yet" case: the activator holds requests for
an InferenceService at zero until a replica is Ready, and the runtime's model repository mode holds
requests for a model until it is loaded (``fail`` ends them when the load fails). A target is any
hashable key; what "ready" means, how to ask for it and how to describe its progress are the three
callables the owner hands in.

- **Bounds, per target**: at most ``max_requests`` requests and ``max_bytes`` bytes held. An arrival over
  either is refused at once with ``Overflow`` (the servers answer 503 + ``Retry-After`` / gRPC
  UNAVAILABLE): a bounded queue sheds at its door instead of growing without limit.
- **Deadlines**: each held request leaves at the smaller of its own timeout and the cold-start budget
  (``cold_start_timeout_s``), with ``HoldTimeout`` naming the target's stage (the servers answer 504 /
  DEADLINE_EXCEEDED). ``expire`` applies the deadlines against the injected clock; ``run_deadlines`` is
  the task that calls it on time.
- **Release order**: when the target turns ready (``notify``), the held requests are released by priority
  level, then by arrival. Levels follow the runtime's batcher: ``priority`` 1 is the highest level, a
  larger number a lower one, and 0 or none is ``default_priority_level``.
- **Demand**: ``demand(key)`` is called when a request is held on an empty queue of a target that is not
  ready (the first request after a quiet spell asks for a replica). The callable must be idempotent: a
  target whose held requests all timed out is asked again by the next arrival.
- **Clients that leave**: a waiter cancelled while held (the client closed the connection) leaves the
  queue and frees its share of the bounds.

Times are seconds of the clock handed in (``time.monotonic`` by default; tests hand a fake one).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

__all__ = [
    "Held",
    "Hold",
    "HoldError",
    "HoldLimits",
    "HoldTimeout",
    "Overflow",
    "priority_level",
    "retry_after_header",
    "seconds_from_us",
]


class HoldError(Exception):
    """A held request that will not be forwarded; ``message`` is what the client is told."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Overflow(HoldError):
    """The target's queue is full (``reason`` "requests" or "bytes"); retry after ``retry_after_s``
    seconds. Answered as 503 with ``Retry-After`` (REST) or UNAVAILABLE (gRPC)."""

    def __init__(self, message: str, *, reason: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


class HoldTimeout(HoldError):
    """The request's deadline passed while the target was not ready; ``stage`` is where the target was
    then, ``waited_s`` how long the request was held (seconds). Answered as 504 (REST) or
    DEADLINE_EXCEEDED (gRPC)."""

    def __init__(self, message: str, *, stage: str, waited_s: float) -> None:
        super().__init__(message)
        self.stage = stage
        self.waited_s = waited_s


@dataclass(frozen=True)
class HoldLimits:
    """The hold's settings.

    Args:
        max_requests: requests held per target; one more is an ``Overflow``.
        max_bytes: bytes (request bodies) held per target; an arrival that would exceed it is an
            ``Overflow`` (so is a single request larger than it).
        cold_start_timeout_s: the longest any request is held, seconds (the cold-start budget).
        retry_after_s: the ``Retry-After`` an ``Overflow`` suggests, seconds.
        default_priority_level: the level of a request with priority 0 or none (the runtime's default
            ``batching.default_priority_level`` is 2).
    """

    max_requests: int = 100
    max_bytes: int = 64 * 1024 * 1024
    cold_start_timeout_s: float = 60.0
    retry_after_s: float = 1.0
    default_priority_level: int = 2

    def __post_init__(self) -> None:
        if self.max_requests < 1 or self.max_bytes < 1:
            raise ValueError("max_requests and max_bytes must be at least 1")
        if not self.cold_start_timeout_s > 0 or self.retry_after_s < 0:
            raise ValueError("cold_start_timeout_s must be > 0 and retry_after_s >= 0")
        if self.default_priority_level < 1:
            raise ValueError("default_priority_level must be at least 1 (1 = highest)")


def priority_level(priority: object, default_level: int) -> int:
    """The queue level of an OIP ``priority`` parameter: the value itself when it is an integer >= 1
    (1 = highest), else ``default_level`` (0, none, or a value the runtime will reject: the runtime, not
    the activator, answers the 400 once the request is forwarded)."""
    if isinstance(priority, int) and not isinstance(priority, bool) and priority >= 1:
        return priority
    return default_level


@dataclass(frozen=True)
class Held:
    """What a target's queue holds now: ``requests`` and ``nbytes``."""

    requests: int
    nbytes: int


@dataclass(eq=False)
class _Entry:
    level: int
    seq: int
    nbytes: int
    arrived: float
    deadline: float
    future: asyncio.Future[float]


@dataclass
class _Queue:
    entries: dict[int, _Entry] = field(default_factory=dict)
    nbytes: int = 0


class Hold(Generic[K]):
    """Bounded, deadline- and priority-aware waiting for targets to turn ready.

    Args:
        limits: the bounds and budgets (``HoldLimits``).
        ready: ``ready(key)``: True when requests for ``key`` can go on now.
        demand: ``demand(key)``: ask for ``key`` to become ready (idempotent, must not block or raise).
        stage: ``stage(key)``: a short description of where ``key`` is (e.g. "loading model"), for the
            timeout's message.
        clock: seconds, monotonic (default ``time.monotonic``).
    """

    def __init__(
        self,
        limits: HoldLimits,
        *,
        ready: Callable[[K], bool],
        demand: Callable[[K], None],
        stage: Callable[[K], str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self._ready = ready
        self._demand = demand
        self._stage = stage
        self._clock = clock
        self._queues: dict[K, _Queue] = {}
        self._seq = itertools.count()
        self._arrived = asyncio.Event()

    async def wait(
        self,
        key: K,
        *,
        nbytes: int = 0,
        priority: object = None,
        timeout_s: float | None = None,
        budget_s: float | None = None,
    ) -> float:
        """Return once ``key`` is ready: at once when it is, else when ``notify`` finds it ready.

        Args:
            key: the target.
            nbytes: the request's size, bytes (counted against ``max_bytes`` while held).
            priority: the OIP ``priority`` parameter (see ``priority_level``).
            timeout_s: the request's own timeout, seconds (None or 0: none; the cold-start budget applies).
            budget_s: the target's own cold-start budget, seconds (None: ``limits.cold_start_timeout_s``).

        Returns:
            The seconds the request was held (0.0 when not held).

        Raises:
            Overflow: the target's queue is at ``max_requests`` or this request would exceed ``max_bytes``.
            HoldTimeout: the deadline passed first (``expire``).
            asyncio.CancelledError: the caller was cancelled (the client left); the request left the queue.
        """
        if self._ready(key):
            return 0.0
        queue = self._queues.get(key)
        held = len(queue.entries) if queue else 0
        held_bytes = queue.nbytes if queue else 0
        self._check_room(key, held, held_bytes, nbytes)
        now = self._clock()
        budget = self.limits.cold_start_timeout_s if budget_s is None else budget_s
        if timeout_s is not None and timeout_s > 0:
            budget = min(budget, timeout_s)
        entry = _Entry(
            level=priority_level(priority, self.limits.default_priority_level),
            seq=next(self._seq),
            nbytes=nbytes,
            arrived=now,
            deadline=now + budget,
            future=asyncio.get_running_loop().create_future(),
        )
        if queue is None:
            queue = self._queues[key] = _Queue()
        queue.entries[entry.seq] = entry
        queue.nbytes += nbytes
        self._arrived.set()
        if held == 0:
            self._demand(key)
        try:
            return await entry.future
        finally:
            # cancelled (the client left) or done: a request still queued leaves, freeing its share
            self._remove(key, entry)

    def _check_room(self, key: K, held: int, held_bytes: int, nbytes: int) -> None:
        limits = self.limits
        if held + 1 > limits.max_requests:
            raise Overflow(
                f"{key}: {held} requests already held while it starts (at most {limits.max_requests})",
                reason="requests",
                retry_after_s=limits.retry_after_s,
            )
        if held_bytes + nbytes > limits.max_bytes:
            raise Overflow(
                f"{key}: {held_bytes} bytes already held while it starts; this request's {nbytes} would "
                f"exceed {limits.max_bytes}",
                reason="bytes",
                retry_after_s=limits.retry_after_s,
            )

    def _remove(self, key: K, entry: _Entry) -> None:
        queue = self._queues.get(key)
        if queue is None or queue.entries.pop(entry.seq, None) is None:
            return
        queue.nbytes -= entry.nbytes
        if not queue.entries:
            del self._queues[key]

    def notify(self, key: K) -> int:
        """Re-check ``ready(key)``; when ready, release its held requests by level, then arrival.

        Call it whenever the target may have changed (an endpoint appeared). Returns how many requests were
        released (their ``wait`` returns the seconds each was held)."""
        queue = self._queues.get(key)
        if queue is None or not self._ready(key):
            return 0
        del self._queues[key]
        now = self._clock()
        # the futures' callbacks run in the order they are set: the waiters resume in this order
        order = sorted(queue.entries.values(), key=lambda e: (e.level, e.seq))
        for entry in order:
            if not entry.future.done():
                entry.future.set_result(max(0.0, now - entry.arrived))
        return len(order)

    def fail(self, key: K, error: HoldError) -> int:
        """Fail every request held for ``key`` with ``error`` (the target will not turn ready: its model
        failed to load). Returns how many were failed; the next arrival for ``key`` is held again and
        calls ``demand``."""
        queue = self._queues.pop(key, None)
        if queue is None:
            return 0
        for entry in queue.entries.values():
            if not entry.future.done():
                entry.future.set_exception(error)
        return len(queue.entries)

    def expire(self) -> int:
        """Fail every held request whose deadline has passed with ``HoldTimeout`` naming its target's
        stage. Returns how many were failed."""
        now = self._clock()
        failed = 0
        for key, queue in list(self._queues.items()):
            late = [e for e in queue.entries.values() if e.deadline <= now]
            if not late:
                continue
            stage = self._stage(key)
            for entry in late:
                self._remove(key, entry)
                waited = now - entry.arrived
                if not entry.future.done():
                    entry.future.set_exception(
                        HoldTimeout(
                            f"{key} was not ready after {waited:.1f} s (stage: {stage})",
                            stage=stage,
                            waited_s=waited,
                        )
                    )
                    failed += 1
        return failed

    def next_deadline(self) -> float | None:
        """The earliest deadline of any held request (clock seconds), or None when nothing is held."""
        deadlines = [e.deadline for q in self._queues.values() for e in q.entries.values()]
        return min(deadlines) if deadlines else None

    def held(self, key: K) -> Held:
        """What is held for ``key`` now."""
        queue = self._queues.get(key)
        return Held(len(queue.entries), queue.nbytes) if queue else Held(0, 0)

    def targets(self) -> list[K]:
        """The targets with requests held."""
        return list(self._queues)

    async def run_deadlines(self) -> None:
        """Call ``expire`` at every deadline, forever (cancel the task to stop). The clock must be the
        event loop's time base (``time.monotonic``, the default) for the sleeps to match it."""
        while True:
            self.expire()
            deadline = self.next_deadline()
            delay = None if deadline is None else max(0.0, deadline - self._clock())
            self._arrived.clear()
            if delay is not None and delay <= 0:
                continue
            # an arrival may bring an earlier deadline: wake for it too
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout=delay)


def seconds_from_us(timeout_us: object) -> float | None:
    """An OIP ``timeout`` parameter (microseconds, 0 = none) as seconds, or None when it is absent, 0 or
    not a non-negative integer (the runtime rejects such a value once forwarded)."""
    if isinstance(timeout_us, int) and not isinstance(timeout_us, bool) and timeout_us > 0:
        return timeout_us / 1e6
    return None


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` (whole seconds, at least 1) for ``seconds``."""
    return str(max(1, math.ceil(seconds)))
