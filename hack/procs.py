"""Process supervision shared by every component of the local cluster (hack/controlplane.py,
hack/node.py): free ports, spawning with logs, matching a recorded pid by its start time, stopping.

Nothing here knows about Kubernetes; each component module owns its flags and its cleanup.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path


class ClusterError(RuntimeError):
    """A component of the local cluster could not be started, reached or stopped; the message says
    which part and how to fix it."""


def free_port(host: str = "127.0.0.1", exclude: Iterable[int] = ()) -> int:
    """Return a TCP port on ``host`` that the OS reports free right now (bind to port 0).

    The port is released before returning, so another process may take it: callers that start a
    server on it must handle "address already in use" by choosing again. Ports in ``exclude`` are
    never returned (raises ClusterError after 50 tries).
    """
    excluded = set(exclude)
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in excluded:
            return port
    raise ClusterError("could not find a free port")


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/<pid>/stat), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def is_ours(pid: int, start_time: int | None) -> bool:
    """True when ``pid`` is alive and is the process we recorded (same start time, not a zombie)."""
    st = proc_start_time(pid)
    if st is None or (start_time is not None and st != start_time):
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def die_with_parent() -> None:
    """``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when the thread that started it
    exits (Linux ``prctl(PR_SET_PDEATHSIG)``), so a killed test run or demo leaves no process behind.
    Runs in the child between fork and exec; a failing ``prctl`` is ignored."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def spawn(
    cmd: list[str], log: Path, with_parent: bool, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session, stdout and stderr appended to ``log``; with ``with_parent``
    it dies with the caller (:func:`die_with_parent`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent if with_parent else None,
            env=dict(env) if env is not None else None,
        )


def terminate(pid: int, start_time: int | None, timeout: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout`` seconds, the recorded process; True when something was
    stopped (False when it was already gone or the pid now belongs to another process)."""
    if not is_ours(pid, start_time):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not is_ours(pid, start_time):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    return True


def log_tail(path: Path, n: int = 15) -> str:
    """The last ``n`` lines of a log file, or "(no log)"."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def ssl_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """A client TLS context trusting ``ca`` and presenting the ``cert``/``key`` pair (PEM paths)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def http_get(url: str, ctx: ssl.SSLContext | None, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET ``url``: (status, body); status 0 when nothing answered (refused, timeout, TLS error)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return 0, b""


def run(cmd: list[str], *, check: bool = True, timeout: float = 60.0, input: str | None = None) -> str:
    """Run a short command and return its stdout; ClusterError with stderr on failure (``check``)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        if check:
            raise ClusterError(f"`{' '.join(cmd)}` failed: {e}") from e
        return ""
    if check and r.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` exited {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout
