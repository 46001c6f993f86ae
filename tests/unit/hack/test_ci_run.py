""".ci/run, CI's entry point, with a stand-in ``make`` on PATH: lint first, a lint failure stops it
before the tests, and pytest's "no tests collected" (status 5) is a failure."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

CI_RUN = Path(__file__).resolve().parents[3] / ".ci" / "run"

#: Records each target it is asked for, and exits with $FAKE_MAKE_<TARGET>_RC (0 when unset).
FAKE_MAKE = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_MAKE_LOG"
var="FAKE_MAKE_${1^^}_RC"
exit "${!var:-0}"
"""


def run_ci(tmp_path: Path, **rcs: int) -> tuple[int, list[str], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    make = bin_dir / "make"
    make.write_text(FAKE_MAKE)
    make.chmod(0o755)
    log = tmp_path / "make.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_MAKE_LOG": str(log),
        **{f"FAKE_MAKE_{target.upper()}_RC": str(rc) for target, rc in rcs.items()},
    }
    proc = subprocess.run(["bash", str(CI_RUN)], env=env, capture_output=True, text=True, timeout=30)
    targets = log.read_text().split("\n")[:-1] if log.exists() else []
    return proc.returncode, targets, proc.stderr


def test_lint_then_test(tmp_path: Path) -> None:
    assert run_ci(tmp_path)[:2] == (0, ["lint", "test"])


def test_a_lint_failure_fails_ci_without_running_the_tests(tmp_path: Path) -> None:
    rc, targets, stderr = run_ci(tmp_path, lint=2)
    assert (rc, targets) == (2, ["lint"])
    assert "make lint failed" in stderr


@pytest.mark.parametrize(("test_rc", "ci_rc"), [(1, 1), (2, 2), (5, 1)])
def test_the_tests_status_is_ci_status_and_no_tests_is_a_failure(
    tmp_path: Path, test_rc: int, ci_rc: int
) -> None:
    assert run_ci(tmp_path, test=test_rc)[:2] == (ci_rc, ["lint", "test"])
