"""The batch executor: runs the batches the batcher takes, on the threads it owns.

``kubeinfer.runtime.batching.Batcher`` keeps the queue and decides what forms a batch, on the event
loop; it hands each batch it takes to ``BatchExecutor.run``. The executor owns the threads:

- ``executors`` threads run ``model.execute`` (torch releases the GIL); a batch taken while an
  executor is idle is preprocessed and executed there in ONE hand-off (one event-loop round trip per
  batch instead of two: nothing could overlap the preprocessing).
- a separate pool of the same size runs ``model.preprocess`` of batches taken *ahead*, while every
  executor is busy (the batcher takes at most one such batch per executor); the prepared batch then
  waits for an executor, in order.

Once a batch holds an executor its requests' queue timeouts stop (``QueuedRequest.timer``); the
time from enqueue to that moment is the request's queue time (``kubeinfer_queue_duration_seconds``).

Every request gets exactly one outcome: its rows of the outputs, or one error. If ``preprocess`` or
``execute`` raises for a batch of several requests, the batch is split in halves and each half run as
its own batch (bisection, ``_settle``), so the well-formed requests succeed and only the failing one
gets the error: an ``InputError`` as raised, anything else as a ``ServingError`` 500 naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from kubeinfer.runtime.errors import InputError, ServingError
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models.base import ServableModel

log = logging.getLogger(__name__)

_seq = itertools.count()


class RequestGroup:
    """The pieces of one request queued as several (``Batcher.infer_pieces``): ``pending`` of them have
    not started yet; the request's queue time is recorded once, when the last one starts."""

    def __init__(self, pending: int) -> None:
        self.pending = pending


@dataclass(eq=False)
class QueuedRequest:
    """One infer request from submission to its outcome.

    Attributes:
        inputs: tensor name -> array, rows first. rows: its batch-dimension size.
        level: priority level (1 highest). enqueued: event-loop time of submission, seconds.
        future: resolved with this request's outputs, or failed with its error.
        key: batch key (``ServableModel.batch_key``). seq: arrival order (unique, increasing).
        tokens: its longest row's tokens, at most (``ServableModel.tokens``; 0 for a tensor model).
        timer: the queue-timeout timer, or None. taken: taken into a batch.
        group: the request this is a piece of (``RequestGroup``), or None for a whole request.
        queue_time: whether its queue time is recorded when it starts (False for the windows of a
            request after its first part, ``Batcher``'s windows: the request's wait counted once).
    """

    inputs: Mapping[str, np.ndarray]
    rows: int
    level: int
    enqueued: float
    future: asyncio.Future[dict[str, np.ndarray]]
    key: Hashable = None
    tokens: int = 0
    seq: int = field(default_factory=lambda: next(_seq))
    timer: asyncio.TimerHandle | None = None
    taken: bool = False
    group: RequestGroup | None = None
    queue_time: bool = True

    def fail(self, exc: BaseException) -> None:
        """Fail the request with ``exc`` unless it has its outcome already."""
        if not self.future.done():
            self.future.set_exception(exc)


