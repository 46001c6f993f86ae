"""The policy's decisions on short traces, pinned by digest: a change to any rule shows up here.

``decide`` is run in the loop of the benchmark's simulator (bench/autoscaler_sim.py, seed 0) over the
first 900 s of three of the project's traces, which together reach the SLO-capacity rule, the surge
prior and the step floor, the burst headroom (compressed_day), the level hold (cron_jobs), the
cold-start timeout, a covered demand and a drained backlog (flash_crowd), and of flash_crowd with the
reactive law alone (the P99 and utilization rules, the AIMD max queue delay, the scale-up holds). Each
tick's replicas, max queue delay and kind of hold make one digest, the reasons another: a change of
words alone shows as the second only.

When a change to the policy is meant to change decisions, run the benchmark
(``make bench-autoscaler``), say what moved and why, and pin the new digests printed by the failure.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest

from tests.support.bench import load_bench

sim = load_bench("autoscaler_sim")

HORIZON = 900
#: (trace, controller) → (ticks, digest of (t, replicas, max queue delay, hold), digest of the reasons).
PINNED: dict[tuple[str, str], tuple[int, str, str]] = {
    ("compressed_day", "kubeinfer"): (59, "bf1f8a3936d7f21c", "a2abf04b14dfb9b6"),
    ("cron_jobs", "kubeinfer"): (59, "fa9f403bfbab2a4d", "b4c71f5380d28705"),
    ("flash_crowd", "kubeinfer"): (59, "0a13012aece01a19", "f7f0e9992151d0fe"),
    ("flash_crowd", "kubeinfer_reactive"): (59, "5d737f216da0c4df", "a7947773f2fdab65"),
}


def decisions(trace_name: str, controller: str, monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """Every decision of ``controller`` (``kubeinfer`` or a variant) over the trace's first ``HORIZON``
    seconds, as ``[t, replicas, max queue delay, hold, reason]``."""
    a, c, batch, _ = sim.load_service_model(sim.TRACES_DIR / sim.SERVICE_MODEL_FILE)
    cfg = sim.SimConfig(a=a, c=c, max_batch=batch or 32, horizon=float(HORIZON))
    trace = sim.read_trace(sim.TRACES_DIR / f"{trace_name}.csv")
    trace = replace(trace, rates=trace.rates[:HORIZON])
    arrivals, high, start_n = sim._seed_inputs(trace, cfg, 0)
    seen: list[list[Any]] = []
    real = sim.decide

    def spy(*args: Any) -> Any:
        d = real(*args)
        seen.append([args[-1], d.replicas, f"{d.max_queue_delay_seconds:.9g}", d.hold, d.reason])
        return d

    monkeypatch.setattr(sim, "decide", spy)
    sim.Simulator(cfg, arrivals, start_n, high=high).run(sim.controller_for(controller, cfg, trace.rates))
    return seen


def digest(rows: list[list[Any]]) -> str:
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    ("trace", "controller"),
    [
        ("compressed_day", "kubeinfer"),
        ("cron_jobs", "kubeinfer"),
        ("flash_crowd", "kubeinfer"),
        ("flash_crowd", "kubeinfer_reactive"),
    ],
)
def test_policy_decisions_are_pinned(trace: str, controller: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = decisions(trace, controller, monkeypatch)
    got = (len(rows), digest([r[:4] for r in rows]), digest([r[4] for r in rows]))
    assert got == PINNED[(trace, controller)], (
        f"the policy's decisions on {trace} ({controller}) changed: pin {got} if that is meant "
        f"(the first ticks: {rows[:3]})"
    )
