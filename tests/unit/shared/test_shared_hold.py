"""The hold (kubeinfer/shared/hold.py), driven by traces of events against a fake clock.

A trace is a list of events: ``arrive`` (a request is held, or refused), ``tick`` (the clock moves and
``expire`` runs), ``ready`` (the target turns ready and ``notify`` runs), ``leave`` (the client goes: its
waiter is cancelled). Each request ends in one outcome: ``released`` (with its place in the release
order), ``overflow:<reason>``, ``timeout`` (with the stage named), ``left``, or ``at-once`` (ready on
arrival).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubeinfer.shared.hold import (
    Held,
    Hold,
    HoldError,
    HoldLimits,
    HoldTimeout,
    Overflow,
    priority_level,
    retry_after_header,
    seconds_from_us,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    """A hold over fake targets: ``ready`` keys, ``stages``, the ``demands`` it made, in order."""

    limits: HoldLimits
    clock: FakeClock = field(default_factory=FakeClock)
    ready: set[str] = field(default_factory=set)
    stages: dict[str, str] = field(default_factory=dict)
    demands: list[str] = field(default_factory=list)
    hold: Hold[str] = field(init=False)

    def __post_init__(self) -> None:
        self.hold = Hold(
            self.limits,
            ready=lambda k: k in self.ready,
            demand=self.demands.append,
            stage=lambda k: self.stages.get(k, "pending"),
            clock=self.clock,
        )


async def settle() -> None:
    """Let every task that can run, run."""
    for _ in range(5):
        await asyncio.sleep(0)


@dataclass
class Player:
    """Plays a trace against a ``World``, recording each request's outcome."""

    world: World
    outcomes: dict[str, str] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)
    ready_on_arrival: set[str] = field(default_factory=set)

    async def request(
        self, rid: str, key: str, nbytes: int, priority: object, timeout_s: float | None
    ) -> None:
        try:
            waited = await self.world.hold.wait(key, nbytes=nbytes, priority=priority, timeout_s=timeout_s)
        except Overflow as exc:
            self.outcomes[rid] = f"overflow:{exc.reason}"
        except HoldTimeout as exc:
            assert exc.stage in exc.message
            self.outcomes[rid] = f"timeout@{self.world.clock.now:g}:{exc.stage}"
        except asyncio.CancelledError:
            self.outcomes[rid] = "left"
            raise
        else:
            if rid in self.ready_on_arrival:
                assert waited == 0.0
                self.outcomes[rid] = "at-once"
            else:
                self.outcomes[rid] = f"released#{len(self.released)}"
                self.released.append(rid)

    def play(self, kind: str, *args: Any) -> None:
        world = self.world
        if kind == "arrive":
            rid, key = args[0], args[1]
            if key in world.ready:
                self.ready_on_arrival.add(rid)
            self.tasks[rid] = asyncio.create_task(self.request(*args))
        elif kind == "tick":
            world.clock.now += args[0]
            world.hold.expire()
        elif kind == "ready":
            world.ready.add(args[0])
            world.hold.notify(args[0])
        elif kind == "stage":
            world.stages[args[0]] = args[1]
        elif kind == "leave":
            self.tasks[args[0]].cancel()


async def run_trace(world: World, trace: list[tuple[Any, ...]]) -> dict[str, str]:
    """Play ``trace``; returns each request's outcome."""
    player = Player(world)
    for event in trace:
        player.play(*event)
        await settle()
    for task in player.tasks.values():
        assert task.done(), "a request neither released, refused, timed out nor left"
    return player.outcomes


LIMITS = HoldLimits(max_requests=3, max_bytes=100, cold_start_timeout_s=10.0)

