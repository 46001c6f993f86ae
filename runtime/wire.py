"""The HTTP connection layer under uvicorn: read timeouts, accepting connections, open-files limit.

uvicorn (0.54) times out only the wait between requests on a kept-alive connection
(``timeout_keep_alive``); a fresh connection that never sends a byte, a request head sent a byte at a
time or a body that stops short of its ``Content-Length`` each hold a file descriptor (and a buffer)
for ever. ``TimedHttpProtocol`` adds the two read timeouts of ``server``:

- ``header_timeout_seconds``: from the connection's start (or a kept-alive connection's next request's
  first byte) until the request line and headers are in. Nothing of a request received: the
  connection is closed; a part of a head: 408 Request Timeout, then closed.
- ``body_timeout_seconds``: the longest pause between two pieces of a body the app is waiting for
  (not while the app has not read what came, nor before a ``100 Continue``). The response not yet
  started: 408 and closed (the app's ``receive`` then says the client disconnected); else closed.

``Acceptor`` accepts connections itself instead of the event loop's server: uvloop (libuv) accepts and
drops connections silently when the process is out of file descriptors, so that every client and the
liveness probe failed and nothing was logged. Here an ``EMFILE`` (or ``ENFILE``, ``ENOBUFS``,
``ENOMEM``) pauses accepting for ``ACCEPT_RETRY_SECONDS`` (the connections wait in the backlog) and is
logged once per ``EMFILE_LOG_SECONDS`` with a count.

``process.raise_open_files_limit`` raises the soft ``RLIMIT_NOFILE`` to the hard one (a container's soft
limit is often 1024), called first thing by the model process and by each front-end process.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import select
import socket
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

#: Seconds between retries of ``accept`` after the process ran out of file descriptors (asyncio's).
ACCEPT_RETRY_SECONDS = 1.0
#: At most one log line per this many seconds about running out of file descriptors.
EMFILE_LOG_SECONDS = 10.0
#: At shutdown, an idle connection whose client was not told ``Connection: close`` is kept this long
#: for a request the client may be sending at that instant (answered, with ``Connection: close``).
SHUTDOWN_LINGER_SECONDS = 0.5
#: Connections accepted per readiness of the listening socket before the loop serves others.
ACCEPT_BATCH = 64
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_TIMEOUT_BODY = b'{"error":"request timeout: the request was not received in time"}'
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(_TIMEOUT_BODY)).encode()
    + b"\r\nconnection: close\r\n\r\n"
    + _TIMEOUT_BODY
)


class WireConfig(uvicorn.Config):
    """uvicorn's ``Config`` with the read timeouts ``TimedHttpProtocol`` reads (seconds, > 0)."""

    def __init__(self, app: Any, *, header_timeout: float, body_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, http=TimedHttpProtocol, **kwargs)
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.shutting_down = False  # set by ``rest.UvicornServer.shutdown``


class TimedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header and body read timeouts of a ``WireConfig``."""

    def __init__(self, config: WireConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._header_timeout = config.header_timeout
        self._body_timeout = config.body_timeout
        self._read_timer: asyncio.TimerHandle | None = None
        self._in_head = False  # a byte of the current request's head received
        self._wire = config
        self._closing = False  # shut down: the next request is answered with Connection: close

    def _arm(self, seconds: float, callback: Callable[[], None]) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self._header_timeout, self._header_timed_out)
        if self._wire.shutting_down:  # accepted in the last pass before the listener closed
            self.shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        if self._read_timer is None:  # a kept-alive connection's next request: its head's deadline
            self._arm(self._header_timeout, self._header_timed_out)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        # the body's timer; on_message_complete (at once for a request without a body) disarms it
        self._arm(self._body_timeout, self._body_timed_out)
        super().on_headers_complete()
        if self._closing and self.cycle is not None:
            self.cycle.keep_alive = False

    def on_body(self, body: bytes) -> None:
        self._arm(self._body_timeout, self._body_timed_out)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown of this connection. A request being answered gets
        ``Connection: close`` (as in uvicorn). An idle connection is not closed at once, as uvicorn
        does: its client may be sending a request at this instant (a keep-alive client that was not
        told ``Connection: close``, or one that just connected), which the close would lose. It is
        kept ``SHUTDOWN_LINGER_SECONDS``, then closed unless a request arrived (answered, then
        closed) or its bytes wait unread (kept until they are read)."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
            return
        if self.transport.is_closing():
            return
        self._closing = True
        if not self._in_head:  # a head arriving has its own timer
            self._arm(SHUTDOWN_LINGER_SECONDS, self._linger_over)

    def _linger_over(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self._in_head:
            self._arm(self._header_timeout, self._header_timed_out)
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request came: closed after its response
        if not self.flow.read_paused and self._unread():
            self._arm(SHUTDOWN_LINGER_SECONDS, self._linger_over)
            return
        self.transport.close()

    def _unread(self) -> bool:
        """Bytes (or the peer's close) wait in the kernel, not yet given to ``data_received``."""
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
        return bool(readable)

    def _header_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # a pipelined request's head is slow while the one before is answered: close after it
            self.cycle.keep_alive = False
            return
        if self._in_head:
            self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()

    def _body_timed_out(self) -> None:
        self._read_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None:
            return
        if self.flow.read_paused or cycle.waiting_for_100_continue:
            # the app has not read what came yet (or not asked for the body): not the client's delay
            self._arm(self._body_timeout, self._body_timed_out)
            return
        if not cycle.response_started and not cycle.response_complete:
            self.transport.write(_TIMEOUT_RESPONSE)
            cycle.disconnected = True  # the app's receive says so, its send writes nothing
            cycle.message_event.set()
        self.transport.close()


class Acceptor:
    """Accepts connections on the listening ``sock`` (non-blocking) and hands each to the event loop
    with a protocol from ``factory``; what uvicorn's server list needs of an ``asyncio.Server``
    (``close``, ``wait_closed``). Out of file descriptors it pauses and logs (module docstring)."""

    def __init__(self, sock: socket.socket, factory: Callable[[], asyncio.Protocol]) -> None:
        self._sock = sock
        self._factory = factory
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self._retry: asyncio.TimerHandle | None = None
        self._pending: set[asyncio.Task[Any]] = set()
        self._refused = 0  # accepts that failed for lack of resources since the last log line
        self._logged_at = -EMFILE_LOG_SECONDS
        self._loop.add_reader(sock.fileno(), self._accept)

    def _accept(self, batch: int = ACCEPT_BATCH) -> None:
        for _ in range(batch):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise
                self._out_of_resources(exc)
                return
            conn.setblocking(False)
            task = self._loop.create_task(self._connect(conn))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError as exc:  # the peer went away at once, or no memory for the transport
            log.debug("accepted connection dropped: %s", exc)
            conn.close()

    def _out_of_resources(self, exc: OSError) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._logged_at >= EMFILE_LOG_SECONDS:
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            log.error(
                "cannot accept connections: %s (%d times in %.0f s; open files limit %d, hard %d); "
                "retrying every %.1f s",
                exc.strerror,
                self._refused,
                min(now - self._logged_at, EMFILE_LOG_SECONDS),
                soft,
                hard,
                ACCEPT_RETRY_SECONDS,
            )
            self._logged_at = now
            self._refused = 0
        self._loop.remove_reader(self._sock.fileno())
        if not self._closed:
            self._retry = self._loop.call_later(ACCEPT_RETRY_SECONDS, self._resume)

    def _resume(self) -> None:
        self._retry = None
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._accept)
            self._accept()

    def close(self) -> None:
        """Stop accepting (the socket stays open; its owner closes it). The connections the kernel
        completed meanwhile are accepted first: closing the listener would reset them, requests
        already sent on them included."""
        if self._closed:
            return
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
            return
        self._loop.remove_reader(self._sock.fileno())
        try:
            self._accept(batch=1 << 16)
        except OSError as exc:
            log.warning("accepting the connections left at shutdown: %s", exc)

    async def wait_closed(self) -> None:
        """Return once the connections accepted before ``close`` have their protocol."""
        if self._pending:
            await asyncio.wait(set(self._pending))
