"""hack/test.sh, ``make test``'s tiers, with a stand-in Python that records each call: every tier
runs, the first failure is the status, "no tests collected" fails, and the integration tier holds the
lock that the e2e tier's ``quiet_node`` files wait for, while the e2e tier runs beside it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

TEST_SH = Path(__file__).resolve().parents[3] / "hack" / "test.sh"

#: Records "TIER LOCK-ENV" per pytest call (TIER: the last argument), exits with $RC_<TIER> (0 unset);
#: the integration tier lasts $INTEGRATION_SECONDS and the e2e tier records whether the lock it is
#: given is held when it starts.
FAKE_PY = """#!/usr/bin/env bash
if [ "$1" = hack/cluster.py ]; then echo preloaded; exit 0; fi
tier=${@: -1}; tier=${tier#tests/}
held=free
if [ -n "${KUBEINFER_QUIET_NODE_LOCK:-}" ] && ! flock -n "$KUBEINFER_QUIET_NODE_LOCK" true; then held=held; fi
echo "$tier ${KUBEINFER_QUIET_NODE_LOCK:-unset} $held $(date +%s.%N)" >> "$CALLS"
if [ "$tier" = integration ]; then sleep "${INTEGRATION_SECONDS:-0}"; echo "integration output"; fi
var="RC_${tier^^}"
exit "${!var:-0}"
"""


def run(tmp_path: Path, **env: str) -> tuple[int, list[list[str]], str]:
    py = tmp_path / "python"
    py.write_text(FAKE_PY)
    py.chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    work = tmp_path / "repo"
    work.mkdir()
    proc = subprocess.run(
        ["bash", str(TEST_SH), str(py), "-q", "-q -n 3", "-q"],
        cwd=work,
        env={**os.environ, "CALLS": str(calls), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, [line.split() for line in calls.read_text().splitlines()], proc.stdout


def test_the_e2e_tier_runs_beside_the_integration_tier_which_holds_the_lock(tmp_path: Path) -> None:
    rc, calls, out = run(tmp_path, INTEGRATION_SECONDS="2")
    assert rc == 0, out
    assert calls[0][0] == "unit"
    # the two others start together: either may record first
    by_tier = {c[0]: c for c in calls}
    assert sorted(by_tier) == ["e2e", "integration", "unit"]
    unit, integration, e2e = by_tier["unit"], by_tier["integration"], by_tier["e2e"]
    assert unit[1] == "unset" and integration[1] == "unset"
    assert e2e[1] == ".cache/locks/integration-tier.lock" and e2e[2] == "held"
    # the e2e tier started while the integration tier ran (2 s), whose output is printed after it
    assert float(e2e[3]) - float(integration[3]) < 1.5
    assert out.index("integration output") > out.index("ran beside tests/e2e")


@pytest.mark.parametrize(
    ("rcs", "want"),
    [
        ({"RC_UNIT": "1"}, 1),
        ({"RC_INTEGRATION": "2"}, 2),
        ({"RC_E2E": "1"}, 1),
        ({"RC_INTEGRATION": "5"}, 1),
        ({"RC_E2E": "3", "RC_INTEGRATION": "2"}, 2),
    ],
)
def test_every_tier_runs_and_the_first_failure_is_the_status(
    tmp_path: Path, rcs: dict[str, str], want: int
) -> None:
    rc, calls, out = run(tmp_path, **rcs)
    assert sorted(c[0] for c in calls) == ["e2e", "integration", "unit"], out
    assert rc == want
