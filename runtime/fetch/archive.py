"""Unpacking an archive safely: ``.tar``, ``.tar.gz``/``.tgz`` and ``.zip``.

Every member is checked before anything is written, and the archive is refused whole when one of
them is an absolute path, has a ``..`` component, is a symbolic or hard link that leads out of
the destination, or is a device file or FIFO; tar members are then extracted with the standard
library's ``data`` filter (PEP 706) as well, which also drops set-uid bits and ownership. The
members go to a scratch directory in the destination (``.kubeinfer-unpack-<random>``) and are
renamed into the destination when every one is out, so a failure leaves no half-unpacked model.
Members land at the destination's root as the archive names them (pack with
``tar -C model/ -czf model.tar.gz .``).
"""

from __future__ import annotations

import os
import platform
import posixpath
import re
import secrets
import shutil
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kubeinfer.runtime.fetch.errors import FetchError
from kubeinfer.runtime.fetch.files import SCRATCH_PREFIX, SizeBudget, count_files, safe_path

#: Whether this Python's tarfile has extraction filters (3.11.4+, 3.12+): then ``filter="data"``
#: extracts, links included; else :func:`_extract_tar_plain` (files and directories only).
HAS_DATA_FILTER = hasattr(tarfile, "data_filter")
_FILTER_ERRORS: tuple[type[tarfile.FilterError], ...] = (tarfile.FilterError,) if HAS_DATA_FILTER else ()

ArchiveKind = Literal["tar", "zip"]
#: File name endings (lower-cased) that are unpacked, and how.
SUFFIXES: dict[str, ArchiveKind] = {".tar": "tar", ".tar.gz": "tar", ".tgz": "tar", ".zip": "zip"}
_DRIVE = re.compile(r"^[A-Za-z]:")


def archive_kind(filename: str) -> ArchiveKind | None:
    """``"tar"`` or ``"zip"`` when ``filename`` ends with an archive suffix (``SUFFIXES``), else None."""
    lower = filename.lower()
    for suffix, kind in SUFFIXES.items():
        if lower.endswith(suffix) and len(lower) > len(suffix):
            return kind
    return None


@dataclass(frozen=True)
class Unpacked:
    """The files an archive put in the destination and their bytes."""

    files: int
    bytes: int


def check_member_name(name: str) -> None:
    """Refuse an absolute member name or one with a ``..`` component.

    Raises:
        FetchError: (permanent) ``archive member NAME is an absolute path`` or
            ``archive member NAME escapes the destination``.
    """
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        raise FetchError(f"archive member {name} is an absolute path")
    if ".." in re.split(r"[/\\]", name) or "\0" in name:
        raise FetchError(f"archive member {name} escapes the destination")


def _link_escapes(member_name: str, target: str, *, relative_to_member: bool) -> bool:
    """Whether a link ``member_name -> target`` leads outside the archive's root."""
    if target.startswith(("/", "\\")) or _DRIVE.match(target):
        return True
    base = posixpath.dirname(member_name) if relative_to_member else ""
    resolved = posixpath.normpath(posixpath.join(base, target))
    return resolved == ".." or resolved.startswith("../")


def check_tar_member(member: tarfile.TarInfo) -> None:
    """Refuse a tar member that would write outside the destination or is not a file, a directory
    or a link within it.

    Raises:
        FetchError: (permanent) naming the member and what is wrong with it.
    """
    name = member.name
    check_member_name(name)
    if member.issym() and _link_escapes(name, member.linkname, relative_to_member=True):
        raise FetchError(
            f"archive member {name} is a symbolic link out of the destination (-> {member.linkname})"
        )
    if member.islnk() and _link_escapes(name, member.linkname, relative_to_member=False):
        raise FetchError(
            f"archive member {name} is a hard link out of the destination (-> {member.linkname})"
        )
    if member.ischr() or member.isblk() or member.isfifo():
        raise FetchError(f"archive member {name} is a device file or FIFO")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise FetchError(f"archive member {name} is of an unsupported type ({member.type!r})")


