"""The activator's Gate over the hold (activator/gate.py): each target's own cold-start budget."""

from __future__ import annotations

import asyncio

from kubeinfer.activator.gate import Gate
from kubeinfer.activator.targets import InMemoryTargets, TargetState

from kubeinfer.shared.hold import HoldLimits, HoldTimeout


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def settle() -> None:
    """Let every task that can run, run."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_targets_own_budget_replaces_the_holds_default_both_ways() -> None:
    """The Gate holds each request for its InferenceService's ``coldStartTimeout`` (longer or shorter
    than the activator's default), and the request's own timeout still cuts it shorter."""
    clock = FakeClock()
    table = InMemoryTargets()
    table.put(TargetState("slow", "ml", cold_start_timeout_s=30.0))
    table.put(TargetState("quick", "ml", cold_start_timeout_s=2.0))
    table.put(TargetState("default", "ml"))
    gate = Gate(table, HoldLimits(cold_start_timeout_s=10.0), clock=clock)
    names = ("ml/slow", "ml/quick", "ml/default")
    waiters = {n: asyncio.create_task(gate.endpoint(n, nbytes=1)) for n in names}
    own = asyncio.create_task(gate.endpoint("ml/slow", nbytes=1, timeout_s=5.0))
    await settle()
    failed_at: dict[str, float] = {}
    for now in (1.0, 2.0, 5.0, 10.0, 29.0, 30.0):
        clock.now = now
        gate.hold.expire()
        await settle()
        for n, task in [*waiters.items(), ("own timeout", own)]:
            if task.done() and n not in failed_at:
                assert isinstance(task.exception(), HoldTimeout)
                failed_at[n] = now
    assert failed_at == {"ml/quick": 2.0, "own timeout": 5.0, "ml/default": 10.0, "ml/slow": 30.0}
