"""Real storage servers for the model-fetch tests (``kubeinfer-runtime fetch``), started by the tests.

- :class:`FileServer`: the project's own HTTP(S) file server (the standard library's
  ``ThreadingHTTPServer`` in a thread) serving a directory, with knobs for the failures a fetch must
  survive or report: a required bearer token, a stall mid-body (nothing more after N bytes until the
  server stops), a 500 (or another status) for the first K requests, redirects; a missing file is a
  404. TLS with a throw-away CA (``hack.pki``, openssl) when asked.
- :class:`MinioServer`: a real MinIO (``minio server``), the binary that ``make setup`` builds into
  ``.cache/bin/minio`` (or ``$KUBEINFER_MINIO_BIN``); :func:`minio_binary` fails, not skips, when
  it is missing. Buckets and objects are made with boto3 (:meth:`MinioServer.client`).
- The Hugging Face Hub stand-in is in :mod:`tests.support.hfhub`.

Every server binds ``host`` (127.0.0.1 by default; the e2e tests pass the node's address so that
pods reach it) on a free port, and stops in ``stop()`` / at the end of its ``with`` block.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[2]
#: Where ``make setup`` puts the MinIO server binary.
MINIO_BIN = ROOT / ".cache" / "bin" / "minio"
#: The environment variable naming another MinIO binary.
MINIO_BIN_ENV = "KUBEINFER_MINIO_BIN"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``host`` right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def url_host(host: str) -> str:
    """``host`` as it goes in a URL (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host else host


def server_tls(pki: Path, host: str, common_name: str) -> tuple[ssl.SSLContext, Path]:
    """A throw-away CA and a serving certificate for ``host`` (an IP or a DNS name, plus localhost)
    made in ``pki`` (``hack.pki``, openssl): the server's TLS context and the CA file to trust."""
    from hack.pki import Leaf, make_pki

    san = f"IP:{host}" if host.replace(".", "").isdigit() or ":" in host else f"DNS:{host}"
    make_pki(pki, [Leaf("server", f"/CN={common_name}", server_sans=(san, "DNS:localhost"))])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "server.crt", pki / "server.key")
    return ctx, pki / "ca.crt"


# ----- the HTTP(S) file server ---------------------------------------------------------------------


@dataclass
class Request:
    """One request the file server received."""

    method: str
    path: str
    authorization: str | None


@dataclass
class FileServer:
    """An HTTP(S) server of the files under ``root`` (see the module docstring).

    Knobs (attributes, changeable while it runs): ``token`` (requests without
    ``Authorization: Bearer <token>`` get 401), ``stall_after`` (bytes of a body sent before the
    server goes silent), ``fail_first`` (that many requests answered ``fail_status``, 500 by
    default, before any is served), ``redirects`` (path -> Location, answered 302),
    ``content_types`` (path -> the Content-Type a file is served with; default
    ``application/octet-stream``). ``requests`` records what came in.
    """

    root: Path
    host: str = "127.0.0.1"
    port: int = 0
    tls: bool = False
    token: str | None = None
    stall_after: int | None = None
    fail_first: int = 0
    fail_status: int = 500
    redirects: dict[str, str] = field(default_factory=dict)
    content_types: dict[str, str] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    ca_file: Path | None = None
    _httpd: http.server.ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _release: threading.Event = field(default_factory=threading.Event)

    @property
    def base_url(self) -> str:
        """``http(s)://host:port``."""
        return f"{'https' if self.tls else 'http'}://{url_host(self.host)}:{self.port}"

    def url(self, path: str) -> str:
        """The URL of ``path`` (relative to ``root``)."""
        return f"{self.base_url}/{path.lstrip('/')}"

    def start(self) -> FileServer:
        """Listen and serve in a daemon thread; returns self. With ``tls``, makes a CA and a serving
        certificate for ``host`` (``ca_file`` is the CA to trust: ``SSL_CERT_FILE``)."""
        server = self
        handler = type("Handler", (_FileHandler,), {"server_state": server})
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        httpd_class = type("Server", (http.server.ThreadingHTTPServer,), {"address_family": family})
        httpd = httpd_class((self.host, self.port), handler)
        httpd.daemon_threads = True
        if self.tls:
            httpd.socket = self._tls_context().wrap_socket(httpd.socket, server_side=True)
        self.port = int(httpd.server_address[1])
        self._httpd = httpd
        self._release.clear()
        self._thread = threading.Thread(target=httpd.serve_forever, name="file-server", daemon=True)
        self._thread.start()
        return self

    def _tls_context(self) -> ssl.SSLContext:
        ctx, self.ca_file = server_tls(
            self.root.parent / f".pki-{id(self)}", self.host, "kubeinfer-test-files"
        )
        return ctx

    def stop(self) -> None:
        """Release stalled responses, stop serving and close the socket."""
        self._release.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> FileServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _FileHandler(http.server.BaseHTTPRequestHandler):
    server_state: FileServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _plain(self, status: int, text: str, extra: dict[str, str] | None = None) -> None:
        data = text.encode()
        self.send_response(status)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _serve(self, *, body: bool) -> None:
        state = self.server_state
        path = unquote(urlsplit(self.path).path)
        state.requests.append(Request(self.command, path, self.headers.get("Authorization")))
        if state.fail_first > 0:
            state.fail_first -= 1
            self._plain(state.fail_status, "injected failure\n")
            return
        if state.token is not None and self.headers.get("Authorization") != f"Bearer {state.token}":
            self._plain(401, "unauthorized\n", {"WWW-Authenticate": "Bearer"})
            return
        if path in state.redirects:
            self._plain(302, "moved\n", {"Location": state.redirects[path]})
            return
        file = (state.root / path.lstrip("/")).resolve()
        if not file.is_relative_to(state.root.resolve()) or not file.is_file():
            self._plain(404, "not found\n")
            return
        size = file.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", state.content_types.get(path, "application/octet-stream"))
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if not body:
            return
        with contextlib.suppress(ConnectionError, ssl.SSLError), open(file, "rb") as f:
            if state.stall_after is not None:
                self.wfile.write(f.read(state.stall_after))
                self.wfile.flush()
                state._release.wait()  # silent until the server stops
                return
            shutil.copyfileobj(f, self.wfile, 1 << 20)


