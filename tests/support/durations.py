"""A pytest plugin that prints the time of each tier of the suite (unit, integration, e2e) at the end
of a run, so the suite's budget is in plain sight after every ``make test``.

A tier is the first folder under ``tests/`` of a test's path. For each tier the summary gives:

- ``wall``: seconds from the start of its first test to the end of its last one (in one pytest run the
  tiers run one after the other, in path order, so the walls add up to the run's time less collection;
  on pytest-xdist workers a file at a time, the last files of one tier overlap the first of the next;
  ``make test`` runs each tier as a pytest of its own, the integration tier beside the e2e tier);
- ``tests``: the number of tests that ran, with their outcomes;
- ``setup``/``call``/``teardown``: seconds summed over its tests per phase (session- and module-scoped
  fixtures are paid in the setup of the first test that uses them and the teardown of the last; on
  several workers the sums exceed the wall);
- its ``SLOWEST_MODULES`` slowest test files, each with the seconds of its tests' three phases: where
  to look first when the tier is over its budget.

One line per tier, then the budget the tier has (``TIER_BUDGET_SECONDS``) and whether the wall is
within it; nothing fails on it: the budget is watched by people and CI's limit, not by a flaky test.
The slowest tests themselves are pytest's own ``--durations=N`` (the Makefile passes it).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import PurePath

import pytest

#: Seconds each tier may take on a warm, quiet 2-core machine (docs/development.md, "Durations").
TIER_BUDGET_SECONDS: dict[str, float] = {"unit": 180.0, "integration": 720.0, "e2e": 720.0}
#: Seconds the whole of ``make test`` may take on that machine.
SUITE_BUDGET_SECONDS = 1800.0
#: How many of a tier's slowest test files its summary names.
SLOWEST_MODULES = 5


@dataclass
class Tier:
    """What one tier cost: wall seconds (first start to last finish) and seconds per phase."""

    first_start: float | None = None
    last_finish: float | None = None
    phases: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    modules: Counter[str] = field(default_factory=Counter)

    @property
    def wall(self) -> float:
        """Seconds from the first test's start to the last test's end (0.0 before any test)."""
        if self.first_start is None or self.last_finish is None:
            return 0.0
        return self.last_finish - self.first_start


def tier_of(nodeid: str) -> str:
    """The tier of a test id: the folder under ``tests/`` (``tests/unit/x/test_y.py::t`` -> ``unit``);
    ``other`` for a test outside such a folder."""
    parts = PurePath(nodeid.split("::", 1)[0]).parts
    if len(parts) >= 3 and parts[0] == "tests":
        return parts[1]
    return "other"


def format_summary(tiers: dict[str, Tier], total_seconds: float) -> list[str]:
    """The summary's lines: one per tier in the order they ran, then the whole run.

    Args:
        tiers: tier name -> :class:`Tier`, in the order the tiers started.
        total_seconds: the run's wall seconds, collection included.
    """
    lines = []
    for name, t in tiers.items():
        budget = TIER_BUDGET_SECONDS.get(name)
        verdict = (
            "" if budget is None else f" (budget {budget:.0f} s: {'within' if t.wall <= budget else 'OVER'})"
        )
        outcomes = ", ".join(f"{n} {o}" for o, n in sorted(t.outcomes.items()))
        lines.append(
            f"tier {name}: {t.wall:.0f} s wall{verdict}; {sum(t.outcomes.values())} tests ({outcomes}); "
            f"setup {t.phases['setup']:.0f} s, call {t.phases['call']:.0f} s, "
            f"teardown {t.phases['teardown']:.0f} s"
        )
        slowest = t.modules.most_common(SLOWEST_MODULES)
        if slowest:
            lines.append("  slowest files: " + ", ".join(f"{m} {sec:.0f} s" for m, sec in slowest))
    verdict = "within" if total_seconds <= SUITE_BUDGET_SECONDS else "OVER"
    lines.append(f"all tiers: {total_seconds:.0f} s (budget {SUITE_BUDGET_SECONDS:.0f} s: {verdict})")
    return lines


class TierDurations:
    """The plugin: collects per-tier times from the test reports and prints them at the end."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.tiers: dict[str, Tier] = {}

    def _tier(self, nodeid: str) -> Tier:
        return self.tiers.setdefault(tier_of(nodeid), Tier())

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        t = self._tier(nodeid)
        if t.first_start is None:
            t.first_start = time.monotonic()

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        t = self._tier(report.nodeid)
        t.phases[report.when] += report.duration
        t.modules[report.nodeid.split("::", 1)[0]] += report.duration
        t.last_finish = time.monotonic()
        # One outcome per test: a failed setup or teardown counts as "error", else the call's outcome.
        if report.when == "call" or (report.when == "setup" and not report.passed):
            t.outcomes["error" if report.when == "setup" and report.failed else report.outcome] += 1
        elif report.when == "teardown" and report.failed:
            t.outcomes["error"] += 1

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.tiers:
            return
        terminalreporter.section("time per tier")
        for line in format_summary(self.tiers, time.monotonic() - self.started):
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    """Register :class:`TierDurations` once per run (not in xdist workers: the controller sums)."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(TierDurations(), "kubeinfer-tier-durations")
