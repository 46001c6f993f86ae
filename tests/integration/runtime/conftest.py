"""Fixtures of the model-fetch tests: real servers started by the tests (``tests/support/storage.py``,
``tests/support/hfhub.py``) and ``fetch_cli``, which runs the real ``kubeinfer-runtime fetch``.

- ``file_server`` (function): a started :class:`tests.support.storage.FileServer` over a fresh
  directory (``file_server.root``), stopped after the test.
- ``minio_server`` (module): a started :class:`tests.support.storage.MinioServer`; the test FAILS
  (not skips) when the MinIO binary is missing: ``make setup`` builds it.
- ``local_hub`` (function): a started :class:`tests.support.hfhub.LocalHub`, no repositories yet.
- ``fetch_cli`` (function): ``fetch_cli(*args, env=..., timeout=...) -> FetchRun``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.hfhub import LocalHub
from tests.support.storage import FileServer, MinioMissing, MinioServer

CLI = Path(sys.executable).parent / "kubeinfer-runtime"


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[FileServer]:
    root = tmp_path / "files"
    root.mkdir()
    with FileServer(root) as server:
        yield server


@pytest.fixture(scope="module")
def minio_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    server = MinioServer(data=tmp_path_factory.mktemp("minio") / "data")
    try:
        server.start()
    except MinioMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def local_hub() -> Iterator[LocalHub]:
    with LocalHub() as hub:
        yield hub


@dataclass(frozen=True)
class FetchRun:
    """One ``kubeinfer-runtime fetch`` run: exit status, stderr, the termination log, seconds taken."""

    returncode: int
    stderr: str
    termination: str
    seconds: float


FetchCli = Callable[..., FetchRun]


@pytest.fixture
def fetch_cli(tmp_path: Path) -> FetchCli:
    """Run ``.venv/bin/kubeinfer-runtime fetch ARGS --termination-log <tmp>`` with ``env`` added to a
    clean environment (PATH, HOME; no credentials, ``HF_HUB_OFFLINE=1`` as ``make test`` sets it)."""
    counter = iter(range(1000))

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> FetchRun:
        log = tmp_path / f"termination-log-{next(counter)}"
        base = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp_path / "home"),
            "HF_HUB_OFFLINE": "1",  # the Makefile exports it; the fetch is a download regardless
            "TRANSFORMERS_OFFLINE": "1",
        }
        started = time.monotonic()
        proc = subprocess.run(
            [str(CLI), "fetch", *args, "--termination-log", str(log)],
            env={**base, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        seconds = time.monotonic() - started
        termination = log.read_text() if log.exists() else ""
        return FetchRun(proc.returncode, proc.stderr, termination, seconds)

    return run
