"""Config watcher (ConfigMap-style symlink swaps, invalid content) and the CLI's flag overrides."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pydantic
import pytest
from kubeinfer.runtime.cli import build_parser, load_config, overrides_from
from kubeinfer.runtime.config import BatchingConfig, RuntimeConfig
from kubeinfer.runtime.reload import ConfigWatcher

from kubeinfer.contract.instances import MAX_INSTANCES


def configmap_volume(root: Path, text: str, version: int) -> None:
    """Write ``runtime.yaml`` as the kubelet does: a timestamped dir, ``..data`` swapped by rename."""
    data = root / f"..v{version}"
    data.mkdir()
    (data / "runtime.yaml").write_text(text)
    tmp = root / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, root / "..data")
    link = root / "runtime.yaml"
    if not link.is_symlink():
        link.symlink_to("..data/runtime.yaml")


def yaml_of(**batching: object) -> str:
    return RuntimeConfig.model_validate({"batching": batching}).to_yaml()


def test_symlink_swap_applies_batching_and_invalid_content_keeps_old(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    configmap_volume(tmp_path, yaml_of(max_batch_size=8), 1)
    path = tmp_path / "runtime.yaml"
    applied: list[BatchingConfig] = []
    errors: list[str] = []

    def apply(b: BatchingConfig) -> None:
        if b.max_batch_size > 16:
            raise ValueError(f"batching.max_batch_size {b.max_batch_size} is over the warmed maximum 16")
        applied.append(b)

    w = ConfigWatcher(path, RuntimeConfig.load(path), apply, on_error=errors.append)
    assert w.poll_once() == "unchanged"
    configmap_volume(tmp_path, yaml_of(max_batch_size=4, max_queue_delay_seconds=0.02), 2)
    assert w.poll_once() == "applied"
    assert applied[-1].max_batch_size == 4 and applied[-1].max_queue_delay_seconds == 0.02
    assert w.poll_once() == "unchanged"

    caplog.set_level(logging.ERROR)
    configmap_volume(tmp_path, "batching:\n  max_queue_delay_seconds: -1\n", 3)
    assert w.poll_once() == "error"
    assert (
        "batching.max_queue_delay_seconds" in errors[-1] and "batching.max_queue_delay_seconds" in caplog.text
    )
    configmap_volume(tmp_path, "batching: [unclosed\n", 4)
    assert w.poll_once() == "error"
    configmap_volume(tmp_path, yaml_of(max_batch_size=32), 5)
    assert w.poll_once() == "error" and "warmed maximum" in errors[-1]
    assert len(applied) == 1 and w.current.batching.max_batch_size == 4  # old settings kept
    configmap_volume(tmp_path, yaml_of(max_batch_size=4, max_queue_delay_seconds=0.02), 6)
    assert w.poll_once() == "unchanged"  # same batching as in force


def test_restart_only_changes_are_ignored_and_flags_reapplied(tmp_path: Path) -> None:
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml_of(max_batch_size=8))
    args = build_parser().parse_args(["serve", "--config", str(path), "--max-batch-size", "2"])
    cfg = load_config(args)
    assert cfg.batching.max_batch_size == 2
    applied: list[BatchingConfig] = []
    w = ConfigWatcher(path, cfg, applied.append, overrides=overrides_from(args))
    text = RuntimeConfig.model_validate(
        {"batching": {"max_batch_size": 8, "max_queue_delay_seconds": 0.5}, "quantization": {"mode": "bf16"}}
    ).to_yaml()
    path.write_text(text)
    assert w.poll_once() == "applied"
    assert applied[-1].max_batch_size == 2 and applied[-1].max_queue_delay_seconds == 0.5
    assert w.current.quantization.mode == "none"  # needs a restart


def test_cli_flags_override_and_are_validated() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            "/m",
            "--quantization",
            "int8-dynamic",
            "--max-queue-delay",
            "0.002",
            "--port",
            "0",
        ]
    )
    cfg = load_config(args)
    assert cfg.model.source == "/m" and cfg.quantization.mode == "int8-dynamic"
    assert cfg.batching.max_queue_delay_seconds == 0.002 and cfg.server.port == 0
    with pytest.raises(pydantic.ValidationError, match="max_batch_size"):
        load_config(build_parser().parse_args(["serve", "--max-batch-size", "0"]))


def test_every_serve_flag_overrides_its_config_field() -> None:
    from kubeinfer.runtime.cli import FLAG_FIELDS, RENAMED_FLAGS, REPOSITORY_FLAGS

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = {a.dest for a in serve._actions if a.dest not in ("help", "config", "log_level")}
    assert flags == set(FLAG_FIELDS) | set(REPOSITORY_FLAGS) | set(RENAMED_FLAGS)
    assert set(RENAMED_FLAGS.values()) <= set(FLAG_FIELDS)
    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            "/m",
            "--quantization",
            "bf16",
            "--max-batch-size",
            "7",
            "--max-queue-delay",
            "0.25",
            "--port",
            "9",
            "--grpc-port",
            "10",
            "--host",
            "::1",
            "--device",
            "cpu",
            "--instances",
            "3",
        ]
    )
    cfg = load_config(args)
    assert (cfg.model.source, cfg.quantization.mode, cfg.device, cfg.instances) == ("/m", "bf16", "cpu", 3)
    assert (cfg.batching.max_batch_size, cfg.batching.max_queue_delay_seconds) == (7, 0.25)
    assert (cfg.server.port, cfg.server.grpc_port, cfg.server.host) == (9, 10, "::1")


def test_the_former_executors_flag_sets_instances_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    args = build_parser().parse_args(["serve", "--executors", "3"])
    with caplog.at_level(logging.WARNING, logger="kubeinfer.runtime.cli"):
        cfg = load_config(args)
    assert cfg.instances == 3
    assert [r.getMessage() for r in caplog.records] == ["--executors is deprecated: it is now --instances"]
    # every reload applies it too; --instances, when also given, wins
    assert overrides_from(args)(RuntimeConfig()).instances == 3
    both = build_parser().parse_args(["serve", "--executors", "3", "--instances", "2"])
    assert load_config(both).instances == 2


def test_instances_in_the_file_and_the_former_name_refused() -> None:
    assert "instances" not in RuntimeConfig().file_data()  # one instance: runtime.yaml reads as before
    two = RuntimeConfig.from_yaml("instances: 2\n")
    assert two.instances == 2 and RuntimeConfig.from_yaml(two.to_yaml()).instances == 2
    with pytest.raises(pydantic.ValidationError, match="executors is now instances"):
        RuntimeConfig.from_yaml("executors: 2\n")
    with pytest.raises(pydantic.ValidationError, match="instances"):
        RuntimeConfig.from_yaml(f"instances: {MAX_INSTANCES + 1}\n")


def test_the_repository_flags_make_the_repository_section() -> None:
    assert load_config(build_parser().parse_args(["serve"])).repository is None
    args = build_parser().parse_args(
        ["serve", "--model-repository", "/models", "--memory-budget", "2Gi", "--pin", "a", "--pin", "b"]
    )
    repository = load_config(args).repository
    assert repository is not None
    assert (repository.path, repository.memory_budget_bytes, repository.pinned) == (
        "/models",
        2 << 30,
        ["a", "b"],
    )
    assert "repository" not in RuntimeConfig().file_data()  # one model: runtime.yaml reads as before
