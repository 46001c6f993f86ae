"""hack/cluster.py recovers: a port taken at bind time, a crashed cluster, `down` twice.

Starts its own second control plane in a tmp directory (the session ``cluster`` keeps running:
this also shows two clusters side by side).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from hack import cluster as hc
from hack import procs


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_taken_port_crash_and_down_recover(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        hc.check_binaries()
    except hc.ClusterError as e:
        pytest.fail(f"{e}")
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    blocked = blocker.getsockname()[1]
    real_free_port = procs.free_port
    calls = {"n": 0}

    def free_port_first_api_port_taken(*args: object, **kwargs: object) -> int:
        calls["n"] += 1
        # The third port of the first attempt is the API server's: hand out one that is in use.
        return blocked if calls["n"] == 3 else real_free_port(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(procs, "free_port", free_port_first_api_port_taken)
    messages: list[str] = []
    workdir = tmp_path / "cp"
    try:
        info = hc.start(workdir, die_with_parent=True, log=messages.append)
        assert info.ports["kube-apiserver"] != blocked
        assert any("port was taken" in m for m in messages), messages
        assert hc.is_healthy(info)
    finally:
        blocker.close()
    monkeypatch.setattr(procs, "free_port", real_free_port)

    # Crash: kill -9 every process. The recorded state is stale; start() cleans up and starts anew.
    for pid in info.pids.values():
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in info.pids.values()) and time.monotonic() < deadline:
        for p in info.pids.values():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p, os.WNOHANG)
        time.sleep(0.05)
    assert not hc.is_healthy(info)
    again = hc.start(workdir, die_with_parent=True, log=messages.append)
    assert any("stale cluster state" in m for m in messages), messages
    assert hc.is_healthy(again)
    assert set(again.pids.values()).isdisjoint(info.pids.values())
    # start() on a healthy cluster returns it unchanged.
    assert hc.start(workdir, die_with_parent=True, log=messages.append).pids == again.pids

    removed = hc.stop(workdir, log=messages.append)
    assert workdir / "kubeconfig" in removed and workdir / "etcd" in removed
    assert not any(_alive(p) for p in again.pids.values())
    assert hc.stop(workdir, log=messages.append) == []  # twice is fine
