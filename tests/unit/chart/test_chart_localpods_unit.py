"""Pure parts of hack/localpods.py: the per-process config and the atomic write."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubeinfer.runtime.config import RuntimeConfig

from hack.localpods import render_local_config, write_atomic


def test_chart_localpods_config_overrides_only_host_and_port() -> None:
    cm = RuntimeConfig.model_validate(
        {"batching": {"max_queue_delay_seconds": 0.003, "max_batch_size": 16}, "device": "cpu"}
    ).to_yaml()
    out = yaml.safe_load(render_local_config(cm, 41234))
    want = yaml.safe_load(cm)
    want["server"].update(host="127.0.0.1", port=41234)
    assert out == want
    RuntimeConfig.model_validate(out)  # still a valid runtime config


def test_chart_localpods_config_without_server_section_gets_one() -> None:
    assert yaml.safe_load(render_local_config("batching: {max_batch_size: 4}\n", 9)) == {
        "batching": {"max_batch_size": 4},
        "server": {"host": "127.0.0.1", "port": 9},
    }


def test_chart_localpods_config_must_be_a_mapping() -> None:
    with pytest.raises(ValueError, match=r"runtime\.yaml"):
        render_local_config("- a\n- b\n", 1)


def test_chart_localpods_write_atomic_replaces_without_leftovers(tmp_path: Path) -> None:
    p = tmp_path / "runtime.yaml"
    write_atomic(p, "a: 1\n")
    inode = p.stat().st_ino
    write_atomic(p, "a: 2\n")
    assert p.read_text() == "a: 2\n"
    assert p.stat().st_ino != inode  # a rename, not an in-place write a poller could half-read
    assert [f.name for f in tmp_path.iterdir()] == ["runtime.yaml"]
