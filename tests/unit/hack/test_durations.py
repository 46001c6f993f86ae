"""tests/support/durations.py, the plugin that closes every ``make test`` with each tier's time: its pure
parts, and a real pytest run (pytester) over a tree with two tiers."""

from __future__ import annotations

import pytest

from tests.support.durations import SUITE_BUDGET_SECONDS, Tier, format_summary, tier_of

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(
    ("nodeid", "tier"),
    [
        ("tests/unit/operator/test_x.py::test_a", "unit"),
        ("tests/integration/runtime/test_y.py::test_b[1]", "integration"),
        ("tests/e2e/test_z.py::test_c", "e2e"),
        ("test_top.py::test_d", "other"),
        ("tests/test_shallow.py::test_e", "other"),
    ],
)
def test_tier_is_the_folder_under_tests(nodeid: str, tier: str) -> None:
    assert tier_of(nodeid) == tier


def test_summary_gives_wall_phases_outcomes_and_the_budget_verdict() -> None:
    unit = Tier(first_start=10.0, last_finish=70.0)
    unit.phases.update({"setup": 5.0, "call": 50.0, "teardown": 1.0})
    unit.outcomes.update({"passed": 99, "skipped": 1})
    unit.modules.update({f"tests/unit/test_{i}.py": float(i) for i in range(7)})
    e2e = Tier(first_start=70.0, last_finish=70.0 + 800.0)
    e2e.phases.update({"setup": 300.0, "call": 480.0, "teardown": 20.0})
    e2e.outcomes.update({"passed": 3, "failed": 1})
    lines = format_summary({"unit": unit, "e2e": e2e}, total_seconds=SUITE_BUDGET_SECONDS + 1)
    assert lines == [
        "tier unit: 60 s wall (budget 180 s: within); 100 tests (99 passed, 1 skipped); "
        "setup 5 s, call 50 s, teardown 1 s",
        "  slowest files: tests/unit/test_6.py 6 s, tests/unit/test_5.py 5 s, tests/unit/test_4.py 4 s, "
        "tests/unit/test_3.py 3 s, tests/unit/test_2.py 2 s",
        "tier e2e: 800 s wall (budget 720 s: OVER); 4 tests (1 failed, 3 passed); "
        "setup 300 s, call 480 s, teardown 20 s",
        f"all tiers: {SUITE_BUDGET_SECONDS + 1:.0f} s (budget {SUITE_BUDGET_SECONDS:.0f} s: OVER)",
    ]


def test_a_run_prints_each_tier_with_its_outcomes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        **{
            "tests/unit/test_a.py": (
                "import pytest\n"
                "def test_ok(): pass\n"
                "def test_bad(): assert False\n"
                "@pytest.mark.skip\n"
                "def test_skipped(): pass\n"
            ),
            "tests/integration/test_b.py": (
                "import pytest, time\n"
                "@pytest.fixture\n"
                "def broken(): raise RuntimeError('setup fails')\n"
                "def test_slow(): time.sleep(0.3)\n"
                "def test_error(broken): pass\n"
            ),
        }
    )
    result = pytester.runpytest(
        "-p", "no:asyncio", "-p", "tests.support.durations", "tests/unit", "tests/integration"
    )
    result.assert_outcomes(passed=2, failed=1, skipped=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*time per tier*",
            "tier unit: * s wall (budget 180 s: within); 3 tests (1 failed, 1 passed, 1 skipped); *",
            "tier integration: * s wall (budget 720 s: within); 2 tests (1 error, 1 passed); "
            "setup * s, call * s, teardown * s",
            "  slowest files: tests/integration/test_b.py * s",
            "all tiers: * s (budget 1800 s: within)",
        ]
    )
