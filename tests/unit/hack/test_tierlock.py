"""tests/support/tierlock.py with a real holder: a shell that takes the lock as ``hack/test.sh`` does
(``flock`` on fd 9, handed to a background child, the shell's own copy closed)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.support.tierlock import wait_for_quiet_node


def _holder(lock: Path, seconds: float) -> subprocess.Popen[bytes]:
    """A shell whose background child holds ``lock`` for ``seconds``; returns once it is held."""
    script = f'exec 9>"{lock}"; flock 9; sleep {seconds} & exec 9>&-; echo held; wait'
    proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"held\n"
    return proc


def test_the_wait_ends_when_the_holder_ends_and_says_once_that_it_waits(tmp_path: Path) -> None:
    lock = tmp_path / "locks" / "tier.lock"
    lock.parent.mkdir()
    holder = _holder(lock, 2.0)
    said: list[str] = []
    t0 = time.monotonic()
    f = wait_for_quiet_node(lock, timeout=30.0, say=said.append)
    waited = time.monotonic() - t0
    holder.wait(timeout=10)
    assert 1.0 <= waited < 10.0, waited
    assert len(said) == 1 and str(lock) in said[0], said
    # held shared: a second waiter passes at once, silently
    again: list[str] = []
    wait_for_quiet_node(lock, timeout=1.0, say=again.append).close()
    assert again == []
    f.close()


def test_a_lock_nobody_holds_is_taken_at_once_and_its_folder_made(tmp_path: Path) -> None:
    lock = tmp_path / "absent" / "tier.lock"
    said: list[str] = []
    wait_for_quiet_node(lock, timeout=1.0, say=said.append).close()
    assert said == [] and lock.exists()


def test_a_holder_past_the_timeout_is_a_timeout_naming_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "tier.lock"
    holder = _holder(lock, 30.0)
    try:
        with pytest.raises(TimeoutError, match=r"tier\.lock still held after 1 s"):
            wait_for_quiet_node(lock, timeout=1.0, say=lambda _line: None)
    finally:
        holder.kill()
        holder.wait()
