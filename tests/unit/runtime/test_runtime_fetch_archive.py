"""Safe unpacking: crafted archives (traversal, absolute names, links out, devices) are refused
whole, before anything is written; good archives land at the destination's root."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest
from kubeinfer.runtime.fetch.archive import archive_kind, unpack
from kubeinfer.runtime.fetch.errors import FetchError
from kubeinfer.runtime.fetch.files import SizeBudget

pytestmark = pytest.mark.timeout(30)


def make_tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for m in members:
            if isinstance(m, tuple):
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                tar.addfile(info, io.BytesIO(m[1]))
            else:
                tar.addfile(m)
    return path


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def make_zip(path: Path, members: list[tuple[str, bytes] | zipfile.ZipInfo]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for m in members:
            if isinstance(m, zipfile.ZipInfo):
                zf.writestr(m, b"/etc/passwd")
            else:
                zf.writestr(m[0], m[1])
    return path


def tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_archive_kinds_by_name() -> None:
    assert [archive_kind(n) for n in ("m.tar", "m.TAR.GZ", "m.tgz", "m.zip", "m.onnx", ".tgz", "tar")] == [
        "tar",
        "tar",
        "tar",
        "zip",
        None,
        None,
        None,
    ]


def test_a_tar_with_dot_slash_names_and_an_inner_link_unpacks(tmp_path: Path) -> None:
    archive = make_tar(
        tmp_path / "m.tgz",
        [
            ("./config.json", b"{}"),
            ("./onnx/model.onnx", b"x" * 100),
            link("./latest.onnx", "onnx/model.onnx"),
        ],
    )
    dest = tmp_path / "dest"
    dest.mkdir()
    result = unpack(archive, "tar", dest, budget=SizeBudget(None))
    assert tree(dest) == ["config.json", "latest.onnx", "onnx", "onnx/model.onnx"]
    assert (dest / "latest.onnx").read_bytes() == b"x" * 100
    assert (result.files, result.bytes) == (2, 102)  # the link is not a regular file of its own


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (("../x", b"evil"), "archive member ../x escapes the destination"),
        (("a/../../x", b"evil"), "archive member a/../../x escapes the destination"),
        (("/etc/cron.d/x", b"evil"), "archive member /etc/cron.d/x is an absolute path"),
        (link("innocent", "/etc/passwd"), "is a symbolic link out of the destination (-> /etc/passwd)"),
        (link("a/b", "../../outside"), "is a symbolic link out of the destination (-> ../../outside)"),
        (link("hard", "../../etc/shadow", tarfile.LNKTYPE), "is a hard link out of the destination"),
        (link("hard", "/etc/shadow", tarfile.LNKTYPE), "is a hard link out of the destination"),
    ],
)
def test_an_unsafe_tar_member_refuses_the_archive_before_anything_is_written(
    tmp_path: Path, member: tarfile.TarInfo | tuple[str, bytes], message: str
) -> None:
    archive = make_tar(tmp_path / "evil.tar.gz", [("ok.txt", b"fine"), member])
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(FetchError, match="archive member") as info:
        unpack(archive, "tar", dest, budget=SizeBudget(None))
    assert message in info.value.cause and not info.value.transient
    assert tree(dest) == []  # not even the safe member, no scratch directory
    assert tree(tmp_path) == ["dest", "evil.tar.gz"]  # nothing written outside either


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_device_files_and_fifos_are_refused(tmp_path: Path, kind: bytes) -> None:
    dev = tarfile.TarInfo("dev/sda")
    dev.type = kind
    archive = make_tar(tmp_path / "dev.tar", [dev], mode="w")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(FetchError, match="archive member dev/sda is a device file or FIFO"):
        unpack(archive, "tar", dest, budget=SizeBudget(None))
    assert tree(dest) == []


def test_a_zip_unpacks_and_unsafe_zip_members_are_refused(tmp_path: Path) -> None:
    good = make_zip(tmp_path / "good.zip", [("config.json", b"{}"), ("sub/w.bin", b"w" * 10)])
    dest = tmp_path / "dest"
    dest.mkdir()
    assert unpack(good, "zip", dest, budget=SizeBudget(None)).files == 2
    assert tree(dest) == ["config.json", "sub", "sub/w.bin"]

    symlink = zipfile.ZipInfo("innocent")
    symlink.external_attr = (stat.S_IFLNK | 0o777) << 16
    cases = [
        ([("../evil", b"x")], "archive member ../evil escapes the destination"),
        ([("a\\..\\..\\evil", b"x")], "escapes the destination"),
        ([("/abs/evil", b"x")], "archive member /abs/evil is an absolute path"),
        ([("C:/evil", b"x")], "is an absolute path"),
        ([symlink], "archive member innocent is a symbolic link"),
    ]
    for members, message in cases:
        target = tmp_path / "t"
        target.mkdir()
        archive = make_zip(tmp_path / "evil.zip", [("ok", b"ok"), *members])
        with pytest.raises(FetchError) as info:
            unpack(archive, "zip", target, budget=SizeBudget(None))
        assert message in info.value.cause
        assert tree(target) == []
        target.rmdir()


def test_members_over_the_size_limit_are_refused_before_extraction(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "big.tar", [("a", b"a" * 600), ("b", b"b" * 600)], mode="w")
    dest = tmp_path / "dest"
    dest.mkdir()
    budget = SizeBudget(1000)
    budget.take(10)  # the archive's own bytes, counted while it was downloaded
    with pytest.raises(
        FetchError,
        match=r"0.0 MB \(1200 bytes\) unpacked plus 0.0 MB already written, more than --size-limit",
    ):
        unpack(archive, "tar", dest, budget=budget)
    assert tree(dest) == []


def test_a_corrupt_archive_is_one_line(tmp_path: Path) -> None:
    archive = tmp_path / "m.tar.gz"
    archive.write_bytes(b"\x1f\x8b this is no gzip stream")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(FetchError, match="not a readable tar archive"):
        unpack(archive, "tar", dest, budget=SizeBudget(None))
    (tmp_path / "m.zip").write_bytes(b"PK nope")
    with pytest.raises(FetchError, match="not a readable zip archive"):
        unpack(tmp_path / "m.zip", "zip", dest, budget=SizeBudget(None))
    assert tree(dest) == []


def test_without_tarfile_filters_files_and_directories_unpack_with_plain_modes_and_links_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian 12's Python 3.11.2 (the runtime image's) has no tarfile extraction filters."""
    import kubeinfer.runtime.fetch.archive as archive

    monkeypatch.setattr(archive, "HAS_DATA_FILTER", False)
    setuid = tarfile.TarInfo("bin/tool")
    setuid.size, setuid.mode = 3, 0o4755
    path = make_tar(tmp_path / "m.tar.gz", [("./model/simple.onnx", b"onnx"), ("config.json", b"{}")])
    dest = tmp_path / "dest"
    dest.mkdir()
    got = unpack(path, "tar", dest, budget=SizeBudget(None))
    assert (got.files, got.bytes) == (2, 6)
    assert (dest / "model" / "simple.onnx").read_bytes() == b"onnx"
    assert stat.S_IMODE((dest / "config.json").stat().st_mode) == 0o644

    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        tar.addfile(setuid, io.BytesIO(b"abc"))
    dest2 = tmp_path / "dest2"
    dest2.mkdir()
    unpack(tmp_path / "s.tar", "tar", dest2, budget=SizeBudget(None))
    assert stat.S_IMODE((dest2 / "bin" / "tool").stat().st_mode) == 0o644, "no setuid bit from the archive"

    linked = make_tar(tmp_path / "l.tar.gz", [("model.onnx", b"x"), link("alias.onnx", "model.onnx")])
    dest3 = tmp_path / "dest3"
    dest3.mkdir()
    with pytest.raises(FetchError, match=r"alias\.onnx is a link: this Python"):
        unpack(linked, "tar", dest3, budget=SizeBudget(None))
    assert tree(dest3) == [], "nothing is written when a link is refused"
