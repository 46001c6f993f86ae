"""The HTTP connection layer of a real runtime (tiny BERT), one process and two front ends: a connection
that sends nothing is closed after ``server.header_timeout_seconds``, a request head cut short gets a
408, a body that stops short of its ``Content-Length`` gets a 408 after ``server.body_timeout_seconds``;
a gRPC connection that sends no HTTP/2 preface is closed after the header timeout too;
the processes start with their soft open-files limit raised to the hard one; out of file descriptors,
the server logs it (once) and serves again once connections close."""

from __future__ import annotations

import contextlib
import re
import resource
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hack.devtools.runtime_proc import RuntimeProcess
from hack.devtools.runtime_tiny import tiny_hf_config, tiny_hf_dir

INFER = "/v2/models/tiny/infer"
HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.5
#: The soft open-files limit the runtime is started with (the hard one stays as it is).
LOW_SOFT_LIMIT = 512


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_dir(tmp_path_factory.mktemp("tiny"))


@contextlib.contextmanager
def _soft_open_files_limit(soft: int) -> Iterator[None]:
    """This process's soft RLIMIT_NOFILE lowered to ``soft`` (what a child started meanwhile inherits)."""
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, old[1]), old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


@pytest.fixture(scope="module", params=[1, 2], ids=["http_workers=1", "http_workers=2"])
def runtime(tiny_dir: Path, request: pytest.FixtureRequest) -> Iterator[RuntimeProcess]:
    cfg = tiny_hf_config(
        tiny_dir,
        server={
            "http_workers": request.param,
            "header_timeout_seconds": HEADER_TIMEOUT,
            "body_timeout_seconds": BODY_TIMEOUT,
        },
    )
    rt = RuntimeProcess(cfg, ready_timeout=60)
    with _soft_open_files_limit(LOW_SOFT_LIMIT):
        rt.start()
    try:
        yield rt
    finally:
        rt.close()


def _connect(rt: RuntimeProcess) -> socket.socket:
    return socket.create_connection((rt.host, rt.port), timeout=30)


def _read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and the seconds that took."""
    t0 = time.monotonic()
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - t0


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(runtime: RuntimeProcess) -> None:
    with _connect(runtime) as sock:
        data, seconds = _read_until_closed(sock)
    assert data == b""
    assert HEADER_TIMEOUT - 0.1 < seconds < HEADER_TIMEOUT + 3, seconds
    assert runtime.get("/v2/health/live")[0] == 200


def test_a_request_head_cut_short_gets_408_after_the_header_timeout(runtime: RuntimeProcess) -> None:
    with _connect(runtime) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        data, seconds = _read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert HEADER_TIMEOUT - 0.1 < seconds < HEADER_TIMEOUT + 3, seconds


def _read_response(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response with a Content-Length (its head and body can come in separate
    segments: the next read must start at the next response)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        body += chunk
    assert len(body) == length, (head, body)
    return head + b"\r\n\r\n" + body


def test_the_next_request_head_on_a_kept_alive_connection_has_the_header_timeout(
    runtime: RuntimeProcess,
) -> None:
    with _connect(runtime) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        data, seconds = _read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert seconds < HEADER_TIMEOUT + 3, seconds


def test_a_body_that_stops_short_of_its_length_gets_408_after_the_body_timeout(
    runtime: RuntimeProcess,
) -> None:
    declared = 60 * 1024 * 1024  # under the body limit (4 x 16 MiB): the server waits for it
    with _connect(runtime) as sock:
        sock.sendall(
            f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {declared}\r\n\r\n".encode()
            + b'{"inputs": [{'
        )
        data, seconds = _read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert b"connection: close" in data.lower()
    assert BODY_TIMEOUT - 0.1 < seconds < BODY_TIMEOUT + 3, seconds
    assert runtime.get("/v2/health/live")[0] == 200


def test_a_grpc_connection_that_sends_no_preface_is_closed_after_the_header_timeout(
    runtime: RuntimeProcess,
) -> None:
    with socket.create_connection((runtime.host, runtime.grpc_port), timeout=30) as sock:
        _, seconds = _read_until_closed(sock)  # the server's SETTINGS frame, then the close
    assert HEADER_TIMEOUT - 0.1 < seconds < HEADER_TIMEOUT + 3, seconds


def _http_pids(rt: RuntimeProcess) -> list[int]:
    """The processes that accept HTTP connections: the runtime, or its front-end processes."""
    children = psutil.Process(rt.pid).children()
    return [c.pid for c in children if "frontend" in " ".join(c.cmdline())] or [rt.pid]


def _open_files_limits(pid: int) -> tuple[int, int]:
    text = Path(f"/proc/{pid}/limits").read_text()
    m = re.search(r"^Max open files\s+(\d+)\s+(\d+)", text, re.M)
    assert m, text
    return int(m.group(1)), int(m.group(2))


def test_every_process_raises_its_soft_open_files_limit_to_the_hard_one(runtime: RuntimeProcess) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert hard > LOW_SOFT_LIMIT, "the test needs a hard limit above the lowered soft one"
    pids = {runtime.pid, *_http_pids(runtime)}
    assert {pid: _open_files_limits(pid) for pid in pids} == {pid: (hard, hard) for pid in pids}


def test_out_of_file_descriptors_is_logged_once_and_the_server_recovers(runtime: RuntimeProcess) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    pids = _http_pids(runtime)
    for pid in pids:  # room for a few connections more than it has open
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (psutil.Process(pid).num_fds() + 8, hard))
    socks = []
    try:
        for _ in range(40 * len(pids)):  # more than the room: the kernel queues them in the backlog
            socks.append(_connect(runtime))
        time.sleep(0.5)
    finally:
        for pid in pids:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
    t0 = time.monotonic()
    # the connections it could accept close after the header timeout, the rest are accepted then
    for sock in socks:
        sock.settimeout(HEADER_TIMEOUT * 2 + 10)
        assert _read_until_closed(sock)[0] == b""
        sock.close()
    assert time.monotonic() - t0 < HEADER_TIMEOUT * 2 + 10
    assert runtime.get("/v2/health/live")[0] == 200
    lines = [line for line in runtime.log_text().splitlines() if "cannot accept connections" in line]
    assert 1 <= len(lines) <= len(pids), lines
    assert "Too many open files" in lines[0]


def test_a_request_sent_on_an_idle_connection_as_the_server_closes_is_answered(tiny_dir: Path) -> None:
    """At shutdown an idle keep-alive connection (its last response without ``Connection: close``)
    is not closed under a request its client is sending: a request sent once the listener is closed
    still gets an answer (here a 503, with ``Connection: close``)."""
    cfg = tiny_hf_config(tiny_dir, server={"header_timeout_seconds": 30.0})
    with RuntimeProcess(cfg, ready_timeout=60) as rt, _connect(rt) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b"}"):  # head and body come in two writes
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in first.lower()
        assert rt.proc is not None
        rt.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while True:  # until the listener is closed: the final close of the connections has begun
            assert time.monotonic() < deadline, rt.tail()
            try:
                socket.create_connection((rt.host, rt.port), timeout=1).close()
            except ConnectionRefusedError:
                break
            time.sleep(0.005)
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        data, _ = _read_until_closed(sock)
        assert data.startswith(b"HTTP/1.1 503 "), data
        assert b"connection: close" in data.lower()
        assert rt.proc.wait(30) == 0
