"""Writing into the destination: temp-then-rename, sha256 while streaming, the size limit, safe paths.

Every file is written under a hidden temporary name in its final directory
(``.<name>.<random>.kubeinfer-partial``), flushed and fsynced, then renamed over its final name
(``os.replace``, atomic on one filesystem): a reader never sees half a file under a model's name,
and a killed attempt leaves only hidden ``*.kubeinfer-partial`` files, which ``remove_leftovers``
deletes at the next start. The loaders skip hidden files. A file that begins as an HTML page is
refused (``htmlpage``) before its first bytes are written.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import threading
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from kubeinfer.runtime.fetch import htmlpage
from kubeinfer.runtime.fetch.errors import FetchError
from kubeinfer.runtime.fetch.progress import Progress, megabytes

#: The suffix of a file being written.
PARTIAL_SUFFIX = ".kubeinfer-partial"
#: The prefix of scratch entries in the destination (an archive being unpacked, the Hub's cache).
SCRATCH_PREFIX = ".kubeinfer-"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def check_sha256(value: str) -> str:
    """``value`` lower-cased, when it is 64 hex digits. Raises ``ValueError`` otherwise."""
    hexdigest = value.strip().lower()
    if not _SHA256.match(hexdigest):
        raise ValueError(f"--sha256 must be 64 hexadecimal digits, got {len(hexdigest)} characters")
    return hexdigest


def short_hash(hexdigest: str) -> str:
    """The first 12 hex digits and an ellipsis (messages)."""
    return f"{hexdigest[:12]}..."


class SizeBudget:
    """The bytes the destination may receive (``--size-limit``; None: no limit), shared by every file
    of a fetch. Thread-safe."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def check_total(self, total: int, what: str = "to fetch") -> None:
        """Refuse before starting when the source states a total over the limit.

        Raises:
            FetchError: (permanent) ``total`` plus what is used already exceeds the limit:
                ``12.0 MB (12000000 bytes) to fetch, more than --size-limit 10.0 MB (10000000 bytes)``.
        """
        if self.limit is None or self.used + total <= self.limit:
            return
        already = f" plus {megabytes(self.used)} already written" if self.used else ""
        raise FetchError(
            f"{megabytes(total)} ({total} bytes) {what}{already}, more than --size-limit "
            f"{megabytes(self.limit)} ({self.limit} bytes)"
        )

    def give_back(self, n: int) -> None:
        """Uncount ``n`` bytes (a discarded file's)."""
        with self._lock:
            self.used -= n

    def take(self, n: int) -> None:
        """Count ``n`` more bytes written.

        Raises:
            FetchError: (permanent) the bytes written exceed the limit.
        """
        with self._lock:
            over = self.limit is not None and self.used + n > self.limit
            if not over:
                self.used += n
        if over:
            raise FetchError(
                f"more than --size-limit {megabytes(self.limit or 0)} ({self.limit} bytes) received"
            )


def safe_path(root: Path, relative: str, what: str) -> Path:
    """``root / relative`` for a relative POSIX path that stays under ``root``.

    Raises:
        FetchError: (permanent) an absolute path, a ``..`` or empty component, a NUL or a
            backslash: ``<what> <relative> escapes the destination``.
    """
    parts = PurePosixPath(relative).parts
    bad = (
        not relative
        or relative.startswith("/")
        or "\\" in relative
        or "\0" in relative
        or any(p in ("..", ".") for p in parts)
        or "//" in relative
    )
    if bad:
        raise FetchError(f"{what} {relative} escapes the destination")
    path = root.joinpath(*parts)
    if not path.resolve().is_relative_to(root.resolve()):
        raise FetchError(f"{what} {relative} escapes the destination")
    return path


def temp_name(final: Path) -> Path:
    """A hidden temporary sibling of ``final`` (``.<name>.<random>.kubeinfer-partial``)."""
    return final.with_name(f".{final.name}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}")