# ----- MinIO ---------------------------------------------------------------------------------------


class MinioMissing(RuntimeError):
    """The MinIO server binary is not there (``make setup`` builds it)."""


def minio_binary() -> Path:
    """The MinIO server binary: ``.cache/bin/minio``, else ``$KUBEINFER_MINIO_BIN``.

    Raises:
        MinioMissing: neither exists (the message says that ``make setup`` builds it).
    """
    candidates = [MINIO_BIN]
    if os.environ.get(MINIO_BIN_ENV):
        candidates.append(Path(os.environ[MINIO_BIN_ENV]))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise MinioMissing(
        f"the MinIO server binary is missing ({MINIO_BIN}; ${MINIO_BIN_ENV} not set or not a binary): "
        "`make setup` builds it"
    )


@dataclass
class MinioServer:
    """A real MinIO server on ``host`` storing its data under ``data``; ``endpoint`` is its S3 URL.

    ``access_key`` / ``secret_key``: the root user (MINIO_ROOT_USER / MINIO_ROOT_PASSWORD). ``tls``:
    serve https with a certificate of a throw-away CA (``ca_file``, set by ``start``), MinIO's
    ``--certs-dir`` holding ``public.crt`` and ``private.key``.
    """

    data: Path
    host: str = "127.0.0.1"
    port: int = 0
    access_key: str = "kubeinfer-test"
    secret_key: str = "kubeinfer-test-secret-0123"
    binary: Path | None = None
    tls: bool = False
    ca_file: Path | None = None
    _proc: subprocess.Popen[bytes] | None = None
    _log: Any = None

    @property
    def endpoint(self) -> str:
        """``http://host:port`` (``https://`` with ``tls``)."""
        return f"{'https' if self.tls else 'http'}://{url_host(self.host)}:{self.port}"

    def _certs_dir(self) -> Path:
        """Make the CA and the serving certificate; returns MinIO's certs directory."""
        from hack.pki import Leaf, make_pki

        pki = self.data.parent / f"{self.data.name}.pki"
        make_pki(
            pki,
            [Leaf("server", "/CN=kubeinfer-test-minio", server_sans=(f"IP:{self.host}", "DNS:localhost"))],
        )
        certs = self.data.parent / f"{self.data.name}.certs"
        certs.mkdir(exist_ok=True)
        shutil.copyfile(pki / "server.crt", certs / "public.crt")
        shutil.copyfile(pki / "server.key", certs / "private.key")
        self.ca_file = pki / "ca.crt"
        return certs

    def start(self, timeout: float = 60.0) -> MinioServer:
        """Start ``minio server`` and wait for ``/minio/health/live``; returns self.

        Raises:
            MinioMissing: no binary (``minio_binary``).
            RuntimeError: it exited or did not answer within ``timeout`` seconds (its log tail says why).
        """
        binary = self.binary or minio_binary()
        self.data.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(self.host)
        console = free_port(self.host)
        env = {
            **os.environ,
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
            "MINIO_CI_CD": "1",
        }
        log_path = self.data.parent / f"{self.data.name}.minio.log"
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self._proc = subprocess.Popen(
            [
                str(binary), "server", str(self.data),
                "--address", f"{url_host(self.host)}:{self.port}",
                "--console-address", f"{url_host(self.host)}:{console}",
                "--quiet",
                *(["--certs-dir", str(self._certs_dir())] if self.tls else []),
            ],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(
                    f"minio exited with {self._proc.returncode if self._proc else '?'}: {tail}"
                )
            try:
                context = ssl.create_default_context(cafile=str(self.ca_file)) if self.tls else None
                live = f"{self.endpoint}/minio/health/live"
                with urllib.request.urlopen(live, timeout=2, context=context) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"minio did not answer /minio/health/live within {timeout:g} s: {tail}")
            time.sleep(0.2)

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client of the root user (path-style addressing)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, **config),
            verify=str(self.ca_file) if self.tls else None,
        )

    def put(self, bucket: str, files: dict[str, bytes]) -> None:
        """Create ``bucket`` (when missing) and put ``files`` (key -> content) in it."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)
        for key, content in files.items():
            client.put_object(Bucket=bucket, Key=key, Body=content)

    def env(self) -> dict[str, str]:
        """The credential environment of the root user (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 10 s) and close its log."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> MinioServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@contextlib.contextmanager
def minio(data: Path, host: str = "127.0.0.1") -> Iterator[MinioServer]:
    """A started :class:`MinioServer` for the block; stopped after it."""
    server = MinioServer(data=data, host=host)
    server.start()
    try:
        yield server
    finally:
        server.stop()
