"""The gate both fronts pass a request through: its target's endpoint, at once or after the hold.

``Gate.endpoint`` returns a ready replica for a target, holding the request (``hold.Hold``) while there is
none; ``Targets.subscribe`` tells the hold when a target may have turned ready. ``refused`` logs one line
per request the activator answers itself (never a traceback).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kubeinfer.activator.targets import Endpoint, Targets

from kubeinfer.shared.hold import Hold, HoldLimits, HoldTimeout

log = logging.getLogger("kubeinfer.activator")

__all__ = ["Gate", "refused"]


class Gate:
    """Targets plus the hold.

    Args:
        targets: the ``Targets`` to resolve and ask.
        limits: the hold's bounds and budgets.
        clock: seconds, monotonic (the event loop's time base when ``run_deadlines`` runs).
    """

    def __init__(
        self, targets: Targets, limits: HoldLimits, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.targets = targets
        self._clock = clock
        self.hold: Hold[str] = Hold(
            limits,
            ready=lambda target: targets.endpoint(target) is not None,
            demand=targets.demand,
            stage=targets.stage,
            clock=clock,
        )
        targets.subscribe(self._changed)

    def _changed(self, target: str) -> None:
        self.hold.notify(target)

    async def endpoint(
        self, target: str, *, nbytes: int, priority: object = None, timeout_s: float | None = None
    ) -> Endpoint:
        """A ready replica of ``target``: at once, or once the hold releases the request.

        Args:
            target: a resolved target.
            nbytes: the request's size in bytes (counted against the hold's byte bound).
            priority: the OIP ``priority`` parameter (1 = highest; 0 or None = the default level).
            timeout_s: the request's own timeout, seconds (None: only the cold-start budget: the target's
                own, ``Targets.cold_start_timeout``, else the hold's ``cold_start_timeout_s``).

        Raises:
            Overflow: the target's queue is full (503 / UNAVAILABLE).
            HoldTimeout: not ready within the request's deadline (504 / DEADLINE_EXCEEDED).
            asyncio.CancelledError: the client left while held.
        """
        endpoint = self.targets.endpoint(target)
        if endpoint is not None:
            return endpoint
        start = self._clock()
        own = self.targets.cold_start_timeout(target)
        budget = self.hold.limits.cold_start_timeout_s if own is None else own
        if timeout_s is not None and timeout_s > 0:
            budget = min(budget, timeout_s)
        while True:
            remaining = budget - (self._clock() - start)
            if remaining <= 0:
                # released, but the replica left again before the request went out, and its time is up
                stage = self.targets.stage(target)
                message = f"{target} was not ready after {budget:.1f} s (stage: {stage})"
                raise HoldTimeout(message, stage=stage, waited_s=budget)
            # the remaining budget already counts the request's own timeout
            await self.hold.wait(target, nbytes=nbytes, priority=priority, budget_s=remaining)
            endpoint = self.targets.endpoint(target)
            if endpoint is not None:
                return endpoint


def refused(kind: str, target: str, message: str) -> None:
    """Log one line for a request the activator answered itself (``kind``: "REST 503", "gRPC ..."...)."""
    log.warning("%s for %s: %s", kind, target, message)