def check_zip_member(info: zipfile.ZipInfo) -> None:
    """Refuse a zip member that would write outside the destination, is a link or a special file
    (zip links are not extracted), or is encrypted.

    Raises:
        FetchError: (permanent) naming the member and what is wrong with it.
    """
    check_member_name(info.filename)
    mode = info.external_attr >> 16
    if mode and stat.S_ISLNK(mode):
        raise FetchError(f"archive member {info.filename} is a symbolic link (zip links are not extracted)")
    if mode and (stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        raise FetchError(f"archive member {info.filename} is a device file or FIFO")
    if info.flag_bits & 0x1:
        raise FetchError(f"archive member {info.filename} is encrypted")


def unpack(archive: Path, kind: ArchiveKind, dest: Path, *, budget: SizeBudget) -> Unpacked:
    """Check every member of ``archive``, then extract them into ``dest``.

    The members' total size is checked against ``budget`` (``--size-limit``) before extraction and
    counted in it; the archive itself stays counted (the caller deletes it and gives its bytes back).

    Raises:
        FetchError: (permanent) an unsafe member (see the module docstring), a corrupt archive, or
            members over the size limit. Nothing is left in ``dest`` then.
    """
    scratch = dest / f"{SCRATCH_PREFIX}unpack-{secrets.token_hex(4)}"
    scratch.mkdir()
    try:
        if kind == "tar":
            _extract_tar(archive, scratch, budget)
        else:
            _extract_zip(archive, scratch, budget)
        files, nbytes = count_files(scratch)
        for entry in list(scratch.iterdir()):
            target = dest / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            os.replace(entry, target)
        return Unpacked(files=files, bytes=nbytes)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _extract_tar(archive: Path, scratch: Path, budget: SizeBudget) -> None:
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                check_tar_member(member)
            total = sum(m.size for m in members if m.isreg())
            budget.check_total(total, "unpacked")
            budget.take(total)
            if HAS_DATA_FILTER:
                try:
                    tar.extractall(scratch, members=members, filter="data")
                except _FILTER_ERRORS as exc:
                    raise FetchError(f"archive member {exc.tarinfo.name} refused: {exc}") from None
            else:
                _extract_tar_plain(tar, members, scratch)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise FetchError(f"not a readable tar archive ({type(exc).__name__}: {exc})") from None


def _extract_tar_plain(tar: tarfile.TarFile, members: list[tarfile.TarInfo], scratch: Path) -> None:
    """Extract the (already checked) directories and regular files of ``tar`` into ``scratch``, on a
    Python without tarfile's extraction filters (before 3.11.4, e.g. Debian 12's 3.11.2). Files get
    mode 0644, directories 0755 (no owner, setuid bit or mtime from the archive). A link is refused:
    only the ``data`` filter resolves a link through links extracted before it safely.

    Raises:
        FetchError: (permanent) a symbolic or hard link member.
    """
    for member in members:
        if member.issym() or member.islnk():
            raise FetchError(
                f"archive member {member.name} is a link: this Python ({platform.python_version()}) "
                "has no tarfile extraction filter (3.11.4+) to extract links safely"
            )
    for member in members:
        target = (
            safe_path(scratch, member.name.rstrip("/"), "archive member") if member.name.strip("/") else None
        )
        if target is None:
            continue
        if member.isdir():
            target.mkdir(mode=0o755, parents=True, exist_ok=True)
            continue
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        src = tar.extractfile(member)
        if src is None:  # a regular file always has a body
            raise FetchError(f"archive member {member.name} has no data")
        with src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        target.chmod(0o644)


def _extract_zip(archive: Path, scratch: Path, budget: SizeBudget) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            for info in infos:
                check_zip_member(info)
            total = sum(i.file_size for i in infos if not i.is_dir())
            budget.check_total(total, "unpacked")
            budget.take(total)
            for info in infos:
                name = info.filename.rstrip("/")
                if not name:
                    continue
                target = safe_path(scratch, name, "archive member")
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        zlib.error,
        EOFError,
        OSError,
        NotImplementedError,
    ) as exc:
        raise FetchError(f"not a readable zip archive ({type(exc).__name__}: {exc})") from None