class Sink:
    """One file being written: ``write`` chunks (sha256, byte count, progress, size budget), then
    ``commit`` (verify, fsync, rename) or ``discard``. A context manager: leaving it without a
    commit discards.

    Its first ``htmlpage.HEAD_BYTES`` are held back until they are all there (or ``commit``) and
    checked: an HTML page is refused (``htmlpage.check_head``; not for a file ``final`` named as HTML).
    """

    def __init__(
        self,
        final: Path,
        *,
        budget: SizeBudget,
        progress: Progress,
        sha256: str | None = None,
    ) -> None:
        self.final = final
        self.path = temp_name(final)
        self.bytes = 0
        self._budget = budget
        self._progress = progress
        self._want = sha256
        self._hash = hashlib.sha256()
        #: The first bytes, until they are checked (then None).
        self._head: bytearray | None = None if htmlpage.may_be_html(final.name) else bytearray()
        final.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO | None = open(self.path, "wb")  # noqa: SIM115 (closed by commit/discard)

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self.discard()

    def write(self, chunk: bytes) -> None:
        """Append ``chunk``.

        Raises:
            FetchError: (permanent) past the size limit; the file begins as an HTML page
                (``errors.HTML_PAGE_CAUSE``).
        """
        assert self._file is not None, "write after commit or discard"
        self._budget.take(len(chunk))
        self._hash.update(chunk)
        self.bytes += len(chunk)  # counted first: a refused head gives them back (discard)
        self._progress.add(len(chunk))
        if self._head is None:
            self._file.write(chunk)
        else:
            self._head += chunk
            if len(self._head) >= htmlpage.HEAD_BYTES:
                self._write_head()

    def _write_head(self) -> None:
        """Check the bytes held back (``htmlpage.check_head``), then write them."""
        assert self._file is not None and self._head is not None
        htmlpage.check_head(self.final.name, bytes(self._head))
        self._file.write(self._head)
        self._head = None

    def commit(self) -> Path:
        """Check the sha256 (when one was asked for) and that a file shorter than
        ``htmlpage.HEAD_BYTES`` is no HTML page, flush to disk and rename to the final name.

        Raises:
            FetchError: (permanent) ``sha256 mismatch (expected ..., got ...)``; an HTML page
                (``errors.HTML_PAGE_CAUSE``); the file is removed.
        """
        assert self._file is not None, "commit after commit or discard"
        if self._head is not None:
            try:
                self._write_head()
            except FetchError:
                self.discard()
                raise
        got = self._hash.hexdigest()
        if self._want is not None and got != self._want:
            self.discard()
            raise FetchError(f"sha256 mismatch (expected {short_hash(self._want)}, got {short_hash(got)})")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        os.replace(self.path, self.final)
        return self.final

    @property
    def sha256(self) -> str:
        """The hex sha256 of the bytes written so far."""
        return self._hash.hexdigest()

    def discard(self) -> None:
        """Close and delete the temporary file; give its bytes back to the budget and the progress."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self.path.unlink(missing_ok=True)
        self._budget.give_back(self.bytes)
        self._progress.add(-self.bytes)
        self.bytes = 0


def remove_leftovers(root: Path) -> int:
    """Delete what an interrupted fetch left under ``root``: ``*.kubeinfer-partial`` files and
    ``.kubeinfer-*`` scratch directories. Returns how many entries were removed."""
    removed = 0
    if not root.is_dir():
        return 0
    for entry in list(root.iterdir()):
        if entry.name.startswith(SCRATCH_PREFIX) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            if name.endswith(PARTIAL_SUFFIX):
                Path(dirpath, name).unlink(missing_ok=True)
                removed += 1
    return removed


def count_files(root: Path) -> tuple[int, int]:
    """``(files, bytes)`` of the regular files under ``root``, hidden entries (the report, scratch,
    the Hub's ``.cache``) excluded."""
    files = total = 0
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            path = Path(dirpath, name)
            if not name.startswith(".") and path.is_file() and not path.is_symlink():
                files += 1
                total += path.stat().st_size
    return files, total