CASES: list[tuple[str, HoldLimits, list[tuple[Any, ...]], dict[str, str], list[str]]] = [
    (
        "the count bound refuses exactly the excess; the rest are released in arrival order",
        LIMITS,
        [
            ("arrive", "a", "svc", 1, None, None),
            ("arrive", "b", "svc", 1, None, None),
            ("arrive", "c", "svc", 1, None, None),
            ("arrive", "d", "svc", 1, None, None),
            ("arrive", "e", "svc", 1, None, None),
            ("ready", "svc"),
        ],
        {
            "a": "released#0",
            "b": "released#1",
            "c": "released#2",
            "d": "overflow:requests",
            "e": "overflow:requests",
        },
        ["svc"],
    ),
    (
        "the byte bound: a request that would exceed it is refused, a smaller one after it still fits",
        LIMITS,
        [
            ("arrive", "a", "svc", 60, None, None),
            ("arrive", "b", "svc", 50, None, None),
            ("arrive", "c", "svc", 40, None, None),
            ("arrive", "huge", "other", 101, None, None),
            ("ready", "svc"),
        ],
        {"a": "released#0", "b": "overflow:bytes", "c": "released#1", "huge": "overflow:bytes"},
        ["svc"],
    ),
    (
        "bounds are per target",
        LIMITS,
        [
            *[("arrive", f"s{i}", "svc", 1, None, None) for i in range(3)],
            *[("arrive", f"o{i}", "other", 1, None, None) for i in range(3)],
            ("ready", "other"),
            ("ready", "svc"),
        ],
        {**{f"o{i}": f"released#{i}" for i in range(3)}, **{f"s{i}": f"released#{3 + i}" for i in range(3)}},
        ["svc", "other"],
    ),
    (
        "release by priority level (1 highest; 0 and none are the default level 2), then arrival",
        HoldLimits(max_requests=10, max_bytes=100, cold_start_timeout_s=10.0),
        [
            ("arrive", "a", "svc", 1, 0, None),
            ("arrive", "b", "svc", 1, 1, None),
            ("arrive", "c", "svc", 1, 2, None),
            ("arrive", "d", "svc", 1, 1, None),
            ("arrive", "e", "svc", 1, None, None),
            ("arrive", "f", "svc", 1, 3, None),
            (
                "arrive",
                "g",
                "svc",
                1,
                "high",
                None,
            ),  # not an integer: the default level (the runtime says 400)
            ("ready", "svc"),
        ],
        {
            "b": "released#0",
            "d": "released#1",
            "a": "released#2",
            "c": "released#3",
            "e": "released#4",
            "g": "released#5",
            "f": "released#6",
        },
        ["svc"],
    ),
    (
        "a deadline is the smaller of the request's timeout and the cold-start budget; it names the stage",
        LIMITS,
        [
            ("stage", "svc", "Unschedulable: 0/1 nodes are available"),
            ("arrive", "short", "svc", 1, None, 2.0),
            ("arrive", "none", "svc", 1, None, None),
            ("arrive", "long", "svc", 1, None, 20.0),
            ("tick", 1.9),
            ("tick", 0.1),
            ("stage", "svc", "loading model"),
            ("tick", 7.9),
            ("tick", 0.1),
        ],
        {
            "short": "timeout@2:Unschedulable: 0/1 nodes are available",
            "none": "timeout@10:loading model",
            "long": "timeout@10:loading model",
        },
        ["svc"],
    ),
    (
        "a timeout of 0 is no timeout (Triton's convention): the cold-start budget applies",
        LIMITS,
        [("arrive", "a", "svc", 1, None, 0), ("tick", 9.99), ("ready", "svc")],
        {"a": "released#0"},
        ["svc"],
    ),
    (
        "a client that leaves frees its place: the next arrival fits, the others are still released",
        LIMITS,
        [
            ("arrive", "a", "svc", 1, None, None),
            ("arrive", "b", "svc", 1, None, None),
            ("arrive", "c", "svc", 1, None, None),
            ("leave", "b"),
            ("arrive", "d", "svc", 1, None, None),
            ("ready", "svc"),
        ],
        {"a": "released#0", "b": "left", "c": "released#1", "d": "released#2"},
        ["svc"],
    ),
    (
        "demand once per quiet spell: again only after the queue emptied (here by timeouts)",
        LIMITS,
        [
            ("arrive", "a", "svc", 1, None, 1.0),
            ("arrive", "b", "svc", 1, None, 1.0),
            ("tick", 1.0),
            ("arrive", "c", "svc", 1, None, None),
            ("ready", "svc"),
        ],
        {"a": "timeout@1:pending", "b": "timeout@1:pending", "c": "released#0"},
        ["svc", "svc"],
    ),
    (
        "a ready target: no hold, no demand, no bound",
        HoldLimits(max_requests=1, max_bytes=1, cold_start_timeout_s=10.0),
        [
            ("ready", "svc"),
            ("arrive", "a", "svc", 1000, None, None),
            ("arrive", "b", "svc", 1000, None, None),
        ],
        {"a": "at-once", "b": "at-once"},
        [],
    ),
]


