"""The dynamic batcher: requests queue on the event loop, batches run on executor threads.

Policy (``plan_batch``, pure, unit-tested without threads):

- Requests are ordered by priority level (1 = highest, as in Triton's ``priority`` parameter; 0 or
  absent = ``default_priority_level``), then by arrival; but a level that waited while others were
  served earns ``priority_min_share`` of a turn per batch taken without it, and with a whole turn its
  oldest request heads the next batch (``head_level``; a deficit round robin): at overload each level
  below the highest still heads that share of the batches, and a level's requests never wait for an
  unbounded stream of higher ones. With ``priority_min_share`` 0 the order is strict. Only requests with
  equal batch keys (``ServableModel.batch_key``, e.g. a TorchScript model's non-batch dimensions) share
  a batch: the batch takes the head of that order and, in order, the requests with the head's key whose
  rows fit in ``max_batch_size``; requests of other keys keep their places and wait for a later batch
  (they become the head once the older ones are served, so none starves). A request is never split
  across batches (a chunked text's windows are parts of their own: "Windows" below), and the batch
  stops at the first same-key request that does not fit (no overtaking).
- A request with more rows than the current ``max_batch_size`` (but no more than the warmed maximum,
  ``model.max_batch_size``) runs alone in its own batch. More rows than the warmed maximum -> HTTP 413
  at submission.
- Size trigger: the batch is *full* (its rows reach ``max_batch_size``, or the next same-key request
  does not fit). Delay trigger: the oldest queued request (of any key) has waited
  ``max_queue_delay_seconds``; requests of another key therefore never wait much longer than their
  own delay plus the batches ahead of them. With ``max_queue_delay_seconds == 0`` an idle executor
  takes whatever is queued at once.
- Early dispatch (no request can arrive in time): an idle executor does not wait out the delay when,
  at the moment a request arrives or a batch finishes, the expected time to the next arrival
  (``arrival_gap``: the mean gap between the submissions of the last ``ARRIVAL_WINDOW_SECONDS``;
  arrivals treated as memoryless) reaches past the moment the batch would be due, so at low load a
  lone request starts at once instead of after ``max_queue_delay_seconds``. A sequential client (the last
  ``SEQUENTIAL_STREAK`` submissions each came while nothing else was queued or running, within
  ``FOLLOW_UP_SECONDS`` of the previous answer: a closed-loop client at concurrency 1) sends its next
  request only after this answer, however fast it calls, so its request starts at once too (the gap
  is infinite). An open-loop client at a low rate does not look like one: its arrivals do not follow
  the answers. A burst
  (several arrivals in the window, some while others were outstanding) still waits for its delay,
  and so does everything in the first window after ``start`` (no estimate yet).
- Preferred batch sizes (Triton's ``preferred_batch_size``): a prefix with exactly a preferred rows
  count also counts as full (the largest such prefix is taken).
- A batch is taken when an executor is idle (fewer batches in flight than executors) and one trigger
  holds. So that tokenization of the next batch overlaps execution of the current one, a *full* batch is
  also taken while all executors are busy, up to one extra batch per executor, and preprocessed while it
  waits (not a batch of window parts: "Windows" below); a batch that is only *due* waits for an idle
  executor and keeps collecting rows.
- While draining, every queued request is due at once.

Per request: ``timeout`` (microseconds, Triton semantics) is enforced while queued by a timer on the
event loop: when it expires before the request's batch is taken, the request fails with 504. Once a
batch is taken it runs to completion.

Load shedding (``Batcher._admit``): the queue admits at most ``max_queue_size`` requests, and a level
with a limit in ``priority_queue_sizes`` (Triton's per-priority queue policy) at most that many. When
the whole queue is full, an arrival of a higher priority than the lowest queued one displaces the newest
request of the lowest queued level (its whole requests before its window parts), which fails with 429;
otherwise (its own level full, or nothing of a lower priority queued) the arrival fails at once with
429. Both carry a ``Retry-After`` hint, and ``kubeinfer_shed_requests_total{priority, reason}`` counts
them, so a tier is only shed after every lower tier. An arrival displaces at most as many requests as
places it takes, also when the queue holds more than ``max_queue_size``: a chunked request's later
window queues without admission ("Windows" below), and a smaller ``max_queue_size`` keeps the requests
already queued.

One request of more rows than ``max_batch_size`` (an OpenAI request of many texts) is queued as
several pieces of at most ``max_batch_size`` rows (``Batcher.infer_pieces``, ``split_rows``), admitted
together: all of them when the queue (and its level) has room for all, making that room by displacing
as many newer requests of lower levels as needed (a request in pieces displaced counts once), else
none (429; a request of more pieces than ``max_queue_size``, or its level's limit, can never be
queued: 413). Once one piece fails, the pieces still queued leave the queue, so no work is done for
a request that has its outcome.

Windows (a text model's ``overflow: chunk``): a request with a text longer than the model's window runs
as its windows (``ServableModel.window_parts``, tokenized once at submission), in parts of about one
window's padded tokens (``pack_windows``), queued ONE AT A TIME (``Batcher._infer_windows``): the next
part queues when the one before has its outputs, so a batch of parts holds at most one part of each
chunked request (parts batch with parts only, ``WINDOW_PARTS_KEY``: a window would pad a batch's short
rows to its length). Parts wait in their priority level BELOW its whole requests: the level's next
batch is of its whole requests while one waits, of its parts (oldest first) when none waits, or when
``WINDOW_PART_MAX_PASSES`` (4) batches of its whole requests were taken while its parts waited
(``parts_first``: aging, so a chunked request finishes under any load of short ones, at about a fifth
of its level's batches); and a batch of parts is never taken ahead while every executor is busy
(``plan_batch``'s ``look_ahead``). So a short request never waits behind a part that has not started,
except an aged one (one batch of parts after every 4 batches of its level's whole requests, at most)
and a higher level's parts (priority orders parts as it orders whole requests; ``priority_min_share``
counts a level's parts and whole requests as one level's); it waits for the batch of parts running at
most, one window per chunked request (a 10,000-character text is 11 windows, ~360 ms of compute on two
CPU cores; queued as one request, every short request behind it waited for all of them). The request
takes one place in the queue, is admitted (and shed, after its level's whole requests) as one, and its
``timeout`` holds until its first part starts; a later part is due at once (it keeps its request's
submission time: while a part waits, the next batch is due at once, so the short requests ahead of
it do not wait out ``max_queue_delay_seconds`` first) but records no queue time of its own, and
its level is its request's. A failed part fails its request alone (bisection isolates it from its
batch-mates) and no later part queues; a client that leaves drops the part still queued and the later
ones. Once the last part has its outputs, the model's ``merge`` joins them (an embedder pools each
text's windows, a token classifier tags each text from its windows' logits). The cost: one chunked
request no longer runs its windows in one batch, nor on several executors at once, and at a level busy
with short requests it finishes at their pace.

Every request gets exactly one response: its outputs, or one ``ServingError``/``InputError``. A
request whose ``infer`` is cancelled (its client left: the transports cancel the task that awaits it)
gets none: still queued, it leaves the queue and is never computed; already taken into a batch, the
batch runs for the others (a batch that has not started yet is re-formed without it) and its rows
are dropped.

Split of the work: ``Batcher`` (this module) holds the queue and the dispatch; all queue state lives on
the event loop thread. A batch it takes runs on the ``BatchExecutor`` (``kubeinfer.runtime.executor``),
which owns the threads (``executors`` execute threads, a look-ahead preprocessing pool) and isolates a
failing request by bisection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from kubeinfer.runtime.config import BatchingConfig
from kubeinfer.runtime.errors import InputError, ServingError
from kubeinfer.runtime.executor import BatchExecutor, QueuedRequest, RequestGroup
from kubeinfer.runtime.metrics import RuntimeMetrics
from kubeinfer.runtime.models.base import ServableModel, WindowParts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchSettings:
    """The batching settings in force; hot-reloadable as a whole.

    Attributes:
        max_batch_size: rows per batch (1 = batching off), at most the model's warmed maximum.
        max_queue_delay_seconds: seconds the oldest queued request may wait for a batch to fill.
        max_queue_size: queued requests beyond which submission fails with 429.
        priority_levels: valid ``priority`` values are 1..priority_levels (1 highest); 0 = default.
        default_priority_level: level of requests that give no priority (or 0).
        preferred_batch_sizes: rows counts dispatched at once when reached (see ``plan_batch``).
        priority_queue_sizes: level -> queued requests beyond which an arrival at that level gets 429
            (levels not in it: only ``max_queue_size``).
        priority_min_share: the share of a turn a level earns per batch taken while it waits: at
            overload each level heads at least this share of the batches; 0 = strict priority.
        max_batch_tokens: the most tokens a batch may cost, counted padded (its rows times its longest
            row's tokens, ``Queued.tokens``), or None for no such bound (see ``plan_batch``).
    """

    max_batch_size: int = 32
    max_queue_delay_seconds: float = 0.005
    max_queue_size: int = 1024
    priority_levels: int = 2
    default_priority_level: int = 2
    preferred_batch_sizes: tuple[int, ...] = ()
    priority_queue_sizes: Mapping[int, int] = field(default_factory=dict)
    priority_min_share: float = 0.1
    max_batch_tokens: int | None = None

    @classmethod
    def from_config(cls, cfg: BatchingConfig) -> BatchSettings:
        """The settings of a config file's ``batching`` section."""
        return cls(
            max_batch_size=cfg.max_batch_size,
            max_queue_delay_seconds=cfg.max_queue_delay_seconds,
            max_queue_size=cfg.max_queue_size,
            priority_levels=cfg.priority_levels,
            default_priority_level=cfg.default_priority_level,
            preferred_batch_sizes=tuple(cfg.preferred_batch_sizes),
            priority_queue_sizes=dict(cfg.priority_queue_sizes),
            priority_min_share=cfg.priority_min_share,
            max_batch_tokens=cfg.max_batch_tokens,
        )


class Queued(Protocol):
    """What the policy needs to know of a queued request."""

    @property
    def rows(self) -> int: ...

    @property
    def enqueued(self) -> float: ...

    @property
    def key(self) -> Hashable: ...

    @property
    def tokens(self) -> int: ...


@dataclass(frozen=True)
class Plan:
    """The policy's decision: take ``take`` requests now (0 = none), those at positions ``picked`` of
    the ordered queue (ascending; the head's key only); if none, look again at ``wake_at``
    (event-loop time, seconds) or on the next state change when ``wake_at`` is ``None``."""

    take: int
    wake_at: float | None
    full: bool = False
    picked: tuple[int, ...] = ()


def plan_batch(
    ordered: Sequence[Queued],
    oldest_enqueued: float | None,
    *,
    max_batch_size: int,
    max_queue_delay_seconds: float,
    now: float,
    in_flight: int,
    executors: int,
    draining: bool = False,
    preferred_batch_sizes: Sequence[int] = (),
    arrival_gap: float | None = None,
    max_batch_tokens: int | None = None,
    look_ahead: bool = True,
) -> Plan:
    """Decide which requests form the next batch (pure; see the module docstring for the rules).

    Args:
        ordered: queued requests in service order (priority level, then arrival); each has ``rows``,
            ``enqueued`` (seconds) and ``key`` (requests batch together only if their keys are equal).
        oldest_enqueued: the earliest ``enqueued`` time among them (the delay trigger's reference).
        max_batch_size: rows per batch. max_queue_delay_seconds: the delay trigger, seconds.
        now: current time, seconds.
        in_flight: batches taken and not finished executing. executors: executor threads.
        draining: shutting down; everything queued is due.
        preferred_batch_sizes: rows counts that count as full (Triton's ``preferred_batch_size``): when a
            prefix of the queue has exactly one of these rows counts, the largest such prefix is taken
            at once, without waiting for ``max_batch_size`` rows or the delay.
        arrival_gap: expected seconds from ``now`` to the next arrival (None: unknown). An idle
            executor takes a batch that is neither full nor due at once when ``now + arrival_gap`` is
            at or past the moment it would be due (no other request is expected in time to join it).
        max_batch_tokens: the token budget (TEI's ``max_batch_tokens``, counted padded: the batch's
            rows times its longest row's ``tokens``): a request that would take the batch over it ends
            the batch (which is then full, as when rows do not fit); a first request over it alone runs
            alone. None: no budget.
        look_ahead: whether a full batch is taken ahead while every executor is busy (False for a
            batch of window parts: taken ahead, it would run before a short request that arrives
            meanwhile, which is to go first; nothing of it is left to preprocess either).
    """
    if not ordered or oldest_enqueued is None:
        return Plan(0, None)
    picked, full = _pick(ordered, max_batch_size, preferred_batch_sizes, max_batch_tokens)
    due_at = oldest_enqueued + max_queue_delay_seconds
    due = draining or max_queue_delay_seconds <= 0 or now >= due_at
    if arrival_gap is not None and now + arrival_gap >= due_at:
        due = True  # nobody is expected in time to share the batch: waiting only adds latency
    if in_flight < executors:
        if full or due:
            return Plan(len(picked), None, full, tuple(picked))
        return Plan(0, due_at)
    if look_ahead and in_flight < 2 * executors and full:
        return Plan(len(picked), None, full, tuple(picked))
    return Plan(0, None)


def _pick(
    ordered: Sequence[Queued],
    max_batch_size: int,
    preferred_batch_sizes: Sequence[int],
    max_batch_tokens: int | None = None,
) -> tuple[list[int], bool]:
    """The positions of the next batch in ``ordered`` (the head's key, in order, what fits in rows and
    padded tokens; a head larger than either alone) and whether it is full (size, token budget or
    preferred-size trigger)."""
    key = ordered[0].key
    rows = 0
    longest = 0
    picked: list[int] = []
    preferred_take = 0
    blocked = False  # a same-key request did not fit
    for index, item in enumerate(ordered):
        if item.key != key:
            continue
        if rows + item.rows > max_batch_size:
            blocked = True
            break
        padded = (rows + item.rows) * max(longest, item.tokens)
        if max_batch_tokens is not None and picked and padded > max_batch_tokens:
            blocked = True
            break
        longest = max(longest, item.tokens)
        rows += item.rows
        picked.append(index)
        if rows in preferred_batch_sizes:
            preferred_take = len(picked)
    if not picked:  # the first request alone is larger than max_batch_size: it runs alone
        return [0], True
    full = rows >= max_batch_size or blocked
    if not full and preferred_take:
        return picked[:preferred_take], True
    return picked, full


#: Seconds of submissions the arrival-rate estimate of the early dispatch counts (``arrival_gap``).
ARRIVAL_WINDOW_SECONDS = 1.0

#: Longest time from a batch's end to the next submission for that submission to count as a sequential
#: client's follow-up: the answer's encoding and transport, the client's turnaround and the next
#: request's decoding (a front-end hop included; over REST on a busy 2-core machine 2-5 ms); an
#: open-loop client at 10/s lands that close after an answer 10 % of the time.
FOLLOW_UP_SECONDS = 0.01
#: Consecutive follow-ups that make a client sequential (three: an open-loop client at 10/s lands three
#: in a row that close after answers 0.1 % of the time, and a short early dispatch is all it costs).
SEQUENTIAL_STREAK = 3


def head_level(queued_levels: Sequence[int], turns: Mapping[int, float]) -> int:
    """The priority level whose oldest request heads the next batch (pure).

    Args:
        queued_levels: the levels with requests queued, highest priority (smallest number) first.
        turns: the turns each level has earned by waiting (levels absent: none; see ``earn_turns``).

    Returns the highest-priority level with a whole turn earned, else the highest queued level.
    Raises ValueError when ``queued_levels`` is empty.
    """
    if not queued_levels:
        raise ValueError("no level has requests queued")
    for level in queued_levels:
        if turns.get(level, 0.0) >= 1.0:
            return level
    return queued_levels[0]


def earn_turns(
    turns: Mapping[int, float], head: int, waiting_levels: Sequence[int], min_share: float
) -> dict[int, float]:
    """The turns after a batch headed by level ``head`` was taken (pure): ``head`` spends a turn if it
    had one, every other level in ``waiting_levels`` (those still with requests queued) earns
    ``min_share`` of one (at most two held), and a level with nothing queued holds none."""
    after: dict[int, float] = {}
    for level in waiting_levels:
        held = turns.get(level, 0.0)
        if level == head:
            after[level] = max(0.0, held - 1.0)
        else:
            after[level] = min(2.0, held + min_share)
    return after


#: The most batches of a priority level's whole requests taken while a window part of that level waits;
#: then the level's parts head its next batch (``parts_first``). So at most this many batches of short
#: requests (and the batches of higher levels, as priority orders) run between a waiting part and the
#: batch of parts that takes it, or the one before it when more parts wait than a batch holds; a
#: chunked request finishes under any load of short ones, at about 1 / (this + 1) of its level's batches.
WINDOW_PART_MAX_PASSES = 4


def parts_first(whole_queued: bool, passed: int, max_passes: int = WINDOW_PART_MAX_PASSES) -> bool:
    """Whether a priority level's window parts head its next batch rather than its whole requests (pure;
    see "Windows" in the module docstring).

    Args:
        whole_queued: a whole request (not a window part) of the level is queued.
        passed: batches of the level's whole requests taken since its parts last ran, or since the
            first of those waiting was queued.
        max_passes: the bound on ``passed`` (``WINDOW_PART_MAX_PASSES``): a level's parts passed over
            by this many batches go first.

    Returns True when no whole request of the level waits, or its parts were passed over ``max_passes``
    times.
    """
    return not whole_queued or passed >= max_passes


#: The batch key of every window part (``ServableModel.window_parts``): parts share batches with each
#: other only, never with whole requests, whose short rows they would pad to a window's length.
WINDOW_PARTS_KEY = ("window parts",)

#: How far (in multiples of ``max_batch_size + 1`` requests per priority level) the dispatcher looks
#: past requests of other batch keys for ones that share the head's key; bounds the per-dispatch cost.
_KEY_SCAN_WINDOW = 16


class Batcher:
    """Dynamic batcher of one model: the queue and the dispatch, on the event loop. The batches it
    takes run on a ``BatchExecutor`` (``kubeinfer.runtime.executor``), which owns the threads.
    Create and use it on a running event loop.

    Usage::

        batcher = Batcher(model, BatchSettings(...), executors=1, metrics=metrics)
        batcher.start()
        outputs = await batcher.infer({"text": np.array([b"hi"], dtype=object)}, priority=1)
        await batcher.drain()   # stop accepting, finish everything queued and running
        batcher.close()
    """

    def __init__(
        self,
        model: ServableModel,
        settings: BatchSettings,
        *,
        metrics: RuntimeMetrics,
        executors: int = 1,
    ) -> None:
        self.model = model
        self.executors = executors
        self.metrics = metrics
        self._check(settings)
        self._settings = settings
        self._levels: dict[int, dict[int, QueuedRequest]] = {}  # level -> its whole requests, in order
        # level -> its window parts queued (``WINDOW_PARTS_KEY``), in order: below the level's whole
        # requests (see "Windows" in the module docstring)
        self._parts: dict[int, dict[int, QueuedRequest]] = {}
        # level -> batches of its whole requests taken while its parts waited (``parts_first``)
        self._passed: dict[int, int] = {}
        self._turns: dict[int, float] = {}  # level -> turns earned by waiting (``earn_turns``)
        self._arrivals: collections.deque[float] = collections.deque()  # submission times, loop clock
        # consecutive submissions that were a sequential client's follow-ups (nothing else queued or
        # running, within FOLLOW_UP_SECONDS of the last answer), and when the last batch finished
        self._follow_ups = 0
        self._last_answer = -math.inf
        self._judge_early = False  # an arrival or a finished batch since the dispatcher last planned
        self._started_at: float | None = None
        self._queued = 0
        self._in_flight = 0
        self._windowed = 0  # requests run as windows with a part still to come (``_infer_windows``)
        self._closed = False
        self._accepting = True
        self._draining = False
        self._changed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.executor = BatchExecutor(model, executors, metrics)
        self._task: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()
        self._publish_settings()

    # ----- settings -------------------------------------------------------------------------------
    @property
    def settings(self) -> BatchSettings:
        """The settings in force."""
        return self._settings

    def _check(self, s: BatchSettings) -> None:
        warmed = self.model.max_batch_size
        if warmed and s.max_batch_size > warmed:
            raise ValueError(
                f"batching.max_batch_size {s.max_batch_size} is over the warmed maximum {warmed} "
                "(restart with a larger max_batch_size to warm it up)"
            )
        if not 1 <= s.default_priority_level <= s.priority_levels:
            raise ValueError(
                f"batching.default_priority_level {s.default_priority_level} must be within "
                f"1..priority_levels ({s.priority_levels})"
            )

    def update_settings(self, settings: BatchSettings) -> None:
        """Apply new settings at once, without dropping queued or running requests.

        A smaller ``max_queue_size`` keeps the requests already queued and only rejects new ones.
        Raises ``ValueError`` (settings unchanged) if ``max_batch_size`` exceeds the warmed maximum.
        """
        self._check(settings)
        self._settings = settings
        self._publish_settings()
        self._changed.set()

    def _publish_settings(self) -> None:
        self.metrics.max_batch_size.set(self._settings.max_batch_size)
        self.metrics.max_queue_delay.set(self._settings.max_queue_delay_seconds)
        self.metrics.max_queue_size.set(self._settings.max_queue_size)

    # ----- life cycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the dispatcher task on the running loop."""
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._started_at = loop.time()
            self._task = loop.create_task(self._dispatch(), name="kubeinfer-dispatch")

    @property
    def accepting(self) -> bool:
        """False once ``drain`` began."""
        return self._accepting

    @property
    def queued(self) -> int:
        """Requests waiting in the queue."""
        return self._queued

    async def drain(self, timeout: float | None = None) -> bool:
        """Stop accepting (new requests fail with 503), run everything queued at once, and wait until
        nothing is queued or running. Returns False if ``timeout`` seconds passed first."""
        self._accepting = False
        self._draining = True
        self._changed.set()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Stop the dispatcher and the threads (after ``drain``; anything still queued gets 503)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for queue in (self._levels, self._parts):
            for level in queue.values():
                for req in level.values():
                    req.fail(ServingError("server shutting down", 503))
            queue.clear()
        self._queued = 0
        self.executor.close()

    # ----- submission ------------------------------------------------------------------------------
    def priority_level(self, priority: int | None) -> int:
        """The queue level of a request's ``priority`` parameter; raises ``InputError`` (400) if it is
        not an integer in 0..priority_levels."""
        s = self._settings
        if priority is None or priority == 0:
            return s.default_priority_level
        if (
            isinstance(priority, bool)
            or not isinstance(priority, int)
            or not 1 <= priority <= s.priority_levels
        ):
            raise InputError(
                f"parameter 'priority' must be an integer 1..{s.priority_levels} (1 = highest) or 0 for the "
                f"default level {s.default_priority_level}, got {priority!r}"
            )
        return priority

    def check_parameters(self, priority: Any, timeout_us: Any, overflow: Any = None) -> int:
        """The queue level of a request's ``priority``, after checking it, its ``timeout`` and its
        ``overflow`` (``ServableModel.narrow_overflow``). Raises ``InputError`` (400) for any of them
        out of its range (also for a request answered from the cache)."""
        level = self.priority_level(priority)
        _check_timeout(timeout_us)
        self.model.narrow_overflow(overflow)
        return level

    async def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        priority: int | None = None,
        timeout_us: int | None = None,
        overflow: str | None = None,
    ) -> dict[str, np.ndarray]:
        """Queue one request and wait for its outputs (each with this request's rows only).

        Args:
            inputs: tensor name -> array, the first dimension is rows.
            priority: Triton ``priority`` parameter (1 = highest; 0/None = default level).
            timeout_us: Triton ``timeout`` parameter, microseconds the request may wait in the queue
                (0/None: no limit).
            overflow: the ``overflow`` parameter: a text longer than the window gets this policy where
                it narrows the service's (``ServableModel.narrow_overflow``; None: the service's).

        Raises:
            InputError: 400/413 (bad tensors, bad parameters, more rows than the warmed maximum).
            ServingError: 429 queue full, 503 not accepting, 504 timed out while queued, 500 model error.
            asyncio.CancelledError: the calling task was cancelled (its client left); a request still
                queued is removed from the queue first.
        """
        if not self._accepting:
            raise ServingError("server is shutting down; not accepting requests", 503)
        level = self.check_parameters(priority, timeout_us)
        policy = self.model.narrow_overflow(overflow)
        inputs = self.model.with_config_shapes(inputs)
        rows = self._rows(inputs, policy)
        windowed = self.model.window_parts(inputs, self._settings.max_batch_size, policy)
        if windowed is not None:
            return await self._infer_windows(windowed, level, timeout_us)
        self._admit(level)
        (req,) = self._enqueue([(inputs, rows)], level, timeout_us)
        try:
            return await req.future
        except asyncio.CancelledError:  # the client went away: forget the request if still queued
            self._remove(req)
            raise

    async def infer_pieces(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        priority: int | None = None,
        timeout_us: int | None = None,
        overflow: str | None = None,
    ) -> dict[str, np.ndarray]:
        """Queue one request of any number of rows as pieces of at most ``max_batch_size`` rows
        (``split_rows``), admitted all together or not at all, and wait for all of them. Returns the
        outputs as ``infer`` does, the pieces' rows joined in input order (``join_rows``).

        Arguments as ``infer``. Every piece is validated before any is queued; once one piece fails,
        the pieces still queued leave the queue and the request fails with that piece's error.

        Raises:
            InputError: 400/413 as ``infer`` (for the first bad piece); 413 when the request needs
                more pieces than ``max_queue_size`` or its level's ``priority_queue_sizes`` (no queue
                could ever hold it).
            ServingError: 429 when the queue cannot take every piece now (none is queued), 503, 504,
                500 as ``infer``.
        """
        if not self._accepting:
            raise ServingError("server is shutting down; not accepting requests", 503)
        level = self.check_parameters(priority, timeout_us)
        policy = self.model.narrow_overflow(overflow)
        s = self._settings
        pieces = [(piece, self._rows(piece, policy)) for piece in split_rows(inputs, s.max_batch_size)]
        windowed = self.model.window_parts(inputs, s.max_batch_size, policy)
        if windowed is not None:  # its windows queue one part at a time: one place in the queue
            return await self._infer_windows(windowed, level, timeout_us)
        level_limit = s.priority_queue_sizes.get(level, s.max_queue_size)
        holds, limit = min(
            (s.max_queue_size, "max_queue_size"), (level_limit, f"priority_queue_sizes[{level}]")
        )
        if len(pieces) > holds:  # no wait makes room: a 429 would be retried for ever
            raise InputError(
                f"request has {sum(rows for _, rows in pieces)} rows, {len(pieces)} batches of "
                f"{s.max_batch_size} rows, more than the queue holds ({limit} {holds}); split it into "
                "smaller requests",
                413,
                tensor=self.model.inputs[0].name if self.model.inputs else None,
            )
        self._admit(level, len(pieces))
        reqs = self._enqueue(pieces, level, timeout_us)
        futures = [req.future for req in reqs]
        for future in futures:  # a piece that fails after the request failed: its error is no news
            future.add_done_callback(_consume)
        try:
            await asyncio.wait(futures, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:  # the client went away: forget the pieces still queued
            for req in reqs:
                self._remove(req)
            raise
        failed = next((f.exception() for f in futures if f.done() and f.exception() is not None), None)
        if failed is not None:  # no work for a request that has its outcome
            for req in reqs:
                self._remove(req)
            raise failed
        return join_rows([f.result() for f in futures])

    async def _infer_windows(
        self, windowed: WindowParts, level: int, timeout_us: int | None
    ) -> dict[str, np.ndarray]:
        """Run a request as its window parts (``ServableModel.window_parts``), one queued at a time, each
        below the whole requests of its level, so short requests' batches go first (see "Windows" in
        the module docstring). Returns ``windowed.merge`` of the parts' outputs.

        Raises what ``infer`` raises: 429 (no place for its first part), 504 (``timeout_us`` passed
        before its first part started), a failed part's error (its later parts never queue), 500 when
        the merge fails; ``asyncio.CancelledError`` with its queued part removed."""
        self._admit(level)
        self._windowed += 1
        outputs: list[Mapping[str, np.ndarray]] = []
        try:
            submitted = 0.0
            for index, (part, rows, tokens) in enumerate(
                zip(windowed.parts, windowed.rows, windowed.tokens, strict=True)
            ):
                if index == 0:
                    (req,) = self._enqueue([(part, rows)], level, timeout_us, tokens=tokens, parts=True)
                    submitted = req.enqueued
                else:
                    req = self._queue_part(part, rows, tokens, level, submitted)
                try:
                    outputs.append(await req.future)
                except asyncio.CancelledError:  # the client went away: no further part queues
                    self._remove(req)
                    raise
        finally:
            self._windowed -= 1
            self._check_idle()
        try:
            return windowed.merge(outputs)
        except Exception as exc:
            log.warning("merging the windows of a request failed: %s: %s", type(exc).__name__, exc)
            why = f"{type(exc).__name__}: {exc}"
            raise ServingError(
                f"model '{self.model.name}' failed merging this request's windows: {why}", 500
            ) from exc

    def _queue_part(
        self, inputs: Mapping[str, np.ndarray], rows: int, tokens: int, level: int, submitted: float
    ) -> QueuedRequest:
        """Queue a later part of a request run as windows at the end of ``level``'s parts (below its
        whole requests; see "Windows" in the module docstring): not an arrival (the arrival estimate and
        the admission counted its request once), no queue timeout (its request started), its request's
        submission time ``submitted`` as its own (it is due at once). Raises ``ServingError`` 503 once
        ``close`` ran (no dispatcher would take it)."""
        if self._closed:
            raise ServingError("server shutting down", 503)
        loop = asyncio.get_running_loop()
        req = QueuedRequest(
            inputs=inputs,
            rows=rows,
            level=level,
            enqueued=submitted,
            future=loop.create_future(),
            key=WINDOW_PARTS_KEY,
            tokens=tokens,
            queue_time=False,
        )
        self._place(req)
        self._queued += 1
        self._idle.clear()
        self._judge_early = True
        self._publish_queue()
        self._changed.set()
        return req

    def _enqueue(
        self,
        pieces: Sequence[tuple[Mapping[str, np.ndarray], int]],
        level: int,
        timeout_us: int | None,
        tokens: int | None = None,
        parts: bool = False,
    ) -> list[QueuedRequest]:
        """Queue ``pieces`` ((inputs, rows) each, admitted already) at ``level``, as one request whose
        queue time counts once (``QueuedRequest.group``). ``tokens``: each piece's padded tokens when
        known (None: ``ServableModel.tokens`` of its inputs). ``parts``: window parts
        (``WINDOW_PARTS_KEY``). Returns them in order."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        follow_up = not self._queued and not self._in_flight and now - self._last_answer <= FOLLOW_UP_SECONDS
        self._follow_ups = self._follow_ups + 1 if follow_up else 0
        self._arrivals.append(now)
        self._judge_early = True
        group = RequestGroup(len(pieces)) if len(pieces) > 1 else None
        reqs = []
        for inputs, rows in pieces:
            req = QueuedRequest(
                inputs=inputs,
                rows=rows,
                level=level,
                enqueued=now,
                future=loop.create_future(),
                key=WINDOW_PARTS_KEY if parts else self.model.batch_key(inputs),
                tokens=self.model.tokens(inputs) if tokens is None else tokens,
                group=group,
            )
            if timeout_us:  # 0 = no timeout (Triton)
                req.timer = loop.call_at(req.enqueued + timeout_us / 1e6, self._expire, req)
            self._place(req)
            reqs.append(req)
        self._queued += len(reqs)
        self._idle.clear()
        self._publish_queue()
        self._changed.set()
        return reqs

    def _place(self, req: QueuedRequest) -> None:
        """Put ``req`` at the end of its level's queue: a window part (``WINDOW_PARTS_KEY``) in the
        level's parts, below its whole requests; the first part to wait there has been passed over by
        none of them yet."""
        if req.key == WINDOW_PARTS_KEY:
            parts = self._parts.setdefault(req.level, {})
            if not parts:
                self._passed[req.level] = 0
            parts[req.seq] = req
        else:
            self._levels.setdefault(req.level, {})[req.seq] = req

    def _rows(self, inputs: Mapping[str, np.ndarray], overflow: str | None = None) -> int:
        """The request's rows (``model.validate``, ``overflow`` its narrowed policy); 413 beyond the
        warmed maximum batch."""
        truncated, chunked = self.model.truncated_rows, self.model.chunked_rows
        rows = self.model.validate(inputs, overflow)
        if self.model.truncated_rows != truncated:
            self.metrics.truncated_rows.inc(self.model.truncated_rows - truncated)
        if self.model.chunked_rows != chunked:
            self.metrics.chunked_rows.inc(self.model.chunked_rows - chunked)
        warmed = self.model.max_batch_size or self._settings.max_batch_size
        if rows > warmed:
            raise InputError(
                f"request has {rows} rows, over the largest batch this server runs ({warmed} rows); "
                "split it into smaller requests",
                413,
                tensor=self.model.inputs[0].name if self.model.inputs else None,
            )
        return rows

    def _admit(self, level: int, count: int = 1) -> None:
        """Make room for ``count`` queued requests (the pieces of one request) arriving at ``level``, or
        refuse them all (see "Load shedding" in the module docstring): room is made only when there is
        room for every one, by displacing the newest requests of the lowest levels below ``level``.
        Raises ``ServingError`` 429 with ``Retry-After`` when they are refused (nothing displaced)."""
        s = self._settings
        queued_here = len(self._levels.get(level, ())) + len(self._parts.get(level, ()))
        level_limit = s.priority_queue_sizes.get(level)
        if level_limit is not None and queued_here + count > level_limit:
            self._shed(level, "refused")
            raise self._queue_full(
                f"{queued_here} requests queued at priority {level}, limit {level_limit}"
                + (f"; this one needs {count} places" if count > 1 else "")
            )
        # never more than the places it takes: the queue may hold more than max_queue_size (a chunked
        # request's later window queues without admission, a smaller max_queue_size keeps what is
        # queued), and one arrival does not shed the requests admitted before it down to the size
        over = min(self._queued + count - s.max_queue_size, count)
        if over <= 0:
            return
        # the newest whole requests of the lowest level first, then its window parts (a part's
        # request may have run windows already, work that displacing it would waste)
        victims: list[QueuedRequest] = []
        below = {lv for lv, reqs in itertools.chain(self._levels.items(), self._parts.items()) if reqs}
        for lowest in sorted((lv for lv in below if lv > level), reverse=True):
            newest = itertools.chain(
                reversed(self._levels.get(lowest, {}).values()),
                reversed(self._parts.get(lowest, {}).values()),
            )
            victims.extend(itertools.islice(newest, over - len(victims)))
            if len(victims) == over:
                break
        if len(victims) < over:
            self._shed(level, "refused")
            raise self._queue_full(
                f"{self._queued} requests queued, max_queue_size {s.max_queue_size}"
                + (f"; this one needs {count} places" if count > 1 else "")
            )
        shed_groups: set[int] = set()  # a displaced request in pieces counts once
        for victim in victims:
            self._remove(victim)
            if victim.group is None or id(victim.group) not in shed_groups:
                self._shed(victim.level, "displaced")
                if victim.group is not None:
                    shed_groups.add(id(victim.group))
            victim.fail(self._queue_full(f"displaced by a request of priority {level}"))

    def _queue_full(self, why: str) -> ServingError:
        retry = max(1, math.ceil(self._settings.max_queue_delay_seconds + 0.5))
        return ServingError(f"queue full ({why}); retry later", 429, {"Retry-After": str(retry)})

    def _shed(self, level: int, reason: str) -> None:
        self.metrics.shed_requests.labels(self.metrics.model, str(level), reason).inc()

    def _remove(self, req: QueuedRequest) -> bool:
        level = (self._parts if req.key == WINDOW_PARTS_KEY else self._levels).get(req.level)
        if level is None or level.pop(req.seq, None) is None:
            return False
        if req.timer is not None:
            req.timer.cancel()
        self._queued -= 1
        self._publish_queue()
        self._check_idle()
        return True

    def _expire(self, req: QueuedRequest) -> None:
        # queued, or taken into a batch that waits for an executor (its timer is cancelled when the
        # batch starts executing)
        if self._remove(req) or req.taken:
            waited = asyncio.get_running_loop().time() - req.enqueued
            req.fail(
                ServingError(
                    f"request timed out after {waited * 1e3:.1f} ms in the queue (timeout parameter)", 504
                )
            )
            self._changed.set()

    def _publish_queue(self) -> None:
        self.metrics.queue_size.set(self._queued)

    def _check_idle(self) -> None:
        if self._queued == 0 and self._in_flight == 0 and self._windowed == 0:
            self._idle.set()

    # ----- dispatch --------------------------------------------------------------------------------
    def _ordered(self) -> tuple[list[QueuedRequest], float | None]:
        """The candidates of the next batch in service order: the head request and, per level, the
        requests of the head's batch key (at most ``max_batch_size + 1`` per level, found within a
        window of ``_KEY_SCAN_WINDOW`` times that many) among the level's whole requests, or among its
        window parts where those go first (``parts_first``); and the oldest queued request's enqueue
        time (window parts included: while a part waits, the next batch is due at once)."""
        ordered: list[QueuedRequest] = []
        oldest: float | None = None
        limit = self._settings.max_batch_size + 1
        head_key: Hashable = None
        have_head = False
        levels = sorted(
            {level for level, reqs in self._levels.items() if reqs}
            | {level for level, reqs in self._parts.items() if reqs}
        )
        if len(levels) > 1 and self._turns:
            first = head_level(levels, self._turns)
            levels.remove(first)
            levels.insert(0, first)
        for level in levels:
            whole = self._levels.get(level) or {}
            parts = self._parts.get(level) or {}
            for queue in (whole, parts):
                if queue:
                    enqueued = next(iter(queue.values())).enqueued
                    oldest = enqueued if oldest is None else min(oldest, enqueued)
            reqs = parts if parts and parts_first(bool(whole), self._passed.get(level, 0)) else whole
            if not have_head:
                head_key, have_head = next(iter(reqs.values())).key, True
            found = 0
            for req in itertools.islice(reqs.values(), limit * _KEY_SCAN_WINDOW):
                if req.key == head_key:
                    ordered.append(req)
                    found += 1
                    if found >= limit:
                        break
        return ordered, oldest

    async def _dispatch(self) -> None:
        while True:
            try:
                await self._dispatch_loop()
            except asyncio.CancelledError:
                raise
            except Exception:  # a dead dispatcher would leave every request unanswered
                log.exception("batch dispatcher failed; restarting it")
                await asyncio.sleep(0.01)

    def arrival_gap(self, now: float) -> float | None:
        """The expected time (seconds) from ``now`` (event-loop time) to the next arrival: the mean gap
        between the submissions of the last ``ARRIVAL_WINDOW_SECONDS`` (the whole window when there
        was at most one); ``math.inf`` when the last ``SEQUENTIAL_STREAK`` submissions were a
        sequential client's follow-ups (see the module docstring: its next request waits for this
        answer; known from the start). Otherwise None (unknown) until the dispatcher has run for a
        whole window."""
        arrivals = self._arrivals
        while arrivals and arrivals[0] < now - ARRIVAL_WINDOW_SECONDS:
            arrivals.popleft()
        if self._follow_ups >= SEQUENTIAL_STREAK:
            return math.inf
        if self._started_at is None or now - self._started_at < ARRIVAL_WINDOW_SECONDS:
            return None
        return ARRIVAL_WINDOW_SECONDS / max(1, len(arrivals))

    async def _dispatch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # early dispatch is judged when a request arrives or a batch finishes, not as time passes
            early, self._judge_early = self._judge_early, False
            self._changed.clear()
            ordered, oldest = self._ordered()
            s = self._settings
            now = loop.time()
            plan = plan_batch(
                ordered,
                oldest,
                max_batch_size=s.max_batch_size,
                max_queue_delay_seconds=s.max_queue_delay_seconds,
                now=now,
                in_flight=self._in_flight,
                executors=self.executors,
                draining=self._draining,
                preferred_batch_sizes=s.preferred_batch_sizes,
                arrival_gap=self.arrival_gap(now) if early else None,
                max_batch_tokens=s.max_batch_tokens,
                look_ahead=bool(ordered) and ordered[0].key != WINDOW_PARTS_KEY,
            )
            if plan.take:
                self._take([ordered[i] for i in plan.picked])
                continue
            timeout = None if plan.wake_at is None else max(0.0, plan.wake_at - loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    def _take(self, batch: list[QueuedRequest]) -> None:
        """Take ``batch`` out of the queue and hand it to the executor; the levels it leaves waiting
        earn turns (``earn_turns``)."""
        for req in batch:
            (self._parts if req.key == WINDOW_PARTS_KEY else self._levels)[req.level].pop(req.seq)
            req.taken = True
        # a batch of parts resets its levels' count of passes; one of whole requests adds one to
        # each of its levels whose parts it leaves waiting (``parts_first``)
        of_parts = batch[0].key == WINDOW_PARTS_KEY
        for level in {req.level for req in batch}:
            if of_parts:
                self._passed[level] = 0
            elif self._parts.get(level):
                self._passed[level] = self._passed.get(level, 0) + 1
        share = self._settings.priority_min_share
        if share > 0 and (self._turns or len(self._levels.keys() | self._parts.keys()) > 1):
            waiting = sorted(
                {level for level, reqs in self._levels.items() if reqs}
                | {level for level, reqs in self._parts.items() if reqs}
            )
            self._turns = earn_turns(self._turns, batch[0].level, waiting, share)
        self._queued -= len(batch)
        self._in_flight += 1
        self._publish_queue()
        task = asyncio.get_running_loop().create_task(self._run_batch(batch))
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    async def _run_batch(self, batch: list[QueuedRequest]) -> None:
        try:
            await self.executor.run(batch)
        finally:
            self._in_flight -= 1
            self._last_answer = asyncio.get_running_loop().time()
            self._check_idle()
            self._judge_early = True
            self._changed.set()


def split_rows(inputs: Mapping[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
    """``inputs`` (name -> array, rows first, every array as many rows) cut into pieces of at most
    ``size`` rows (the last one shorter), in order; views, not copies. One piece when it has at most
    ``size`` rows (or no rows)."""
    total = len(next(iter(inputs.values()))) if inputs else 0
    if total <= size:
        return [dict(inputs)]
    return [
        {name: array[start : start + size] for name, array in inputs.items()}
        for start in range(0, total, size)
    ]


def join_rows(outputs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The outputs of the pieces of one request (``split_rows``; each name -> array, rows first) as one:
    each output's rows concatenated in piece order."""
    if len(outputs) == 1:
        return dict(outputs[0])
    return {name: np.concatenate([out[name] for out in outputs]) for name in outputs[0]}


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve a finished future's exception (asyncio logs the ones never retrieved)."""
    if not future.cancelled():
        future.exception()


def _check_timeout(timeout_us: object) -> None:
    """Raise ``InputError`` (400) unless the ``timeout`` parameter is None or an integer 0..2^64-1."""
    if timeout_us is not None and (
        isinstance(timeout_us, bool)
        or not isinstance(timeout_us, int)
        or not 0 <= timeout_us <= 2**64 - 1  # Triton's uint64; far larger ints overflow a float
    ):
        raise InputError(
            "parameter 'timeout' must be a non-negative integer (microseconds) below 2^64, "
            f"got {timeout_us!r:.40}"
        )
