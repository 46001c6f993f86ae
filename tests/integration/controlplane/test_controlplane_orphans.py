"""Processes started by the test helpers die with the process that started them (no orphans)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux-only")
def test_prometheus_dies_with_a_killed_parent(tmp_path: Path) -> None:
    """A demo or test run killed with SIGKILL leaves no Prometheus behind."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from hack.devtools.prom import PrometheusServer
        prom = PrometheusServer(Path({str(tmp_path)!r})).start()
        print(prom._proc.pid, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline().strip()
        assert line.isdigit(), f"the parent did not start Prometheus: {line!r}"
        prom_pid = int(line)
        assert _alive(prom_pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _alive(prom_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(prom_pid), f"prometheus (pid {prom_pid}) outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