@pytest.mark.parametrize(
    ("limits", "trace", "outcomes", "demands"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_trace(
    limits: HoldLimits, trace: list[tuple[Any, ...]], outcomes: dict[str, str], demands: list[str]
) -> None:
    world = World(limits)
    assert await run_trace(world, trace) == outcomes
    assert world.demands == demands
    assert world.hold.targets() == [] or all(world.hold.held(k).requests for k in world.hold.targets())


async def test_held_counts_requests_and_bytes_and_frees_them_on_release() -> None:
    world = World(LIMITS)
    waiters = [asyncio.create_task(world.hold.wait("svc", nbytes=n)) for n in (10, 20)]
    await settle()
    assert world.hold.held("svc").requests == 2 and world.hold.held("svc").nbytes == 30
    assert world.hold.next_deadline() == 10.0
    assert world.hold.notify("svc") == 0  # not ready yet: nothing released
    world.clock.now = 4.0
    world.ready.add("svc")
    assert world.hold.notify("svc") == 2
    assert await asyncio.gather(*waiters) == [4.0, 4.0]  # seconds held
    assert world.hold.held("svc").requests == 0 and world.hold.next_deadline() is None


async def test_run_deadlines_expires_on_time_with_the_real_clock() -> None:
    hold: Hold[str] = Hold(
        HoldLimits(cold_start_timeout_s=0.05),
        ready=lambda k: False,
        demand=lambda k: None,
        stage=lambda k: "pulling",
    )
    ticker = asyncio.create_task(hold.run_deadlines())
    try:
        with pytest.raises(HoldTimeout, match="stage: pulling"):
            await asyncio.wait_for(hold.wait("svc", timeout_s=10.0), timeout=5.0)
        # an arrival with an earlier deadline than the one the ticker sleeps for wakes it
        late = asyncio.create_task(hold.wait("svc", timeout_s=None))
        await settle()
        with pytest.raises(HoldTimeout):
            await asyncio.wait_for(hold.wait("other", timeout_s=0.01), timeout=5.0)
        with pytest.raises(HoldTimeout):
            await asyncio.wait_for(late, timeout=5.0)
    finally:
        ticker.cancel()


@pytest.mark.parametrize(
    ("priority", "level"),
    [(1, 1), (2, 2), (3, 3), (0, 2), (None, 2), (-1, 2), (True, 2), ("1", 2), (1.0, 2)],
)
def test_priority_level(priority: object, level: int) -> None:
    assert priority_level(priority, 2) == level


@pytest.mark.parametrize(
    ("timeout_us", "seconds"),
    [(1_500_000, 1.5), (1, 1e-6), (0, None), (None, None), (-5, None), (True, None), ("100", None)],
)
def test_seconds_from_us(timeout_us: object, seconds: float | None) -> None:
    assert seconds_from_us(timeout_us) == seconds


@pytest.mark.parametrize(("seconds", "header"), [(0.0, "1"), (0.2, "1"), (1.0, "1"), (1.5, "2"), (30, "30")])
def test_retry_after_header(seconds: float, header: str) -> None:
    assert retry_after_header(seconds) == header


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_requests": 0},
        {"max_bytes": 0},
        {"cold_start_timeout_s": 0},
        {"retry_after_s": -1},
        {"default_priority_level": 0},
    ],
)
def test_limits_refuse_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        HoldLimits(**kwargs)


async def test_fail_ends_every_held_request_with_the_error_and_the_next_arrival_demands_again() -> None:
    world = World(HoldLimits())
    waiters = [asyncio.create_task(world.hold.wait("m", nbytes=10)) for _ in range(3)]
    await settle()
    assert world.demands == ["m"] and world.hold.held("m") == Held(3, 30)
    assert world.hold.fail("m", HoldError("m: failed to load: bad file")) == 3
    await settle()
    assert [str(w.exception()) for w in waiters] == ["m: failed to load: bad file"] * 3
    assert world.hold.held("m") == Held(0, 0) and world.hold.fail("m", HoldError("x")) == 0
    again = asyncio.create_task(world.hold.wait("m"))
    await settle()
    assert world.demands == ["m", "m"]
    world.ready.add("m")
    world.hold.notify("m")
    assert await again >= 0.0