class BatchExecutor:
    """Runs batches of one model on ``executors`` threads (see the module docstring).

    Create on the event loop that calls ``run``; ``close`` stops the threads.
    """

    def __init__(self, model: ServableModel, executors: int, metrics: RuntimeMetrics) -> None:
        self.model = model
        self.executors = executors
        self.metrics = metrics
        self._slots = asyncio.Semaphore(executors)
        self._ahead = 0  # batches preprocessed ahead that wait for an executor
        self._exec_pool = ThreadPoolExecutor(executors, thread_name_prefix="kubeinfer-exec")
        self._prep_pool = ThreadPoolExecutor(executors, thread_name_prefix="kubeinfer-prep")

    @property
    def saturated(self) -> bool:
        """Every executor runs a batch."""
        return self._slots.locked()

    def close(self) -> None:
        """Stop the threads (batches not yet started are dropped)."""
        self._exec_pool.shutdown(wait=False, cancel_futures=True)
        self._prep_pool.shutdown(wait=False, cancel_futures=True)

    async def run(self, batch: list[QueuedRequest]) -> None:
        """Run a batch the batcher took; return once every request in it has its outcome."""
        try:
            if not self._slots.locked() and not self._ahead:  # an idle executor, no batch before it
                await self._run_now(batch)
            else:
                await self._run_ahead(batch)
        except Exception as exc:  # never leave a request without a response
            log.exception("batch failed unexpectedly")
            for req in batch:
                req.fail(ServingError(f"internal error running the batch: {exc}", 500))

    async def _run_now(self, batch: list[QueuedRequest]) -> None:
        async with self._slots:  # free: acquired without yielding
            live = self._start(batch, batch)
            if live:
                with self._busy():
                    await self._settle(live)

    async def _run_ahead(self, batch: list[QueuedRequest]) -> None:
        """Preprocess on the look-ahead pool, then wait for an executor (in order) and execute."""
        self._ahead += 1
        waiting = True
        try:
            live = [r for r in batch if not r.future.done()]
            prepared: Any = None
            error: BaseException | None = None
            t0 = time.perf_counter()
            if live:
                try:
                    prepared = await asyncio.get_running_loop().run_in_executor(
                        self._prep_pool, self.model.preprocess, [r.inputs for r in live]
                    )
                except Exception as exc:
                    error = exc
            prep_seconds = time.perf_counter() - t0
            async with self._slots:
                self._ahead -= 1
                waiting = False
                still = self._start(batch, live, prep_seconds)
                if not still:
                    return
                with self._busy():
                    if len(still) < len(live):  # some timed out while the batch waited: re-form it
                        await self._settle(still)
                    else:
                        await self._settle(still, prepared, error, prep_seconds)
        finally:
            if waiting:
                self._ahead -= 1

    def _start(
        self, batch: Sequence[QueuedRequest], live: Sequence[QueuedRequest], prep_seconds: float = 0.0
    ) -> list[QueuedRequest]:
        """The batch holds an executor: its requests' queue timeouts stop and their queue time is
        recorded; returns those of ``live`` still without an outcome.

        ``prep_seconds``: the batch was preprocessed ahead for that long while it waited (its compute
        input time, recorded with the batch): left out of the queue time when the prepared batch runs
        as it is, so that the two never overlap (the queue time is the wait before the batch was taken
        plus the wait for an executor after its preprocessing, as Triton's statistics count them)."""
        now = asyncio.get_running_loop().time()
        for req in batch:
            if req.timer is not None:
                req.timer.cancel()
        still = [r for r in live if not r.future.done()]
        counted = prep_seconds if len(still) == len(live) else 0.0  # re-formed: preprocessed again
        for req in still:
            if not req.queue_time:
                continue
            if req.group is not None:  # a piece of a request: its queue time counts once, at its last
                req.group.pending -= 1
                if req.group.pending > 0:
                    continue
            self.metrics.observe_queue(max(0.0, now - req.enqueued - counted))
        return still

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        token = self.metrics.busy.begin()
        try:
            yield
        finally:
            self.metrics.busy.end(token)

    async def _settle(
        self,
        reqs: list[QueuedRequest],
        prepared: Any = None,
        error: BaseException | None = None,
        prep_seconds: float = 0.0,
    ) -> None:
        """Run ``reqs`` as one batch on an executor thread and deliver each request's rows.

        ``prepared``: the batch already preprocessed (else preprocess and execute run in one hand-off);
        ``error``: its preprocessing already failed. On failure of a batch of several requests, each
        half runs again as its own batch (bisection) until the failing request is alone and gets the
        error.
        """
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        if error is None:
            try:
                if prepared is None:
                    outputs, prep_seconds = await loop.run_in_executor(
                        self._exec_pool, self._preprocess_execute, [r.inputs for r in reqs]
                    )
                    infer_seconds = time.perf_counter() - t0 - prep_seconds
                else:
                    outputs = await loop.run_in_executor(self._exec_pool, self.model.execute, prepared)
                    infer_seconds = time.perf_counter() - t0
                t1 = time.perf_counter()
                deliver(reqs, outputs)
            except Exception as exc:
                error = exc
            else:
                rows = sum(r.rows for r in reqs)
                output_seconds = time.perf_counter() - t1
                self.metrics.observe_batch(rows, len(reqs), prep_seconds, infer_seconds, output_seconds)
                return
        if len(reqs) == 1:
            reqs[0].fail(self._explain(error))
            return
        log.warning(
            "batch of %d requests failed (%s: %s); bisecting to isolate the failing request",
            len(reqs),
            type(error).__name__,
            error,
        )
        mid = len(reqs) // 2
        for half in (reqs[:mid], reqs[mid:]):
            await self._settle(half)

    def _preprocess_execute(
        self, batch: list[Mapping[str, np.ndarray]]
    ) -> tuple[dict[str, np.ndarray], float]:
        """Preprocess and execute on this thread; the outputs and the preprocess seconds."""
        t0 = time.perf_counter()
        prepared = self.model.preprocess(batch)
        prep_seconds = time.perf_counter() - t0
        return self.model.execute(prepared), prep_seconds

    def _explain(self, exc: BaseException) -> BaseException:
        if isinstance(exc, InputError):
            return exc
        return ServingError(
            f"model '{self.model.name}' failed on this request: {type(exc).__name__}: {exc}", 500
        )


def deliver(reqs: Sequence[QueuedRequest], outputs: Mapping[str, np.ndarray]) -> None:
    """Split a batch's outputs (rows of ``reqs`` concatenated in order) back to the requests.

    Raises:
        RuntimeError: an output is a scalar or its rows are not the batch's total.
    """
    total = sum(r.rows for r in reqs)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise RuntimeError(
                f"model returned output '{name}' with shape {list(array.shape)} for a batch of {total} rows"
            )
    offset = 0
    for req in reqs:
        part = {name: array[offset : offset + req.rows] for name, array in outputs.items()}
        offset += req.rows
        if not req.future.done():
            req.future.set_result(part)
