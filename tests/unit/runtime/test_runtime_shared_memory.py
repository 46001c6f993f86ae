"""The system shared-memory registry (Triton's shared-memory extension) on real POSIX shared memory,
created the way clients create it (``tritonclient.utils.shared_memory``), and refused inputs."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from kubeinfer.runtime.errors import InputError, ProtocolError
from kubeinfer.runtime.protocol import RegionRef, region_ref
from kubeinfer.runtime.shared_memory import SharedMemoryRegistry


@pytest.fixture
def region() -> Iterator[tuple[str, object]]:
    key = f"/kubeinfer-test-{secrets.token_hex(4)}"
    handle = shm.create_shared_memory_region("r", key, 128)
    try:
        yield key, handle
    finally:
        shm.destroy_shared_memory_region(handle)


def test_register_read_write_status_unregister(region: tuple[str, object]) -> None:
    key, handle = region
    data = np.arange(16, dtype=np.int32)
    shm.set_shared_memory_region(handle, [data])
    reg = SharedMemoryRegistry()
    reg.register("in", key, 0, 64)
    reg.register("out", key, 64, 64)
    assert reg.status() == [
        {"name": "in", "key": key, "offset": 0, "byte_size": 64},
        {"name": "out", "key": key, "offset": 64, "byte_size": 64},
    ]
    got = np.frombuffer(reg.read(RegionRef("in", 0, 64), "INPUT0"), dtype=np.int32)
    np.testing.assert_array_equal(got, data)
    reg.write(RegionRef("out", 0, 64), "OUTPUT0", (data * 2).tobytes())
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [32])[16:], data * 2)
    reg.unregister("in")
    assert [r["name"] for r in reg.status()] == ["out"]
    reg.unregister("never-registered")  # no error, as Triton
    reg.unregister()
    assert reg.status() == []


@pytest.mark.parametrize(
    ("key", "offset", "size", "message"),
    [
        ("/kubeinfer-no-such-key", 0, 8, "unable to open shared memory region 'x'"),
        ("../etc/passwd", 0, 8, "must name an object in /dev/shm"),
        ("/a/b", 0, 8, "must name an object in /dev/shm"),
        (None, 100, 64, "beyond the 128 bytes"),
        (None, 0, 0, "byte_size > 0"),
    ],
)
def test_bad_registrations_are_refused_naming_the_region(
    region: tuple[str, object], key: str | None, offset: int, size: int, message: str
) -> None:
    reg = SharedMemoryRegistry()
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        reg.register("x", key or region[0], offset, size)
    assert reg.status() == []


def test_a_region_registered_twice_an_unknown_one_and_out_of_bounds_tensors(
    region: tuple[str, object],
) -> None:
    key, _ = region
    reg = SharedMemoryRegistry()
    reg.register("in", key, 0, 64)
    with pytest.raises(InputError, match="already registered"):
        reg.register("in", key, 0, 64)
    with pytest.raises(InputError, match="unable to find system shared memory region 'nope'"):
        reg.status("nope")
    with pytest.raises(InputError, match="tensor 'INPUT0': shared memory region 'nope' is not registered"):
        reg.read(RegionRef("nope", 0, 4), "INPUT0")
    with pytest.raises(InputError, match="beyond the 64 bytes of shared memory region 'in'"):
        reg.read(RegionRef("in", 32, 64), "INPUT0")
    with pytest.raises(
        InputError, match="output 'OUTPUT0' has 128 bytes, over the shared_memory_byte_size 64"
    ):
        reg.write(RegionRef("in", 0, 64), "OUTPUT0", bytes(128))
    reg.close()


def test_region_parameters_are_checked() -> None:
    assert region_ref("x", {}, "input tensor") is None
    ref = region_ref("x", {"shared_memory_region": "r", "shared_memory_byte_size": 8}, "input tensor")
    assert ref == RegionRef("r", 0, 8)
    for params in (
        {"shared_memory_region": "r"},  # no size
        {"shared_memory_region": "r", "shared_memory_byte_size": -1},
        {"shared_memory_region": "r", "shared_memory_byte_size": 8, "shared_memory_offset": "0"},
        {"shared_memory_region": 5, "shared_memory_byte_size": 8},
    ):
        with pytest.raises(ProtocolError, match="input tensor 'x'"):
            region_ref("x", params, "input tensor")


def test_keys_resolve_inside_the_shm_directory_only(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(bytes(64))
    (tmp_path / "link").symlink_to(tmp_path / "real")
    reg = SharedMemoryRegistry(str(tmp_path))
    reg.register("ok", "/real", 0, 64)
    with pytest.raises(InputError, match="unable to open"):  # O_NOFOLLOW: no symbolic link out
        reg.register("via-link", "/link", 0, 64)
    reg.close()
