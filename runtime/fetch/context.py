"""What every backend gets (``Context``: options, destination, progress, size budget, retries) and
returns (``Fetched``), and the single-file finish they share (an archive is unpacked)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from kubeinfer.runtime.fetch.archive import ArchiveKind, archive_kind, unpack
from kubeinfer.runtime.fetch.files import SCRATCH_PREFIX, SizeBudget
from kubeinfer.runtime.fetch.progress import Progress
from kubeinfer.runtime.fetch.redact import redact_text
from kubeinfer.runtime.fetch.retry import retrying

T = TypeVar("T")
AddressingStyle = Literal["path", "virtual", "auto"]

#: Defaults of the command-line options (seconds, attempts).
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_STALL_TIMEOUT = 60.0
DEFAULT_RETRIES = 3


@dataclass(frozen=True)
class FetchOptions:
    """The options of ``kubeinfer-runtime fetch`` (see ``docs/runtime.md``).

    ``sha256``: expected hex digest of the single file or archive. ``size_limit``: bytes the
    destination may receive (the emptyDir's sizeLimit). ``connect_timeout``: seconds to connect.
    ``stall_timeout``: seconds without a byte that fail an attempt. ``retries``: further attempts
    after a transient failure. ``ca_file``: a PEM file of CAs trusted besides the public ones (a
    private CA; ``tls``).
    """

    sha256: str | None = None
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_addressing_style: AddressingStyle | None = None
    hf_endpoint: str | None = None
    allow_patterns: tuple[str, ...] = ()
    allow_http: bool = False
    ca_file: str | None = None
    size_limit: int | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    retries: int = DEFAULT_RETRIES


@dataclass(frozen=True)
class Fetched:
    """What a backend put in the destination: ``files`` written, ``bytes`` downloaded."""

    files: int
    bytes: int


@dataclass
class Context:
    """A fetch in progress: where to, with which options, and the shared progress and size budget."""

    label: str
    dest: Path
    options: FetchOptions
    env: Mapping[str, str]
    progress: Progress
    budget: SizeBudget
    log: Callable[[str], None]
    secrets: list[str] = field(default_factory=list)
    sleep: Callable[[float], None] = time.sleep

    def retry(self, attempt: Callable[[], T], label: str | None = None) -> T:
        """``attempt()`` with ``options.retries`` retries of transient failures (``retry.retrying``)."""
        return retrying(
            attempt, retries=self.options.retries, log=self.log, label=label or self.label, sleep=self.sleep
        )

    def redact(self, text: str) -> str:
        """``text`` without URLs' credentials and without the credential values in the environment."""
        return redact_text(text, self.secrets)


def single_target(ctx: Context, filename: str) -> tuple[Path, ArchiveKind | None]:
    """Where a single downloaded file goes: ``dest/filename``, or for an archive a hidden scratch name
    (unpacked by ``finish_single``)."""
    kind = archive_kind(filename)
    if kind is None:
        return ctx.dest / filename, None
    return ctx.dest / f"{SCRATCH_PREFIX}archive-{filename}", kind


def finish_single(ctx: Context, path: Path, kind: ArchiveKind | None, nbytes: int) -> Fetched:
    """A single file downloaded to ``path`` (``single_target``): kept as it is, or unpacked and
    deleted when it is an archive. Raises ``FetchError`` for an unsafe or corrupt archive."""
    if kind is None:
        return Fetched(files=1, bytes=nbytes)
    ctx.log(f"fetch: {ctx.label}: unpacking the {kind} archive")
    try:
        unpacked = unpack(path, kind, ctx.dest, budget=ctx.budget)
    finally:
        path.unlink(missing_ok=True)
        ctx.budget.give_back(nbytes)
    return Fetched(files=unpacked.files, bytes=nbytes)
