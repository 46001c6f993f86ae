"""A minimal local Hugging Face Hub: the routes ``huggingface_hub.snapshot_download`` calls, for the
``hf://`` fetch tests, offline.

Why not a real mirror: ``olah`` (PyPI, "self-hosted lightweight huggingface mirror", 0.5.4) serves a
local git repository offline (``mirrors-path``, ``offline = true``) and passes a plain snapshot,
but it answers a missing revision as ``401 RepoNotFound`` (the Hub: ``404 RevisionNotFound``), has
no private repositories or token checks, and lists no file sizes; the errors the fetch must report
cannot be produced with it. This stand-in answers as the Hub does (huggingface_hub's
``hf_raise_for_status`` reads the ``X-Error-Code`` header):

- ``GET /api/models/{repo}/revision/{rev}``: ``id``, ``sha`` (the commit), ``siblings``;
- ``GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=...``: the files with ``oid`` and ``size``;
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag``, ``Content-Length``
  (``Range: bytes=N-`` answered 206);
- a missing repository: ``401`` (``404`` with a valid token) ``X-Error-Code: RepoNotFound``; a
  private one without ``Authorization: Bearer <token>``: the same 401; a missing revision: ``404
  RevisionNotFound``; a missing file: ``404 EntryNotFound``; a gated repository's files without
  the token: ``403 GatedRepo``.

A revision is a branch or tag name, or its commit (40 hex digits, derived from the repository and
the name). ``stall_after`` makes file bodies go silent after that many bytes (until ``stop``).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import shutil
import socket
import ssl
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.storage import server_tls, url_host


@dataclass
class HubRepo:
    """A model repository: ``revisions`` maps a branch or tag name to its files (path -> bytes)."""

    revisions: dict[str, dict[str, bytes]]
    private: bool = False
    gated: bool = False


def commit_of(repo_id: str, revision: str) -> str:
    """The 40-hex commit id the stand-in gives ``revision`` of ``repo_id``."""
    return hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()


def git_blob_id(data: bytes) -> str:
    """A file's git blob id (the Hub's ``oid`` and ETag of a file not in LFS)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class LocalHub:
    """The stand-in Hub on ``host`` (a free port); ``endpoint`` goes to ``--hf-endpoint``.

    ``repos``: repository id -> :class:`HubRepo`; ``token``: the one valid token;
    ``requests``: ``(method, path)`` of what came in. ``tls``: serve https with a certificate of a
    throw-away CA (``ca_file``, set by ``start``).
    """

    repos: dict[str, HubRepo] = field(default_factory=dict)
    token: str = "hf_test_token_0123456789"
    host: str = "127.0.0.1"
    port: int = 0
    stall_after: int | None = None
    tls: bool = False
    ca_file: Path | None = None
    _pki: Path | None = None
    requests: list[tuple[str, str]] = field(default_factory=list)
    _httpd: http.server.ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _release: threading.Event = field(default_factory=threading.Event)

    @property
    def endpoint(self) -> str:
        """``http://host:port`` (``https://`` with ``tls``)."""
        return f"{'https' if self.tls else 'http'}://{url_host(self.host)}:{self.port}"

    def add(
        self,
        repo_id: str,
        revisions: dict[str, dict[str, bytes]],
        *,
        private: bool = False,
        gated: bool = False,
    ) -> None:
        """Add (or replace) a repository."""
        self.repos[repo_id] = HubRepo(revisions=revisions, private=private, gated=gated)

    def start(self) -> LocalHub:
        """Serve in a daemon thread; returns self."""
        handler = type("Handler", (_HubHandler,), {"hub": self})
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        httpd = type("Server", (http.server.ThreadingHTTPServer,), {"address_family": family})(
            (self.host, self.port), handler
        )
        httpd.daemon_threads = True
        if self.tls:
            httpd.socket = self._tls_context().wrap_socket(httpd.socket, server_side=True)
        self.port = int(httpd.server_address[1])
        self._httpd = httpd
        self._release.clear()
        self._thread = threading.Thread(target=httpd.serve_forever, name="local-hub", daemon=True)
        self._thread.start()
        return self

    def _tls_context(self) -> ssl.SSLContext:
        self._pki = Path(tempfile.mkdtemp(prefix="kubeinfer-hub-pki-"))
        ctx, self.ca_file = server_tls(self._pki, self.host, "kubeinfer-test-hub")
        return ctx

    def stop(self) -> None:
        """Release stalled bodies, stop serving, close the socket."""
        self._release.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._pki is not None:
            shutil.rmtree(self._pki, ignore_errors=True)
            self._pki = None

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _HubError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class _HubHandler(http.server.BaseHTTPRequestHandler):
    hub: LocalHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    # ----- helpers ----------------------------------------------------------------------------
    def _authorized(self) -> bool:
        return self.headers.get("Authorization") == f"Bearer {self.hub.token}"

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        with contextlib.suppress(ConnectionError):
            if self.hub.stall_after is not None and headers.get("Content-Type") == "application/octet-stream":
                self.wfile.write(body[: self.hub.stall_after])
                self.wfile.flush()
                self.hub._release.wait()
                return
            self.wfile.write(body)

    def _json(self, value: Any) -> None:
        self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

    def _error(self, err: _HubError) -> None:
        body = json.dumps({"error": err.message}).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Error-Code": err.code,
            "X-Error-Message": err.message,
        }
        self._send(err.status, body, headers)

    def _repo(self, repo_id: str) -> HubRepo:
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and not self._authorized()):
            status = 404 if self._authorized() else 401
            raise _HubError(status, "RepoNotFound", "Repository not found")
        return repo

    def _files(self, repo_id: str, repo: HubRepo, revision: str) -> tuple[str, dict[str, bytes]]:
        for name, files in repo.revisions.items():
            commit = commit_of(repo_id, name)
            if revision in (name, commit):
                return commit, files
        raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def _split(self, segments: list[str], keywords: tuple[str, ...]) -> tuple[str, str, list[str]]:
        """``org/name/<keyword>/rest...`` or ``name/<keyword>/rest...``: (repo id, keyword, rest)."""
        for n in (2, 1):
            if len(segments) > n and segments[n] in keywords:
                return "/".join(unquote(s) for s in segments[:n]), segments[n], segments[n + 1 :]
        raise _HubError(404, "EntryNotFound", "no such route")

    # ----- routes -----------------------------------------------------------------------------
    def _route(self) -> None:
        url = urlsplit(self.path)  # the raw path: a quoted revision keeps its %2F
        self.hub.requests.append((self.command, url.path))
        segments = [s for s in url.path.split("/") if s]
        try:
            if segments[:2] == ["api", "models"]:
                repo_id, keyword, rest = self._split(segments[2:], ("revision", "tree"))
                if keyword == "revision":
                    self._revision(repo_id, unquote("/".join(rest)) or "main", parse_qs(url.query))
                else:
                    self._tree(repo_id, unquote(rest[0]) if rest else "main", unquote("/".join(rest[1:])))
            else:
                repo_id, _, rest = self._split(segments, ("resolve",))
                if not rest:
                    raise _HubError(404, "EntryNotFound", "no revision")
                self._resolve(repo_id, unquote(rest[0]), unquote("/".join(rest[1:])))
        except _HubError as err:
            self._error(err)

    def _revision(self, repo_id: str, revision: str, query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_id)
        commit, files = self._files(repo_id, repo, revision)
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = [
            {"rfilename": p, **({"size": len(d), "blobId": git_blob_id(d)} if blobs else {})}
            for p, d in sorted(files.items())
        ]
        self._json(
            {
                "_id": commit[:24],
                "id": repo_id,
                "modelId": repo_id,
                "author": repo_id.split("/")[0],
                "sha": commit,
                "private": repo.private,
                "gated": "auto" if repo.gated else False,
                "disabled": False,
                "tags": [],
                "siblings": siblings,
                "lastModified": "2026-01-01T00:00:00.000Z",
                "createdAt": "2026-01-01T00:00:00.000Z",
            }
        )

    def _tree(self, repo_id: str, revision: str, path: str) -> None:
        repo = self._repo(repo_id)
        _, files = self._files(repo_id, repo, revision)
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        entries: list[dict[str, Any]] = []
        dirs: set[str] = set()
        for p, data in sorted(files.items()):
            if not p.startswith(prefix):
                continue
            parts = p[len(prefix) :].split("/")
            for i in range(1, len(parts)):
                dirs.add(prefix + "/".join(parts[:i]))
            entries.append({"type": "file", "oid": git_blob_id(data), "size": len(data), "path": p})
        folders = [
            {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
            for d in sorted(dirs)
        ]
        self._json(folders + entries)

    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        repo = self._repo(repo_id)
        commit, files = self._files(repo_id, repo, revision)
        if repo.gated and not self._authorized():
            raise _HubError(403, "GatedRepo", "Access to this model is restricted")
        if path not in files:
            raise _HubError(404, "EntryNotFound", f"{path} does not exist on {revision}")
        data = files[path]
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Repo-Commit": commit,
            "ETag": f'"{git_blob_id(data)}"',
            "Accept-Ranges": "bytes",
        }
        start = 0
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and rng[6:].endswith("-") and rng[6:-1].isdigit():
            start = min(int(rng[6:-1]), len(data))
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self._send(206, data[start:], headers)
            return
        self._send(200, data, headers)
